//go:build linux

package roomclaims

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/acpagent"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/roomsqlite"
	"github.com/agenthost/agenthost/internal/rpcagent"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// claimPooled: with a warm pool (serve --pool 1), a new room and (rpc)
// the same room woken after a release are each given a pool agent,
// confined like a cold one (Landlock, the model's port only), which runs
// the room's shell tool in the room's workspace and resumes its session;
// over acp the woken room starts cold (a miss, resume) and resumes its
// session. It runs on a host of its own (the path's rooms have MCP
// servers, which take the cold path).
func claimPooled(r *pathRun) {
	t := r.t
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	dir := filepath.Join(r.dir, "pooled")
	db, err := store.Open(ctx, filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	cust, err := custody.New(custody.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cust.Close()
	cf, err := confine.New(confine.Options{Mode: confine.ModeLandlock, Net: []uint16{}, Ports: []uint16{r.simPort()}, Tools: r.in.Dir})
	if err != nil {
		t.Fatal(err)
	}
	cfg := room.Config{Agent: string(r.p.kind), ApprovalMode: room.ApprovalYolo}
	var m *room.Manager
	acpPath := r.p.transport == "acp"
	shell := r.p.shell
	var tr interface {
		room.Transport
		StartPool() error
		PoolWait(context.Context, int) error
		Close() error
	}
	if acpPath {
		if r.p.kind == agents.Codex {
			// A yolo room's codex refuses a call asking for escalation.
			shell = shellCmd("exec_command", "cmd", nil)
		}
		tr, err = acpagent.New(acpagent.Options{Custodian: cust, Install: r.in, ModelURL: r.sim.URL(), Confine: cf,
			Pool: &acpagent.PoolOptions{Size: 1, Config: cfg, Rooms: filepath.Join(dir, "rooms"), Workspaces: filepath.Join(dir, "ws")}})
	} else {
		tr, err = rpcagent.New(rpcagent.Options{Custodian: cust, Install: r.in, ModelURL: r.sim.URL(), Confine: cf,
			Pool: &rpcagent.PoolOptions{Size: 1, Config: cfg, Rooms: filepath.Join(dir, "rooms"), Workspaces: filepath.Join(dir, "ws"),
				Tools: func() []room.Tool { return m.ToolDefs() }}})
	}
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	m, err = room.New(room.Options{Store: roomsqlite.New(db), Transport: tr, Root: filepath.Join(dir, "rooms"),
		Workspaces: filepath.Join(dir, "ws"), Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = m.Close()
		wctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_ = m.Wait(wctx)
	}()
	if err := tr.StartPool(); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var session string
	for i, text := range []string{"remember marker-pool " + shell("pwd > where.txt"), "again " + shell("cat where.txt")} {
		if err := tr.PoolWait(ctx, 1); err != nil {
			t.Fatal(err)
		}
		acc, err := m.Submit(ctx, "pooled", room.Message{Text: text, Sender: "ann"})
		if err != nil {
			t.Fatal(err)
		}
		var started, ended map[string]any
		for after := acc.Seq; ended == nil; {
			evs, err := db.Events(ctx, "pooled", after, 100)
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range evs {
				after = ev.Seq
				switch ev.Type {
				case "agent.started":
					started = decode(ev.Data)
				case "turn.ended":
					ended = decode(ev.Data)
				}
			}
			if ended == nil && len(evs) == 0 {
				watch, stop := db.Watch("pooled")
				if more, _ := db.Events(ctx, "pooled", after, 1); len(more) == 0 {
					select {
					case <-watch:
					case <-ctx.Done():
						stop()
						t.Fatalf("turn %d did not end", i)
					}
				}
				stop()
			}
		}
		// Over acp a woken room starts cold.
		if (started["pooled"] == true) != (i == 0 || !acpPath) || (i == 1) != (started["resumed"] == true) {
			t.Fatalf("turn %d: agent.started %v", i, started)
		}
		if ended["outcome"] != room.OutcomeSettled {
			t.Fatalf("turn %d ended %v", i, ended)
		}
		if i == 1 && started["session_id"] != session {
			t.Fatalf("woken: session %v, was %s", started["session_id"], session)
		}
		session, _ = started["session_id"].(string)
		if err := m.Release(ctx, "pooled"); err != nil {
			t.Fatal(err)
		}
	}
	ws, _ := filepath.Glob(filepath.Join(dir, "ws", "pooled-*"))
	if len(ws) != 1 {
		t.Fatalf("the room's workspace: %v", ws)
	}
	if b, err := os.ReadFile(filepath.Join(ws[0], "where.txt")); err != nil || strings.TrimSpace(string(b)) != ws[0] {
		t.Fatalf("the tool ran in %q (%v), not the room's workspace %s", b, err, ws[0])
	}
	// The woken room's turn carried the first turn to the model.
	reqs := r.sim.Requests()
	seen := false
	for _, msg := range reqs[len(reqs)-1].Messages {
		seen = seen || strings.Contains(msg.Content, "marker-pool")
	}
	if !seen {
		t.Fatal("the woken room's turn lacks the first turn")
	}
	if slots, _ := filepath.Glob(filepath.Join(dir, "ws", ".pool", "*")); len(slots) > 1 {
		t.Fatalf("slots left: %v", slots)
	}
}

func decode(raw json.RawMessage) map[string]any {
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return m
}
