package natsroom

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/agenthost/agenthost/room"
)

// fakeTransport starts fakeAgents, which act on the prompt's text:
//
//	hang          run until the turn's context ends
//	sleep:D       run for D, then answer
//	approve:TOOL  ask for approval, answer "allowed" or "denied"
//	anything else answered "ok: <text>"
//
// With a journal file set, every agent appends "start|end NODE ROOM
// UNIXNANO" lines to it (O_APPEND: whole lines from many processes), so a
// test sees from the agents' own side where turns ran.
//
// The agents are room.LeaseBound, as serve's are through custody's fuse:
// held to a deadline, an agent is frozen past it (it starts, answers and
// ends nothing until a later hold thaws it), and a turn cut while it was
// frozen ended, as the journal tells, at the deadline.
type fakeTransport struct {
	node    string
	journal string

	mu   sync.Mutex
	n    int
	live map[*fakeAgent]bool
}

func newFakeTransport(node, journal string) *fakeTransport {
	return &fakeTransport{node: node, journal: journal, live: map[*fakeAgent]bool{}}
}

func (f *fakeTransport) Start(ctx context.Context, spec room.AgentSpec) (room.Agent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	a := &fakeAgent{f: f, spec: spec, session: fmt.Sprintf("%s-sess-%d", f.node, f.n), done: make(chan struct{})}
	f.live[a] = true
	return a, nil
}

func (f *fakeTransport) record(what, rm string, at time.Time) {
	if f.journal == "" {
		return
	}
	line := fmt.Sprintf("%s %s %s %d\n", what, f.node, rm, at.UnixNano())
	fh, err := os.OpenFile(f.journal, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	_, _ = fh.WriteString(line)
	_ = fh.Close()
}

type fakeAgent struct {
	f       *fakeTransport
	spec    room.AgentSpec
	session string
	once    sync.Once
	done    chan struct{}

	holdMu sync.Mutex
	hold   time.Time     // frozen from here on (zero: not held)
	thawed chan struct{} // closed and replaced by each hold
}

var _ room.LeaseBound = (*fakeAgent)(nil)

// HoldUntil implements room.LeaseBound (the fuse, emulated).
func (a *fakeAgent) HoldUntil(deadline time.Time) error {
	a.holdMu.Lock()
	defer a.holdMu.Unlock()
	a.hold = deadline
	if a.thawed != nil {
		close(a.thawed)
	}
	a.thawed = make(chan struct{})
	return nil
}

// Kill implements room.LeaseBound.
func (a *fakeAgent) Kill() error {
	_, err := a.Close(context.Background())
	return err
}

// frozenAt is when the agent froze (zero while it may act), and a channel
// closed by the next hold.
func (a *fakeAgent) frozenAt() (time.Time, <-chan struct{}) {
	a.holdMu.Lock()
	defer a.holdMu.Unlock()
	if a.hold.IsZero() || time.Now().Before(a.hold) {
		return time.Time{}, nil
	}
	return a.hold, a.thawed
}

// act waits, while the agent is frozen, for a hold that thaws it (or its
// end): a frozen agent does nothing.
func (a *fakeAgent) act(ctx context.Context) {
	for {
		at, thawed := a.frozenAt()
		if at.IsZero() {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-a.done:
			return
		case <-thawed:
		}
	}
}

// lastActed is when the agent last acted: now, or when it froze.
func (a *fakeAgent) lastActed() time.Time {
	if at, _ := a.frozenAt(); !at.IsZero() {
		return at
	}
	return time.Now()
}

func (a *fakeAgent) SessionID() string { return a.session }

func (a *fakeAgent) Run(ctx context.Context, text string) (room.TurnResult, error) {
	a.act(ctx)
	a.f.record("start", a.spec.Room, time.Now())
	defer func() { a.f.record("end", a.spec.Room, a.lastActed()) }()
	defer a.act(ctx) // (an answer waits for the thaw)
	h := a.spec.Handler
	h.Event(room.AgentEvent{Kind: room.KindActivity})
	if i := strings.LastIndex(text, "\n\n"); i >= 0 {
		text = text[i+2:] // a transcript may come first
	}
	switch {
	case text == "hang":
		select {
		case <-ctx.Done():
			return room.TurnResult{}, ctx.Err()
		case <-a.done:
			return room.TurnResult{}, errors.New("agent closed")
		}
	case strings.HasPrefix(text, "sleep:"):
		d, _ := time.ParseDuration(strings.TrimPrefix(text, "sleep:"))
		select {
		case <-ctx.Done():
			return room.TurnResult{}, ctx.Err()
		case <-a.done:
			return room.TurnResult{}, errors.New("agent closed")
		case <-time.After(d):
		}
	case strings.HasPrefix(text, "approve:"):
		ok := h.Approve(ctx, room.ApprovalRequest{Tool: strings.TrimPrefix(text, "approve:"), Input: "ls", Options: []string{"Approve", "Deny"}})
		if ctx.Err() != nil {
			return room.TurnResult{}, ctx.Err()
		}
		if ok {
			return room.TurnResult{Text: "allowed"}, nil
		}
		return room.TurnResult{Text: "denied"}, nil
	}
	h.Event(room.AgentEvent{Kind: room.KindText, Text: "ok: " + text})
	return room.TurnResult{Text: "ok: " + text}, nil
}

func (a *fakeAgent) Steer(ctx context.Context, text string) error    { return nil }
func (a *fakeAgent) FollowUp(ctx context.Context, text string) error { return nil }

func (a *fakeAgent) Close(ctx context.Context) (json.RawMessage, error) {
	a.once.Do(func() {
		close(a.done)
		a.f.mu.Lock()
		delete(a.f.live, a)
		a.f.mu.Unlock()
	})
	return json.RawMessage(`{"processes":[]}`), nil
}

func (a *fakeAgent) Done() <-chan struct{} { return a.done }
