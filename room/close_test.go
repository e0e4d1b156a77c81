package room

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The callback and shutdown contract (see the package doc): Close is safe
// from any callback and never waits on user code, Wait joins the
// shutdown, and every Close returns the first one's result.

// hookTransport is a fakeTransport whose Start and agents' Run call hook
// first (where names the callback).
type hookTransport struct {
	*fakeTransport
	hook func(where string)
}

func (h *hookTransport) Start(ctx context.Context, spec AgentSpec) (Agent, error) {
	h.hook("Transport.Start")
	a, err := h.fakeTransport.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &hookAgent{Agent: a, hook: h.hook}, nil
}

// newHarnessTransport is newHarness on the transport f.
func newHarnessTransport(t *testing.T, opts Options, f *hookTransport) *harness {
	t.Helper()
	opts.Transport = f
	h := newHarnessWith(t, opts, nil)
	h.f = f.fakeTransport
	return h
}

type hookAgent struct {
	Agent
	hook func(where string)
}

func (a *hookAgent) Close(ctx context.Context) (json.RawMessage, error) {
	a.hook("Agent.Close")
	return a.Agent.Close(ctx)
}

func (a *hookAgent) Run(ctx context.Context, text string) (TurnResult, error) {
	a.hook("Agent.Run")
	return a.Agent.Run(ctx, text)
}

// TestManager_CloseFromCallbacks: Close called from inside each kind of
// callback returns while that callback still runs (it used to wait for
// the turns, and so for its own caller, until ShutdownBudget ran out; from
// RoomConfig it deadlocked on the room's lock). Wait, from outside, then
// joins everything; a second Close returns the first's result, and Detach
// after Close says it did not detach.
func TestManager_CloseFromCallbacks(t *testing.T) {
	for _, tc := range []struct{ where, text string }{
		{"RoomConfig", "hi"},
		{"Transport.Start", "hi"},
		{"Agent.Run", "hi"},
		{"Policy", "approve:bash"},
	} {
		t.Run(tc.where, func(t *testing.T) {
			var m atomic.Pointer[Manager]
			closed := make(chan error, 1)
			release := make(chan struct{})
			var once sync.Once
			hook := func(where string) {
				if where != tc.where {
					return
				}
				once.Do(func() {
					closed <- m.Load().Close()
					<-release // the callback goes on after Close returned
				})
			}
			f := &hookTransport{fakeTransport: newFakeTransport(), hook: hook}
			opts := Options{
				// Long enough that waiting for the callbacks would show.
				ShutdownBudget: time.Hour,
				RoomConfig: func(string) Config {
					hook("RoomConfig")
					return Config{}
				},
				Policy: func(string, ApprovalRequest) Decision {
					hook("Policy")
					return Allow
				},
			}
			h := newHarnessTransport(t, opts, f)
			m.Store(h.m)
			submitted := make(chan error, 1)
			go func() {
				_, err := h.m.Submit(context.Background(), "r", Message{Text: tc.text})
				submitted <- err
			}()
			select {
			case err := <-closed:
				if err != nil {
					t.Fatalf("Close from %s: %v", tc.where, err)
				}
			case <-time.After(30 * time.Second):
				close(release)
				t.Fatalf("Close called from %s did not return while the callback ran", tc.where)
			}
			close(release)
			if err := <-submitted; err != nil && !errors.Is(err, ErrClosed) {
				t.Fatalf("Submit: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := h.m.Wait(ctx); err != nil {
				t.Fatalf("Wait after Close: %v", err)
			}
			if n := f.resident(); n != 0 {
				t.Fatalf("%d agents left after Wait", n)
			}
			if err := h.m.Close(); err != nil {
				t.Fatalf("a second Close: %v, want the first's nil", err)
			}
			if err := h.m.Detach(); !errors.Is(err, ErrClosed) {
				t.Fatalf("Detach after Close: %v, want ErrClosed", err)
			}
		})
	}
}

// TestManager_WaitBoundedByContext: Wait returns with its context's error
// while a turn's agent ignores the cancel; once the budget ran out and the
// room released the agent (which ends the stuck Run), Wait joins it all
// and reports the overrun.
func TestManager_WaitBoundedByContext(t *testing.T) {
	stuck := make(chan struct{})
	released := make(chan struct{})
	var once, relOnce sync.Once
	f := &hookTransport{fakeTransport: newFakeTransport(), hook: func(where string) {
		switch where {
		case "Agent.Run":
			once.Do(func() {
				close(stuck)
				<-released // ignores its context, until the agent is closed
			})
		case "Agent.Close":
			relOnce.Do(func() { close(released) })
		}
	}}
	h := newHarnessTransport(t, Options{ShutdownBudget: 100 * time.Millisecond}, f)
	h.submit("r", "hi")
	<-stuck
	if err := h.m.Close(); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.m.Wait(short); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a turn still running = %v, want its context's error", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := h.m.Wait(ctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait after a turn outlived the shutdown budget: %v, want the overrun", err)
	}
}
