package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition never held")
		}
		time.Sleep(time.Millisecond)
	}
}

// turnStarted: the current turn saw its agent_start.
func (c *Client) turnStarted() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.turn != nil && c.turn.started
}

// promptAcked sends a prompt through p and acknowledges it.
func promptAcked(t *testing.T, p *pipePeer, ctx context.Context, msg string, opts *PromptOptions) {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- p.c.Prompt(ctx, msg, opts) }()
	m := p.recv()
	p.say(`{"id":"` + m["id"].(string) + `","type":"response","command":"prompt","success":true}`)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func assistantFrame(text string) string {
	return `{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"` + text + `"}],"stopReason":"stop"}}`
}

// Item 6: an agent that follows the protocol but sends no agent_start: its
// agent_end after the acknowledgement ends the turn.
func TestTurn_AgentEndWithoutStartEndsTurn(t *testing.T) {
	p := newPipePeer(t, Options{})
	ctx := ctxT(t, 10*time.Second)
	promptAcked(t, p, ctx, "hi", nil)
	p.say(assistantFrame("minimal"), `{"type":"agent_end","messages":[]}`)
	turn, err := p.c.WaitTurn(ctx)
	if err != nil || turn.Text != "minimal" {
		t.Fatalf("turn %+v, err %v", turn, err)
	}
}

// Item 18: an invalid frame of a frequent type is reported and not kept
// in the turn, which still marshals.
func TestTurn_InvalidFrequentFrameNotRetained(t *testing.T) {
	p := newPipePeer(t, Options{})
	errs := make(chan error, 4)
	p.c.OnError(func(err error) { errs <- err })
	ctx := ctxT(t, 10*time.Second)
	promptAcked(t, p, ctx, "hi", nil)
	p.say(`{"type":"agent_start"}`, `{"type":"message_update", broken`, `{"type":"message_update","message":{"role":"assistant"}}`,
		assistantFrame("ok"), `{"type":"agent_end","messages":[]}`)
	turn, err := p.c.WaitTurn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := json.Marshal(turn); err != nil {
		t.Fatalf("marshal the turn: %v", err)
	}
	for _, e := range turn.Events {
		if !json.Valid(e.raw) {
			t.Fatalf("invalid frame kept in the turn: %q", e.raw)
		}
	}
	if len(turn.Events) != 4 {
		t.Fatalf("%d events kept, want 4", len(turn.Events))
	}
	select {
	case err := <-errs:
		if !errors.Is(err, ErrProtocol) {
			t.Fatalf("reported %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the invalid frame was not reported")
	}
}

// Issue 25: a negative RetainedTurnBytes keeps no events or messages (a
// caller that reads only the outcome pays no copies under a flood), yet the
// turn ends as before, counts what it dropped, listeners see every valid
// frame, and an invalid frame of a frequent type is still refused and
// reported.
func TestTurn_RetainNoneKeepsOutcomeAndStrictness(t *testing.T) {
	p := newPipePeer(t, Options{RetainedTurnBytes: -1})
	errs := make(chan error, 4)
	p.c.OnError(func(err error) { errs <- err })
	var updates atomic.Int32
	p.c.On(EventMessageUpdate, func(Event) { updates.Add(1) })
	ctx := ctxT(t, 10*time.Second)
	update := `{"type":"message_update","message":{"role":"assistant","content":[{"type":"text","text":"t"}]}}`

	promptAcked(t, p, ctx, "hi", nil)
	frames := []string{`{"type":"agent_start"}`}
	for i := 0; i < 100; i++ {
		frames = append(frames, update)
	}
	frames = append(frames, assistantFrame("the end"), `{"type":"agent_end","messages":[]}`)
	p.say(strings.Join(frames, "\n"))
	turn, err := p.c.WaitTurn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if turn.Text != "the end" || turn.StopReason != "stop" {
		t.Fatalf("text %q, stop reason %q", turn.Text, turn.StopReason)
	}
	if len(turn.Events) != 0 || len(turn.Messages) != 0 || turn.DroppedEvents != 103 || turn.DroppedMessages != 1 {
		t.Fatalf("kept %d events, %d messages; dropped %d, %d", len(turn.Events), len(turn.Messages), turn.DroppedEvents, turn.DroppedMessages)
	}

	promptAcked(t, p, ctx, "again", nil)
	p.say(`{"type":"agent_start"}`, `{"type":"message_update", broken`, update, assistantFrame("second"), `{"type":"agent_end","messages":[]}`)
	if turn, err = p.c.WaitTurn(ctx); err != nil || turn.Text != "second" {
		t.Fatalf("turn %+v, err %v", turn, err)
	}
	select {
	case err := <-errs:
		var pe *ProtocolError
		if !errors.As(err, &pe) || pe.Op != "frame" {
			t.Fatalf("reported %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the invalid frame was not reported")
	}
	// WaitTurn returns once the turn ends; the dispatcher may still be
	// delivering: Sync waits for it.
	if err := p.c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if n := updates.Load(); n != 101 {
		t.Fatalf("listeners saw %d message_updates, want the 101 valid ones", n)
	}
}

// Item 15: messages count against RetainedTurnBytes, and retained frames
// are copies, not slices of the reader's buffers.
func TestTurn_RetainedBytesBoundMessagesAndCopyFrames(t *testing.T) {
	const budget = 4 << 10
	p := newPipePeer(t, Options{RetainedTurnBytes: budget})
	ctx := ctxT(t, 10*time.Second)
	promptAcked(t, p, ctx, "hi", nil)
	big := strings.Repeat("r", 10<<10)
	frames := []string{`{"type":"agent_start"}`, `{"type":"turn_start","n":1}`, `{"type":"turn_start","n":22}`}
	for i := 0; i < 200; i++ {
		frames = append(frames, `{"type":"message_end","message":{"role":"toolResult","content":[{"type":"text","text":"`+big+`"}]}}`)
	}
	frames = append(frames, assistantFrame("end"), `{"type":"agent_end","messages":[]}`)
	p.say(strings.Join(frames, "\n"))
	turn, err := p.c.WaitTurn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kept := 0
	for _, m := range turn.Messages {
		b, _ := json.Marshal(m)
		kept += len(b)
	}
	if kept > budget || turn.DroppedMessages < 200 {
		t.Fatalf("%d messages (%d bytes) kept with a %d byte budget, %d dropped", len(turn.Messages), kept, budget, turn.DroppedMessages)
	}
	if turn.Text != "end" {
		t.Fatalf("text %q", turn.Text)
	}
	// The two turn_start frames were read in one go: as slices of the read
	// buffer they sit one LF apart.
	a, b := turn.Events[1].raw, turn.Events[2].raw
	if uintptr(unsafe.Pointer(unsafe.SliceData(a)))+uintptr(len(a))+1 == uintptr(unsafe.Pointer(unsafe.SliceData(b))) {
		t.Fatal("retained events are slices of the read buffer")
	}
}

// Item 4 (fake side): a refused abort_and_prompt, answered id-less and
// followed at once by the running turn's own end: the turn ends with it.
func TestTurn_RefusedAbortAndPromptRollsBack(t *testing.T) {
	p := newPipePeer(t, Options{})
	ctx := ctxT(t, 10*time.Second)
	promptAcked(t, p, ctx, "hi", nil)
	p.say(`{"type":"agent_start"}`)
	errc := make(chan error, 1)
	go func() { errc <- p.c.AbortAndPrompt(ctx, "instead", nil) }()
	p.recv()
	p.say(`{"type":"response","command":"abort_and_prompt","success":false,"error":"Unknown command: abort_and_prompt"}`,
		assistantFrame("own end"), `{"type":"agent_end","messages":[]}`)
	var re *ResponseError
	if err := <-errc; !errors.As(err, &re) || !errors.Is(err, ErrPromptFailed) {
		t.Fatalf("abort_and_prompt: %v", err)
	}
	turn, err := p.c.WaitTurn(ctx)
	if err != nil || turn.Text != "own end" {
		t.Fatalf("turn %+v, err %v", turn, err)
	}
	// With no turn running, a refused abort_and_prompt leaves no turn open.
	go func() { errc <- p.c.AbortAndPrompt(ctx, "again", nil) }()
	p.recv()
	p.say(`{"type":"response","command":"abort_and_prompt","success":false,"error":"Unknown command: abort_and_prompt"}`)
	if err := <-errc; !errors.Is(err, ErrPromptFailed) {
		t.Fatalf("abort_and_prompt: %v", err)
	}
	if _, err := p.c.WaitTurn(ctx); !errors.Is(err, ErrPromptFailed) {
		t.Fatalf("the refused prompt's turn: %v", err)
	}
	promptAcked(t, p, ctx, "next", nil)
}

// Item 5 (fake side): a follow-up sent while the turn ran, taken by the
// agent after that turn ended (its acknowledgement follows the agent_end),
// runs as a new run: WaitTurn returns that run, not the previous text.
func TestTurn_FollowUpAfterEndIsTracked(t *testing.T) {
	p := newPipePeer(t, Options{})
	ctx := ctxT(t, 10*time.Second)
	promptAcked(t, p, ctx, "hi", nil)
	p.say(`{"type":"agent_start"}`)
	errc := make(chan error, 1)
	go func() { errc <- p.c.Prompt(ctx, "more", &PromptOptions{StreamingBehavior: "followUp"}) }()
	m := p.recv()
	if m["streamingBehavior"] != "followUp" {
		t.Fatalf("sent %v", m)
	}
	p.say(assistantFrame("first"), `{"type":"agent_end","messages":[]}`,
		`{"id":"`+m["id"].(string)+`","type":"response","command":"prompt","success":true}`)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	p.say(`{"type":"agent_start"}`, assistantFrame("second"), `{"type":"agent_end","messages":[]}`)
	turn, err := p.c.WaitTurn(ctx)
	if err != nil || turn.Text != "second" {
		t.Fatalf("turn %q, err %v", turn.Text, err)
	}
}

// Item 5: a run the agent starts on its own is tracked as a turn.
func TestTurn_UnsolicitedRunIsATurn(t *testing.T) {
	p := newPipePeer(t, Options{})
	ctx := ctxT(t, 10*time.Second)
	p.say(`{"type":"agent_start"}`, assistantFrame("by itself"), `{"type":"agent_end","messages":[]}`)
	var turn *Turn
	waitFor(t, func() bool {
		var err error
		turn, err = p.c.WaitTurn(ctxT(t, time.Millisecond))
		return err == nil
	})
	if !turn.Unsolicited || turn.Text != "by itself" {
		t.Fatalf("turn %+v", turn)
	}
	promptAcked(t, p, ctx, "next", nil)
}

// Item 20: omp's late failure of a prompt queued with StreamingBehavior
// reaches the turn.
func TestTurn_LateFailureOfQueuedPrompt(t *testing.T) {
	p := newPipePeer(t, Options{})
	ctx := ctxT(t, 10*time.Second)
	promptAcked(t, p, ctx, "hi", nil)
	p.say(`{"type":"agent_start"}`)
	errc := make(chan error, 1)
	go func() { errc <- p.c.Prompt(ctx, "steer", &PromptOptions{StreamingBehavior: "steer"}) }()
	m := p.recv()
	id := m["id"].(string)
	p.say(`{"id":"` + id + `","type":"response","command":"prompt","success":true}`)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	p.say(`{"id":"` + id + `","type":"response","command":"prompt","success":false,"error":"refused later"}`)
	if _, err := p.c.WaitTurn(ctx); !errors.Is(err, ErrPromptFailed) || !strings.Contains(err.Error(), "refused later") {
		t.Fatalf("turn err %v", err)
	}
	if len(p.c.Errors()) != 0 {
		t.Fatalf("reported as errors: %v", p.c.Errors())
	}
}

// Item 20: a frame with a duplicated "type" (read first as an event by the
// fast path, last as a response by encoding/json) is refused, and the
// request it names fails at once instead of waiting for its context.
func TestClient_DuplicateKeyFrameFailsItsWaiter(t *testing.T) {
	for _, frame := range []string{
		`{"type":"message_update","id":"%s","type":"response","command":"get_state","success":true}`,
		`{"type":"response","id":"%s","command":"get_state","success":true,"type":"message_update"}`,
		`{"id":"%s","type":"response","command":"get_state","success":true,"id":"other"}`,
		// The same in the spellings encoding/json takes for the key: the
		// decoder would answer "other", the scanner the request.
		`{"type":"response","id":"%s","ID":"other","command":"get_state","success":true}`,
		`{"type":"response","id":"%s","Id":"other","command":"get_state","success":true}`,
		`{"type":"response","id":"%s","\u0069d":"other","command":"get_state","success":true}`,
		`{"type":"response","id":"%s","command":"get_state","success":true,"Type":"message_update"}`,
		`{"type":"response","id":"%s","command":"get_state","success":true,"t\u0079pe":"message_update"}`,
	} {
		p := newPipePeer(t, Options{})
		ctx := ctxT(t, 10*time.Second)
		errc := make(chan error, 1)
		go func() {
			_, err := p.c.GetState(ctx)
			errc <- err
		}()
		m := p.recv()
		p.say(fmt.Sprintf(frame, m["id"]))
		var dk *DuplicateKeyError
		if err := <-errc; !errors.Is(err, ErrProtocol) || !errors.As(err, &dk) {
			t.Fatalf("%s: get_state err %v", frame, err)
		}
	}
}

// Item 20: a numeric id in a raw line is matched by its literal text; an
// id already pending is refused, not overwritten.
func TestClient_RequestLineIDs(t *testing.T) {
	p := newPipePeer(t, Options{})
	ctx := ctxT(t, 10*time.Second)
	type res struct {
		r   *Response
		err error
	}
	num := make(chan res, 1)
	go func() {
		r, err := p.c.RequestLine(ctx, []byte(`{"id":7,"type":"get_state"}`))
		num <- res{r, err}
	}()
	p.recv()
	p.say(`{"id":7,"type":"response","command":"get_state","success":true}`)
	if got := <-num; got.err != nil || got.r.ID != "7" {
		t.Fatalf("numeric id: %+v %v", got.r, got.err)
	}

	first := make(chan res, 1)
	go func() {
		r, err := p.c.RequestLine(ctx, []byte(`{"id":"x","type":"get_state"}`))
		first <- res{r, err}
	}()
	p.recv()
	if _, err := p.c.RequestLine(ctx, []byte(`{"id":"x","type":"get_messages"}`)); !errors.Is(err, ErrDuplicateID) {
		t.Fatalf("second request with a pending id: %v", err)
	}
	p.say(`{"id":"x","type":"response","command":"get_state","success":true}`)
	if got := <-first; got.err != nil || got.r.Command != "get_state" {
		t.Fatalf("first request: %+v %v", got.r, got.err)
	}
}

// answerState answers the next frame the client wrote, which must be a
// get_state, with isStreaming set as given.
func answerState(t *testing.T, p *pipePeer, streaming bool) {
	t.Helper()
	m := p.recv()
	if m["type"] != "get_state" {
		t.Fatalf("sent %v, want get_state", m["type"])
	}
	p.say(fmt.Sprintf(`{"id":"%s","type":"response","command":"get_state","success":true,"data":{"isStreaming":%v,"pendingMessageCount":0}}`, m["id"], streaming))
}

// Item 3 (fake side): an agent without ready that acknowledges a prompt
// and starts no run: the turn ends once get_state says idle, three times in
// a row, with AgentInvoked false.
func TestTurn_AckedPromptWithoutRunSettles(t *testing.T) {
	p := newPipePeer(t, Options{})
	ctx := ctxT(t, 10*time.Second)
	promptAcked(t, p, ctx, "/probe", nil)
	for i := 0; i < noRunIdleAnswers; i++ {
		answerState(t, p, false)
	}
	turn, err := p.c.WaitTurn(ctx)
	if err != nil || turn.AgentInvoked {
		t.Fatalf("turn %+v, err %v", turn, err)
	}
}

// The no-run poll never races a run about to start: a streaming answer
// resets the count, and an agent_start read before the last idle answer
// keeps the turn for its run.
func TestTurn_NoRunProbeYieldsToARun(t *testing.T) {
	p := newPipePeer(t, Options{})
	ctx := ctxT(t, 10*time.Second)
	promptAcked(t, p, ctx, "hi", nil)
	answerState(t, p, false)
	answerState(t, p, true) // preparing: the count starts over
	answerState(t, p, false)
	answerState(t, p, false)
	// The run starts before the answer that would have been the third.
	m := p.recv()
	if m["type"] != "get_state" {
		t.Fatalf("sent %v", m["type"])
	}
	p.say(`{"type":"agent_start"}`, fmt.Sprintf(`{"id":"%s","type":"response","command":"get_state","success":true,"data":{"isStreaming":false}}`, m["id"]))
	p.say(assistantFrame("ran"), `{"type":"agent_end","messages":[]}`)
	turn, err := p.c.WaitTurn(ctx)
	if err != nil || turn.Text != "ran" || !turn.AgentInvoked {
		t.Fatalf("turn %+v, err %v", turn, err)
	}
}
