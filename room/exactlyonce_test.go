package room

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/record"
)

// Issue 47: every accepted message ends exactly once, across planned
// restarts (Detach) and steering; the tests here pin each race down, and
// TestExactlyOnceProperty (property_test.go) mixes them at random.

// exactLog is a room's log, checked: events numbered 1, 2, 3… with no
// gap; each accepted message ended exactly once, after its acceptance;
// each turn started ended exactly once, one turn open at a time, and
// turns started in the order their messages were accepted (a message
// queued again after a planned restart starts again in its place).
type exactLog struct {
	evs      []store.Event
	accepted []string                  // message ids, in order
	msgEnd   map[string]map[string]any // message id -> its message.ended
	turnEnd  map[string]map[string]any // turn id -> its turn.ended
	turnSeq  map[string]int64          // turn id -> its turn.ended's seq
	turnsOf  map[string][]string       // message id -> the turns it started, in order
}

func readExactLog(t *testing.T, db *store.DB, room string) *exactLog {
	t.Helper()
	l := &exactLog{msgEnd: map[string]map[string]any{}, turnEnd: map[string]map[string]any{},
		turnSeq: map[string]int64{}, turnsOf: map[string][]string{}}
	for after := int64(0); ; {
		evs, err := db.Events(context.Background(), room, after, 0)
		if err != nil {
			t.Fatal(err)
		}
		l.evs = append(l.evs, evs...)
		if len(evs) < record.MaxPage {
			break
		}
		after = evs[len(evs)-1].Seq
	}
	open := ""
	acc := map[string]int64{} // message id -> its acceptance's seq
	var last int64            // the acceptance seq of the last turn's message
	requeued := false         // the last turn ended queuing its message again
	for i, ev := range l.evs {
		if ev.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i+1, ev.Seq)
		}
		var d map[string]any
		_ = json.Unmarshal(ev.Data, &d)
		mid, _ := d["message_id"].(string)
		tid, _ := d["turn_id"].(string)
		switch ev.Type {
		case "message.accepted":
			if acc[mid] != 0 {
				t.Fatalf("seq %d: message %s accepted twice", ev.Seq, mid)
			}
			acc[mid] = ev.Seq
			l.accepted = append(l.accepted, mid)
		case "message.ended":
			if acc[mid] == 0 {
				t.Fatalf("seq %d: message %s ended before it was accepted", ev.Seq, mid)
			}
			if prev, ok := l.msgEnd[mid]; ok {
				t.Fatalf("seq %d: message %s ended twice: %v, then %v", ev.Seq, mid, prev, d)
			}
			l.msgEnd[mid] = d
		case "turn.started":
			if open != "" {
				t.Fatalf("seq %d: turn %s started while %s was open", ev.Seq, tid, open)
			}
			open = tid
			l.turnsOf[mid] = append(l.turnsOf[mid], tid)
			if s := acc[mid]; s < last || s == last && !requeued {
				t.Fatalf("seq %d: the turn of the message accepted at seq %d started after that of seq %d", ev.Seq, s, last)
			}
			last = acc[mid]
		case "turn.ended":
			if tid != open {
				t.Fatalf("seq %d: turn.ended of %s while %q was open", ev.Seq, tid, open)
			}
			open = ""
			requeued = d["reason"] == errRequeued.Error()
			l.turnEnd[tid], l.turnSeq[tid] = d, ev.Seq
		}
	}
	return l
}

// allEnded checks every accepted message ended and no turn is open.
func (l *exactLog) allEnded(t *testing.T) {
	t.Helper()
	for _, id := range l.accepted {
		if l.msgEnd[id] == nil {
			t.Fatalf("message %s never ended", id)
		}
	}
	for _, tids := range l.turnsOf {
		for _, tid := range tids {
			if l.turnEnd[tid] == nil {
				t.Fatalf("turn %s never ended", tid)
			}
		}
	}
}

// typeSeq is the seq of the first event of type typ about message id (0:
// none).
func (l *exactLog) typeSeq(typ, id string) int64 {
	for _, ev := range l.evs {
		if ev.Type == typ && field(ev, "message_id") == id {
			return ev.Seq
		}
	}
	return 0
}

// raceTransport's agents end a "wait" run when a steer or follow_up
// reaches them, and answer the delivery only once the room has begun to
// record the turn's end (the room's onTurnClosing hook): the reply comes
// after the turn ended, as with an agent whose run was over (omp's
// follow_up on an idle agent, "no run to follow up"), or a release that
// closed the agent under the call.
type raceTransport struct {
	fakeTransport
	refuse  bool          // the late reply refuses the delivery
	closing chan struct{} // the room's onTurnClosing
	// during, if set, runs as the reply waits (the turn's end begun).
	during func()

	mu       sync.Mutex
	end      chan struct{}
	prompted chan struct{}
	got      []string // prompts and deliveries, as the agent had them
	closed   int      // agents closed
}

func newRaceTransport() *raceTransport {
	return &raceTransport{fakeTransport: *newFakeTransport(), closing: make(chan struct{}, 8), prompted: make(chan struct{}, 8)}
}

func (f *raceTransport) Start(ctx context.Context, spec AgentSpec) (Agent, error) {
	a, err := f.fakeTransport.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &raceAgent{Agent: a, f: f}, nil
}

type raceAgent struct {
	Agent
	f *raceTransport
}

func (a *raceAgent) Run(ctx context.Context, text string) (TurnResult, error) {
	a.f.mu.Lock()
	a.f.got = append(a.f.got, text)
	end := make(chan struct{})
	a.f.end = end
	a.f.mu.Unlock()
	a.f.prompted <- struct{}{}
	if text != "wait" {
		return TurnResult{Text: "ok: " + text}, nil
	}
	select {
	case <-end:
		return TurnResult{Text: "first answer"}, nil
	case <-ctx.Done():
		return TurnResult{}, ctx.Err()
	}
}

func (a *raceAgent) FollowUp(ctx context.Context, text string) error {
	a.f.mu.Lock()
	end := a.f.end
	a.f.mu.Unlock()
	close(end) // the run ends as the delivery reaches the agent
	select {
	case <-a.f.closing:
	case <-ctx.Done():
		return ctx.Err()
	}
	if a.f.during != nil {
		a.f.during()
	}
	if a.f.refuse {
		return errors.New("rpc: follow_up: no run to follow up")
	}
	a.f.mu.Lock()
	a.f.got = append(a.f.got, "follow_up:"+text)
	a.f.mu.Unlock()
	return nil
}

func (a *raceAgent) Steer(ctx context.Context, text string) error { return a.FollowUp(ctx, text) }

func (a *raceAgent) Close(ctx context.Context) (json.RawMessage, error) {
	a.f.mu.Lock()
	a.f.closed++
	a.f.mu.Unlock()
	return a.Agent.Close(ctx)
}

func (f *raceTransport) waitPrompted(t *testing.T) {
	t.Helper()
	select {
	case <-f.prompted:
	case <-time.After(30 * time.Second):
		t.Fatal("no prompt reached the agent")
	}
}

// raceHarness runs a room on a raceTransport whose late replies wait for
// the room's turn end.
func raceHarness(t *testing.T, f *raceTransport) *harness {
	h := newHarness(t, Options{Transport: f})
	h.m.onTurnClosing = func(string) {
		select {
		case f.closing <- struct{}{}:
		default:
		}
	}
	return h
}

// A follow_up whose delivery the agent refuses after the turn's end began
// (followup-double-end.sh): the message is queued and runs as a turn of
// its own, ending once (it ended with the turn, then again with its own,
// and the agent had its text twice).
func TestDeliveryRefusedAsItsTurnEndsIsQueuedAndEndsOnce(t *testing.T) {
	f := newRaceTransport()
	f.refuse = true
	h := raceHarness(t, f)
	first := h.submit("r", "wait")
	f.waitPrompted(t)
	fu := h.submitAs("r", "and also this", DeliverFollowUp)
	f.waitPrompted(t)
	if d := h.turnEnded("r", fu); d["outcome"] != OutcomeSettled || d["text"] != "ok: and also this" {
		t.Fatalf("the follow_up's own turn: %v", d)
	}
	l := readExactLog(t, h.db, "r")
	l.allEnded(t)
	if got := l.msgEnd[first.ID]; got["outcome"] != OutcomeSettled {
		t.Fatalf("the first message ended %v", got)
	}
	own := l.turnsOf[fu.ID]
	if len(own) != 1 || l.msgEnd[fu.ID]["turn_id"] != own[0] {
		t.Fatalf("the follow_up ended %v, its turns %v: want it ended by its own one turn", l.msgEnd[fu.ID], own)
	}
	if l.typeSeq("message.delivered", fu.ID) != 0 || l.typeSeq("message.queued", fu.ID) == 0 {
		t.Fatal("the refused follow_up: want message.queued and no message.delivered")
	}
	f.mu.Lock()
	got := slices.Clone(f.got)
	f.mu.Unlock()
	if fmt.Sprint(got) != "[wait and also this]" {
		t.Fatalf("the agent had %q: want the follow_up's text once, in its own turn", got)
	}
	msgs, err := h.db.Messages(t.Context(), "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if m.Status != record.MessageEnded {
			t.Fatalf("message %s left %s", m.ID, m.Status)
		}
	}
}

// A follow_up the agent accepts after the turn's end began (FU_REPLY=ok):
// it is delivered before the turn's end is recorded and ends with that
// turn, once; its record is ended (it was left "started" after its
// message.ended, and a restart ended it a second time, failed).
func TestDeliveryAcceptedAsItsTurnEndsEndsWithTheTurnOnce(t *testing.T) {
	f := newRaceTransport()
	h := raceHarness(t, f)
	first := h.submit("r", "wait")
	f.waitPrompted(t)
	fu := h.submitAs("r", "and also this", DeliverFollowUp)
	end := h.turnEnded("r", first)
	if end["outcome"] != OutcomeSettled {
		t.Fatalf("turn %v", end)
	}
	l := readExactLog(t, h.db, "r")
	l.allEnded(t)
	tid := l.turnsOf[first.ID][0]
	if d := l.msgEnd[fu.ID]; d["turn_id"] != tid || d["outcome"] != OutcomeSettled {
		t.Fatalf("the follow_up ended %v: want with turn %s, settled", d, tid)
	}
	if ds := l.typeSeq("message.delivered", fu.ID); ds == 0 || ds > l.turnSeq[tid] {
		t.Fatalf("message.delivered at seq %d, turn.ended at %d: want the delivery recorded first", ds, l.turnSeq[tid])
	}
	if len(l.turnsOf[fu.ID]) != 0 {
		t.Fatalf("the delivered follow_up ran as a turn of its own too: %v", l.turnsOf[fu.ID])
	}
	m, err := h.db.Message(t.Context(), "r", fu.ID)
	if err != nil || m.Status != record.MessageEnded || m.Outcome != OutcomeSettled {
		t.Fatalf("the follow_up's record %+v, %v: want ended, settled", m, err)
	}
	// A restart finds nothing of it to end again.
	if err := shut(h.m); err != nil {
		t.Fatal(err)
	}
	h.restart(Options{Transport: f})
	again := h.submit("r", "after the restart")
	h.turnEnded("r", again)
	readExactLog(t, h.db, "r").allEnded(t)
}

// A release asked for while the turn's end waits for a delivery (the
// stress run's DELETE, which closed the agent under the follow_up: "rpc:
// client closed") leaves the agent to the delivery; it goes once the turn
// has ended.
func TestReleaseDuringATurnsEndWaitsForTheDelivery(t *testing.T) {
	f := newRaceTransport()
	h := raceHarness(t, f)
	var relErr error
	f.during = func() {
		relErr = h.m.Release(context.Background(), "r")
		f.mu.Lock()
		closed := f.closed
		f.mu.Unlock()
		if closed != 0 {
			relErr = errors.New("the agent was closed under the delivery")
		}
	}
	first := h.submit("r", "wait")
	f.waitPrompted(t)
	fu := h.submitAs("r", "and also this", DeliverFollowUp)
	h.turnEnded("r", first)
	if relErr != nil {
		t.Fatal(relErr)
	}
	l := readExactLog(t, h.db, "r")
	l.allEnded(t)
	if d := l.msgEnd[fu.ID]; d["outcome"] != OutcomeSettled || d["turn_id"] != l.turnsOf[first.ID][0] {
		t.Fatalf("the follow_up ended %v", d)
	}
	if err := h.m.Release(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	h.waitEvent("r", 0, "agent.released", nil)
}

// openDaemonRoom opens a store and a manager on the daemon transport.
func openDaemonRoom(t *testing.T, d *daemonTransport) (*store.DB, string, *Manager) {
	t.Helper()
	dir := t.TempDir()
	db, err := store.Open(t.Context(), filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	root := filepath.Join(dir, "rooms")
	return db, root, managerOn(t, db, root, d)
}

// A planned restart with a turn running and messages queued
// (usr2-drain.sh): the detaching host starts no agent and no turn; the
// queue waits in the store; the next host continues the running turn and
// runs the queue in order, each message ending once, settled, with the
// text the agent gave it. Three restarts in a row, each mid-turn.
func TestDetachStartsNothingAndTheNextHostRunsTheQueue(t *testing.T) {
	d := newDaemonTransport()
	db, root, m := openDaemonRoom(t, d)
	h := &harness{t: t, db: db, m: m}
	first := h.submit("r", "go")
	d.waitPrompted(t)
	var queued []Accepted
	for i := range 12 {
		queued = append(queued, h.submit("r", fmt.Sprintf("q%d", i)))
	}
	p := d.proc("p1")
	ran := 0 // turns the agent ended
	for restart := range 3 {
		p.emit(frame{text: fmt.Sprintf("delta %d", restart)})
		h.waitEvent("r", 0, KindText, func(m map[string]any) bool { return m["text"] == fmt.Sprintf("delta %d", restart) })
		if err := detach(h.m); err != nil {
			t.Fatal(err)
		}
		if d.n != 1 {
			t.Fatalf("restart %d: %d agents started, want 1 (the detaching host started one)", restart, d.n)
		}
		if turns, _ := db.OpenTurns(t.Context()); len(turns) != 1 {
			t.Fatalf("restart %d: %d open turns after Detach, want the running one", restart, len(turns))
		}
		msgs, _ := db.OpenMessages(t.Context())
		waiting := 0
		for _, msg := range msgs {
			if msg.Status == record.MessageQueued {
				waiting++
			}
		}
		if want := len(queued) - ran; waiting != want {
			t.Fatalf("restart %d: %d messages still queued in the store, want %d", restart, waiting, want)
		}
		h.m = managerOn(t, db, root, d)
		// The running turn ends on the attached agent; the next one
		// starts on it too.
		p.emit(frame{text: fmt.Sprintf("answer %d", ran), end: true})
		ran++
		d.waitPrompted(t)
	}
	t.Cleanup(func() { _ = shut(h.m) })
	for ran < len(queued)+1 {
		p.emit(frame{text: fmt.Sprintf("answer %d", ran), end: true})
		ran++
		if ran < len(queued)+1 {
			d.waitPrompted(t)
		}
	}
	h.turnEnded("r", queued[len(queued)-1])
	l := readExactLog(t, db, "r")
	l.allEnded(t)
	for i, acc := range append([]Accepted{first}, queued...) {
		tids := l.turnsOf[acc.ID]
		if len(tids) != 1 {
			t.Fatalf("message %d had turns %v, want one", i, tids)
		}
		if e := l.turnEnd[tids[0]]; e["outcome"] != OutcomeSettled || e["text"] != fmt.Sprintf("answer %d", i) {
			t.Fatalf("message %d's turn ended %v", i, e)
		}
	}
	if d.n != 1 {
		t.Fatalf("%d agents started, want 1", d.n)
	}
}

// A run that ended as the host began to detach (its end read before the
// agent was let go of) is recorded by that host as it ended, not left
// open for the next one (which recorded the turns a detaching host ran as
// failed, "host restarted").
func TestDetachRecordsARunThatEndedBeforeItsAgentWasLetGo(t *testing.T) {
	d := newDaemonTransport()
	db, root, m := openDaemonRoom(t, d)
	h := &harness{t: t, db: db, m: m}
	var once sync.Once
	m.onTurnClosing = func(string) { once.Do(func() { _ = m.Detach() }) }
	acc := h.submit("r", "go")
	d.waitPrompted(t)
	d.proc("p1").emit(frame{text: "done", end: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := m.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if turns, _ := db.OpenTurns(t.Context()); len(turns) != 0 {
		t.Fatalf("open turns after the detach: %+v, want none (the run had ended)", turns)
	}
	if e := h.turnEnded("r", acc); e["outcome"] != OutcomeSettled || e["text"] != "done" {
		t.Fatalf("turn ended %v", e)
	}
	h.m = managerOn(t, db, root, d)
	defer shut(h.m)
	next := h.submit("r", "next")
	d.waitPrompted(t)
	d.proc("p1").emit(frame{text: "again", end: true})
	if e := h.turnEnded("r", next); e["text"] != "again" {
		t.Fatalf("the next turn %v", e)
	}
	l := readExactLog(t, db, "r")
	l.allEnded(t)
	if d.n != 1 || len(l.turnEnd) != 2 {
		t.Fatalf("%d agents started, %d turns ended: want 1 and 2", d.n, len(l.turnEnd))
	}
}

// A steer in flight when the host detaches: the agent is let go of only
// once the delivery is done, so the steered message is joined to the
// turn the next host continues and ends with it, once (its call failed
// when the agent was let go of under it, and the message, which the agent
// may have had, was queued to run again).
func TestDetachWaitsForADeliveryInFlight(t *testing.T) {
	d := newDaemonTransport()
	d.steerGate, d.steering = make(chan struct{}), make(chan struct{}, 1)
	db, root, m := openDaemonRoom(t, d)
	h := &harness{t: t, db: db, m: m}
	waiting := make(chan struct{}, 1)
	m.onAwaitDeliveries = func(string) {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}
	first := h.submit("r", "go")
	d.waitPrompted(t)
	steered := make(chan Accepted, 1)
	go func() {
		acc, err := m.Submit(context.Background(), "r", Message{Text: "steer this", Delivery: DeliverSteer})
		if err != nil {
			t.Error(err)
		}
		steered <- acc
	}()
	<-d.steering
	if err := m.Detach(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-waiting:
	case <-time.After(30 * time.Second):
		t.Fatal("the detach did not wait for the delivery")
	}
	select {
	case <-d.agent(0).stop:
		t.Fatal("the agent was let go of under the delivery")
	default:
	}
	close(d.steerGate)
	acc := <-steered
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := m.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if msg, err := db.Message(t.Context(), "r", acc.ID); err != nil || msg.Status != record.MessageStarted {
		t.Fatalf("the steered message %+v, %v: want started in the open turn", msg, err)
	}
	h.m = managerOn(t, db, root, d)
	defer shut(h.m)
	d.proc("p1").emit(frame{text: "done", end: true})
	h.turnEnded("r", first)
	l := readExactLog(t, db, "r")
	l.allEnded(t)
	tid := l.turnsOf[first.ID][0]
	if e := l.msgEnd[acc.ID]; e["turn_id"] != tid || e["outcome"] != OutcomeSettled {
		t.Fatalf("the steered message ended %v, want with turn %s", e, tid)
	}
	if len(l.turnsOf[acc.ID]) != 0 {
		t.Fatal("the steered message ran as a turn of its own too")
	}
	d.mu.Lock()
	n := len(d.steered)
	d.mu.Unlock()
	if n != 1 || !strings.Contains(fmt.Sprint(d.steered), "steer this") {
		t.Fatalf("the agent was given %v", d.steered)
	}
}
