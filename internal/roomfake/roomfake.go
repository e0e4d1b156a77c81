// Package roomfake is a room.Transport for tests outside the room package
// that need rooms but not a real agent: the client's examples and the
// CLI's fault tests. Its agents act on the prompt text:
//
//	hang          wait until the turn's context ends
//	fail          the turn fails
//	approve:TOOL  ask for approval, answer "allowed" or "denied"
//	ask:TITLE     ask a question (options red, blue), answer "answer: <text>" or "no answer"
//	write:NAME    write NAME ("hello\n") in the workspace, answer "wrote NAME"
//	anything else answered "ok: <text>", with one text delta "ok: "
package roomfake

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

// Transport starts fake agents. The zero value is not usable: use New.
type Transport struct {
	mu   sync.Mutex
	n    int
	live map[*agent]bool
}

// New returns a Transport.
func New() *Transport { return &Transport{live: map[*agent]bool{}} }

// Start starts a fake agent with a new session (a resumed session id is
// kept as it is).
func (f *Transport) Start(ctx context.Context, spec room.AgentSpec) (room.Agent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sess := spec.SessionID
	if sess == "" {
		f.n++
		sess = fmt.Sprintf("sess-%d", f.n)
	}
	a := &agent{f: f, spec: spec, session: sess, done: make(chan struct{})}
	f.live[a] = true
	return a, nil
}

// Resident returns how many agents run.
func (f *Transport) Resident() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live)
}

type agent struct {
	f       *Transport
	spec    room.AgentSpec
	session string
	once    sync.Once
	done    chan struct{}
}

func (a *agent) SessionID() string { return a.session }

func (a *agent) Run(ctx context.Context, text string) (room.TurnResult, error) {
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
	case strings.HasPrefix(text, "write:"):
		name := filepath.Base(strings.TrimPrefix(text, "write:"))
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
		h.Event(room.AgentEvent{Kind: room.KindToolEnded, Tool: tool, CallID: "c1", IsError: !ok})
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
	return room.TurnResult{Text: "ok: " + text}, nil
}

func (a *agent) Steer(ctx context.Context, text string) error    { return nil }
func (a *agent) FollowUp(ctx context.Context, text string) error { return nil }

func (a *agent) Close(ctx context.Context) (json.RawMessage, error) {
	a.once.Do(func() { close(a.done) })
	a.f.mu.Lock()
	delete(a.f.live, a)
	a.f.mu.Unlock()
	return json.RawMessage(`{"processes":[]}`), nil
}

func (a *agent) Done() <-chan struct{} { return a.done }
