package rpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pipePeer is an in-process agent on the other end of two pipes: the test
// reads what the client sent and writes what the agent says.
type pipePeer struct {
	t       testing.TB
	c       *Client
	toAgent *bufio.Scanner
	agentW  *io.PipeWriter
	wmu     sync.Mutex
}

func newPipePeer(t testing.TB, opts Options) *pipePeer {
	t.Helper()
	cr, aw := io.Pipe() // agent stdout -> client
	ar, cw := io.Pipe() // client -> agent stdin
	p := &pipePeer{t: t, agentW: aw, toAgent: bufio.NewScanner(ar)}
	p.toAgent.Buffer(make([]byte, 1<<20), 8<<20)
	opts.NoHandshake = true
	p.c = New(cr, cw, opts)
	if err := p.c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		aw.Close()
		ar.Close()
		_ = closeAndWait(t, p.c)
	})
	return p
}

// recv returns the next frame the client wrote, as a map.
func (p *pipePeer) recv() map[string]any {
	p.t.Helper()
	if !p.toAgent.Scan() {
		p.t.Fatalf("client wrote nothing more: %v", p.toAgent.Err())
	}
	var m map[string]any
	if err := json.Unmarshal(p.toAgent.Bytes(), &m); err != nil {
		p.t.Fatalf("client wrote invalid JSON %q: %v", p.toAgent.Bytes(), err)
	}
	return m
}

func (p *pipePeer) say(frames ...string) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	for _, f := range frames {
		if _, err := io.WriteString(p.agentW, f+"\n"); err != nil {
			p.t.Errorf("peer write: %v", err)
		}
	}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestClient_ResponsesMatchedByID(t *testing.T) {
	p := newPipePeer(t, Options{})
	ctx := ctxT(t, 10*time.Second)
	var wg sync.WaitGroup
	results := make([]string, 2)
	for i, cmd := range []string{"get_state", "get_messages"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := p.c.Request(ctx, cmd, nil)
			if err != nil {
				t.Errorf("%s: %v", cmd, err)
				return
			}
			results[i] = string(r.Data)
		}()
	}
	a, b := p.recv(), p.recv()
	// Answer in reverse order: matching is by id, not order.
	for _, m := range []map[string]any{b, a} {
		data, _ := json.Marshal(map[string]any{"for": m["type"]})
		line, _ := json.Marshal(map[string]any{"id": m["id"], "type": "response", "command": m["type"], "success": true, "data": json.RawMessage(data)})
		p.say(string(line))
	}
	wg.Wait()
	if results[0] != `{"for":"get_state"}` || results[1] != `{"for":"get_messages"}` {
		t.Fatalf("results = %q", results)
	}
	if a["id"] == b["id"] {
		t.Fatal("ids not unique")
	}
}

func TestClient_IdlessErrorMatchesOldestOfCommand(t *testing.T) {
	p := newPipePeer(t, Options{})
	ctx := ctxT(t, 10*time.Second)
	errs := make(chan error, 2)
	go func() {
		_, err := p.c.Request(ctx, "no_such", nil)
		errs <- err
	}()
	p.recv()
	go func() {
		_, err := p.c.Request(ctx, "get_state", nil)
		errs <- err
	}()
	gs := p.recv()
	p.say(`{"type":"response","command":"no_such","success":false,"error":"Unknown command: no_such"}`)
	err := <-errs
	var re *ResponseError
	if !errors.As(err, &re) || re.Message != "Unknown command: no_such" {
		t.Fatalf("err = %v", err)
	}
	p.say(`{"id":"` + gs["id"].(string) + `","type":"response","command":"get_state","success":true,"data":{}}`)
	if err := <-errs; err != nil {
		t.Fatalf("get_state: %v", err)
	}
}

func TestClient_ParseErrorAnswersRawLine(t *testing.T) {
	p := newPipePeer(t, Options{})
	ctx := ctxT(t, 10*time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := p.c.RequestLine(ctx, []byte(`{"type": broken`))
		done <- err
	}()
	if !p.toAgent.Scan() || p.toAgent.Text() != `{"type": broken` {
		t.Fatalf("raw line not sent verbatim: %q", p.toAgent.Text())
	}
	p.say(`{"type":"response","command":"parse","success":false,"error":"Failed to parse command: x"}`)
	var re *ResponseError
	if err := <-done; !errors.As(err, &re) || re.Command != "parse" {
		t.Fatalf("err = %v", err)
	}
}

// A reply that arrives after its request timed out is dropped: never
// delivered to a later request of the same command, even without an id.
func TestClient_LateReplyToTimedOutRequestDropped(t *testing.T) {
	p := newPipePeer(t, Options{})
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := p.c.Request(short, "no_such", nil)
		done <- err
	}()
	first := p.recv()
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first: %v", err)
	}
	ctx := ctxT(t, 10*time.Second)
	go func() {
		_, err := p.c.Request(ctx, "no_such", nil)
		done <- err
	}()
	p.recv()
	// The id-less answer to the first (timed-out) request arrives now.
	p.say(`{"type":"response","command":"no_such","success":false,"error":"answer to the first"}`)
	// ... and one with the first's id, also late.
	p.say(`{"id":"` + first["id"].(string) + `","type":"response","command":"no_such","success":false,"error":"late with id"}`)
	p.say(`{"type":"response","command":"no_such","success":false,"error":"answer to the second"}`)
	var re *ResponseError
	if err := <-done; !errors.As(err, &re) || re.Message != "answer to the second" {
		t.Fatalf("second got %v", err)
	}
	for _, e := range p.c.Errors() {
		t.Errorf("unexpected protocol error: %v", e)
	}
}

func TestClient_UnknownEventsPassThrough(t *testing.T) {
	p := newPipePeer(t, Options{})
	got := make(chan Event, 4)
	unsub := p.c.On("", func(e Event) { got <- e })
	defer unsub()
	p.say(`{"type":"brand_new_event","x":1}`, `{"type":"notice","text":"hi"}`)
	for _, want := range []string{"brand_new_event", "notice"} {
		select {
		case e := <-got:
			if e.Type != want {
				t.Fatalf("type %q, want %q", e.Type, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("event not delivered")
		}
	}
	if errs := p.c.Errors(); len(errs) != 0 {
		t.Fatalf("unknown events reported as errors: %v", errs)
	}
}

func TestClient_InvalidJSONReportedAndReadingGoesOn(t *testing.T) {
	p := newPipePeer(t, Options{})
	errc := make(chan error, 4)
	p.c.OnError(func(err error) { errc <- err })
	evs := make(chan Event, 4)
	p.c.On("after", func(e Event) { evs <- e })
	p.say(`{"type":"before"}`, `{"type": nope`, `{"type":"after"}`)
	select {
	case err := <-errc:
		if !errors.Is(err, ErrProtocol) {
			t.Fatalf("err = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no error reported")
	}
	select {
	case <-evs:
	case <-time.After(10 * time.Second):
		t.Fatal("reading stopped after invalid JSON")
	}
	if len(p.c.Errors()) != 1 {
		t.Fatalf("kept errors: %v", p.c.Errors())
	}
}

func TestClient_ListenerPanicRecovered(t *testing.T) {
	p := newPipePeer(t, Options{})
	errc := make(chan error, 1)
	p.c.OnError(func(err error) { errc <- err })
	p.c.On("boom", func(Event) { panic("listener bug") })
	ok := make(chan struct{})
	p.c.On("fine", func(Event) { close(ok) })
	p.say(`{"type":"boom"}`, `{"type":"fine"}`)
	select {
	case err := <-errc:
		var lp *ListenerPanicError
		if !errors.As(err, &lp) || lp.EventType != "boom" {
			t.Fatalf("err = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("panic not reported")
	}
	select {
	case <-ok:
	case <-time.After(10 * time.Second):
		t.Fatal("dispatch stopped after a panic")
	}
}

func TestClient_UnsubscribeStopsDelivery(t *testing.T) {
	p := newPipePeer(t, Options{})
	var n atomic.Int32
	unsub := p.c.On("x", func(Event) { n.Add(1) })
	done := make(chan struct{}, 2)
	p.c.On("mark", func(Event) { done <- struct{}{} })
	p.say(`{"type":"x"}`, `{"type":"mark"}`)
	<-done
	unsub()
	p.say(`{"type":"x"}`, `{"type":"mark"}`)
	<-done
	if n.Load() != 1 {
		t.Fatalf("delivered %d times", n.Load())
	}
}

// A slow listener must not delay response matching.
func TestClient_SlowListenerDoesNotDelayResponses(t *testing.T) {
	p := newPipePeer(t, Options{})
	release := make(chan struct{})
	// Buffered: the listener may run before the test waits on it.
	entered := make(chan struct{}, 1)
	p.c.On("message_update", func(Event) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
	})
	defer close(release)
	p.say(`{"type":"message_update"}`)
	ctx := ctxT(t, 10*time.Second)
	select {
	case <-entered: // the dispatcher is now stuck in the listener
	case <-ctx.Done():
		t.Fatal("listener never ran")
	}
	done := make(chan error, 1)
	go func() {
		_, err := p.c.GetState(ctx)
		done <- err
	}()
	m := p.recv()
	p.say(`{"type":"message_update"}`, `{"id":"`+m["id"].(string)+`","type":"response","command":"get_state","success":true,"data":{"isStreaming":false}}`)
	if err := <-done; err != nil {
		t.Fatalf("get_state while a listener blocks: %v", err)
	}
}

// A listener that mutates what it was given cannot change the retained
// turn or what other listeners see.
func TestClient_ListenerCannotMutateRetainedTurn(t *testing.T) {
	p := newPipePeer(t, Options{})
	p.c.On("message_end", func(e Event) {
		raw := e.Raw()
		for i := range raw {
			raw[i] = 'X'
		}
		var m MessageEndEvent
		_ = e.Decode(&m)
		m.Message.Role = "mutated"
	})
	ctx := ctxT(t, 10*time.Second)
	done := make(chan *Turn, 1)
	go func() {
		turn, err := p.c.Run(ctx, "hi", nil)
		if err != nil {
			t.Error(err)
		}
		done <- turn
	}()
	m := p.recv()
	p.say(`{"id":"`+m["id"].(string)+`","type":"response","command":"prompt","success":true}`,
		`{"type":"agent_start"}`,
		`{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"kept"}],"stopReason":"stop"}}`,
		`{"type":"agent_end","messages":[]}`)
	turn := <-done
	if turn == nil {
		t.Fatal("no turn")
	}
	for _, e := range turn.Events {
		if strings.Contains(string(e.Raw()), "XXXX") {
			t.Fatalf("retained event mutated: %s", e.Raw())
		}
	}
	if turn.Text != "kept" || len(turn.Messages) != 1 || turn.Messages[0].Role != "assistant" {
		t.Fatalf("turn = %+v", turn)
	}
}

// Stale ends: an agent_end read before this turn's prompt was acknowledged,
// or one that closes a run already open when the turn began (the run of a
// turn that Run's context ended before its agent_end), never ends the turn.
// (This test used to send a bare agent_end after the acknowledgement and
// call it stale; since a minimal agent may omit agent_start, such an end
// now ends the turn: see TestTurn_AgentEndWithoutStartEndsTurn.)
func TestClient_StaleAgentEndDoesNotEndNewTurn(t *testing.T) {
	p := newPipePeer(t, Options{})
	ctx := ctxT(t, 10*time.Second)

	// A turn whose run is open when Run's context ends: its agent_end has
	// not come yet. The abort is left unanswered (Run gives it a second).
	rctx, rcancel := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() {
		_, err := p.c.Run(rctx, "first", nil)
		runErr <- err
	}()
	m := p.recv()
	p.say(`{"id":"`+m["id"].(string)+`","type":"response","command":"prompt","success":true}`, `{"type":"agent_start"}`)
	waitFor(t, func() bool { return p.c.turnStarted() })
	rcancel()
	if ab := p.recv(); ab["type"] != "abort" {
		t.Fatalf("sent %v, want abort", ab["type"])
	}
	if err := <-runErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v", err)
	}

	errc := make(chan error, 1)
	go func() { errc <- p.c.Prompt(ctx, "hi", nil) }()
	m = p.recv()
	// Before the acknowledgement: earlier work.
	p.say(`{"type":"agent_end","messages":[]}`)
	p.say(`{"id":"` + m["id"].(string) + `","type":"response","command":"prompt","success":true}`)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := p.c.WaitTurn(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("turn ended by an agent_end read before the acknowledgement: %v", err)
	}
	p.say(`{"type":"agent_start"}`, `{"type":"agent_end","isTerminal":false,"messages":[]}`)
	short2, cancel2 := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel2()
	if _, err := p.c.WaitTurn(short2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("turn ended by a non-terminal agent_end: %v", err)
	}
	p.say(`{"type":"agent_end","messages":[]}`)
	if _, err := p.c.WaitTurn(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestClient_OneWaiterAtATime(t *testing.T) {
	p := newPipePeer(t, Options{})
	ctx := ctxT(t, 10*time.Second)
	errc := make(chan error, 1)
	go func() { errc <- p.c.Prompt(ctx, "hi", nil) }()
	m := p.recv()
	p.say(`{"id":"` + m["id"].(string) + `","type":"response","command":"prompt","success":true}`)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if err := p.c.Prompt(ctx, "again", nil); !errors.Is(err, ErrTurnInProgress) {
		t.Fatalf("second prompt: %v", err)
	}
	first := make(chan error, 1)
	waiting := make(chan struct{})
	go func() {
		close(waiting)
		_, err := p.c.WaitTurn(ctx)
		first <- err
	}()
	<-waiting
	// Wait until the first waiter is registered, then a second one fails.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := p.c.WaitTurn(ctxT(t, time.Millisecond))
		if errors.Is(err, ErrConcurrentWait) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("second waiter never refused: %v", err)
		}
	}
	p.say(`{"type":"agent_start"}`, `{"type":"agent_end","messages":[]}`)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

func TestClient_BacklogOverflowFailsTurnAndRetires(t *testing.T) {
	p := newPipePeer(t, Options{Backlog: 8, StallTimeout: 50 * time.Millisecond})
	block := make(chan struct{})
	defer close(block)
	p.c.On("message_update", func(Event) { <-block })
	ctx := ctxT(t, 10*time.Second)
	errc := make(chan error, 1)
	go func() {
		_, err := p.c.Run(ctx, "hi", nil)
		errc <- err
	}()
	m := p.recv()
	p.say(`{"id":"`+m["id"].(string)+`","type":"response","command":"prompt","success":true}`, `{"type":"agent_start"}`)
	go func() {
		for i := 0; i < 100; i++ {
			if _, err := io.WriteString(p.agentW, `{"type":"message_update"}`+"\n"); err != nil {
				return
			}
		}
	}()
	if err := <-errc; !errors.Is(err, ErrBacklogOverflow) {
		t.Fatalf("turn err = %v", err)
	}
	select {
	case <-p.c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("transport not retired")
	}
	if _, err := p.c.GetState(ctx); !errors.Is(err, ErrBacklogOverflow) {
		t.Fatalf("call after overflow: %v", err)
	}
}

func TestClient_CloseReleasesEveryWaiter(t *testing.T) {
	p := newPipePeer(t, Options{})
	ctx := ctxT(t, 10*time.Second)
	errc := make(chan error, 3)
	go func() {
		_, err := p.c.GetState(ctx)
		errc <- err
	}()
	p.recv()
	go func() {
		_, err := p.c.Run(ctx, "x", nil)
		errc <- err
	}()
	m := p.recv()
	p.say(`{"id":"` + m["id"].(string) + `","type":"response","command":"prompt","success":true}`)
	go func() { errc <- p.c.Close() }()
	for i := 0; i < 3; i++ {
		err := <-errc
		// The host's own Close is not the agent exiting.
		if err != nil && (!errors.Is(err, ErrClosed) || errors.Is(err, ErrAgentExited) || strings.Contains(err.Error(), "agent exited")) {
			t.Fatalf("waiter got %v, want ErrClosed (and not ErrAgentExited)", err)
		}
	}
	if err := p.c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// A write that cannot finish by the deadline: with nothing written the call
// fails and the transport stays; with half a frame written the transport
// is retired, since nothing after it would parse.
func TestClient_WriteDeadline(t *testing.T) {
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdinR.Close()
	c := clientWritingTo(t, stdinW)
	// Nobody reads stdin: a frame larger than the pipe cannot be written.
	big := append(append([]byte(`{"type":"x","pad":"`), bytes.Repeat([]byte("p"), 1<<20)...), `"}`...)
	short, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = c.RequestLine(short, big)
	var pe *ProtocolError
	if !errors.As(err, &pe) || pe.Op != "write" {
		t.Fatalf("partial write: %v", err)
	}
	select {
	case <-c.Done():
	default:
		t.Fatal("transport not retired after a partial frame")
	}
}

// clientWritingTo starts a client whose frames go to stdin and whose agent
// says nothing; the test's cleanup closes it.
func clientWritingTo(t *testing.T, stdin *os.File) *Client {
	t.Helper()
	outR, outW := io.Pipe()
	c := New(outR, stdin, Options{NoHandshake: true})
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = closeAndWait(t, c)
		outW.Close()
	})
	return c
}

func TestClient_WriteDeadlineNothingWritten(t *testing.T) {
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdinR.Close()
	// Fill the pipe first, outside the client.
	stdinW.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	for {
		if _, err := stdinW.Write(make([]byte, 4096)); err != nil {
			break
		}
	}
	stdinW.SetWriteDeadline(time.Time{})
	c := clientWritingTo(t, stdinW)
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.GetState(short); err == nil || errors.Is(err, ErrProtocol) {
		t.Fatalf("blocked write: %v", err)
	}
	select {
	case <-c.Done():
		t.Fatal("transport retired though nothing was written")
	default:
	}
}

// Sync returns only once the listeners have seen every event read before
// it: the dispatcher runs behind the reader, and a host that records a
// turn's events must not record its end first.
func TestClient_SyncWaitsForListeners(t *testing.T) {
	p := newPipePeer(t, Options{})
	release := make(chan struct{})
	var seen atomic.Int32
	p.c.On("message_update", func(Event) {
		<-release
		seen.Add(1)
	})
	for range 5 {
		p.say(`{"type":"message_update"}`)
	}
	// The get_state answer is read after the five updates.
	ctx := ctxT(t, 30*time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := p.c.GetState(ctx)
		done <- err
	}()
	m := p.recv()
	p.say(`{"id":"` + m["id"].(string) + `","type":"response","command":"get_state","success":true,"data":{"isStreaming":false}}`)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	synced := make(chan error, 1)
	go func() { synced <- p.c.Sync(ctx) }()
	select {
	case err := <-synced:
		t.Fatalf("Sync returned (%v) while the listener held %d of 5 events", err, 5-seen.Load())
	case <-time.After(200 * time.Millisecond): // Sync must still be waiting: nothing to wait on but time
	}
	close(release)
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if n := seen.Load(); n != 5 {
		t.Fatalf("Sync returned with %d of 5 events delivered", n)
	}
}
