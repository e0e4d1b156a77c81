package room

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// waitFor polls cond (state another goroutine sets, with no event to wait
// on) until it holds, failing after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		time.Sleep(time.Millisecond) // polling state set by another goroutine
	}
}

// The door: shared entries pass together; an exclusive one waits for
// them, and while it waits no new shared entry passes (a purge is not
// starved by diffs); one that gives up (its context) lets them pass.
func TestDoorOrdersEntries(t *testing.T) {
	var d door
	ctx := t.Context()
	if err := d.enter(ctx, false); err != nil {
		t.Fatal(err)
	}
	if !d.tryEnter() {
		t.Fatal("a second shared entry was refused")
	}
	entered := make(chan error, 1)
	go func() { entered <- d.enter(ctx, true) }()
	waitFor(t, "the exclusive entry waits", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.waiting == 1
	})
	if d.tryEnter() {
		t.Fatal("a shared entry passed an exclusive one waiting")
	}
	d.leave(false)
	select {
	case err := <-entered:
		t.Fatalf("the exclusive entry passed a shared one inside: %v", err)
	default:
	}
	d.leave(false)
	if err := <-entered; err != nil {
		t.Fatal(err)
	}
	if d.tryEnter() {
		t.Fatal("a shared entry passed an exclusive one inside")
	}
	// A second exclusive entry gives up: shared ones it held back pass.
	cctx, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- d.enter(cctx, true) }()
	waitFor(t, "the second exclusive entry waits", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.waiting == 1
	})
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled entry: %v", err)
	}
	d.leave(true)
	if !d.tryEnter() {
		t.Fatal("the door stayed shut after everyone left")
	}
	d.leave(false)
}

// settings_race (review-api F3): concurrent SetSettings of two settings,
// one with a budget the room's totals reach, many rounds. After each, the
// settings stored, those GET /config shows and those the room applies (a
// message refused or taken) are the same: the last one stored.
func TestConcurrentSettingsLastWriterWins(t *testing.T) {
	h := newHarness(t, Options{})
	ctx := t.Context()
	x := Settings{Instructions: "x", Budget: Budget{Turns: 1}}
	y := Settings{Instructions: "y"}
	h.turnEnded("c", h.submit("c", "first"))
	rounds := 150
	if testing.Short() {
		rounds = 30
	}
	for i := range rounds {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for k := range 8 {
			s := x
			if (i+k)%2 == 1 {
				s = y
			}
			wg.Go(func() {
				<-start
				if _, err := h.m.SetSettings(ctx, "c", s); err != nil {
					t.Error(err)
				}
			})
		}
		close(start)
		wg.Wait()
		stored, _, err := h.m.loadSettings(ctx, "c")
		if err != nil {
			t.Fatal(err)
		}
		shown, err := h.m.EffectiveSettings(ctx, "c")
		if err != nil {
			t.Fatal(err)
		}
		r, _ := h.m.room("c")
		r.mu.Lock()
		inForce := r.settings
		r.mu.Unlock()
		if stored.Instructions != inForce.Instructions || shown.Instructions != stored.Instructions {
			t.Fatalf("round %d: stored %q, in force %q, shown %q", i, stored.Instructions, inForce.Instructions, shown.Instructions)
		}
		acc, err := h.m.Submit(ctx, "c", Message{Text: "probe"})
		switch stored.Instructions {
		case "x":
			if !errors.Is(err, ErrBudgetExhausted) {
				t.Fatalf("round %d: X stored (1 turn), the room took a message: %v", i, err)
			}
		default:
			if err != nil {
				t.Fatalf("round %d: Y stored (no budget), the room refused a message: %v", i, err)
			}
			h.turnEnded("c", acc)
		}
	}
}

// purgeHeld starts a purge of room whose agent's Close waits (the purge
// is inside the room's door) and returns its result channel and the
// function that lets the Close go.
func purgeHeld(t *testing.T, h *harness, room string) (<-chan error, func()) {
	t.Helper()
	gate, closing := make(chan struct{}), make(chan struct{}, 1)
	h.f.mu.Lock()
	h.f.closeGate, h.f.closing = gate, closing
	h.f.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := h.m.Purge(context.Background(), room)
		done <- err
	}()
	<-closing
	var once sync.Once
	release := func() {
		once.Do(func() {
			h.f.mu.Lock()
			h.f.closeGate, h.f.closing = nil, nil
			h.f.mu.Unlock()
			close(gate)
		})
	}
	t.Cleanup(release)
	return done, release
}

// purge_put_race, purge_revert_race, purge_snapshot_race (review-api F2,
// F8, F11): operations that come while a purge works wait for it, then
// act on the id's new room: settings and a message make the new room (the
// PUT is not lost), the old room's turn is not found for a diff or a
// revert (nothing of the old room is touched or made again), and a second
// purge finds the room gone.
func TestPurgeFencesTheRoom(t *testing.T) {
	snaps := newFakeSnapshots()
	h := newHarness(t, Options{Snapshots: snaps})
	ctx := t.Context()
	old := h.submit("p", "write")
	turn := h.turnEnded("p", old)["turn_id"].(string)
	oldInc, err := h.m.Incarnation(ctx, "p")
	if err != nil || oldInc == "" {
		t.Fatalf("incarnation %q, %v", oldInc, err)
	}
	purged, release := purgeHeld(t, h, "p")

	type result struct {
		op  string
		err error
	}
	results := make(chan result, 6)
	var acc Accepted
	go func() {
		_, err := h.m.SetSettings(ctx, "p", Settings{Instructions: "survivor"})
		results <- result{"put", err}
	}()
	go func() {
		var err error
		acc, err = h.m.Submit(ctx, "p", Message{Text: "new"})
		results <- result{"submit", err}
	}()
	go func() {
		_, err := h.m.TurnDiff(ctx, "p", turn)
		results <- result{"diff", err}
	}()
	go func() {
		_, err := h.m.Revert(ctx, "p", turn)
		results <- result{"revert", err}
	}()
	go func() {
		_, err := h.m.Purge(ctx, "p")
		results <- result{"purge", err}
	}()
	// Each waits at the door: none returns before the purge.
	r, _ := h.m.room("p")
	waitFor(t, "five operations wait at the door", func() bool {
		r.door.mu.Lock()
		defer r.door.mu.Unlock()
		return r.door.blocked == 5
	})
	select {
	case res := <-results:
		t.Fatalf("%s returned during the purge: %v", res.op, res.err)
	default:
	}
	release()
	if err := <-purged; err != nil {
		t.Fatal(err)
	}
	got := map[string]error{}
	for range 5 {
		res := <-results
		got[res.op] = res.err
	}
	if got["put"] != nil || got["submit"] != nil {
		t.Fatalf("put %v, submit %v: both act on the new room", got["put"], got["submit"])
	}
	for _, op := range []string{"diff", "revert"} {
		if !errors.Is(got[op], ErrNotFound) {
			t.Fatalf("%s of the purged room's turn: %v, want ErrNotFound", op, got[op])
		}
	}
	// The second purge came after the first: it found the room gone (the
	// new room not made yet), or purged the new room, or found its turn
	// running.
	if err := got["purge"]; err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrBusy) {
		t.Fatalf("second purge: %v", err)
	}
	if len(snaps.reverted) != 0 {
		t.Fatalf("a revert ran on a purged room: %v", snaps.reverted)
	}
	inc, err := h.m.Incarnation(ctx, "p")
	if got["purge"] != nil {
		// The new room was not purged: the PUT and the message are in it.
		if err != nil || inc == oldInc {
			t.Fatalf("the new room's incarnation %q (old %q), %v", inc, oldInc, err)
		}
		if s, err := h.m.Settings(ctx, "p"); err != nil || s.Instructions != "survivor" {
			t.Fatalf("the PUT during the purge: %+v, %v (lost)", s, err)
		}
	}
	if err == nil && acc.Incarnation == inc {
		h.turnEnded("p", acc)
	}
}

// purge.sh step 4 (review-api F11): concurrent purges of one room: one
// deletes it, the others find it gone (not "a turn is running").
func TestConcurrentPurgesOneDeletes(t *testing.T) {
	h := newHarness(t, Options{})
	h.turnEnded("p", h.submit("p", "hello"))
	errs := make(chan error, 10)
	for range 10 {
		go func() {
			_, err := h.m.Purge(context.Background(), "p")
			errs <- err
		}()
	}
	ok := 0
	for range 10 {
		switch err := <-errs; {
		case err == nil:
			ok++
		case !errors.Is(err, ErrNotFound):
			t.Errorf("a concurrent purge: %v, want ErrNotFound", err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d purges deleted the room", ok)
	}
}

// diff_revert (review-api F11): concurrent reverts run one after another,
// each answered by what it did (not "a turn is running").
func TestConcurrentRevertsRunInTurn(t *testing.T) {
	snaps := newFakeSnapshots()
	h := newHarness(t, Options{Snapshots: snaps})
	turn := h.turnEnded("r", h.submit("r", "write"))["turn_id"].(string)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := h.m.Revert(context.Background(), "r", turn)
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("a concurrent revert: %v", err)
		}
	}
	if len(snaps.reverted) != 4 {
		t.Fatalf("reverts run: %v", snaps.reverted)
	}
}

// A purge with messages waiting says so (and one with a turn running,
// that): the answer names what keeps the room.
func TestPurgeSaysWhatKeepsTheRoom(t *testing.T) {
	h := newHarness(t, Options{})
	hung := h.submit("p", "hang")
	h.waitEvent("p", hung.Seq, "turn.started", nil)
	h.submit("p", "waiting")
	_, err := h.m.Purge(t.Context(), "p")
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "a turn is running") {
		t.Fatalf("purge with a turn running: %v", err)
	}
	if err := h.m.Cancel(t.Context(), "p"); err != nil {
		t.Fatal(err)
	}
	h.turnEnded("p", hung)
}

// Idempotent submit: a message sent twice with one key is accepted once
// (the same id, seq and incarnation; one turn), also when both come at
// once and after a restart; the key with another message is
// ErrKeyReused naming the first; a key is 1 to 255 printable ASCII
// characters; after a purge the key is free in the new room.
func TestIdempotentSubmit(t *testing.T) {
	h := newHarness(t, Options{})
	ctx := t.Context()
	msg := Message{Text: "once", Sender: "ann", Key: "k-1"}
	first, err := h.m.Submit(ctx, "i", msg)
	if err != nil || first.Incarnation == "" {
		t.Fatalf("%+v, %v", first, err)
	}
	h.turnEnded("i", first)
	again, err := h.m.Submit(ctx, "i", msg)
	if err != nil || again != first {
		t.Fatalf("sent again: %+v, %v; first %+v", again, err, first)
	}
	for _, other := range []Message{{Text: "twice", Sender: "ann", Key: "k-1"}, {Text: "once", Sender: "bob", Key: "k-1"},
		{Text: "once", Sender: "ann", Delivery: DeliverSteer, Key: "k-1"}} {
		_, err := h.m.Submit(ctx, "i", other)
		if !errors.Is(err, ErrKeyReused) || !strings.Contains(err.Error(), first.ID) {
			t.Fatalf("%+v: %v, want ErrKeyReused naming %s", other, err, first.ID)
		}
	}
	for _, key := range []string{strings.Repeat("k", MaxKeyBytes+1), "a\nb", "é"} {
		if _, err := h.m.Submit(ctx, "i", Message{Text: "x", Key: key}); !errors.Is(err, ErrBadMessage) {
			t.Fatalf("key %q: %v", key, err)
		}
	}
	// Ten at once: one message.
	accs := make(chan Accepted, 10)
	for range 10 {
		go func() {
			acc, err := h.m.Submit(ctx, "i", Message{Text: "race", Key: "k-2"})
			if err != nil {
				t.Error(err)
			}
			accs <- acc
		}()
	}
	race := <-accs
	for range 9 {
		if acc := <-accs; acc != race {
			t.Fatalf("concurrent sends: %+v and %+v", acc, race)
		}
	}
	h.turnEnded("i", race)
	// A restart keeps the key with the message.
	if err := shut(h.m); err != nil {
		t.Fatal(err)
	}
	h.restart(Options{})
	if again, err := h.m.Submit(ctx, "i", msg); err != nil || again != first {
		t.Fatalf("after a restart: %+v, %v; first %+v", again, err, first)
	}
	evs, err := h.db.Events(ctx, "i", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	accepted, turns := 0, 0
	for _, ev := range evs {
		switch ev.Type {
		case "message.accepted":
			accepted++
		case "turn.started":
			turns++
		}
	}
	if accepted != 2 || turns != 2 {
		t.Fatalf("%d messages accepted, %d turns, want 2 and 2", accepted, turns)
	}
	// A purge frees the key: the new room takes it as a new message.
	if _, err := h.m.Purge(ctx, "i"); err != nil {
		t.Fatal(err)
	}
	fresh, err := h.m.Submit(ctx, "i", msg)
	if err != nil || fresh.Seq != 1 || fresh.Incarnation == first.Incarnation {
		t.Fatalf("after the purge: %+v, %v (first %+v)", fresh, err, first)
	}
	h.turnEnded("i", fresh)
}

// thinkingTransport is the fake transport knowing omp's thinking levels.
type thinkingTransport struct{ *fakeTransport }

func (thinkingTransport) ThinkingLevels(agent string) []string {
	if agent == "omp" {
		return []string{"off", "low", "high"}
	}
	return nil
}

// settings_effects (review-api F9): settings with which every turn would
// fail are refused with the reason: a NUL byte in instructions (no command
// line carries one), a thinking level the agent does not take, an MCP
// server whose command names no program or whose command, environment or
// headers cannot be passed; nothing is stored.
func TestSettingsThatFailEveryTurnAreRefused(t *testing.T) {
	f := newFakeTransport()
	h := newHarness(t, Options{Transport: thinkingTransport{f}, Agents: []string{"omp", "pi"}, Config: Config{Agent: "omp"}})
	ctx := t.Context()
	for _, c := range []struct {
		s    Settings
		want string
	}{
		{Settings{Instructions: "a\x00b"}, "NUL"},
		{Settings{Thinking: "ultra-mega"}, `thinking "ultra-mega": omp takes off, low, high`},
		{Settings{MCP: map[string]MCPServer{"m": {Command: []string{""}}}}, "names no program"},
		{Settings{MCP: map[string]MCPServer{"m": {Command: []string{" "}}}}, "names no program"},
		{Settings{MCP: map[string]MCPServer{"m": {Command: []string{"x", "a\x00"}}}}, "NUL"},
		{Settings{MCP: map[string]MCPServer{"m": {Command: []string{"x"}, Env: map[string]string{"A=B": "c"}}}}, "environment variable"},
		{Settings{MCP: map[string]MCPServer{"m": {Command: []string{"x"}, Env: map[string]string{"": "c"}}}}, "environment variable"},
		{Settings{MCP: map[string]MCPServer{"m": {URL: "http://x", Headers: map[string]string{"H": "\x00"}}}}, "header"},
	} {
		_, err := h.m.SetSettings(ctx, "s", c.s)
		if !errors.Is(err, ErrBadSettings) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want ErrBadSettings naming %q", c.s, err, c.want)
		}
	}
	if _, err := h.m.EffectiveSettings(ctx, "s"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a refused PUT created the room: %v", err)
	}
	// What the agent takes, and a level of an agent whose levels are not
	// known, are taken.
	for _, s := range []Settings{{Thinking: "high"}, {Agent: "pi", Thinking: "whatever"}} {
		if _, err := h.m.SetSettings(ctx, "s", s); err != nil {
			t.Errorf("%+v: %v", s, err)
		}
	}
	// A room naming another agent is judged by that agent's levels.
	if _, err := h.m.SetSettings(ctx, "s", Settings{Agent: "omp", Thinking: "max"}); !errors.Is(err, ErrBadSettings) {
		t.Errorf("omp with max: %v", err)
	}
}

// A room's incarnation: named in its state and its messages' acceptance,
// kept across a restart, another once the room is purged and made again.
func TestIncarnation(t *testing.T) {
	h := newHarness(t, Options{})
	ctx := t.Context()
	if _, err := h.m.Incarnation(ctx, "n"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an unknown room's incarnation: %v", err)
	}
	acc := h.submit("n", "hello")
	h.turnEnded("n", acc)
	st, err := h.m.State(ctx, "n")
	if err != nil || st.Incarnation == "" || st.Incarnation != acc.Incarnation {
		t.Fatalf("state %q, accepted %q, %v", st.Incarnation, acc.Incarnation, err)
	}
	if err := shut(h.m); err != nil {
		t.Fatal(err)
	}
	h.restart(Options{})
	if inc, err := h.m.Incarnation(ctx, "n"); err != nil || inc != st.Incarnation {
		t.Fatalf("after a restart: %q, %v; before %q", inc, err, st.Incarnation)
	}
	if _, err := h.m.Purge(ctx, "n"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Incarnation(ctx, "n"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a purged room's incarnation: %v", err)
	}
	acc2 := h.submit("n", "again")
	if acc2.Incarnation == "" || acc2.Incarnation == st.Incarnation {
		t.Fatalf("the new room's incarnation %q, the old one's %q", acc2.Incarnation, st.Incarnation)
	}
	h.turnEnded("n", acc2)
}

// An idle agent released by the janitor while its room is purged: the
// release's agent.released is never written after the room's deletion
// (it would start the new room's log).
func TestIdleReleaseNeverOutlivesAPurge(t *testing.T) {
	h := newHarness(t, Options{IdleAfter: time.Second})
	ctx := t.Context()
	for i := range 5 {
		id := fmt.Sprintf("j%d", i)
		h.turnEnded(id, h.submit(id, "hello"))
		// The purge and the janitor's release race for the idle agent.
		waitFor(t, "the room idle a second", func() bool {
			r, _ := h.m.room(id)
			r.mu.Lock()
			defer r.mu.Unlock()
			return time.Since(r.lastUsed) >= 900*time.Millisecond
		})
		if _, err := h.m.Purge(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// Whatever the janitor did, no purged room has a log again.
	if err := shut(h.m); err != nil {
		t.Fatal(err)
	}
	ids, err := h.db.RoomIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 0 {
		for _, id := range ids {
			evs, _ := h.db.Events(ctx, id, 0, 0)
			b, _ := json.Marshal(evs)
			t.Errorf("room %s came back after its purge: %s", id, b)
		}
	}
	if entries, err := os.ReadDir(h.root); err == nil && len(entries) != 0 {
		t.Errorf("the purged rooms' folders are back: %d", len(entries))
	}
}
