package room

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/store"
)

// daemonTransport models agents kept by a process daemon: each runs in a
// daemonProc that outlives the Manager driving it, its output a log of
// frames addressed by offset. The test writes the frames (emit, end);
// agents read them from their offset on, as the real transport tails the
// output file.
type daemonTransport struct {
	prompted chan struct{} // a Run waits for its run's end
	gate     chan struct{} // if set, Start waits for it (or its ctx)
	// steerGate, if set, holds every Steer and FollowUp until it is
	// closed; steering receives a value as one begins to wait. A Steer
	// whose agent was let go of meanwhile fails, as the RPC client's
	// call does when Detach closes it.
	steerGate, steering chan struct{}
	mu                  sync.Mutex
	procs               map[string]*daemonProc
	agents              []*daemonAgent
	steered             []string // what Steer and FollowUp were given
	n                   int
}

type frame struct {
	text string // a text delta, or the run's final text when end
	end  bool
	ask  bool // an approval request for tool text
}

type daemonProc struct {
	id      string
	mu      sync.Mutex
	frames  []frame // frame i ends at offset i+1
	grew    chan struct{}
	gone    bool
	allowed int // approvals the agent got
}

func newDaemonTransport() *daemonTransport {
	return &daemonTransport{procs: map[string]*daemonProc{}, prompted: make(chan struct{}, 8)}
}

func (d *daemonTransport) Start(ctx context.Context, spec AgentSpec) (Agent, error) {
	if d.gate != nil {
		select {
		case <-d.gate:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
	d.mu.Lock()
	d.n++
	p := &daemonProc{id: fmt.Sprintf("p%d", d.n), grew: make(chan struct{})}
	d.procs[p.id] = p
	a := newDaemonAgent(d, p, spec, 0, false)
	d.agents = append(d.agents, a)
	d.mu.Unlock()
	return a, nil
}

func (d *daemonTransport) Attach(ctx context.Context, spec AgentSpec, at Attachment) (Detachable, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.procs[at.Handle]
	if p == nil {
		return nil, errors.New("no such process")
	}
	a := newDaemonAgent(d, p, spec, at.Offset, at.RunOpen)
	d.agents = append(d.agents, a)
	return a, nil
}

// agent is the n-th agent started or attached (from 0).
func (d *daemonTransport) agent(n int) *daemonAgent {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.agents[n]
}

func (d *daemonTransport) proc(id string) *daemonProc {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.procs[id]
}

func (d *daemonTransport) kill(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.procs, id)
}

func (p *daemonProc) emit(f frame) {
	p.mu.Lock()
	p.frames = append(p.frames, f)
	close(p.grew)
	p.grew = make(chan struct{})
	p.mu.Unlock()
}

// daemonAgent reads its process's frames from an offset, as the client of
// a pipe process of the daemon does.
type daemonAgent struct {
	d    *daemonTransport
	p    *daemonProc
	spec AgentSpec

	mu      sync.Mutex
	runEnd  chan TurnResult // the open run's end, once read
	adopted chan TurnResult // the run open when attached (Continue's)
	stop    chan struct{}
	stopped sync.Once
	wg      sync.WaitGroup
}

func newDaemonAgent(d *daemonTransport, p *daemonProc, spec AgentSpec, offset int64, runOpen bool) *daemonAgent {
	a := &daemonAgent{d: d, p: p, spec: spec, stop: make(chan struct{})}
	if runOpen {
		a.runEnd = make(chan TurnResult, 1)
		a.adopted = a.runEnd
	}
	a.wg.Add(1)
	go a.read(offset)
	return a
}

func (a *daemonAgent) read(at int64) {
	defer a.wg.Done()
	for {
		a.p.mu.Lock()
		grew := a.p.grew
		var next []frame
		if int(at) < len(a.p.frames) {
			next = append(next, a.p.frames[at:]...)
		}
		a.p.mu.Unlock()
		for _, f := range next {
			at++
			if f.end {
				a.mu.Lock()
				ch := a.runEnd
				a.runEnd = nil
				a.mu.Unlock()
				if ch != nil {
					ch <- TurnResult{Text: f.text, Offset: at}
				}
				continue
			}
			if f.ask {
				// The agent waits for the answer; others frames may follow.
				req := ApprovalRequest{Tool: f.text, Input: "x", Start: at - 1, Offset: at}
				a.spec.Handler.Event(AgentEvent{Kind: KindDialog, Start: req.Start, Offset: req.Offset})
				a.wg.Add(1)
				go func() {
					defer a.wg.Done()
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					go func() {
						select {
						case <-a.stop:
							cancel()
						case <-ctx.Done():
						}
					}()
					if a.spec.Handler.Approve(ctx, req) {
						a.p.mu.Lock()
						a.p.allowed++
						a.p.mu.Unlock()
					}
				}()
				continue
			}
			a.spec.Handler.Event(AgentEvent{Kind: KindText, Text: f.text, Offset: at})
		}
		select {
		case <-grew:
		case <-a.stop:
			return
		}
	}
}

func (a *daemonAgent) SessionID() string { return "s-" + a.p.id }
func (a *daemonAgent) Handle() string    { return a.p.id }

func (a *daemonAgent) Run(ctx context.Context, text string) (TurnResult, error) {
	ch := make(chan TurnResult, 1)
	a.mu.Lock()
	a.runEnd = ch
	a.mu.Unlock()
	a.d.prompted <- struct{}{}
	return a.wait(ctx, ch)
}

func (a *daemonAgent) Continue(ctx context.Context) (TurnResult, error) {
	a.mu.Lock()
	ch := a.adopted
	a.mu.Unlock()
	if ch == nil {
		return TurnResult{}, errors.New("no run")
	}
	return a.wait(ctx, ch)
}

func (a *daemonAgent) wait(ctx context.Context, ch chan TurnResult) (TurnResult, error) {
	select {
	case res := <-ch:
		return res, nil
	case <-ctx.Done():
		return TurnResult{}, ctx.Err()
	case <-a.stop:
		return TurnResult{}, errors.New("let go of")
	}
}

func (a *daemonAgent) Steer(ctx context.Context, text string) error {
	a.d.mu.Lock()
	a.d.steered = append(a.d.steered, text) // written to the agent
	gate, steering := a.d.steerGate, a.d.steering
	a.d.mu.Unlock()
	if gate == nil {
		return nil
	}
	if steering != nil {
		steering <- struct{}{}
	}
	select {
	case <-gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-a.stop:
		return errors.New("rpc: client closed") // its answer was never read
	default:
		return nil
	}
}

func (a *daemonAgent) FollowUp(ctx context.Context, text string) error { return a.Steer(ctx, text) }
func (a *daemonAgent) Done() <-chan struct{}                           { return a.stop }

func (a *daemonAgent) Detach() error {
	a.stopped.Do(func() { close(a.stop) })
	a.wg.Wait()
	return nil
}

func (a *daemonAgent) Close(ctx context.Context) (json.RawMessage, error) {
	_ = a.Detach()
	a.p.mu.Lock()
	a.p.gone = true
	a.p.mu.Unlock()
	return json.RawMessage(`{"processes":[]}`), nil
}

// waitPrompted waits until an agent runs a prompt.
func (d *daemonTransport) waitPrompted(t *testing.T) {
	t.Helper()
	select {
	case <-d.prompted:
	case <-time.After(30 * time.Second):
		t.Fatal("no prompt reached the agent")
	}
}

// managerOn starts a Manager on db with the daemon transport.
func managerOn(t *testing.T, db *store.DB, root string, d *daemonTransport) *Manager {
	t.Helper()
	m, err := New(Options{Store: SQLite(db), Transport: d, Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return m
}

// deltas is the room's text.delta texts in order.
func deltas(t *testing.T, db *store.DB, room string) []string {
	t.Helper()
	evs, err := db.Events(t.Context(), room, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range evs {
		if ev.Type == KindText {
			out = append(out, field(ev, "text"))
		}
	}
	return out
}

// A planned restart mid-turn: the manager lets go of the agent (Detach),
// the next attaches it at the recorded offset and continues the turn; every
// event is recorded exactly once, including those read while letting go.
func TestDetachThenAttachContinuesTheTurn(t *testing.T) {
	dir := t.TempDir()
	db, err := store.Open(t.Context(), filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d := newDaemonTransport()
	root := filepath.Join(dir, "rooms")
	m1 := managerOn(t, db, root, d)
	h := &harness{t: t, db: db, m: m1}
	acc := h.submit("r", "go")
	d.waitPrompted(t)
	p := d.proc("p1")
	for i := 1; i <= 3; i++ {
		p.emit(frame{text: fmt.Sprint(i)})
	}
	h.waitEvent("r", acc.Seq, KindText, func(d map[string]any) bool { return d["text"] == "3" })
	// Frames in flight while the host lets go: written once, by one host.
	p.emit(frame{text: "4"})
	p.emit(frame{text: "5"})
	if err := detach(m1); err != nil {
		t.Fatal(err)
	}
	if turns, _ := db.OpenTurns(t.Context()); len(turns) != 1 {
		t.Fatalf("open turns after Detach: %d, want the running one", len(turns))
	}
	p.emit(frame{text: "6"})
	m2 := managerOn(t, db, root, d)
	defer shut(m2)
	h.m = m2
	p.emit(frame{text: "7"})
	p.emit(frame{text: "done", end: true})
	end := h.turnEnded("r", acc)
	if end["outcome"] != OutcomeSettled || end["text"] != "done" {
		t.Fatalf("turn ended %v", end)
	}
	if got := fmt.Sprint(deltas(t, db, "r")); got != "[1 2 3 4 5 6 7]" {
		t.Fatalf("text deltas %s, want each once in order", got)
	}
	evs, _ := db.Events(t.Context(), "r", 0, 0)
	starts, attaches := 0, 0
	for _, ev := range evs {
		switch ev.Type {
		case "agent.started":
			starts++
		case "agent.attached":
			attaches++
		}
	}
	if starts != 1 || attaches != 1 {
		t.Fatalf("agent.started %d, agent.attached %d; want 1 and 1", starts, attaches)
	}
	if p.gone {
		t.Fatal("the agent was stopped across the restart")
	}
	// The room goes on on the same agent.
	acc2 := h.submit("r", "again")
	d.waitPrompted(t)
	p.emit(frame{text: "fine", end: true})
	if end := h.turnEnded("r", acc2); end["text"] != "fine" {
		t.Fatalf("second turn %v", end)
	}
	if d.n != 1 {
		t.Fatalf("%d agents started, want 1", d.n)
	}
}

// An agent gone across the restart: the room forgets it and recovers as
// after a crash (the turn failed, a fresh start through the ladder).
func TestAttachOfAGoneAgentRecovers(t *testing.T) {
	dir := t.TempDir()
	db, err := store.Open(t.Context(), filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d := newDaemonTransport()
	root := filepath.Join(dir, "rooms")
	m1 := managerOn(t, db, root, d)
	h := &harness{t: t, db: db, m: m1}
	acc := h.submit("r", "go")
	d.waitPrompted(t)
	if err := detach(m1); err != nil {
		t.Fatal(err)
	}
	d.kill("p1")
	m2 := managerOn(t, db, root, d)
	defer shut(m2)
	h.m = m2
	end := h.turnEnded("r", acc)
	if end["outcome"] != OutcomeFailed || end["reason"] != "host restarted" {
		t.Fatalf("turn ended %v", end)
	}
	h.waitEvent("r", 0, "agent.released", func(d map[string]any) bool {
		r, _ := d["reason"].(string)
		return len(r) > 0 && r[:len("not attached")] == "not attached"
	})
	if rs, _ := db.AgentRooms(t.Context()); len(rs) != 0 {
		t.Fatalf("the gone agent's handle is still recorded: %+v", rs)
	}
	acc2 := h.submit("r", "again")
	d.waitPrompted(t)
	d.proc("p2").emit(frame{text: "fresh", end: true})
	if end := h.turnEnded("r", acc2); end["text"] != "fresh" {
		t.Fatalf("second turn %v", end)
	}
}

// A planned restart while the turn's agent is still starting: the agent
// never had the prompt, so the turn ends cancelled and its message is
// queued again; the next host runs it.
func TestDetachBeforeThePromptQueuesTheMessageAgain(t *testing.T) {
	dir := t.TempDir()
	db, err := store.Open(t.Context(), filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d := newDaemonTransport()
	d.gate = make(chan struct{})
	root := filepath.Join(dir, "rooms")
	m1 := managerOn(t, db, root, d)
	h := &harness{t: t, db: db, m: m1}
	acc := h.submit("r", "go")
	h.waitEvent("r", acc.Seq, "turn.started", nil)
	if err := detach(m1); err != nil {
		t.Fatal(err)
	}
	end := h.turnEnded("r", acc)
	if end["outcome"] != OutcomeCancelled || end["reason"] != errRequeued.Error() {
		t.Fatalf("turn ended %v", end)
	}
	h.waitEvent("r", acc.Seq, "message.queued", func(d map[string]any) bool { return d["message_id"] == acc.ID && d["recovered"] == true })
	d.gate = nil
	m2 := managerOn(t, db, root, d)
	defer shut(m2)
	h.m = m2
	d.waitPrompted(t)
	d.proc("p1").emit(frame{text: "ran", end: true})
	ev := h.waitEvent("r", 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == acc.ID && d["outcome"] == OutcomeSettled })
	if field(ev, "text") != "ran" {
		t.Fatalf("the message's second turn: %s", ev.Data)
	}
}

// A restart while the agent waits on an approval, with events read after
// the request: the next host reads again from the request (not from past
// those events), takes the pending approval over (not asked twice), does
// not record those events again, and the decision reaches the agent.
func TestDetachDuringAnApprovalAsksAgainOnce(t *testing.T) {
	dir := t.TempDir()
	db, err := store.Open(t.Context(), filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d := newDaemonTransport()
	root := filepath.Join(dir, "rooms")
	m1 := managerOn(t, db, root, d)
	h := &harness{t: t, db: db, m: m1}
	acc := h.submit("r", "go")
	d.waitPrompted(t)
	p := d.proc("p1")
	p.emit(frame{text: "1"})
	p.emit(frame{text: "bash", ask: true})
	p.emit(frame{text: "3"})
	h.waitEvent("r", acc.Seq, "approval.requested", nil)
	h.waitEvent("r", acc.Seq, KindText, func(d map[string]any) bool { return d["text"] == "3" })
	if err := detach(m1); err != nil {
		t.Fatal(err)
	}
	if rec, _ := db.Room(t.Context(), "r"); rec.AgentOffset != 1 || rec.AgentSeen != 3 {
		t.Fatalf("recorded offset %d, seen %d: want 1 (the request's start) and 3", rec.AgentOffset, rec.AgentSeen)
	}
	m2 := managerOn(t, db, root, d)
	defer shut(m2)
	h.m = m2
	aps, err := db.Approvals(t.Context(), "r", true)
	if err != nil || len(aps) != 1 {
		t.Fatalf("pending approvals %d %v", len(aps), err)
	}
	if err := m2.Approve(t.Context(), "r", aps[0].ID, true); err != nil {
		t.Fatal(err)
	}
	h.waitEvent("r", 0, "approval.resolved", nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		p.mu.Lock()
		n := p.allowed
		p.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the decision did not reach the agent")
		}
		time.Sleep(5 * time.Millisecond) // the fake agent's counter: polled, bounded
	}
	p.emit(frame{text: "done", end: true})
	if end := h.turnEnded("r", acc); end["outcome"] != OutcomeSettled {
		t.Fatalf("turn ended %v", end)
	}
	requested := 0
	evs, _ := db.Events(t.Context(), "r", 0, 0)
	for _, ev := range evs {
		if ev.Type == "approval.requested" {
			requested++
		}
	}
	if requested != 1 {
		t.Fatalf("approval.requested %d times, want 1", requested)
	}
	if got := fmt.Sprint(deltas(t, db, "r")); got != "[1 3]" {
		t.Fatalf("text deltas %s, want each once", got)
	}
}
