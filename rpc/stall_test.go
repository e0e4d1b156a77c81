package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// closeFromCallback is the common part of the Close-from-a-callback tests:
// trigger makes the agent invoke a callback that calls Close and reports
// on returned. The inner Close must return without waiting for its own
// caller; an outside Close afterwards must return too.
func closeFromCallback(t *testing.T, p *pipePeer, returned <-chan error, trigger func()) {
	t.Helper()
	trigger()
	select {
	case err := <-returned:
		if err != nil {
			t.Fatalf("Close from a callback: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close called from a callback did not return")
	}
	select {
	case <-p.c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Close from a callback did not end the transport")
	}
	outer := make(chan error, 1)
	go func() { outer <- p.c.Close() }()
	select {
	case err := <-outer:
		if err != nil {
			t.Fatalf("later Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a later Close blocked")
	}
}

func TestClient_CloseFromListener(t *testing.T) {
	p := newPipePeer(t, Options{})
	returned := make(chan error, 2)
	p.c.On("probe", func(Event) { returned <- p.c.Close() })
	closeFromCallback(t, p, returned, func() { p.say(`{"type":"probe"}`) })
}

func TestClient_CloseFromErrorListener(t *testing.T) {
	p := newPipePeer(t, Options{})
	returned := make(chan error, 2)
	p.c.OnError(func(error) { returned <- p.c.Close() })
	closeFromCallback(t, p, returned, func() { p.say(`{"type": broken`) })
}

func TestClient_CloseFromUIHandler(t *testing.T) {
	returned := make(chan error, 2)
	var c *Client
	var cmu sync.Mutex
	p := newPipePeer(t, Options{UI: func(ctx context.Context, req *UIRequest) UIResponse {
		cmu.Lock()
		cl := c
		cmu.Unlock()
		returned <- cl.Close()
		return Cancelled()
	}})
	cmu.Lock()
	c = p.c
	cmu.Unlock()
	closeFromCallback(t, p, returned, func() {
		p.say(`{"type":"extension_ui_request","id":"u1","method":"confirm","title":"sure?"}`)
	})
}

func TestClient_CloseFromHostTool(t *testing.T) {
	p := newPipePeer(t, Options{})
	returned := make(chan error, 2)
	setTools(p.c, HostTool{Name: "closer", Run: func(ctx context.Context, call *HostToolCall) (*HostToolResult, error) {
		returned <- p.c.Close()
		return TextResult("closed"), nil
	}})
	closeFromCallback(t, p, returned, func() {
		p.say(`{"type":"host_tool_call","id":"h1","toolCallId":"t1","toolName":"closer","arguments":{}}`)
	})
}

// setTools installs host tools without the set_host_tools round trip, for
// tests whose agent cannot answer it.
func setTools(c *Client, tools ...HostTool) {
	m := map[string]HostTool{}
	for _, t := range tools {
		m[t.Name] = t
	}
	c.tools.mu.Lock()
	c.tools.tools = m
	c.tools.mu.Unlock()
}

// fullPipe returns a pipe whose write end is full: nothing more can be
// written until the read end is drained.
func fullPipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	w.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	for {
		if _, err := w.Write(make([]byte, 4096)); err != nil {
			break
		}
	}
	w.SetWriteDeadline(time.Time{})
	return r, w
}

// stuckWriter is an agent stdin that takes nothing: every Write blocks
// until Close, like a full pipe the agent never drains.
type stuckWriter struct {
	entered chan struct{}
	closed  chan struct{}
	once    sync.Once
}

func newStuckWriter() *stuckWriter {
	return &stuckWriter{entered: make(chan struct{}, 1), closed: make(chan struct{})}
}

func (w *stuckWriter) Write(p []byte) (int, error) {
	select {
	case w.entered <- struct{}{}:
	default:
	}
	<-w.closed
	return 0, os.ErrClosed
}

func (w *stuckWriter) Close() error {
	w.once.Do(func() { close(w.closed) })
	return nil
}

// A call waiting for the write lock (another frame is stuck on a full
// pipe) gives up when its context ends.
func TestClient_WriteLockHonoursContext(t *testing.T) {
	w := newStuckWriter()
	outR, outW := io.Pipe()
	c := New(outR, w, Options{NoHandshake: true})
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = closeAndWait(t, c)
		outW.Close()
	})
	holder := make(chan error, 1)
	go func() { // takes the write lock and blocks in Write
		_, err := c.GetState(ctxT(t, 60*time.Second))
		holder <- err
	}()
	select {
	case <-w.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first call never wrote")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := c.GetState(ctx)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want context.DeadlineExceeded", err)
		}
		t.Logf("returned %v after the call began", time.Since(start))
	case <-time.After(10 * time.Second):
		t.Fatal("a call waiting for the write lock ignored its context")
	}
	select {
	case <-c.Done():
		t.Fatal("a call that wrote nothing retired the transport")
	default:
	}
	c.Close()
	if err := <-holder; err == nil {
		t.Fatal("the stuck write succeeded")
	}
}

// More host tool calls than HostToolConcurrency while the agent reads
// nothing: the refusal must not be written by the reader, so events keep
// flowing; once the agent reads again, the refusal is there.
func TestClient_HostToolExcessDoesNotStallReader(t *testing.T) {
	stdinR, stdinW := fullPipe(t)
	outR, outW := io.Pipe()
	c := New(outR, stdinW, Options{NoHandshake: true, HostToolConcurrency: 1})
	release := make(chan struct{})
	setTools(c, HostTool{Name: "slow", Run: func(ctx context.Context, call *HostToolCall) (*HostToolResult, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return TextResult("slow done"), nil
	}})
	probe := make(chan struct{}, 1)
	c.On("probe", func(Event) { probe <- struct{}{} })
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(release)
		_ = closeAndWait(t, c)
		outW.Close()
	})
	say := func(s string) {
		if _, err := io.WriteString(outW, s+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	say(`{"type":"host_tool_call","id":"h1","toolCallId":"t1","toolName":"slow","arguments":{}}`)
	say(`{"type":"host_tool_call","id":"h2","toolCallId":"t2","toolName":"slow","arguments":{}}`)
	said := make(chan struct{})
	go func() {
		defer close(said)
		io.WriteString(outW, `{"type":"probe"}`+"\n")
	}()
	select {
	case <-probe:
	case <-time.After(10 * time.Second):
		t.Fatal("event delivery stalled behind a host tool refusal the agent does not read")
	}
	<-said
	// The agent reads again: the refusal of h2 arrives.
	found := make(chan bool, 1)
	go func() {
		var seen []byte
		buf := make([]byte, 64<<10)
		for {
			n, err := stdinR.Read(buf)
			seen = append(seen, bytes.Trim(buf[:n], "\x00")...)
			if i := bytes.Index(seen, []byte(`"id":"h2"`)); i >= 0 {
				line := seen[bytes.LastIndexByte(seen[:i], '{'):]
				if j := bytes.IndexByte(line, '\n'); j >= 0 {
					found <- bytes.Contains(line[:j], []byte(`"isError":true`)) && bytes.Contains(line[:j], []byte("too many concurrent calls"))
					return
				}
			}
			if err != nil {
				found <- false
				return
			}
		}
	}()
	select {
	case ok := <-found:
		if !ok {
			t.Fatal("h2 was not refused with an error result")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no refusal for h2")
	}
}

// A dialog whose fields do not decode is still answered (cancelled), so
// the agent does not wait forever, and reported as a protocol error.
func TestClient_UndecodableDialogCancelled(t *testing.T) {
	handled := make(chan struct{}, 1)
	p := newPipePeer(t, Options{UI: func(ctx context.Context, req *UIRequest) UIResponse {
		handled <- struct{}{}
		return Value("x")
	}})
	p.say(`{"type":"extension_ui_request","id":"u9","method":"select","title":"pick","options":[1,2,3]}`)
	got := make(chan []byte, 1)
	go func() { // p.recv fails the test, which only the test goroutine may do
		if p.toAgent.Scan() {
			got <- append([]byte(nil), p.toAgent.Bytes()...)
		}
	}()
	select {
	case b := <-got:
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil || m["type"] != "extension_ui_response" || m["id"] != "u9" || m["cancelled"] != true {
			t.Fatalf("answer = %s", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the undecodable dialog was not answered")
	}
	select {
	case <-handled:
		t.Fatal("the handler saw a dialog that did not decode")
	default:
	}
	var pe *ProtocolError
	errs := p.c.Errors()
	if len(errs) != 1 || !errors.As(errs[0], &pe) || pe.Op != "extension_ui_request" {
		t.Fatalf("errors = %v", errs)
	}
}

// Refusals beyond the reply queue's bound are dropped and reported, and
// the reader keeps going.
func TestClient_ReplyQueueFullReported(t *testing.T) {
	w := newStuckWriter()
	outR, outW := io.Pipe()
	c := New(outR, w, Options{NoHandshake: true, HostToolConcurrency: 1})
	setTools(c, HostTool{Name: "slow", Run: func(ctx context.Context, call *HostToolCall) (*HostToolResult, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}})
	probe := make(chan struct{}, 1)
	c.On("probe", func(Event) { probe <- struct{}{} })
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = closeAndWait(t, c)
		outW.Close()
	})
	go func() {
		for i := 0; i < replyBacklog+10; i++ {
			io.WriteString(outW, `{"type":"host_tool_call","id":"h`+strconv.Itoa(i)+`","toolCallId":"t","toolName":"slow","arguments":{}}`+"\n")
		}
		io.WriteString(outW, `{"type":"probe"}`+"\n")
	}()
	select {
	case <-probe:
	case <-time.After(10 * time.Second):
		t.Fatal("event delivery stalled")
	}
	dropped := 0
	for _, err := range c.Errors() {
		if strings.Contains(err.Error(), "host tool refusal was dropped") {
			dropped++
		}
	}
	// One call runs, replyLoop holds at most one refusal, the queue the rest.
	if dropped < 10-2 {
		t.Fatalf("%d refusals reported dropped; errors: %v", dropped, c.Errors())
	}
}
