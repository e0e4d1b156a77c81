package room

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/record"
)

// propTransport's agents run in processes that outlive a Manager (as the
// process daemon's): a planned restart lets go of them and the next
// Manager attaches them, continuing the run they have open. The test ends
// their runs (settled or failed), and may make a delivery race its run's
// end: the agent ends the run as the steer or follow_up reaches it and
// answers the delivery (accepting or refusing it) only once a host has
// read the run's end.
type propTransport struct {
	mu     sync.Mutex
	procs  map[string]*propProc
	n      int
	starts int
	runs   []*propRun
	// race is how the next delivery races its run's end: "" (it does
	// not), "ok" or "refuse".
	race string
}

type propProc struct {
	id   string
	run  *propRun // the last run (open while end is "")
	gone bool
}

type propRun struct {
	text      string   // the prompt
	delivered []string // steered or followed up into it, accepted
	end       string   // "", "settled", "failed", "aborted"
	done      chan struct{}
	seen      chan struct{} // a host read its end
	seenOnce  sync.Once
}

func newPropTransport() *propTransport { return &propTransport{procs: map[string]*propProc{}} }

func (f *propTransport) Start(ctx context.Context, spec AgentSpec) (Agent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	f.starts++
	p := &propProc{id: fmt.Sprintf("p%d", f.n)}
	f.procs[p.id] = p
	return f.agentLocked(p, spec, nil), nil
}

func (f *propTransport) Attach(ctx context.Context, spec AgentSpec, at Attachment) (Detachable, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.procs[at.Handle]
	if p == nil || p.gone {
		return nil, errors.New("no such process")
	}
	var adopt *propRun
	if at.RunOpen {
		adopt = p.run
	}
	return f.agentLocked(p, spec, adopt), nil
}

func (f *propTransport) agentLocked(p *propProc, spec AgentSpec, adopt *propRun) *propAgent {
	sess := spec.SessionID // resumed as it is: no transcript joins a prompt
	if sess == "" {
		sess = "s-" + p.id
	}
	return &propAgent{f: f, p: p, spec: spec, session: sess, adopt: adopt, stop: make(chan struct{})}
}

// endRun ends the open run of every process as the agent would (end:
// "settled" or "failed"); false when none is open.
func (f *propTransport) endRun(end string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	ended := false
	for _, p := range f.procs {
		if r := p.run; r != nil && r.end == "" && !p.gone {
			r.end = end
			close(r.done)
			ended = true
		}
	}
	return ended
}

type propAgent struct {
	f       *propTransport
	p       *propProc
	spec    AgentSpec
	session string
	adopt   *propRun
	stop    chan struct{}
	once    sync.Once
}

func (a *propAgent) SessionID() string     { return a.session }
func (a *propAgent) Handle() string        { return a.p.id }
func (a *propAgent) Done() <-chan struct{} { return a.stop }

func (a *propAgent) Run(ctx context.Context, text string) (TurnResult, error) {
	a.f.mu.Lock()
	if a.p.gone {
		a.f.mu.Unlock()
		return TurnResult{}, errors.New("the agent is gone")
	}
	r := &propRun{text: text, done: make(chan struct{}), seen: make(chan struct{})}
	a.p.run = r
	a.f.runs = append(a.f.runs, r)
	a.f.mu.Unlock()
	// Written once the run is open: the test ends the runs it finds when
	// the room's log grows.
	a.spec.Handler.Event(AgentEvent{Kind: KindText, Text: "working"})
	return a.wait(ctx, r)
}

func (a *propAgent) Continue(ctx context.Context) (TurnResult, error) {
	if a.adopt == nil {
		return TurnResult{}, errors.New("no run to continue")
	}
	return a.wait(ctx, a.adopt)
}

// wait returns the run's end as the agent reports it. A turn cancelled
// aborts the run (the RPC agent's judge sends abort), unless the agent
// was let go of (Detach: the run goes on for the next host).
func (a *propAgent) wait(ctx context.Context, r *propRun) (TurnResult, error) {
	select {
	case <-r.done:
	case <-a.stop:
		return TurnResult{}, errors.New("let go of")
	case <-ctx.Done():
		select {
		case <-a.stop:
			return TurnResult{}, errors.New("let go of")
		default:
		}
		a.f.mu.Lock()
		if r.end == "" {
			r.end = "aborted"
			close(r.done)
		}
		a.f.mu.Unlock()
	}
	a.f.mu.Lock()
	end := r.end
	a.f.mu.Unlock()
	r.seenOnce.Do(func() { close(r.seen) })
	switch end {
	case "settled":
		return TurnResult{Text: "ok", Usage: record.Usage{OutputTokens: 1}}, nil
	case "failed":
		return TurnResult{Usage: record.Usage{OutputTokens: 1}}, errors.New("the model failed")
	}
	return TurnResult{}, errors.New("the agent aborted the turn")
}

func (a *propAgent) Steer(ctx context.Context, text string) error {
	a.f.mu.Lock()
	r := a.p.run
	if a.p.gone || r == nil || r.end != "" {
		a.f.mu.Unlock()
		return errors.New("no run to steer")
	}
	race := a.f.race
	a.f.race = ""
	if race == "" {
		r.delivered = append(r.delivered, text)
		a.f.mu.Unlock()
		return nil
	}
	// The run ends as the delivery reaches the agent; the answer comes
	// once a host has read that end.
	r.end = "settled"
	close(r.done)
	a.f.mu.Unlock()
	select {
	case <-r.seen:
	case <-ctx.Done():
		return ctx.Err()
	}
	if race == "refuse" {
		return errors.New("no run to follow up")
	}
	a.f.mu.Lock()
	r.delivered = append(r.delivered, text)
	a.f.mu.Unlock()
	return nil
}

func (a *propAgent) FollowUp(ctx context.Context, text string) error { return a.Steer(ctx, text) }

func (a *propAgent) Detach() error {
	a.once.Do(func() { close(a.stop) })
	return nil
}

func (a *propAgent) Close(ctx context.Context) (json.RawMessage, error) {
	a.once.Do(func() { close(a.stop) })
	a.f.mu.Lock()
	defer a.f.mu.Unlock()
	a.p.gone = true
	if r := a.p.run; r != nil && r.end == "" {
		r.end = "aborted"
		close(r.done)
	}
	return json.RawMessage(`{"processes":[]}`), nil
}

// The property test's bounds: seeds from propSeedEnv (default 1), as many
// as propRunsEnv says (default propRuns), each of propSteps random steps.
const (
	propSeedEnv = "AGENTHOST_PROPERTY_SEED"
	propRunsEnv = "AGENTHOST_PROPERTY_RUNS"
	propRuns    = 8
	propSteps   = 60
)

// Issue 47's property: under random interleavings of deliveries (queue,
// steer, follow_up, some racing their turn's end), turn ends (settled and
// failed), cancels, releases, planned restarts (Detach, the next Manager
// attaching the agent) and orderly ones (Close), every accepted message
// has exactly one message.ended, every turn exactly one turn.ended with
// its true outcome (the one its agent gave it; cancelled for one it never
// had, or that was cancelled), each message's text reaches the agent at
// most once (exactly once for one that settled), and every room state
// GET read matches its log at its last_seq. Seeded and reproducible in
// its steps (the scheduler's interleavings vary); set
// AGENTHOST_PROPERTY_RUNS for a long run and AGENTHOST_PROPERTY_SEED to
// repeat one.
func TestExactlyOnceProperty(t *testing.T) {
	seed, runs := int64(1), propRuns
	if s := os.Getenv(propSeedEnv); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", propSeedEnv, err)
		}
		seed = v
	}
	if s := os.Getenv(propRunsEnv); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("%s: %q", propRunsEnv, s)
		}
		runs = v
	}
	seen := map[string]int{}
	for i := range int64(runs) {
		t.Run(fmt.Sprintf("seed=%d", seed+i), func(t *testing.T) {
			for k, v := range propertyRun(t, seed+i, propSteps) {
				seen[k] += v
			}
		})
	}
	t.Logf("%d runs: %v", runs, seen)
}

// stateSample is a room state GET read.
type stateSample struct {
	seq, turns, out int64
}

// propertyRun runs one seed's steps and checks the room; it returns
// what the room went through, counted.
func propertyRun(t *testing.T, seed int64, steps int) map[string]int {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x47))
	dir := t.TempDir()
	db, err := store.Open(t.Context(), filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	f := newPropTransport()
	root := filepath.Join(dir, "rooms")
	start := func() *Manager {
		m, err := New(Options{Store: SQLite(db), Transport: f, Root: root})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := start()
	const room = "p"
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		samples []stateSample
		texts   = map[string]string{} // message id -> its text
		trace   []string
	)
	ctx := t.Context()
	submit := func(m *Manager, text, delivery string) {
		defer wg.Done()
		acc, err := m.Submit(ctx, room, Message{Text: text, Delivery: delivery})
		if errors.Is(err, ErrQueueFull) {
			return
		}
		if err != nil {
			t.Errorf("submit %s: %v", text, err)
			return
		}
		mu.Lock()
		texts[acc.ID] = text
		mu.Unlock()
	}
	sample := func(m *Manager) {
		defer wg.Done()
		st, err := m.State(ctx, room)
		if errors.Is(err, ErrNotFound) {
			return
		}
		if err != nil {
			t.Errorf("state: %v", err)
			return
		}
		mu.Lock()
		samples = append(samples, stateSample{st.LastSeq, st.Turns, st.Usage.OutputTokens})
		mu.Unlock()
	}
	restart := func(planned bool) {
		wg.Wait()
		if planned {
			if err := detach(m); err != nil {
				t.Fatal(err)
			}
		} else if err := shut(m); err != nil {
			t.Fatal(err)
		}
		m = start()
	}
	n := 0
	for range steps {
		op := rng.IntN(100)
		trace = append(trace, strconv.Itoa(op))
		switch {
		case op < 28:
			n++
			wg.Add(1)
			go submit(m, fmt.Sprintf("m%d", n), DeliverQueue)
		case op < 44:
			n++
			delivery := DeliverSteer
			if rng.IntN(2) == 0 {
				delivery = DeliverFollowUp
			}
			if k := rng.IntN(3); k > 0 {
				f.mu.Lock()
				f.race = []string{"", "ok", "refuse"}[k]
				f.mu.Unlock()
			}
			wg.Add(1)
			go submit(m, fmt.Sprintf("m%d", n), delivery)
		case op < 60:
			f.endRun("settled")
		case op < 66:
			f.endRun("failed")
		case op < 72:
			wg.Add(1)
			go func(m *Manager) {
				defer wg.Done()
				if err := m.Cancel(ctx, room); err != nil && !errors.Is(err, ErrNoTurn) && !errors.Is(err, ErrNotFound) {
					t.Errorf("cancel: %v", err)
				}
			}(m)
		case op < 78:
			wg.Add(1)
			go func(m *Manager) {
				defer wg.Done()
				if err := m.Release(ctx, room); err != nil {
					t.Errorf("release: %v", err)
				}
			}(m)
		case op < 86:
			wg.Add(1)
			go sample(m)
		case op < 94:
			restart(true)
		default:
			restart(false)
		}
		if rng.IntN(4) == 0 {
			wg.Wait() // now and then the ops settle before the next
		}
	}
	wg.Wait()
	quiesce(t, db, f, room)
	wg.Add(1)
	sample(m)
	if err := shut(m); err != nil {
		t.Fatal(err)
	}
	if t.Failed() {
		return nil
	}
	return checkProperty(t, db, f, room, texts, samples, trace)
}

// quiesce ends the agents' runs until every accepted message has ended.
func quiesce(t *testing.T, db *store.DB, f *propTransport, room string) {
	t.Helper()
	watch, stop := db.Watch(room)
	defer stop()
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	for {
		f.endRun("settled")
		evs, err := db.Events(t.Context(), room, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		open := map[string]bool{}
		for _, ev := range evs {
			switch ev.Type {
			case "message.accepted":
				open[field(ev, "message_id")] = true
			case "message.ended":
				delete(open, field(ev, "message_id"))
			}
		}
		if len(evs) > 0 && len(open) == 0 {
			if turns, _ := db.OpenTurns(t.Context()); len(turns) == 0 {
				return
			}
		}
		select {
		case <-watch:
		case <-deadline.C:
			t.Fatalf("the room did not settle: messages %v never ended", slices.Sorted(func(yield func(string) bool) {
				for id := range open {
					if !yield(id) {
						return
					}
				}
			}))
		}
	}
}

func checkProperty(t *testing.T, db *store.DB, f *propTransport, room string, texts map[string]string, samples []stateSample, trace []string) map[string]int {
	t.Helper()
	seen := map[string]int{}
	defer func() {
		if t.Failed() {
			t.Logf("steps: %s", strings.Join(trace, " "))
		}
	}()
	l := readExactLog(t, db, room)
	l.allEnded(t)
	h := &harness{t: t, db: db}
	checkMessageEnds(t, h.log(room))
	byText := map[string]string{}
	for id, text := range texts {
		byText[text] = id
	}
	if len(byText) != len(l.accepted) {
		t.Fatalf("%d messages accepted, the log has %d", len(byText), len(l.accepted))
	}
	// What reached the agent, by message; the runs by the turn they ran.
	reached := map[string]int{}
	runOf := map[string]*propRun{} // turn id -> its run
	f.mu.Lock()
	runs := slices.Clone(f.runs)
	f.mu.Unlock()
	for _, r := range runs {
		if r.end == "" {
			t.Fatalf("a run is still open: %q", r.text)
		}
		words := strings.Fields(r.text)
		for _, w := range append(words, r.delivered...) {
			reached[w]++
		}
		id := byText[words[0]]
		tids := l.turnsOf[id]
		if len(tids) == 0 {
			t.Fatalf("the agent ran %q, which no turn started", r.text)
		}
		tid := tids[len(tids)-1] // earlier ones ended before the prompt (queued again)
		if runOf[tid] != nil {
			t.Fatalf("turn %s ran twice", tid)
		}
		runOf[tid] = r
		want := map[string]string{"settled": OutcomeSettled, "failed": OutcomeFailed, "aborted": OutcomeCancelled}[r.end]
		got := l.turnEnd[tid]
		if got["outcome"] != want && r.end == "failed" && got["outcome"] == OutcomeCancelled {
			// The agent failed as the turn was cancelled (by a person or
			// the host's stop): which came first is not told apart.
			want = OutcomeCancelled
		}
		if got["outcome"] != want {
			t.Fatalf("turn %s (%q): the agent's run ended %s, the room recorded %v", tid, r.text, r.end, got)
		}
		// Those steered, followed up or joined to the prompt end with it.
		for _, w := range append(words[1:], r.delivered...) {
			if e := l.msgEnd[byText[w]]; e["turn_id"] != tid || e["outcome"] != want {
				t.Fatalf("message %q, delivered into turn %s (%s), ended %v", w, tid, want, e)
			}
		}
	}
	for text, k := range reached {
		if k > 1 {
			t.Fatalf("message %q reached the agent %d times", text, k)
		}
	}
	for _, id := range l.accepted {
		e := l.msgEnd[id]
		if r, _ := e["reason"].(string); r == "host restarted" {
			t.Fatalf("message %s ended %v: no host crashed", id, e)
		}
		if e["outcome"] == OutcomeSettled && reached[texts[id]] != 1 {
			t.Fatalf("message %s (%q) settled, but reached the agent %d times", id, texts[id], reached[texts[id]])
		}
	}
	for tid, e := range l.turnEnd {
		if out := e["outcome"]; runOf[tid] == nil && out != OutcomeCancelled {
			t.Fatalf("turn %s never reached the agent, but ended %v", tid, e)
		}
	}
	msgs, err := db.Messages(t.Context(), room, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range msgs {
		if e := l.msgEnd[msg.ID]; msg.Status != record.MessageEnded || msg.Outcome != e["outcome"] {
			t.Fatalf("message %s's record: %s %s, its message.ended %v", msg.ID, msg.Status, msg.Outcome, e)
		}
	}
	// Every state GET read agrees with the log at its last_seq.
	ends := make([]int64, 0, len(l.turnSeq))
	out := map[int64]int64{}
	for tid, seq := range l.turnSeq {
		ends = append(ends, seq)
		u, _ := l.turnEnd[tid]["usage"].(map[string]any)
		v, _ := u["output_tokens"].(float64)
		out[seq] = int64(v)
	}
	slices.Sort(ends)
	for _, s := range samples {
		var turns, tokens int64
		for _, seq := range ends {
			if seq > s.seq {
				break
			}
			turns++
			tokens += out[seq]
		}
		if s.turns != turns || s.out != tokens {
			t.Fatalf("a state at last_seq %d: %d turns, %d output tokens; the log up to it: %d and %d", s.seq, s.turns, s.out, turns, tokens)
		}
	}
	if len(samples) == 0 || samples[len(samples)-1].turns != int64(len(ends)) {
		t.Fatalf("the last state %v, turns ended %d", samples, len(ends))
	}
	seen["states"] = len(samples)
	for _, ev := range l.evs {
		switch d := string(ev.Data); {
		case ev.Type == "agent.attached":
			seen["attached"]++
		case ev.Type == "message.delivered":
			seen["delivered"]++
		case ev.Type == "message.queued" && strings.Contains(d, `"recovered":true`):
			seen["queued again"]++
		case ev.Type == "turn.ended":
			seen[field(ev, "outcome")+" "+field(ev, "reason")]++
		}
	}
	for _, r := range runs {
		seen["runs"]++
		seen["run "+r.end]++
	}
	return seen
}
