//go:build linux

package acpagent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/roomtest"
	"github.com/agenthost/agenthost/internal/slotpool"
	"github.com/agenthost/agenthost/internal/slotpool/pooltest"
	"github.com/agenthost/agenthost/internal/slotuid"
	"github.com/agenthost/agenthost/internal/warmpool"
	"github.com/agenthost/agenthost/room"
)

// poolUIDs is the agents' uid range of these tests as root (clear of
// serve's default and of rpcagent's tests' range).
var poolUIDs = confine.UIDRange{First: 3_200_100, Last: 3_200_119}

// startPoolHostUID is startPool as root with agent uids: each room's and
// each slot's agent runs as a uid of its own.
func startPoolHostUID(t *testing.T, dir string, sim *modelsim.Server, cfg room.Config, size int, fault func(string) error) *poolHost {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("agents run as uids of their own only when the server runs as root")
	}
	return startPool(t, dir, sim, cfg, size, fault, poolUIDs)
}

// TestRealCodexPoolUID: as root with agent uids, a codex pool agent runs
// as a uid of its own; a new room bound to it gets that uid (its record
// names it, its tool's file in the room's workspace is its, no other room
// or slot holds it) and is confined as a cold agent (the probe); before
// its bind the next slot's agent (another uid) cannot read the room; the
// room, woken, starts cold as the same uid and resumes its conversation.
func TestRealCodexPoolUID(t *testing.T) {
	cfg := room.Config{Agent: string(agents.Codex), ApprovalMode: room.ApprovalYolo}
	ph := startPoolHostUID(t, "", nil, cfg, 1, nil)
	first := ph.ready(t, 1)
	u1, _ := pooltest.UIDOf(t, first.Dir)
	if u1 < poolUIDs.First || u1 > poolUIDs.Last {
		t.Fatalf("the slot's uid %d is not of the range %s", u1, poolUIDs)
	}

	acc := ph.Submit("a", "remember marker-V "+codexShell("pwd > where.txt && id -u >> where.txt"))
	if st := ph.started(t, "a", acc); st["pooled"] != true {
		ps, _ := ph.tr.PoolStats()
		t.Fatalf("new room: agent.started %v (pool %+v)", st, ps)
	}
	ph.Settled("a", acc)
	ws := pooltest.RoomWorkspace(t, ph.Root, "a")
	roomDir := filepath.Dir(ws)
	b, err := os.ReadFile(filepath.Join(ws, "where.txt"))
	if err != nil || !strings.HasPrefix(string(b), ws+"\n") || !strings.Contains(string(b), "\n"+strconv.Itoa(u1)+"\n") {
		t.Fatalf("the tool wrote %q (%v): want the room's workspace %s and uid %d", b, err, ws, u1)
	}
	if got := pooltest.FileUID(t, filepath.Join(ws, "where.txt")); got != u1 {
		t.Fatalf("where.txt is uid %d's, the slot's agent's is %d", got, u1)
	}
	if got, owned := pooltest.UIDOf(t, roomDir); got != u1 || !owned {
		t.Fatalf("the room's record: uid %d (owned %v), want %d", got, owned, u1)
	}
	if h := pooltest.Holders(t, ph.Root, u1); len(h) != 1 || h[0] != roomDir {
		t.Fatalf("uid %d is held by %v, want only the room", u1, h)
	}
	pooltest.TreeOwnedBy(t, u1, ws, filepath.Join(roomDir, "home"))
	if left, _ := filepath.Glob(filepath.Join(ph.Root, slotpool.Dir, "*", "*.journal")); len(left) != 0 {
		t.Fatalf("journals left after the bind: %v", left)
	}

	// The bound agent is confined as a cold one.
	pooltest.WriteProbe(t, ph.Root, ws)
	ph.Settled("a", ph.Submit("a", "Probe: "+codexShell("bash "+roomtest.ProbeScript)))
	roomtest.CheckConfined(t, roomtest.ProbeResults(ph.Sim), true)
	if err := ph.M.Release(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}

	// The next slot: another uid; before its bind its agent cannot read
	// room a.
	next := ph.ready(t, 1)
	u2, _ := pooltest.UIDOf(t, next.Dir)
	if u2 == u1 || u2 < poolUIDs.First || u2 > poolUIDs.Last {
		t.Fatalf("the next slot's uid %d (the room's %d)", u2, u1)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sess, err := next.Agent.c.NewSession(ctx, next.WS, nil)
	if err != nil {
		t.Fatal(err)
	}
	cmd := "cat " + filepath.Join(ws, "where.txt") + " >/dev/null 2>&1; echo a=$? > probe.txt; id -u >> probe.txt"
	if _, err := next.Agent.c.Prompt(ctx, sess.ID, codexShell(cmd)); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(next.WS, "probe.txt")
	if b, err := os.ReadFile(out); err != nil || !strings.Contains(string(b), "a=1") || !strings.Contains(string(b), strconv.Itoa(u2)) {
		t.Fatalf("a slot's agent before its bind read the room (or is not uid %d): %q, %v", u2, b, err)
	}
	if err := os.Remove(out); err != nil {
		t.Fatal(err)
	}

	// Room a wakes: the cold path, as the uid its record names, with its
	// conversation.
	// Its agent follows the link of its slot's home name, but can
	// neither list nor change that folder.
	link := first.Dir
	check := "id -u > again.txt\nls " + link + " >/dev/null 2>&1; echo ls=$? > link.txt\nrm -f " + link + "/home 2>/dev/null; echo rm=$? >> link.txt\ntouch " + link + "/x 2>/dev/null; echo touch=$? >> link.txt\n"
	if err := os.WriteFile(filepath.Join(ws, "check.sh"), []byte(check), 0o644); err != nil {
		t.Fatal(err)
	}
	again := ph.Submit("a", "what did I say? "+codexShell("bash check.sh"))
	if st := ph.started(t, "a", again); st["pooled"] == true || st["resumed"] != true {
		t.Fatalf("woken room: agent.started %v", st)
	}
	ph.Settled("a", again)
	if !ph.ModelSaw("marker-V") {
		t.Fatal("the woken room's session lacks the earlier turn")
	}
	if b, err := os.ReadFile(filepath.Join(ws, "link.txt")); err != nil || string(b) != "ls=2\nrm=1\ntouch=1\n" {
		t.Fatalf("the woken agent on its slot's home link's folder: %q, %v (want ls, rm and touch refused)", b, err)
	}
	if got := pooltest.FileUID(t, filepath.Join(ws, "again.txt")); got != u1 {
		t.Fatalf("again.txt is uid %d's, the room's is %d", got, u1)
	}
	if st, _ := ph.tr.PoolStats(); st.Hits != 1 || st.Misses[MissResume] != 1 {
		t.Fatalf("pool stats: %+v", st)
	}
}

// A new room's bind as root stopped at each step (as a crash of the
// server there would leave it): once the next server recovered it, the
// room's files are all the uid its record names, which no other room or
// slot holds, no journal is left, and its next turn writes as that uid.
func TestRealCodexPoolUIDBindFault(t *testing.T) {
	steps := append(append([]string{}, slotuid.Steps[:1]...), warmpool.Steps...)
	steps = append(steps, slotuid.Steps[1:]...)
	for _, stop := range steps {
		t.Run(stop, func(t *testing.T) {
			dir := t.TempDir()
			sim := roomtest.StartSim(t)
			var armed atomic.Bool
			armed.Store(true)
			fault := func(step string) error {
				if armed.Load() && step == stop {
					return errors.New("crash")
				}
				return nil
			}
			cfg := room.Config{Agent: string(agents.Codex), ApprovalMode: room.ApprovalYolo}
			ph := startPoolHostUID(t, dir, sim, cfg, 1, fault)
			ph.ready(t, 1)
			failed := ph.Submit("r", "[[say:never]]")
			if d := ph.Ended("r", failed); d["outcome"] != room.OutcomeFailed {
				t.Fatalf("the stopped bind's turn: %v", d)
			}
			ph.Close()
			// The first server is gone before the next starts (as after a
			// crash): its pool no longer boots a replacement slot into the
			// folder the next start clears.
			ph.tr.Close()

			armed.Store(false)
			ph = startPoolHostUID(t, dir, sim, cfg, 1, fault)
			ws := pooltest.RoomWorkspace(t, ph.Root, "r")
			roomDir := filepath.Dir(ws)
			if left, _ := filepath.Glob(filepath.Join(dir, "rooms", slotpool.Dir, "*", "*.journal")); len(left) != 0 {
				t.Fatalf("journals left: %v", left)
			}
			// Past the uid journal's write the recovery gives the room's
			// folders to the uid its record names (allocated if none).
			if uid, owned := pooltest.UIDOf(t, roomDir); uid != 0 || stop != slotuid.StepJournal {
				if uid == 0 || !owned {
					t.Fatalf("the room's record after the recovery: uid %d, not owned", uid)
				}
				pooltest.TreeOwnedBy(t, uid, ws, filepath.Join(roomDir, "home"), filepath.Join(roomDir, "tmp"))
				if h := pooltest.Holders(t, ph.Root, uid); len(h) != 1 || h[0] != roomDir {
					t.Fatalf("uid %d is held by %v, want only the room", uid, h)
				}
			}
			ph.ready(t, 1)
			next := ph.Submit("r", codexShell("echo more > more.txt"))
			ph.Settled("r", next)
			uid, owned := pooltest.UIDOf(t, roomDir)
			if uid == 0 || !owned {
				t.Fatalf("the room's record after its next turn: uid %d, owned %v", uid, owned)
			}
			if got := pooltest.FileUID(t, filepath.Join(ws, "more.txt")); got != uid {
				t.Fatalf("more.txt is uid %d's, the room's record names %d", got, uid)
			}
			pooltest.TreeOwnedBy(t, uid, ws, filepath.Join(roomDir, "home"))
			if h := pooltest.Holders(t, ph.Root, uid); len(h) != 1 || h[0] != roomDir {
				t.Fatalf("uid %d is held by %v, want only the room", uid, h)
			}
		})
	}
}

// Two new rooms race for a pool of two, as root with agent uids: each is
// bound to a pool agent, and their uids differ, each held by its room
// alone; both turns write in their own workspaces as their own uids.
func TestRealCodexPoolUIDRace(t *testing.T) {
	ph := startPoolHostUID(t, "", nil, room.Config{Agent: string(agents.Codex), ApprovalMode: room.ApprovalYolo}, 2, nil)
	ph.ready(t, 2)
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
	if !pooled[0] || !pooled[1] {
		t.Fatalf("pooled: %v, want both", pooled)
	}
	uids := map[int]bool{}
	for _, id := range []string{"x", "y"} {
		ws := pooltest.RoomWorkspace(t, ph.Root, id)
		uid, owned := pooltest.UIDOf(t, filepath.Dir(ws))
		if uid == 0 || !owned || uids[uid] {
			t.Fatalf("room %s's record: uid %d (owned %v); the other's: %v", id, uid, owned, uids)
		}
		uids[uid] = true
		if h := pooltest.Holders(t, ph.Root, uid); len(h) != 1 || h[0] != filepath.Dir(ws) {
			t.Fatalf("uid %d is held by %v, want only room %s", uid, h, id)
		}
		if got := pooltest.FileUID(t, filepath.Join(ws, "where.txt")); got != uid {
			t.Fatalf("room %s's where.txt is uid %d's, its record names %d", id, got, uid)
		}
	}
}
