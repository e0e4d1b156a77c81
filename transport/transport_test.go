package transport_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/modeltest"
	"github.com/agenthost/agenthost/room"
	"github.com/agenthost/agenthost/sqlitestore"
	"github.com/agenthost/agenthost/transport"
)

func custodian(t *testing.T) *custody.Custodian {
	t.Helper()
	c, err := custody.New(custody.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestOptionsRefused: what an embedder gets wrong is refused at
// construction, with an error it can match, never at an agent's start.
func TestOptionsRefused(t *testing.T) {
	cust := custodian(t)
	cases := []struct {
		name string
		opts transport.Options
		is   error
	}{
		{"no custodian", transport.Options{}, nil},
		{"tools folder without agents", transport.Options{Custodian: cust, Tools: t.TempDir()}, transport.ErrNotFound},
		{"the program's own variable", transport.Options{Custodian: cust, AgentEnv: []string{"AGENTHOST_TOKEN"}}, transport.ErrEnvName},
		{"the room's HOME", transport.Options{Custodian: cust, AgentEnv: []string{"HOME"}}, transport.ErrEnvName},
		{"not a name", transport.Options{Custodian: cust, AgentEnv: []string{"A=B"}}, transport.ErrEnvName},
		{"unknown mode", transport.Options{Custodian: cust, Confinement: transport.Confinement{Mode: "strict"}}, nil},
		{"uid range backwards", transport.Options{Custodian: cust, Confinement: transport.Confinement{FirstUID: 2_000_000_010, LastUID: 2_000_000_000}}, nil},
		{"uid range half set", transport.Options{Custodian: cust, Confinement: transport.Confinement{FirstUID: 2_000_000_000}}, nil},
		{"system uids", transport.Options{Custodian: cust, Confinement: transport.Confinement{FirstUID: 1000, LastUID: 2000}}, nil},
	}
	for _, c := range cases {
		for name, start := range map[string]func(transport.Options) (room.Transport, error){"rpc": transport.NewRPC, "acp": transport.NewACP} {
			tr, err := start(c.opts)
			if err == nil || tr != nil {
				t.Errorf("%s, %s: got %v, %v; want an error", c.name, name, tr, err)
				continue
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("%s, %s: %v, want %v", c.name, name, err, c.is)
			}
		}
	}
	if _, err := transport.RPCCommand(transport.Options{}, "omp", t.TempDir()); err == nil {
		t.Error("RPCCommand without a ModelURL: no error")
	}
	if _, err := transport.RPCCommand(transport.Options{ModelURL: "http://127.0.0.1:9/v1", AgentEnv: []string{"AGENTHOST_TOKEN"}}, "omp", t.TempDir()); !errors.Is(err, transport.ErrEnvName) {
		t.Errorf("RPCCommand with AGENTHOST_TOKEN passed: %v", err)
	}
}

// TestConfinementOption: Options.Confinement reaches the agents. A pi
// agent (yolo) runs a bash call that writes beside the rooms' folder:
// confined with Landlock it cannot, unconfined it can; the room's state
// reports which.
func TestConfinementOption(t *testing.T) {
	if confine.KernelABI() < 1 {
		t.Skip("this kernel has no Landlock: ConfineLandlock is refused (TestOptionsRefused covers the error)")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	model, err := modeltest.Start(ctx, modeltest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer model.Close()
	cust := custodian(t)
	for _, c := range []struct {
		mode  transport.ConfineMode
		wrote bool
		shown string
	}{{transport.ConfineLandlock, false, "landlock"}, {transport.ConfineOff, true, "none"}} {
		t.Run(string(c.mode), func(t *testing.T) {
			dir := t.TempDir()
			target := filepath.Join(dir, "outside-the-room")
			st, err := sqlitestore.Open(ctx, filepath.Join(dir, "agenthost.db"), sqlitestore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			tr, err := transport.NewRPC(transport.Options{Custodian: cust, ModelURL: model.URL(), Confinement: transport.Confinement{Mode: c.mode}})
			if err != nil {
				t.Fatal(err)
			}
			m, err := room.New(room.Options{Store: st, Transport: tr, Root: filepath.Join(dir, "rooms"),
				Config: room.Config{Agent: "pi", ApprovalMode: room.ApprovalYolo}})
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := errors.Join(m.Close(), m.Wait(ctx)); err != nil {
					t.Error(err)
				}
			}()
			cmd, _ := json.Marshal(map[string]string{"command": "echo escaped > " + target})
			acc, err := m.Submit(ctx, "r", room.Message{Text: "[[tool:bash " + string(cmd) + "]]"})
			if err != nil {
				t.Fatal(err)
			}
			var end event.TurnEnded
			waitFor(ctx, t, m, "r", acc.Seq, event.TypeTurnEnded, &end)
			if end.Outcome != room.OutcomeSettled {
				t.Fatalf("turn %s: %s", end.Outcome, end.Reason)
			}
			_, err = os.Stat(target)
			if wrote := err == nil; wrote != c.wrote {
				t.Errorf("the agent wrote beside the rooms: %v, want %v (%v)", wrote, c.wrote, err)
			}
			s, err := m.State(ctx, "r")
			if err != nil {
				t.Fatal(err)
			}
			if s.Confinement == nil || s.Confinement.Mode != c.shown {
				t.Errorf("the room's state shows confinement %+v, want mode %s", s.Confinement, c.shown)
			}
		})
	}
}

// TestAgentUIDsOption: with a uid range, a server running as root runs
// each room's agent as a uid of the range (the agent's own shell says
// so), never as root.
func TestAgentUIDsOption(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("agents get uids of their own only when the program runs as root")
	}
	if confine.KernelABI() < 1 {
		t.Skip("this kernel has no Landlock")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	model, err := modeltest.Start(ctx, modeltest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer model.Close()
	dir := t.TempDir()
	st, err := sqlitestore.Open(ctx, filepath.Join(dir, "agenthost.db"), sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const first, last = 2_000_000_100, 2_000_000_109
	tr, err := transport.NewRPC(transport.Options{Custodian: custodian(t), ModelURL: model.URL(),
		Confinement: transport.Confinement{Mode: transport.ConfineLandlock, FirstUID: first, LastUID: last}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := room.New(room.Options{Store: st, Transport: tr, Root: filepath.Join(dir, "rooms"),
		Config: room.Config{Agent: "pi", ApprovalMode: room.ApprovalYolo}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := errors.Join(m.Close(), m.Wait(ctx)); err != nil {
			t.Error(err)
		}
	}()
	acc, err := m.Submit(ctx, "r", room.Message{Text: `[[tool:bash {"command":"id -u"}]]`})
	if err != nil {
		t.Fatal(err)
	}
	var tool event.ToolEnded
	waitFor(ctx, t, m, "r", acc.Seq, event.TypeToolEnded, &tool)
	uid, err := strconv.Atoi(strings.TrimSpace(tool.Output))
	if err != nil || uid < first || uid > last {
		t.Fatalf("the agent's shell runs as uid %q, want one of %d-%d", tool.Output, first, last)
	}
}

func waitFor(ctx context.Context, t *testing.T, m *room.Manager, roomID string, seq int64, typ string, v any) {
	t.Helper()
	watch, stop := m.Watch(roomID)
	defer stop()
	for {
		evs, err := m.Events(ctx, roomID, seq, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if seq = ev.Seq; ev.Type == typ {
				if err := json.Unmarshal(ev.Data, v); err != nil {
					t.Fatal(err)
				}
				return
			}
		}
		select {
		case <-watch:
		case <-ctx.Done():
			t.Fatalf("no %s event: %v", typ, ctx.Err())
		}
	}
}

// TestNoToolsFolder: where no tools folder is found, the transports still
// start (rooms may all run commands of their own) and say so in the log;
// RPCCommand, which needs an agent, fails with ErrNotFound.
func TestNoToolsFolder(t *testing.T) {
	t.Setenv(transport.ToolsEnv, "")
	t.Chdir(t.TempDir())
	var log strings.Builder
	logger := slog.New(slog.NewTextHandler(&log, nil))
	for name, start := range map[string]func(transport.Options) (room.Transport, error){"rpc": transport.NewRPC, "acp": transport.NewACP} {
		log.Reset()
		if _, err := start(transport.Options{Custodian: custodian(t), Logger: logger}); err != nil {
			t.Errorf("%s without a tools folder: %v", name, err)
		}
		if !strings.Contains(log.String(), "no tools folder found") {
			t.Errorf("%s logged %q, want a warning that no tools folder was found", name, log.String())
		}
	}
	if _, err := transport.RPCCommand(transport.Options{ModelURL: "http://127.0.0.1:9/v1"}, "omp", t.TempDir()); !errors.Is(err, transport.ErrNotFound) {
		t.Errorf("RPCCommand without a tools folder: %v, want ErrNotFound", err)
	}
}
