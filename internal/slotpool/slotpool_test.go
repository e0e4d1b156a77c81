package slotpool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/warmpool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The pool's bookkeeping is tested here with agents that are Go values
// (the transports' tests drive it with the real agents).

// fakeAgent is a pool agent: End ends it, exit ends it by itself.
type fakeAgent struct {
	done  chan struct{}
	once  sync.Once
	ended atomic.Bool // End was called
}

func (a *fakeAgent) Done() <-chan struct{} { return a.done }
func (a *fakeAgent) End()                  { a.ended.Store(true); a.exit() }
func (a *fakeAgent) exit()                 { a.once.Do(func() { close(a.done) }) }

var errUnsupported = errors.New("test: the warm pool cannot run here")

type testPool struct {
	*Pool[*fakeAgent]
	rooms string
	fail  atomic.Pointer[error] // Boot's error, if set
	mu    sync.Mutex
	boots []*fakeAgent
}

func newTestPool(t *testing.T, size int, places func() (int, int)) *testPool {
	t.Helper()
	tp := &testPool{rooms: filepath.Join(t.TempDir(), "rooms")}
	p, err := New(Config[*fakeAgent]{Name: "test", Size: size, Rooms: tp.rooms, Places: places, StartTimeout: time.Minute,
		Unsupported: errUnsupported, Boot: func(ctx context.Context, s *Slot[*fakeAgent]) (*fakeAgent, error) {
			for _, d := range []string{s.Dir, s.WS, s.Home} {
				if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
					t.Errorf("a slot's folder before its boot: %v", err)
				}
			}
			if err := tp.fail.Load(); err != nil {
				return nil, *err
			}
			a := &fakeAgent{done: make(chan struct{})}
			tp.mu.Lock()
			tp.boots = append(tp.boots, a)
			tp.mu.Unlock()
			return a, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	tp.Pool = p
	t.Cleanup(p.Close)
	return tp
}

func (tp *testPool) start(t *testing.T) {
	t.Helper()
	if err := tp.Start(); err != nil {
		t.Fatal(err)
	}
}

func (tp *testPool) wait(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := tp.Wait(ctx, n); err != nil {
		t.Fatalf("waiting for %d idle agents: %v", n, err)
	}
}

// slots are the slot folders under the pool's folder.
func (tp *testPool) slots(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(tp.rooms, Dir))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func gone(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left: %v", p, err)
		}
	}
}

func TestNewWithoutRoomsIsUnsupported(t *testing.T) {
	_, err := New(Config[*fakeAgent]{Name: "test", Size: 1, Unsupported: errUnsupported})
	if !errors.Is(err, errUnsupported) {
		t.Fatalf("New without rooms: %v", err)
	}
}

// The pool fills to its size; a take hands out the first idle slot (its
// agent running, its folders there), counts a hit with its bind time,
// and the pool starts a replacement.
func TestFillTakeRefill(t *testing.T) {
	tp := newTestPool(t, 2, nil)
	tp.start(t)
	tp.wait(t, 2)
	if st := tp.Stats(); st.Size != 2 || st.Idle != 2 || st.Booting != 0 || st.LastErr != "" || tp.Held() != 2 {
		t.Fatalf("a full pool: %+v, held %d", st, tp.Held())
	}
	idle, _ := tp.Idle()
	s, stale := tp.Pop(nil)
	if s != idle[0] || stale != 0 {
		t.Fatalf("Pop: %v (stale %d), want the first idle slot %v", s, stale, idle[0])
	}
	if s.Agent.ended.Load() {
		t.Fatal("the taken slot's agent was ended")
	}
	if filepath.Dir(s.Dir) != filepath.Join(tp.rooms, Dir) || s.ID != filepath.Base(s.Dir) || !tp.IsSlot(s.Dir) {
		t.Fatalf("the slot's folder %s (id %s)", s.Dir, s.ID)
	}
	tp.Hit(1500 * time.Millisecond)
	tp.wait(t, 2)
	st := tp.Stats()
	if st.Hits != 1 || len(st.BindSeconds) != 1 || st.BindSeconds[0] != 1.5 || st.Idle != 2 {
		t.Fatalf("after a take: %+v", st)
	}
	// The bound slot's folders are the room's to remove (Cleanup).
	s.Agent.End()
	s.Cleanup()
	gone(t, s.Dir, s.WS)
	if got := tp.slots(t); len(got) != 2 {
		t.Fatalf("slots %v: want the two idle ones", got)
	}
}

// Pop passes over the slots that do not fit (and discards them: agent
// ended, folders removed), counting them.
func TestPopDiscardsUnfit(t *testing.T) {
	tp := newTestPool(t, 2, nil)
	tp.start(t)
	tp.wait(t, 2)
	idle, _ := tp.Idle()
	s, stale := tp.Pop(func(a *fakeAgent) bool { return a == idle[1].Agent })
	if s != idle[1] || stale != 1 {
		t.Fatalf("Pop: %v (stale %d), want the second slot and one passed over", s, stale)
	}
	if !idle[0].Agent.ended.Load() {
		t.Fatal("the passed-over slot's agent runs on")
	}
	gone(t, idle[0].Dir, idle[0].WS)
	s, stale = tp.Pop(func(*fakeAgent) bool { return false })
	if s != nil || stale != 0 {
		t.Fatalf("Pop of an empty pool: %v, %d", s, stale)
	}
}

// An idle agent that ends by itself is removed (its folders too) and
// replaced.
func TestWatchReplacesAnEndedAgent(t *testing.T) {
	tp := newTestPool(t, 1, nil)
	tp.start(t)
	tp.wait(t, 1)
	idle, _ := tp.Idle()
	dead := idle[0]
	dead.Agent.exit()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for {
		idle, changed := tp.Idle()
		if len(idle) == 1 && idle[0] != dead {
			break
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatal("the ended agent was not replaced")
		}
	}
	gone(t, dead.Dir, dead.WS)
}

// A boot that fails is what Wait returns and LastErr says; its folders
// are removed.
func TestBootFailure(t *testing.T) {
	tp := newTestPool(t, 1, nil)
	boom := errors.New("boom")
	tp.fail.Store(&boom)
	tp.start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	err := tp.Wait(ctx, 1)
	if err == nil || err.Error() != "test: the pool's agent did not start: boom" {
		t.Fatalf("Wait: %v", err)
	}
	if st := tp.Stats(); st.LastErr != "boom" || st.Idle != 0 {
		t.Fatalf("after a failed boot: %+v", st)
	}
	tp.Close() // joins the refill: the failed boot's folders are removed
	if got := tp.slots(t); len(got) != 0 {
		t.Fatalf("slots left by a failed boot: %v", got)
	}
}

// The pool's agents count against the places: a miss while they pass
// them ends idle agents, and the pool boots none while every place is
// taken.
func TestPlaces(t *testing.T) {
	var resident atomic.Int64
	tp := newTestPool(t, 2, func() (int, int) { return int(resident.Load()), 2 })
	tp.start(t)
	tp.wait(t, 2)
	resident.Store(1)
	tp.Miss("settings")
	st := tp.Stats()
	if st.Idle != 1 || st.Misses["settings"] != 1 {
		t.Fatalf("a miss with one place short: %+v", st)
	}
	tp.mu.Lock()
	evicted := tp.boots[1] // the last idle one goes first
	tp.mu.Unlock()
	if !evicted.ended.Load() {
		t.Fatal("the evicted agent runs on")
	}
	tp.Signal()
	if h := tp.Held(); h != 1 {
		t.Fatalf("the pool holds %d agents with one place for it", h)
	}
	resident.Store(0)
	tp.wait(t, 2)
}

// A bind stopped by its fault hook ends the agent and leaves the folders
// for the recovery; another failure discards the slot and counts a miss.
func TestFailed(t *testing.T) {
	tp := newTestPool(t, 2, nil)
	tp.start(t)
	tp.wait(t, 2)
	s, _ := tp.Pop(nil)
	fault := fmt.Errorf("%w: %s: crash", warmpool.ErrFault, warmpool.StepMoveWS)
	if ok, err := tp.Failed(s, "r", fault); !ok || !errors.Is(err, warmpool.ErrFault) {
		t.Fatalf("Failed(fault): %v, %v", ok, err)
	}
	if !s.Agent.ended.Load() {
		t.Fatal("the stopped bind's agent runs on")
	}
	if _, err := os.Stat(s.Dir); err != nil {
		t.Fatalf("the stopped bind's slot folder: %v", err)
	}
	s, _ = tp.Pop(nil)
	if ok, err := tp.Failed(s, "r", errors.New("refused")); ok || err != nil {
		t.Fatalf("Failed: %v, %v", ok, err)
	}
	gone(t, s.Dir, s.WS)
	if st := tp.Stats(); st.Misses[MissBindFailed] != 1 || st.Hits != 0 {
		t.Fatalf("after a failed bind: %+v", st)
	}
}

// Start removes the last server's slots; Close ends the idle agents and
// removes their slots, and may be called again.
func TestStartClearsCloseEnds(t *testing.T) {
	tp := newTestPool(t, 2, nil)
	old := filepath.Join(tp.rooms, Dir, "0123456789abcdef")
	if err := os.MkdirAll(filepath.Join(old, "home"), 0o700); err != nil {
		t.Fatal(err)
	}
	tp.start(t)
	gone(t, old)
	tp.wait(t, 2)
	tp.Close()
	tp.Close()
	tp.mu.Lock()
	defer tp.mu.Unlock()
	for i, a := range tp.boots {
		if !a.ended.Load() {
			t.Errorf("agent %d runs on after Close", i)
		}
	}
	if got := tp.slots(t); len(got) != 0 {
		t.Fatalf("slots left after Close: %v", got)
	}
}

// A bound slot's plan makes the room's paths absolute (its TMPDIR beside
// its home), and Link points the slot's paths at them.
func TestPlanAndLink(t *testing.T) {
	dir := t.TempDir()
	s := &Slot[*fakeAgent]{Dir: filepath.Join(dir, "slot"), WS: filepath.Join(dir, "slot", "workspace"), Home: filepath.Join(dir, "slot", "home"), Tmp: filepath.Join(dir, "slot", "tmp")}
	if err := os.Mkdir(s.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	plan, err := s.Plan("room/workspace", "room/home")
	if err != nil {
		t.Fatal(err)
	}
	want := warmpool.Plan{Workspace: warmpool.Pair{Slot: s.WS, Room: filepath.Join(dir, "room", "workspace")},
		Home: warmpool.Pair{Slot: s.Home, Room: filepath.Join(dir, "room", "home")}, Tmp: warmpool.Pair{Slot: s.Tmp, Room: filepath.Join(dir, "room", "tmp")}}
	if plan != want {
		t.Fatalf("plan %+v, want %+v", plan, want)
	}
	if err := s.Link(plan); err != nil {
		t.Fatal(err)
	}
	for _, pr := range []warmpool.Pair{plan.Workspace, plan.Home, plan.Tmp} {
		if to, err := os.Readlink(pr.Slot); err != nil || to != pr.Room {
			t.Fatalf("%s leads to %q (%v), want %s", pr.Slot, to, err, pr.Room)
		}
	}
	s.Cleanup()
	gone(t, s.Dir)
}

// A transport without a pool has the pool's methods, doing nothing.
func TestMethodsWithoutPool(t *testing.T) {
	var m Methods[*fakeAgent]
	if err := m.StartPool(); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.PoolStats(); ok {
		t.Fatal("stats without a pool")
	}
	if err := m.PoolWait(t.Context(), 1); err != nil || m.PoolHeld() != 0 {
		t.Fatalf("PoolWait %v, PoolHeld %d", err, m.PoolHeld())
	}
	m.PoolSignal()
}
