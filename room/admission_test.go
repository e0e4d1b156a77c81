package room

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/store"
)

// roomLog is a room's whole log, decoded.
type roomLog struct {
	evs  []store.Event
	data []map[string]any
}

func (h *harness) log(room string) roomLog {
	h.t.Helper()
	evs, err := h.db.Events(h.t.Context(), room, 0, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	l := roomLog{evs: evs}
	for _, ev := range evs {
		var d map[string]any
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			h.t.Fatalf("event %d: %v", ev.Seq, err)
		}
		l.data = append(l.data, d)
	}
	return l
}

// checkMessageEnds checks the message.ended contract on a room's log:
// every accepted message ends exactly once; the messages a turn consumed
// end right after its turn.ended (its own message first), naming the
// turn; reason only when not settled or answered. It returns each
// message's message.ended data.
func checkMessageEnds(t *testing.T, l roomLog) map[string]map[string]any {
	t.Helper()
	accepted := map[string]bool{}
	ends := map[string]map[string]any{}
	block := map[string]bool{} // ended in the block after its turn's end
	for i, ev := range l.evs {
		d := l.data[i]
		switch ev.Type {
		case "message.accepted":
			accepted[d["message_id"].(string)] = true
		case "message.ended":
			id, _ := d["message_id"].(string)
			if !accepted[id] {
				t.Fatalf("seq %d: message.ended for %q, never accepted before", ev.Seq, id)
			}
			if ends[id] != nil {
				t.Fatalf("seq %d: message %s ended twice", ev.Seq, id)
			}
			ends[id] = d
			switch out := d["outcome"]; out {
			case OutcomeSettled, OutcomeAnswered:
				if _, ok := d["reason"]; ok {
					t.Fatalf("seq %d: %s message.ended with a reason: %v", ev.Seq, out, d)
				}
			case OutcomeFailed, OutcomeCancelled, OutcomeTimedOut:
				if r, _ := d["reason"].(string); r == "" {
					t.Fatalf("seq %d: %s message.ended without a reason: %v", ev.Seq, out, d)
				}
			default:
				t.Fatalf("seq %d: message.ended outcome %v", ev.Seq, out)
			}
		case "turn.ended":
			if d["reason"] == errRequeued.Error() {
				// Its agent never had it (a planned restart): its
				// messages are queued again and end with a later turn.
				continue
			}
			// The turn's messages end right after it, its own first.
			j := i + 1
			if j >= len(l.evs) || l.evs[j].Type != "message.ended" || l.data[j]["message_id"] != d["message_id"] {
				t.Fatalf("seq %d: turn.ended %v is not followed by its message's message.ended", ev.Seq, d)
			}
			for ; j < len(l.evs) && l.evs[j].Type == "message.ended" && l.data[j]["turn_id"] == d["turn_id"]; j++ {
				if l.data[j]["outcome"] != d["outcome"] {
					t.Fatalf("seq %d: message.ended %v after turn.ended %v", l.evs[j].Seq, l.data[j], d)
				}
				block[l.data[j]["message_id"].(string)] = true
			}
		}
	}
	for id := range accepted {
		if ends[id] == nil {
			t.Fatalf("message %s accepted, never ended", id)
		}
		if ends[id]["turn_id"] != nil && !block[id] {
			t.Fatalf("message %s ended %v, not right after its turn's turn.ended", id, ends[id])
		}
	}
	return ends
}

// turnOrder checks that turns started in the order of their messages'
// acceptance and returns how many started.
func turnOrder(t *testing.T, l roomLog) int {
	t.Helper()
	seqOf := map[string]int64{}
	var last int64
	n := 0
	for i, ev := range l.evs {
		id, _ := l.data[i]["message_id"].(string)
		switch ev.Type {
		case "message.accepted":
			seqOf[id] = ev.Seq
		case "turn.started":
			if seqOf[id] <= last {
				t.Fatalf("seq %d: the turn of the message accepted at seq %d started after that of seq %d", ev.Seq, seqOf[id], last)
			}
			last = seqOf[id]
			n++
		}
	}
	return n
}

// TestConcurrentSubmitsKeepTheQueueLimitAndTheOrder: 200 submits at once
// to a busy room with a limit of 64: exactly 64 are accepted, the rest
// refused with ErrQueueFull; every accepted one ends, and turns start in
// the order of the sequence numbers the acceptances carry.
func TestConcurrentSubmitsKeepTheQueueLimitAndTheOrder(t *testing.T) {
	h := newHarness(t, Options{})
	hung := h.submit("q", "hang")
	h.waitEvent("q", hung.Seq, "turn.started", nil)
	const n = 200
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = h.m.Submit(t.Context(), "q", Message{Text: fmt.Sprintf("n%d", i)})
		}()
	}
	close(start)
	wg.Wait()
	accepted, refused := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			accepted++
		case errors.Is(err, ErrQueueFull):
			refused++
		default:
			t.Fatalf("submit: %v", err)
		}
	}
	if accepted != DefaultQueueLimit || refused != n-DefaultQueueLimit {
		t.Fatalf("%d accepted, %d refused; want %d and %d", accepted, refused, DefaultQueueLimit, n-DefaultQueueLimit)
	}
	if st, _ := h.m.State(t.Context(), "q"); st.Queued != DefaultQueueLimit {
		t.Fatalf("queued %d, want %d", st.Queued, DefaultQueueLimit)
	}
	if err := h.m.Cancel(t.Context(), "q"); err != nil {
		t.Fatal(err)
	}
	h.waitTurns("q", accepted+1)
	l := h.log("q")
	if got := turnOrder(t, l); got != accepted+1 {
		t.Fatalf("%d turns started, want %d", got, accepted+1)
	}
	checkMessageEnds(t, l)
}

// TestConcurrentWritersKeepTheOrderOfAcceptance: several writers posting
// to several rooms at once; in every room the turns start in the order of
// acceptance (the order a restart would replay).
func TestConcurrentWritersKeepTheOrderOfAcceptance(t *testing.T) {
	h := newHarness(t, Options{QueueLimit: 1000})
	rooms := []string{"o1", "o2", "o3", "o4", "o5"}
	holds := map[string]Accepted{}
	for _, rm := range rooms {
		// Busy rooms, so that the queues fill while the writers run.
		holds[rm] = h.submit(rm, "hang")
		h.waitEvent(rm, holds[rm].Seq, "turn.started", nil)
	}
	const writers, each = 8, 40
	var wg sync.WaitGroup
	start := make(chan struct{})
	fail := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range each {
				rm := rooms[(w+i)%len(rooms)]
				if _, err := h.m.Submit(t.Context(), rm, Message{Text: fmt.Sprintf("w%d-%d", w, i)}); err != nil {
					fail <- err
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(fail)
	for err := range fail {
		t.Fatal(err)
	}
	for _, rm := range rooms {
		if err := h.m.Cancel(t.Context(), rm); err != nil {
			t.Fatal(err)
		}
	}
	for _, rm := range rooms {
		h.waitTurns(rm, writers*each/len(rooms)+1)
		l := h.log(rm)
		turnOrder(t, l)
		checkMessageEnds(t, l)
	}
}

// waitTurns waits until n of the room's turns ended.
func (h *harness) waitTurns(room string, n int) {
	h.t.Helper()
	var after int64
	for range n {
		after = h.waitEvent(room, after, "turn.ended", nil).Seq
	}
}

// faultStore refuses writes as a full disk does: once armed, the first
// write that records a turn's start fails, and so does every write after
// it until free.
type faultStore struct {
	Store
	mu      sync.Mutex
	armed   bool
	full    bool
	refused int
	changed chan struct{} // signalled on each refusal
}

var errDiskFull = errors.New("store: commit: database or disk is full (13)")

func (s *faultStore) Write(ctx context.Context, fn func(tx Tx) error) error {
	s.mu.Lock()
	if s.full {
		err := s.refuse()
		s.mu.Unlock()
		return err
	}
	s.mu.Unlock()
	return s.Store.Write(ctx, func(tx Tx) error { return fn(faultTx{tx, s}) })
}

func (s *faultStore) refuse() error {
	s.refused++
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return errDiskFull
}

func (s *faultStore) free() {
	s.mu.Lock()
	s.full, s.armed = false, false
	s.mu.Unlock()
}

// waitRefused waits until the store refused n writes.
func (s *faultStore) waitRefused(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		s.mu.Lock()
		got := s.refused
		s.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-s.changed:
		case <-deadline:
			t.Fatalf("the store refused %d writes, want %d", got, n)
		}
	}
}

type faultTx struct {
	Tx
	s *faultStore
}

func (tx faultTx) PutTurn(tr store.Turn) error {
	s := tx.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.armed {
		s.full = true
		return s.refuse()
	}
	return tx.Tx.PutTurn(tr)
}

// TestStoreRefusingATurnStartEndsItsMessageInOrder: the store refuses the
// write that starts a turn (a full disk), and the writes after it for a
// while. The message, answered 202, ends failed with a reason naming the
// store once the store takes writes again, and the message accepted after
// it runs only then: nothing is skipped, the order holds. A host closed
// while the store still refuses leaves the message queued: the next start
// runs it first.
func TestStoreRefusingATurnStartEndsItsMessageInOrder(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restart=%v", restart), func(t *testing.T) {
			fs := &faultStore{changed: make(chan struct{}, 1)}
			h := newHarnessWith(t, Options{}, func(s Store) Store { fs.Store = s; return fs })
			hold := h.submit("d", "approve:bash")
			req := h.waitEvent("d", hold.Seq, "approval.requested", nil)
			m2 := h.submit("d", "two")
			m3 := h.submit("d", "three")
			fs.mu.Lock()
			fs.armed = true
			fs.mu.Unlock()
			if err := h.m.Approve(t.Context(), "d", field(req, "approval_id"), true); err != nil {
				t.Fatal(err)
			}
			// The start, then at least two attempts to end its message.
			fs.waitRefused(t, 3)
			if restart {
				if err := shut(h.m); err != nil {
					t.Fatal(err)
				}
				fs.free()
				h.restart(Options{})
			} else {
				fs.free()
			}
			d3 := h.turnEnded("d", m3)
			if d3["outcome"] != OutcomeSettled {
				t.Fatalf("the message after: %v", d3)
			}
			l := h.log("d")
			turnOrder(t, l)
			ends := checkMessageEnds(t, l)
			e2 := ends[m2.ID]
			if restart {
				// Recovered: it ran first after the restart.
				if e2["outcome"] != OutcomeSettled {
					t.Fatalf("message two after a restart: %v", e2)
				}
				return
			}
			if e2["outcome"] != OutcomeFailed || !strings.Contains(e2["reason"].(string), "store refused") ||
				!strings.Contains(e2["reason"].(string), "disk is full") || e2["turn_id"] != nil {
				t.Fatalf("message two ended %v", e2)
			}
			msgs, err := h.db.Messages(t.Context(), "d", 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, msg := range msgs {
				if msg.ID == m2.ID && (msg.Status != store.MessageEnded || msg.Outcome != OutcomeFailed) {
					t.Fatalf("message two's record: %+v", msg)
				}
			}
		})
	}
}

// TestEveryAcceptedMessageEndsOnce: whatever consumes a message (its own
// turn, whatever the outcome; a turn it was steered or followed up into;
// a question it answered), its end is one message.ended naming it: right
// after the turn's turn.ended, or right after question.answered.
func TestEveryAcceptedMessageEndsOnce(t *testing.T) {
	h := newHarness(t, Options{RoomConfig: func(room string) Config {
		if room == "slow" {
			return Config{TurnTimeout: 300 * time.Millisecond}
		}
		return Config{}
	}})
	want := map[string]string{} // message -> outcome
	for text, outcome := range map[string]string{"hi": OutcomeSettled, "fail": OutcomeFailed} {
		acc := h.submit("e", text)
		h.turnEnded("e", acc)
		want[acc.ID] = outcome
	}
	hung := h.submit("e", "hang")
	h.waitEvent("e", hung.Seq, "turn.started", nil)
	if err := h.m.Cancel(t.Context(), "e"); err != nil {
		t.Fatal(err)
	}
	h.turnEnded("e", hung)
	want[hung.ID] = OutcomeCancelled

	// Steered and followed up into a turn: they end with it.
	ap := h.submit("e", "approve:bash")
	req := h.waitEvent("e", ap.Seq, "approval.requested", nil)
	st := h.submitAs("e", "left", DeliverSteer)
	fu := h.submitAs("e", "right", DeliverFollowUp)
	h.waitEvent("e", fu.Seq, "message.delivered", nil)
	if err := h.m.Approve(t.Context(), "e", field(req, "approval_id"), true); err != nil {
		t.Fatal(err)
	}
	h.turnEnded("e", ap)
	for _, id := range []string{ap.ID, st.ID, fu.ID} {
		want[id] = OutcomeSettled
	}

	// Taken as a question's answer.
	ask := h.submit("e", "ask:Which colour?")
	q := h.waitEvent("e", ask.Seq, "question.asked", nil)
	reply := h.submit("e", "blue")
	ans := h.waitEvent("e", q.Seq, "question.answered", nil)
	if field(ans, "message_id") != reply.ID {
		t.Fatalf("question.answered %s does not name the message", ans.Data)
	}
	h.turnEnded("e", ask)
	want[ask.ID], want[reply.ID] = OutcomeSettled, OutcomeAnswered

	slow := h.submit("slow", "hang")
	h.turnEnded("slow", slow)

	l := h.log("e")
	ends := checkMessageEnds(t, l)
	for id, outcome := range want {
		if ends[id]["outcome"] != outcome {
			t.Fatalf("message %s ended %v, want %s", id, ends[id], outcome)
		}
	}
	for i, ev := range l.evs {
		if ev.Seq == ans.Seq {
			next := l.data[i+1]
			if l.evs[i+1].Type != "message.ended" || next["message_id"] != reply.ID || next["turn_id"] != nil {
				t.Fatalf("after question.answered: %s %v", l.evs[i+1].Type, next)
			}
		}
	}
	if e := checkMessageEnds(t, h.log("slow"))[slow.ID]; e["outcome"] != OutcomeTimedOut {
		t.Fatalf("timed out message ended %v", e)
	}
	msgs, err := h.db.Messages(t.Context(), "e", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range msgs {
		if msg.Status != store.MessageEnded || msg.Outcome != want[msg.ID] {
			t.Fatalf("message record %+v, want ended %s", msg, want[msg.ID])
		}
	}
}

// TestIdleRoomStartsTheTurnInTheWriteThatAcceptsIt: a message to an idle
// room is accepted and its turn started in one store commit (one fsync
// before turn.started, not two). A message that waits behind a running
// turn, and any message of a room with a budget (checked again before
// each turn), starts in a write of its own.
func TestIdleRoomStartsTheTurnInTheWriteThatAcceptsIt(t *testing.T) {
	h := newHarness(t, Options{})
	ctx := t.Context()
	if _, err := h.m.SetSettings(ctx, "b", Settings{Budget: Budget{Turns: 5}}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var batches [][]store.Event
	stop := h.db.Tap(func(evs []store.Event) {
		mu.Lock()
		batches = append(batches, slices.Clone(evs))
		mu.Unlock()
	})
	defer stop()
	// batchOf is the types, in order, of the message's events committed
	// with its message.accepted.
	batchOf := func(acc Accepted) []string {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		for _, b := range batches {
			if !slices.ContainsFunc(b, func(ev store.Event) bool {
				return ev.Type == "message.accepted" && strings.Contains(string(ev.Data), acc.ID)
			}) {
				continue
			}
			var types []string
			for _, ev := range b {
				if strings.Contains(string(ev.Data), acc.ID) {
					types = append(types, ev.Type)
				}
			}
			return types
		}
		t.Fatalf("no batch holds message %s's acceptance", acc.ID)
		return nil
	}
	together := []string{"message.accepted", "message.queued", "turn.started"}
	apart := []string{"message.accepted", "message.queued"}

	idle := h.submit("r", "one")
	if d := h.turnEnded("r", idle); d["outcome"] != OutcomeSettled {
		t.Fatalf("the idle room's turn: %v", d)
	}
	if got := batchOf(idle); !slices.Equal(got, together) {
		t.Fatalf("an idle room's message was committed as %v, want %v", got, together)
	}

	hung := h.submit("r", "hang")
	h.waitEvent("r", hung.Seq, "turn.started", nil)
	behind := h.submit("r", "two")
	if err := h.m.Cancel(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	if d := h.turnEnded("r", behind); d["outcome"] != OutcomeSettled {
		t.Fatalf("the message behind a turn: %v", d)
	}
	if got := batchOf(behind); !slices.Equal(got, apart) {
		t.Fatalf("a message behind a running turn was committed as %v, want %v", got, apart)
	}

	budgeted := h.submit("b", "one")
	if d := h.turnEnded("b", budgeted); d["outcome"] != OutcomeSettled {
		t.Fatalf("the budgeted room's turn: %v", d)
	}
	if got := batchOf(budgeted); !slices.Equal(got, apart) {
		t.Fatalf("a budgeted room's message was committed as %v, want %v", got, apart)
	}
	turnOrder(t, h.log("r"))
	checkMessageEnds(t, h.log("r"))
}

// TestRefusedStartInTheAcceptingWriteRefusesTheMessage: when the write
// that would accept a message to an idle room and start its turn fails,
// the message is refused (no 202, nothing of it recorded) and the room
// is left as it was: the next message runs.
func TestRefusedStartInTheAcceptingWriteRefusesTheMessage(t *testing.T) {
	fs := &faultStore{changed: make(chan struct{}, 1)}
	h := newHarnessWith(t, Options{}, func(s Store) Store { fs.Store = s; return fs })
	first := h.submit("r", "one")
	h.turnEnded("r", first)
	// Idle: a message to a room whose worker is still winding down after
	// turn.ended is queued for that worker, not started in its accepting
	// write (what this test refuses).
	r, _ := h.m.room("r")
	waitFor(t, "the room's worker stops", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return !r.working && !r.ending && r.turn == nil
	})
	fs.mu.Lock()
	fs.armed = true
	fs.mu.Unlock()
	if _, err := h.m.Submit(t.Context(), "r", Message{Text: "refused", Sender: "ann"}); !errors.Is(err, errDiskFull) {
		t.Fatalf("submit while the store refuses the turn's start: %v", err)
	}
	fs.free()
	next := h.submit("r", "two")
	if d := h.turnEnded("r", next); d["outcome"] != OutcomeSettled {
		t.Fatalf("the message after the refused one: %v", d)
	}
	l := h.log("r")
	for i, ev := range l.evs {
		if strings.Contains(string(ev.Data), "refused") {
			t.Fatalf("the refused message is in the log: %s %v", ev.Type, l.data[i])
		}
	}
	turnOrder(t, l)
	ends := checkMessageEnds(t, l)
	if len(ends) != 2 {
		t.Fatalf("messages ended: %v", ends)
	}
	st, err := h.m.State(t.Context(), "r")
	if err != nil {
		t.Fatal(err)
	}
	if st.Turn != nil || st.Queued != 0 {
		t.Fatalf("the room after: turn %v, %d queued", st.Turn, st.Queued)
	}
}
