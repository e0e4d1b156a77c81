//go:build linux

package acpagent

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/roomtest"
	"github.com/agenthost/agenthost/internal/slotpool/pooltest"
	"github.com/agenthost/agenthost/room"
)

// poolHost is a host whose transport keeps a warm pool of size agents of
// cfg's, confined with Landlock (only the model's port).
type poolHost struct {
	*host
	tr *Transport
}

func startPoolHost(t *testing.T, cfg room.Config, size int) *poolHost {
	t.Helper()
	return startPool(t, "", nil, cfg, size, nil, confine.UIDRange{})
}

// startPool is startPoolHost in dir ("": a new one) with sim (nil: its
// own), the bind's fault hook fault, and agents that run as uids of
// agentUIDs (none: as the server).
func startPool(t *testing.T, dir string, sim *modelsim.Server, cfg room.Config, size int, fault func(string) error, agentUIDs confine.UIDRange) *poolHost {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	ph := &poolHost{}
	h := roomtest.Start(t, dir, sim, room.Options{Config: cfg}, func(cust *custody.Custodian, in *agents.Install, raw string) (room.Transport, error) {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, err
		}
		n, err := strconv.ParseUint(u.Port(), 10, 16)
		if err != nil {
			return nil, err
		}
		cf, err := confine.New(confine.Options{Mode: confine.ModeLandlock, Net: []uint16{}, Ports: []uint16{uint16(n)}, Tools: in.Dir, AgentUIDs: agentUIDs})
		if err != nil {
			return nil, err
		}
		if !agentUIDs.Empty() && cf.AgentUsers().Empty() {
			t.Fatal("no agent uids as root")
		}
		tr, err := New(Options{Custodian: cust, Install: in, ModelURL: raw, Confine: cf,
			Pool: &PoolOptions{Size: size, Config: cfg, Rooms: filepath.Join(dir, "rooms"), Fault: fault}})
		if err == nil {
			// After the rooms' close (cleanups run last first).
			t.Cleanup(func() { tr.Close() })
		}
		ph.tr = tr
		return tr, err
	})
	if err := ph.tr.StartPool(); err != nil {
		t.Fatal(err)
	}
	ph.host = h
	return ph
}

func (ph *poolHost) ready(t *testing.T, n int) *slot {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	if err := ph.tr.PoolWait(ctx, n); err != nil {
		t.Fatalf("the pool's agents: %v", err)
	}
	idle, _ := ph.tr.pool.Idle()
	return idle[0]
}

func (ph *poolHost) started(t *testing.T, roomID string, acc room.Accepted) map[string]any {
	t.Helper()
	_, started := ph.Wait(roomID, acc.Seq, "agent.started", nil)
	return started
}

// codexShell is the scripted model's call of codex's shell tool (a yolo
// room's: codex refuses an escalation where it never asks).
func codexShell(cmd string) string {
	b, _ := json.Marshal(map[string]any{"cmd": cmd})
	return "[[tool:exec_command " + string(b) + "]]"
}

// TestRealCodexPool: with a pool of codex-acp (Landlock, yolo), a new room
// is given a pool agent (agent.started pooled, bind_ms) whose shell tool
// runs in the room's workspace and which is confined as a cold agent (the
// probe); its slot's folders are gone after the release; before its bind
// the next slot's agent cannot read the earlier room nor the store; the
// earlier room, woken, takes the cold path (miss resume) and resumes its
// conversation; the next new room is bound to that next slot.
func TestRealCodexPool(t *testing.T) {
	cfg := room.Config{Agent: string(agents.Codex), ApprovalMode: room.ApprovalYolo}
	ph := startPoolHost(t, cfg, 1)
	first := ph.ready(t, 1)

	acc := ph.Submit("a", "remember marker-Q "+codexShell("pwd > where.txt"))
	if st := ph.started(t, "a", acc); st["pooled"] != true || st["bind_ms"] == nil || st["resumed"] == true {
		ps, _ := ph.tr.PoolStats()
		t.Fatalf("new room: agent.started %v (pool %+v)", st, ps)
	}
	ph.Settled("a", acc)
	ws := pooltest.RoomWorkspace(t, ph.Root, "a")
	if b, err := os.ReadFile(filepath.Join(ws, "where.txt")); err != nil || strings.TrimSpace(string(b)) != ws {
		t.Fatalf("the tool ran in %q (%v), not the room's workspace %s", b, err, ws)
	}
	// Nothing of the slot's is in the room's workspace (its snapshots see
	// only the turn's change).
	if ents, _ := os.ReadDir(ws); len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("the room's workspace after the pooled turn: %v", names)
	}

	// The bound agent is confined as a cold one: another room's files,
	// the store, the server's process and a TCP port are out of reach.
	pooltest.WriteProbe(t, ph.Root, ws)
	pacc := ph.Submit("a", "Probe: "+codexShell("bash "+roomtest.ProbeScript))
	ph.Settled("a", pacc)
	roomtest.CheckConfined(t, roomtest.ProbeResults(ph.Sim), true)

	if err := ph.M.Release(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if _, rel := ph.Wait("a", acc.Seq, "agent.released", nil); rel["receipt"] == nil {
		t.Fatalf("a pooled agent's release without a receipt: %v", rel)
	}
	for _, p := range []string{first.Dir, first.WS} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the slot's %s is left after the release: %v", p, err)
		}
	}

	// The next slot, before any bind: its agent cannot read room a nor
	// the store (a session of its own, its shell's output into its
	// workspace).
	next := ph.ready(t, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sess, err := next.Agent.c.NewSession(ctx, next.WS, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(next.WS, "probe.txt")
	cmd := "cat " + filepath.Join(ws, "where.txt") + " >/dev/null 2>&1; echo a=$? > probe.txt; head -c1 " + pooltest.Store(ph.Root) + " >/dev/null 2>&1; echo db=$? >> probe.txt"
	if _, err := next.Agent.c.Prompt(ctx, sess.ID, codexShell(cmd)); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil || !strings.Contains(string(b), "a=1") || !strings.Contains(string(b), "db=1") {
		t.Fatalf("a slot's agent before its bind read the room or the store: %q, %v", b, err)
	}
	if err := os.Remove(out); err != nil {
		t.Fatal(err)
	}

	// Room a wakes: the cold path, with its conversation (codex finds
	// the session its pool agent wrote under the slot's home's name).
	again := ph.Submit("a", "what did I say? "+codexShell("cat where.txt"))
	if st := ph.started(t, "a", again); st["pooled"] == true || st["resumed"] != true {
		t.Fatalf("woken room: agent.started %v", st)
	}
	ph.Settled("a", again)
	if !ph.LastRequestHas("marker-Q") {
		t.Fatal("the woken room's session lacks the earlier turn")
	}

	// A new room takes the slot that waited, and its agent calls the
	// room's tools (served by the MCP server the slot's agent was started
	// with, given room b's tools at the bind).
	bacc := ph.Submit("b", `[[tool:mcp__agenthost__room_info {}]]`)
	if st := ph.started(t, "b", bacc); st["pooled"] != true {
		t.Fatalf("room b: agent.started %v", st)
	}
	_, tool := ph.Wait("b", bacc.Seq, room.KindToolEnded, nil)
	// codex reports the MCP result as JSON: the tool's text is quoted in it.
	if out, _ := tool["output"].(string); !strings.Contains(out, `\"room\":\"b\"`) || tool["is_error"] == true {
		t.Fatalf("room_info over MCP in a pooled room: %v", tool)
	}
	ph.Settled("b", bacc)
	if err := ph.M.Release(t.Context(), "b"); err != nil {
		t.Fatal(err)
	}
	ph.Wait("b", bacc.Seq, "agent.released", nil)
	for _, p := range []string{next.Dir, next.WS} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the slot's %s is left after the release: %v", p, err)
		}
	}
	st, _ := ph.tr.PoolStats()
	if st.Hits != 2 || st.Misses[MissResume] != 1 {
		t.Fatalf("pool stats: %+v", st)
	}
}

// Two new rooms race for a pool of one: one is bound, the other starts
// cold (it never waits for the pool); both turns settle in their own
// workspaces.
func TestRealCodexPoolRace(t *testing.T) {
	ph := startPoolHost(t, room.Config{Agent: string(agents.Codex), ApprovalMode: room.ApprovalYolo}, 1)
	ph.ready(t, 1)
	var wg sync.WaitGroup
	pooled := make([]bool, 2)
	for i, id := range []string{"x", "y"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			acc := ph.Submit(id, codexShell("pwd > where.txt"))
			pooled[i] = ph.started(t, id, acc)["pooled"] == true
			ph.Settled(id, acc)
		}()
	}
	wg.Wait()
	if pooled[0] == pooled[1] {
		t.Fatalf("pooled: %v, want exactly one", pooled)
	}
	for _, id := range []string{"x", "y"} {
		ws := pooltest.RoomWorkspace(t, ph.Root, id)
		if b, err := os.ReadFile(filepath.Join(ws, "where.txt")); err != nil || strings.TrimSpace(string(b)) != ws {
			t.Fatalf("room %s's tool ran in %q (%v), not %s", id, b, err, ws)
		}
	}
	st, _ := ph.tr.PoolStats()
	if st.Hits != 1 || st.Misses[MissEmpty] != 1 {
		t.Fatalf("pool stats: %+v", st)
	}
}
