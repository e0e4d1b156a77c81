package rpcagent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/roomtest"
	"github.com/agenthost/agenthost/internal/slotpool"
	"github.com/agenthost/agenthost/internal/slotpool/pooltest"
	"github.com/agenthost/agenthost/internal/warmpool"
	"github.com/agenthost/agenthost/room"
)

// poolUIDs is the agents' uid range of the pool tests as root (a range of
// the tests' own, clear of serve's default).
var poolUIDs = confine.UIDRange{First: 3_200_000, Last: 3_200_019}

// startPoolHostUID is startPoolHost as root with agent uids: each room's
// and each slot's agent runs as a uid of its own.
func startPoolHostUID(t *testing.T, dir string, sim *modelsim.Server, cfg room.Config, size int, fault func(string) error) *poolHost {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("agents run as uids of their own only when the server runs as root")
	}
	return startPool(t, dir, sim, cfg, size, fault, poolUIDs)
}

// testPooledUID: as root, a pool agent runs as a uid of its own; a new
// room bound to it gets that uid (its record, its files: the tool's file
// is the uid's), and when it wakes and is bound to the next pool agent
// its files and record become that one's uid (the earlier uid held by
// nothing); before its bind the next agent cannot read the room; the
// bound agent cannot read another room or the store.
func testPooledUID(t *testing.T, agent string) {
	cfg := room.Config{Agent: agent, ApprovalMode: room.ApprovalYolo}
	ph := startPoolHostUID(t, "", nil, cfg, 1, nil)
	ph.ready(t, 1)
	first := ph.idleSlot(t)
	u1, _ := pooltest.UIDOf(t, first.Dir)
	if u1 < poolUIDs.First || u1 > poolUIDs.Last {
		t.Fatalf("the slot's uid %d is not of the range %s", u1, poolUIDs)
	}
	if got := pooltest.FileUID(t, first.WS); got != u1 {
		t.Fatalf("the slot's workspace is uid %d's, its agent's is %d", got, u1)
	}

	// A new room: pooled; its tool writes and reads in the workspace as
	// the slot's uid, which is now the room's.
	acc := ph.Submit("a", "remember marker-U "+roomtest.BashCall("pwd && echo made > made.txt && ln made.txt made.hard && cat made.txt && id -u"))
	if st := ph.started(t, "a", acc); st["pooled"] != true {
		ps, _ := ph.tr.PoolStats()
		t.Fatalf("new room: agent.started %v (pool %+v)", st, ps)
	}
	_, tool := ph.Wait("a", acc.Seq, "tool.ended", nil)
	ph.Settled("a", acc)
	ws := pooltest.RoomWorkspace(t, ph.Root, "a")
	roomDir := filepath.Dir(ws)
	out, _ := tool["output"].(string)
	if !strings.Contains(out, ws) || !strings.Contains(out, "made") || !strings.Contains(out, strconv.Itoa(u1)) {
		t.Fatalf("the tool's output %q: want the room's workspace %s, made, uid %d", out, ws, u1)
	}
	if got := pooltest.FileUID(t, filepath.Join(ws, "made.txt")); got != u1 {
		t.Fatalf("made.txt is uid %d's, the agent's is %d", got, u1)
	}
	if got, owned := pooltest.UIDOf(t, roomDir); got != u1 || !owned {
		t.Fatalf("the room's record: uid %d (owned %v), want %d", got, owned, u1)
	}
	if h := pooltest.Holders(t, ph.Root, u1); len(h) != 1 || h[0] != roomDir {
		t.Fatalf("uid %d is held by %v, want only the room", u1, h)
	}
	pooltest.TreeOwnedBy(t, u1, ws, filepath.Join(roomDir, "home"))
	if err := ph.M.Release(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}

	// The next slot: another uid; before its bind it cannot read room a.
	ph.ready(t, 1)
	next := ph.idleSlot(t)
	u2, _ := pooltest.UIDOf(t, next.Dir)
	if u2 == u1 || u2 < poolUIDs.First || u2 > poolUIDs.Last {
		t.Fatalf("the next slot's uid %d (the room's %d)", u2, u1)
	}
	if out := ph.slotRun(t, next, "cat "+filepath.Join(ws, "made.txt")+" >/dev/null 2>&1; echo rc=$?"); !strings.Contains(out, "rc=1") {
		t.Fatalf("a slot's agent read the room before its bind: %q", out)
	}

	// Room a wakes: pooled, resumed; its files are now the new uid's.
	again := ph.Submit("a", "what did I say? "+roomtest.BashCall("cat made.txt && echo again > again.txt && cat again.txt && id -u"))
	if st := ph.started(t, "a", again); st["pooled"] != true || st["resumed"] != true {
		t.Fatalf("woken room: agent.started %v", st)
	}
	_, tool = ph.Wait("a", again.Seq, "tool.ended", nil)
	ph.Settled("a", again)
	if out, _ := tool["output"].(string); !strings.Contains(out, "made") || !strings.Contains(out, "again") || !strings.Contains(out, strconv.Itoa(u2)) {
		t.Fatalf("the woken room's tool: %q (want made, again, uid %d)", out, u2)
	}
	if !ph.ModelSaw("marker-U") {
		t.Fatal("the woken room's session lacks the earlier turn")
	}
	if got := pooltest.FileUID(t, filepath.Join(ws, "again.txt")); got != u2 {
		t.Fatalf("again.txt is uid %d's, the agent's is %d", got, u2)
	}
	// A file of two names the room's earlier uid made is given too (that
	// uid is freed).
	if got := pooltest.FileUID(t, filepath.Join(ws, "made.txt")); got != u2 {
		t.Fatalf("made.txt (two names, uid %d's before) is uid %d's, the room's is %d", u1, got, u2)
	}
	if got, owned := pooltest.UIDOf(t, roomDir); got != u2 || !owned {
		t.Fatalf("the woken room's record: uid %d (owned %v), want %d", got, owned, u2)
	}
	if h := pooltest.Holders(t, ph.Root, u2); len(h) != 1 || h[0] != roomDir {
		t.Fatalf("uid %d is held by %v, want only the room", u2, h)
	}
	if h := pooltest.Holders(t, ph.Root, u1); len(h) != 0 {
		t.Fatalf("the room's earlier uid %d is still held by %v", u1, h)
	}
	pooltest.TreeOwnedBy(t, u2, ws, filepath.Join(roomDir, "home"))

	// The bound agent's confinement: another room's file and the store
	// are out of reach; its own workspace is not.
	pooltest.WriteProbe(t, ph.Root, ws)
	ph.Settled("a", ph.Submit("a", "Probe: "+roomtest.BashCall("bash "+roomtest.ProbeScript)))
	roomtest.CheckConfined(t, roomtest.ProbeResults(ph.Sim), true)
	if st, _ := ph.tr.PoolStats(); st.Hits != 2 {
		t.Fatalf("pool stats: %+v", st)
	}
}

func TestRealPiPoolUID(t *testing.T)  { testPooledUID(t, "pi") }
func TestRealOMPPoolUID(t *testing.T) { testPooledUID(t, "omp") }

// A bind as root stopped at each step (as a crash of the server there
// would leave it) leaves the woken room whole and its uid consistent once
// the next server recovered it: its files are all the uid its record
// names, which no other room or slot holds, and its next turn writes as
// that uid.
func TestRealPiPoolUIDBindFault(t *testing.T) {
	steps := append(append([]string{}, warmpool.Steps...), UIDSteps...)
	for _, stop := range steps {
		t.Run(stop, func(t *testing.T) {
			ph, dir, ws := stopWokenBind(t, stop, startPoolHostUID)
			roomDir := filepath.Dir(ws)
			if b, err := os.ReadFile(filepath.Join(ws, "src", "kept.txt")); err != nil || string(b) != "kept\n" {
				t.Fatalf("the room's file after the recovery: %q, %v", b, err)
			}
			uid, owned := pooltest.UIDOf(t, roomDir)
			if uid == 0 || !owned {
				t.Fatalf("the room's record after the recovery: uid %d, owned %v", uid, owned)
			}
			pooltest.TreeOwnedBy(t, uid, ws, filepath.Join(roomDir, "home"), filepath.Join(roomDir, "tmp"))
			if h := pooltest.Holders(t, ph.Root, uid); len(h) != 1 || h[0] != roomDir {
				t.Fatalf("uid %d is held by %v, want only the room", uid, h)
			}
			left, _ := filepath.Glob(filepath.Join(dir, "rooms", slotpool.Dir, "*", "*.journal"))
			if len(left) != 0 {
				t.Fatalf("journals left: %v", left)
			}
			next := ph.Submit("r", "what did I say? "+roomtest.BashCall("cat src/kept.txt && echo more > more.txt"))
			_, tool := ph.Wait("r", next.Seq, "tool.ended", nil)
			ph.Settled("r", next)
			if out, _ := tool["output"].(string); !strings.Contains(out, "kept") {
				t.Fatalf("after the recovery: %q", out)
			}
			uid, _ = pooltest.UIDOf(t, roomDir)
			if got := pooltest.FileUID(t, filepath.Join(ws, "more.txt")); got != uid {
				t.Fatalf("more.txt is uid %d's, the room's record names %d", got, uid)
			}
			if h := pooltest.Holders(t, ph.Root, uid); len(h) != 1 || h[0] != roomDir {
				t.Fatalf("uid %d is held by %v, want only the room", uid, h)
			}
		})
	}
}

// Two new rooms bind at once to a pool of two, as root: each gets a pool
// agent, and their uids differ (each held by its room alone).
func TestRealPiPoolUIDRace(t *testing.T) {
	ph := startPoolHostUID(t, "", nil, room.Config{Agent: "pi", ApprovalMode: room.ApprovalYolo}, 2, nil)
	ph.ready(t, 2)
	var wg sync.WaitGroup
	ids := []string{"x", "y"}
	pooled := make([]bool, 2)
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			acc := ph.Submit(id, roomtest.BashCall("echo "+id+" > mine.txt && id -u"))
			pooled[i] = ph.started(t, id, acc)["pooled"] == true
			ph.Settled(id, acc)
		}()
	}
	wg.Wait()
	if !pooled[0] || !pooled[1] {
		t.Fatalf("pooled: %v, want both", pooled)
	}
	seen := map[int]string{}
	for _, id := range ids {
		ws := pooltest.RoomWorkspace(t, ph.Root, id)
		uid, _ := pooltest.UIDOf(t, filepath.Dir(ws))
		if other, dup := seen[uid]; dup || uid == 0 {
			t.Fatalf("rooms %s and %s hold uid %d", other, id, uid)
		}
		seen[uid] = id
		if got := pooltest.FileUID(t, filepath.Join(ws, "mine.txt")); got != uid {
			t.Fatalf("room %s's file is uid %d's, its record names %d", id, got, uid)
		}
		if h := pooltest.Holders(t, ph.Root, uid); len(h) != 1 {
			t.Fatalf("uid %d is held by %v", uid, h)
		}
	}
}

// As root, a woken room with more files than a bind gives to another uid
// (maxOwnEntries) starts cold (MissLarge), keeping its uid: its agent
// runs as the uid its record names, and the pool's agent stays idle.
func TestRealPiPoolUIDLargeRoom(t *testing.T) {
	ph := startPoolHostUID(t, "", nil, room.Config{Agent: "pi", ApprovalMode: room.ApprovalYolo}, 1, nil)
	ph.ready(t, 1)
	ph.Settled("big", ph.Submit("big", roomtest.BashCall("echo one > one.txt")))
	ws := pooltest.RoomWorkspace(t, ph.Root, "big")
	uid, _ := pooltest.UIDOf(t, filepath.Dir(ws))
	if err := ph.M.Release(t.Context(), "big"); err != nil {
		t.Fatal(err)
	}
	for i := range maxOwnEntries / 1000 {
		d := filepath.Join(ws, "many", strconv.Itoa(i))
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		for j := range 1000 {
			if err := os.WriteFile(filepath.Join(d, strconv.Itoa(j)), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := confine.GiveTree(&confine.User{UID: uid, GID: uid}, -1, filepath.Join(ws, "many")); err != nil {
		t.Fatal(err)
	}
	ph.ready(t, 1)
	acc := ph.Submit("big", roomtest.BashCall("echo two > two.txt"))
	if st := ph.started(t, "big", acc); st["pooled"] == true {
		t.Fatalf("a room of more than %d entries was bound: %v", maxOwnEntries, st)
	}
	ph.Settled("big", acc)
	if st, _ := ph.tr.PoolStats(); st.Misses[MissLarge] != 1 || st.Idle != 1 {
		t.Fatalf("pool stats: %+v", st)
	}
	if got, _ := pooltest.UIDOf(t, filepath.Dir(ws)); got != uid {
		t.Fatalf("the room's uid changed from %d to %d on a cold start", uid, got)
	}
	if got := pooltest.FileUID(t, filepath.Join(ws, "two.txt")); got != uid {
		t.Fatalf("two.txt is uid %d's, the room's is %d", got, uid)
	}
}
