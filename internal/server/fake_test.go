package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/agenthost/agenthost/room"
)

// A copy of room's fake transport (room/fake_test.go).

// fakeTransport starts fakeAgents. Its agents act on the prompt text:
//
//	hang          wait until the turn's context ends
//	fail          the turn fails
//	approve:TOOL  ask for approval, answer "allowed" or "denied"
//	ask:TITLE     ask a question, answer "answer: <text>" or "no answer"
//	write:NAME    write NAME in the workspace, answer "wrote NAME"
//	read:NAME     answer what NAME in the workspace holds (fail if missing)
//	anything else answered "ok: <text>", with one text delta
type fakeTransport struct {
	mu       sync.Mutex
	starts   []room.AgentSpec
	sessions map[string]bool // sessions that can be resumed
	// forget makes resumes fail (room.ErrSessionNotFound); silent makes them
	// quietly start a new session, as pi and omp do for a missing path.
	forget, silent bool
	prompts        []string
	live           map[*fakeAgent]bool
	n              int
	// closeGate, if set, holds every agent's Close until it is closed;
	// closing receives a value as a Close begins to wait (a purge then
	// holds its room).
	closeGate chan struct{}
	closing   chan struct{}
}

func newFakeTransport() *fakeTransport {
	return &fakeTransport{sessions: map[string]bool{}, live: map[*fakeAgent]bool{}}
}

func (f *fakeTransport) Start(ctx context.Context, spec room.AgentSpec) (room.Agent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts = append(f.starts, spec)
	sess := spec.SessionID
	if sess != "" && (f.forget || f.silent || !f.sessions[sess]) {
		if !f.silent {
			return nil, fmt.Errorf("%w: %s", room.ErrSessionNotFound, sess)
		}
		sess = ""
	}
	if sess == "" {
		f.n++
		sess = fmt.Sprintf("sess-%d", f.n)
		f.sessions[sess] = true
	}
	a := &fakeAgent{f: f, spec: spec, session: sess, done: make(chan struct{})}
	f.live[a] = true
	return a, nil
}

func (f *fakeTransport) resident() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live)
}

type fakeAgent struct {
	f       *fakeTransport
	spec    room.AgentSpec
	session string
	once    sync.Once
	done    chan struct{}
	mu      sync.Mutex
	steered []string
}

func (a *fakeAgent) SessionID() string { return a.session }

func (a *fakeAgent) Run(ctx context.Context, text string) (room.TurnResult, error) {
	a.f.mu.Lock()
	a.f.prompts = append(a.f.prompts, text)
	a.f.mu.Unlock()
	h := a.spec.Handler
	h.Event(room.AgentEvent{Kind: room.KindActivity})
	switch {
	case text == "hang":
		select {
		case <-ctx.Done():
			return room.TurnResult{}, ctx.Err()
		case <-a.done:
			return room.TurnResult{}, errors.New("agent closed")
		}
	case text == "fail":
		return room.TurnResult{}, errors.New("the model failed")
	case strings.HasPrefix(text, "read:"):
		b, err := os.ReadFile(filepath.Join(a.spec.Workspace, strings.TrimPrefix(text, "read:")))
		if err != nil {
			return room.TurnResult{}, err
		}
		return room.TurnResult{Text: string(b)}, nil
	case strings.HasPrefix(text, "write:"):
		// A file in the workspace, as a turn's edit.
		name := strings.TrimPrefix(text, "write:")
		if err := os.WriteFile(filepath.Join(a.spec.Workspace, name), []byte("hello\n"), 0o600); err != nil {
			return room.TurnResult{}, err
		}
		return room.TurnResult{Text: "wrote " + name}, nil
	case strings.HasPrefix(text, "approve:"):
		tool := strings.TrimPrefix(text, "approve:")
		h.Event(room.AgentEvent{Kind: room.KindToolStarted, Tool: tool, CallID: "c1", Input: "ls"})
		ok := h.Approve(ctx, room.ApprovalRequest{Tool: tool, Input: "ls", Options: []string{"Approve", "Deny"}})
		if ctx.Err() != nil {
			return room.TurnResult{}, ctx.Err()
		}
		if ok {
			return room.TurnResult{Text: "allowed"}, nil
		}
		return room.TurnResult{Text: "denied"}, nil
	case strings.HasPrefix(text, "ask:"):
		ans, ok := h.Ask(ctx, room.QuestionRequest{Title: strings.TrimPrefix(text, "ask:"), Options: []string{"red", "blue"}})
		if ctx.Err() != nil {
			return room.TurnResult{}, ctx.Err()
		}
		if !ok {
			return room.TurnResult{Text: "no answer"}, nil
		}
		return room.TurnResult{Text: "answer: " + ans}, nil
	}
	h.Event(room.AgentEvent{Kind: room.KindText, Text: "ok: "})
	a.mu.Lock()
	steered := strings.Join(a.steered, "+")
	a.mu.Unlock()
	if steered != "" {
		return room.TurnResult{Text: "ok: " + text + " +" + steered}, nil
	}
	return room.TurnResult{Text: "ok: " + text}, nil
}

func (a *fakeAgent) Steer(ctx context.Context, text string) error {
	a.mu.Lock()
	a.steered = append(a.steered, text)
	a.mu.Unlock()
	return nil
}

func (a *fakeAgent) FollowUp(ctx context.Context, text string) error { return a.Steer(ctx, text) }

func (a *fakeAgent) Close(ctx context.Context) (json.RawMessage, error) {
	a.f.mu.Lock()
	gate, closing := a.f.closeGate, a.f.closing
	a.f.mu.Unlock()
	if gate != nil {
		if closing != nil {
			closing <- struct{}{}
		}
		<-gate
	}
	a.once.Do(func() { close(a.done) })
	a.f.mu.Lock()
	delete(a.f.live, a)
	a.f.mu.Unlock()
	return json.RawMessage(`{"processes":[]}`), nil
}

func (a *fakeAgent) Done() <-chan struct{} { return a.done }

func (f *fakeTransport) lastPrompt() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.prompts) == 0 {
		return ""
	}
	return f.prompts[len(f.prompts)-1]
}

func (f *fakeTransport) lastSpec() room.AgentSpec {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts[len(f.starts)-1]
}
