package rpc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"
	"testing"
	"time"
)

// The callback and shutdown contract (see the package doc): Close is safe
// from any callback and never waits on user code, Wait joins the
// callbacks, and every Close returns the first one's result.

// closeAndWait closes c and joins its callbacks, as a test that reads what
// they recorded must (Close alone does not wait for them).
func closeAndWait(t testing.TB, c *Client) error {
	t.Helper()
	err := c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if werr := c.Wait(ctx); werr != nil {
		t.Errorf("Wait: %v", werr)
	}
	return err
}

// pipeProcess is an agent process over in-memory pipes whose Stop
// returns stopErr: the outcome every Close must report.
type pipeProcess struct {
	stdin            *io.PipeWriter
	stdout, stderr   *io.PipeReader
	agentW, agentErr *io.PipeWriter
	agentR           *io.PipeReader
	exited           chan struct{}
	once             sync.Once
	stopErr          error
}

func newPipeProcess(stopErr error) *pipeProcess {
	p := &pipeProcess{exited: make(chan struct{}), stopErr: stopErr}
	p.stdout, p.agentW = io.Pipe()
	p.stderr, p.agentErr = io.Pipe()
	p.agentR, p.stdin = io.Pipe()
	return p
}

func (p *pipeProcess) Stdin() io.WriteCloser   { return p.stdin }
func (p *pipeProcess) Stdout() io.Reader       { return p.stdout }
func (p *pipeProcess) Stderr() io.Reader       { return p.stderr }
func (p *pipeProcess) Exited() <-chan struct{} { return p.exited }
func (p *pipeProcess) ExitErr() error          { return nil }

func (p *pipeProcess) Stop(context.Context) error {
	p.once.Do(func() {
		p.agentW.Close()
		p.agentErr.Close()
		p.agentR.Close()
		close(p.exited)
	})
	return p.stopErr
}

func (p *pipeProcess) CloseOutput() {
	p.stdout.Close()
	p.stderr.Close()
}

// attachPipe starts a client that owns a pipeProcess; the test writes
// frames as the agent with say. Cleanup closes and joins the client.
func attachPipe(t *testing.T, stopErr error, opts Options) (*Client, func(string)) {
	t.Helper()
	p := newPipeProcess(stopErr)
	var wmu sync.Mutex
	say := func(frame string) {
		wmu.Lock()
		defer wmu.Unlock()
		if _, err := io.WriteString(p.agentW, frame+"\n"); err != nil {
			t.Errorf("agent write: %v", err)
		}
	}
	// The agent answers get_state, after every frame it wrote before.
	go func() {
		in := bufio.NewScanner(p.agentR)
		for in.Scan() {
			var req struct{ ID, Type string }
			if json.Unmarshal(in.Bytes(), &req) == nil && req.Type == "get_state" {
				say(`{"id":"` + req.ID + `","type":"response","command":"get_state","success":true,"data":{}}`)
			}
		}
	}()
	opts.NoHandshake = true
	c, err := Attach(context.Background(), p, SpawnOptions{Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closeAndWait(t, c) })
	return c, say
}

// TestClient_CloseFromCallbackViaAnotherGoroutine: a listener that closes
// the client on another goroutine and waits for that Close (as a
// context.AfterFunc or an errgroup would) is not deadlocked: Close does
// not wait for the listener. Wait joins it once it returned.
func TestClient_CloseFromCallbackViaAnotherGoroutine(t *testing.T) {
	c, say := attachPipe(t, nil, Options{})
	closed := make(chan error, 1)
	inListener := make(chan error, 1)
	c.On("probe", func(Event) {
		done := make(chan error, 1)
		go func() { done <- c.Close() }()
		select {
		case err := <-done:
			inListener <- err
		case <-time.After(30 * time.Second):
			inListener <- errors.New("Close, called on behalf of a listener, waited for that listener")
		}
	})
	c.OnError(func(error) {})
	say(`{"type":"probe"}`)
	select {
	case err := <-inListener:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the listener never returned")
	}
	go func() { closed <- c.Close() }()
	if err := <-closed; err != nil {
		t.Fatalf("a later Close: %v", err)
	}
	if err := c.Wait(ctxT(t, 30*time.Second)); err != nil {
		t.Fatalf("Wait after Close: %v", err)
	}
}

// TestClient_CloseReturnsTheFirstResult: Close from a listener, a host
// tool and from outside all return the same outcome: the process's stop
// error (a Close from a callback used to return nil before anything had
// ended, and a later one the real outcome).
func TestClient_CloseReturnsTheFirstResult(t *testing.T) {
	stopErr := errors.New("the agent's tree outlived its grace")
	c, say := attachPipe(t, stopErr, Options{})
	fromListener := make(chan error, 1)
	c.On("probe", func(Event) { fromListener <- c.Close() })
	say(`{"type":"probe"}`)
	var got error
	select {
	case got = <-fromListener:
	case <-time.After(60 * time.Second):
		t.Fatal("Close from a listener did not return")
	}
	if !errors.Is(got, stopErr) {
		t.Fatalf("Close from a listener = %v, want the stop error", got)
	}
	for i := 0; i < 2; i++ {
		if err := c.Close(); err != got {
			t.Fatalf("Close #%d = %v, want the first one's %v", i+2, err, got)
		}
	}
	if err := c.Wait(ctxT(t, 30*time.Second)); err != nil {
		t.Fatalf("Wait: %v", err)
	}
}

// TestClient_CloseDoesNotWaitForCallbacksWaitDoes: a host tool that
// ignores its context holds neither Close (from outside) nor a UI
// dialog's Close; Wait returns only once the tool has, and ctx bounds it.
func TestClient_CloseDoesNotWaitForCallbacksWaitDoes(t *testing.T) {
	release := make(chan struct{})
	running := make(chan struct{})
	c, say := attachPipe(t, nil, Options{})
	setTools(c, HostTool{Name: "stubborn", Run: func(ctx context.Context, call *HostToolCall) (*HostToolResult, error) {
		close(running)
		<-release // ignores ctx: user code Close must not wait for
		return TextResult("late"), nil
	}})
	say(`{"type":"host_tool_call","id":"h1","toolCallId":"t1","toolName":"stubborn","arguments":{}}`)
	select {
	case <-running:
	case <-time.After(60 * time.Second):
		t.Fatal("the host tool never ran")
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(60 * time.Second):
		close(release)
		t.Fatal("Close waited for a host tool that was still running")
	}
	short, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Wait(short); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with the tool still running = %v, want the context's error", err)
	}
	close(release)
	if err := c.Wait(ctxT(t, 30*time.Second)); err != nil {
		t.Fatalf("Wait after the tool returned: %v", err)
	}
	if _, err := c.GetState(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("a call after Close: %v", err)
	}
}

// TestClient_WaitDeliversWhatWasQueued: events read before Close reach a
// slow listener; Close does not wait for them, Wait does.
func TestClient_WaitDeliversWhatWasQueued(t *testing.T) {
	const n = 20
	gate := make(chan struct{})
	var mu sync.Mutex
	got := 0
	first := make(chan struct{})
	c, say := attachPipe(t, nil, Options{})
	c.On("notice", func(Event) {
		mu.Lock()
		got++
		k := got
		mu.Unlock()
		if k == 1 {
			close(first)
			<-gate
		}
	})
	for i := 0; i < n; i++ {
		say(`{"type":"notice"}`)
	}
	<-first
	// The answer comes after every notice: all were read before Close.
	if _, err := c.GetState(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	close(gate)
	if err := c.Wait(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got != n {
		t.Fatalf("%d of %d events delivered after Wait", got, n)
	}
}
