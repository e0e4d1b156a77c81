package rpc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/rpc"
)

// Extension UI dialogs through the real omp and pi: testdata/ext/ask_user.ts
// registers the tool ask_user, whose execute asks select, confirm, input and
// editor through ctx.ui (plus notify and setStatus) and returns every answer
// as one line of text. The scripted model calls it on [[tool:ask_user {...}]]
// and answers "done" once it has the result.
//
// Plain --mode rpc is enough for both agents: omp gives extensions its RPC UI
// context in rpc and rpc-ui alike (rpc-ui only adds a UI for built-in tools
// such as ask).
//
// Each agent is spawned twice: once with a UI handler (the phases swap the
// handler behind it) and once with none. The agent's stdin is tapped, so the
// tests also check what the client wrote back: one extension_ui_response per
// answered dialog, none for fire-and-forget methods, none once the agent
// resolved a dialog itself.

// askUserExt is the test extension, loaded with -e by both agents.
const askUserExt = "testdata/ext/ask_user.ts"

// uiAgent is a real agent with its UI handler swappable and its stdin tapped.
type uiAgent struct {
	*realAgent
	tap *wireTap
	ui  *uiSwitch
}

// startUIAgent spawns kind as startReal does, with the test extension loaded,
// ui as its handler (nil: none) and a tap on the client's writes.
func startUIAgent(t *testing.T, kind agents.Kind, ui *uiSwitch) *uiAgent {
	t.Helper()
	ext, err := filepath.Abs(askUserExt)
	if err != nil {
		t.Fatal(err)
	}
	var opts rpc.Options
	if ui != nil {
		opts.UI = ui.handle
	}
	tap := newWireTap()
	a := startRealWith(t, kind, rpc.SpawnOptions{Options: opts, Starter: tapStarter{tap: tap}},
		func(s *rpc.Spec) { s.Extensions = []string{ext} })
	return &uiAgent{realAgent: a, tap: tap, ui: ui}
}

func TestRealUI_Dialogs(t *testing.T) {
	bothAgents(t, func(t *testing.T, kind agents.Kind) {
		t0 := time.Now()
		a := startUIAgent(t, kind, &uiSwitch{})
		t.Logf("%s started in %v", kind, time.Since(t0))
		evs := collectUIEvents(a.c)
		dialogIDs := map[string]bool{} // every dialog the handlers saw
		noReply := map[string]string{} // dialogs the agent resolved itself
		var idMu sync.Mutex
		seen := func(req *rpc.UIRequest) {
			idMu.Lock()
			dialogIDs[req.ID] = true
			idMu.Unlock()
		}

		t.Run("answers", func(t *testing.T) {
			ctx := tctx(t, 60*time.Second)
			var mu sync.Mutex
			var got []rpc.UIRequest
			a.ui.set(func(ctx context.Context, req *rpc.UIRequest) rpc.UIResponse {
				seen(req)
				mu.Lock()
				got = append(got, *req)
				mu.Unlock()
				switch req.Method {
				case rpc.UIMethodSelect:
					return rpc.Value("b")
				case rpc.UIMethodConfirm:
					return rpc.Confirmed(true)
				case rpc.UIMethodInput:
					return rpc.Value(`typed "quoted" ünïcödé`)
				case rpc.UIMethodEditor:
					return rpc.Value(req.Prefill + "\nline three")
				}
				return rpc.Cancelled()
			})
			turn := runAsk(ctx, t, a, `{}`)
			want := fmt.Sprintf("hasUI=true select=%s confirm=true input=%s editor=%s",
				jsString("b"), jsString(`typed "quoted" ünïcödé`), jsString("line one\nline two\nline three"))
			checkAskResult(t, a, turn, want)

			mu.Lock()
			defer mu.Unlock()
			checkDialogs(t, got)
			checkReplies(t, a.tap, got, []string{
				`{"value":"b"}`, `{"confirmed":true}`,
				`{"value":"typed \"quoted\" ünïcödé"}`, `{"value":"line one\nline two\nline three"}`,
			})

			// notify and setStatus are fire-and-forget: events only, in the
			// turn and to listeners.
			if got := fire(turnUIEvents(t, turn)); !slices.Equal(got, wantFire) {
				t.Errorf("fire-and-forget requests in the turn: %q, want %q", got, wantFire)
			}
			if got, ok := evs.waitFor(ctx, func(l []rpc.ExtensionUIRequestEvent) bool { return len(fire(l)) >= len(wantFire) }); !ok {
				t.Errorf("listeners saw fire-and-forget requests %q, want %q", fire(got), wantFire)
			} else if !slices.Equal(fire(got), wantFire) {
				t.Errorf("listeners saw fire-and-forget requests %q, want %q", fire(got), wantFire)
			}
			// The dialogs reach listeners too.
			if got, ok := evs.waitFor(ctx, func(l []rpc.ExtensionUIRequestEvent) bool { return countDialogs(l) >= 4 }); !ok {
				t.Errorf("listeners saw %d dialogs, want 4", countDialogs(got))
			}
		})

		t.Run("cancelled", func(t *testing.T) {
			ctx := tctx(t, 60*time.Second)
			var mu sync.Mutex
			var got []rpc.UIRequest
			a.ui.set(func(ctx context.Context, req *rpc.UIRequest) rpc.UIResponse {
				seen(req)
				mu.Lock()
				got = append(got, *req)
				mu.Unlock()
				if req.Method == rpc.UIMethodInput {
					return rpc.Value("kept")
				}
				return rpc.Cancelled()
			})
			turn := runAsk(ctx, t, a, `{}`)
			checkAskResult(t, a, turn, `hasUI=true select=(cancelled) confirm=false input="kept" editor=(cancelled)`)
			mu.Lock()
			defer mu.Unlock()
			checkDialogs(t, got)
			checkReplies(t, a.tap, got, []string{`{"cancelled":true}`, `{"cancelled":true}`, `{"value":"kept"}`, `{"cancelled":true}`})
		})

		t.Run("channel", func(t *testing.T) {
			ctx := tctx(t, 60*time.Second)
			ch := make(chan *rpc.Dialog)
			a.ui.set(rpc.UIChannel(ch))
			answered := make(chan []rpc.UIRequest, 1)
			stop := make(chan struct{})
			go func() {
				var got []rpc.UIRequest
				defer func() { answered <- got }()
				for {
					select {
					case d := <-ch:
						seen(d.Request)
						got = append(got, *d.Request)
						if d.Context.Err() != nil {
							d.Reply(rpc.Cancelled())
							continue
						}
						switch d.Request.Method {
						case rpc.UIMethodSelect:
							d.Reply(rpc.Value("c"))
						case rpc.UIMethodConfirm:
							d.Reply(rpc.Confirmed(false))
						case rpc.UIMethodInput:
							d.Reply(rpc.Value("from channel"))
						default:
							d.Reply(rpc.Value("")) // empty is an answer, not a cancel
						}
						d.Reply(rpc.Value("second reply is ignored"))
					case <-stop:
						return
					case <-ctx.Done():
						return
					}
				}
			}()
			turn := runAsk(ctx, t, a, `{}`)
			close(stop)
			var got []rpc.UIRequest
			select {
			case got = <-answered:
			case <-ctx.Done():
				t.Fatal("the channel reader never finished")
			}
			checkAskResult(t, a, turn, `hasUI=true select="c" confirm=false input="from channel" editor=""`)
			checkDialogs(t, got)
			checkReplies(t, a.tap, got, []string{`{"value":"c"}`, `{"confirmed":false}`, `{"value":"from channel"}`, `{"value":""}`})
		})

		// A dialog with a timeout: the agent resolves it itself; the
		// handler's context ends at the same deadline and its late answer
		// is never sent.
		t.Run("timed", func(t *testing.T) {
			ctx := tctx(t, 60*time.Second)
			type outcome struct {
				req rpc.UIRequest
				err error
			}
			done := make(chan outcome, 1)
			var calls atomic.Int32
			a.ui.set(func(hctx context.Context, req *rpc.UIRequest) rpc.UIResponse {
				seen(req)
				calls.Add(1)
				select {
				case <-hctx.Done():
				case <-ctx.Done():
				}
				select {
				case done <- outcome{*req, hctx.Err()}:
				default: // an unexpected second dialog; the test fails on the first
				}
				return rpc.Value("too late")
			})
			turn := runAsk(ctx, t, a, `{"scenario":"timed"}`)
			checkAskResult(t, a, turn, `timed=(cancelled)`)
			if n := calls.Load(); n != 1 {
				t.Errorf("%d dialogs, want 1", n)
			}
			select {
			case o := <-done:
				if o.req.Method != rpc.UIMethodInput || o.req.Title != "Timed question" || o.req.Timeout != 400 {
					t.Errorf("timed dialog: %+v", o.req)
				}
				if !errors.Is(o.err, context.DeadlineExceeded) {
					t.Errorf("the handler's context ended with %v, want the dialog's deadline", o.err)
				}
				idMu.Lock()
				noReply[o.req.ID] = "timed out"
				idMu.Unlock()
			case <-ctx.Done():
				t.Fatal("the timed dialog's handler never returned")
			}
		})

		// The extension withdraws its dialog through an AbortSignal. omp
		// tells the host (a cancel request naming the dialog), which ends the
		// handler's context. pi sends nothing: the handler's context stays
		// live (until Close), and once the test releases it the client's
		// answer goes to a pi that no longer waits (and ignores it).
		t.Run("withdraw", func(t *testing.T) {
			ctx := tctx(t, 60*time.Second)
			type outcome struct {
				req rpc.UIRequest
				err error
			}
			asked := make(chan rpc.UIRequest, 1)
			done := make(chan outcome, 1)
			release := make(chan struct{})
			var calls atomic.Int32
			a.ui.set(func(hctx context.Context, req *rpc.UIRequest) rpc.UIResponse {
				seen(req)
				calls.Add(1)
				select {
				case asked <- *req:
				default:
				}
				select {
				case <-hctx.Done():
				case <-release:
				case <-ctx.Done():
				}
				select {
				case done <- outcome{*req, hctx.Err()}:
				default:
				}
				return rpc.Cancelled()
			})
			turn := runAsk(ctx, t, a, `{"scenario":"withdraw"}`)
			checkAskResult(t, a, turn, `withdrawn=(cancelled)`)
			if n := calls.Load(); n != 1 {
				t.Errorf("%d dialogs, want 1", n)
			}
			var req rpc.UIRequest
			select {
			case req = <-asked:
			case <-ctx.Done():
				t.Fatal("the withdrawn dialog never reached the handler")
			}
			if req.Method != rpc.UIMethodInput || req.Title != "Withdrawn question" || req.Placeholder != "never answered" {
				t.Errorf("withdrawn dialog: %+v", req)
			}
			var cancels []string
			for _, e := range turnUIEvents(t, turn) {
				if e.Method == rpc.UIMethodCancel {
					cancels = append(cancels, e.TargetID)
				}
			}
			if kind == agents.OMP {
				if !slices.Equal(cancels, []string{req.ID}) {
					t.Errorf("omp cancel requests target %q, want [%s]", cancels, req.ID)
				}
				select {
				case o := <-done:
					if !errors.Is(o.err, context.Canceled) {
						t.Errorf("the handler's context ended with %v, want cancelled", o.err)
					}
				case <-ctx.Done():
					t.Fatal("omp withdrew the dialog but the handler's context never ended")
				}
				idMu.Lock()
				noReply[req.ID] = "withdrawn"
				idMu.Unlock()
				return
			}
			// pi: no cancel request; the dialog is still open on the host.
			if len(cancels) != 0 {
				t.Errorf("pi sent cancel requests %q", cancels)
			}
			select {
			case o := <-done:
				t.Errorf("the handler returned (%v) though pi never withdrew the dialog on the wire", o.err)
			default:
			}
			close(release)
			select {
			case <-done:
			case <-ctx.Done():
				t.Fatal("the released handler never returned")
			}
			// Its late answer still goes out (pi ignores it); wait for it
			// before Close ends the transport.
			a.tap.waitResponse(ctx, t, req.ID)
		})

		// After Close and Wait every goroutine of the client has
		// finished: the tap holds everything it will ever write.
		t1 := time.Now()
		if err := closeJoin(t, a.c); err != nil {
			t.Fatalf("close: %v", err)
		}
		t.Logf("%s closed in %v", kind, time.Since(t1))
		all := evs.snapshot()
		idMu.Lock()
		defer idMu.Unlock()
		checkWire(t, a.tap, all, dialogIDs, noReply)
		t.Logf("%s: %d dialogs, %d UI requests in all, %v", kind, len(dialogIDs), len(all), time.Since(t0))
	})
}

// With no UI handler every dialog is cancelled at once, so a tool that asks
// still finishes and the turn ends.
func TestRealUI_NoHandler(t *testing.T) {
	bothAgents(t, func(t *testing.T, kind agents.Kind) {
		t0 := time.Now()
		a := startUIAgent(t, kind, nil)
		t.Logf("%s started in %v", kind, time.Since(t0))
		evs := collectUIEvents(a.c)
		ctx := tctx(t, 60*time.Second)
		turn := runAsk(ctx, t, a, `{}`)
		checkAskResult(t, a, turn, `hasUI=true select=(cancelled) confirm=false input=(cancelled) editor=(cancelled)`)

		var dialogs []rpc.UIRequest
		for _, e := range turnUIEvents(t, turn) {
			if dialogMethod(e.Method) {
				dialogs = append(dialogs, e)
			}
		}
		checkDialogs(t, dialogs)
		checkReplies(t, a.tap, dialogs, []string{`{"cancelled":true}`, `{"cancelled":true}`, `{"cancelled":true}`, `{"cancelled":true}`})

		got, _ := evs.waitFor(ctx, func(l []rpc.ExtensionUIRequestEvent) bool { return len(fire(l)) >= len(wantFire) })
		if !slices.Equal(fire(got), wantFire) {
			t.Errorf("listeners saw fire-and-forget requests %q, want %q", fire(got), wantFire)
		}

		t1 := time.Now()
		if err := closeJoin(t, a.c); err != nil {
			t.Fatalf("close: %v", err)
		}
		t.Logf("%s closed in %v", kind, time.Since(t1))
		ids := map[string]bool{}
		for _, d := range dialogs {
			ids[d.ID] = true
		}
		all := evs.snapshot()
		checkWire(t, a.tap, all, ids, nil)
		t.Logf("%s: %v", kind, time.Since(t0))
	})
}

// runAsk runs one ask_user turn and checks it ended with "done" after the
// tool ran.
func runAsk(ctx context.Context, t *testing.T, a *uiAgent, args string) *rpc.Turn {
	t.Helper()
	turn, err := a.c.Run(ctx, "[[tool:ask_user "+args+"]]", nil)
	if err != nil {
		t.Fatalf("ask_user turn: %v (stderr: %s)", err, lastLines(a.c.Stderr(), 5))
	}
	if turn.Text != "done" || turn.StopReason != "stop" {
		t.Fatalf("ask_user turn: text %q stop %q err %q", turn.Text, turn.StopReason, turn.ErrorMessage)
	}
	return turn
}

// checkAskResult checks the ask_user result in the turn's
// tool_execution_end and in what the model received.
func checkAskResult(t *testing.T, a *uiAgent, turn *rpc.Turn, want string) {
	t.Helper()
	var ends []string
	for _, e := range turn.Events {
		if e.Type != rpc.EventToolExecutionEnd {
			continue
		}
		var te rpc.ToolExecutionEvent
		if err := e.Decode(&te); err != nil {
			t.Fatal(err)
		}
		var res struct {
			Content []struct{ Type, Text string }
		}
		if err := json.Unmarshal(te.Result, &res); err != nil {
			t.Fatalf("tool result %s: %v", te.Result, err)
		}
		if te.ToolName != "ask_user" || te.IsError || len(res.Content) != 1 || res.Content[0].Type != "text" {
			t.Fatalf("tool_execution_end: %s %v %s", te.ToolName, te.IsError, te.Result)
		}
		ends = append(ends, res.Content[0].Text)
	}
	if !slices.Equal(ends, []string{want}) {
		t.Errorf("tool_execution_end results %q, want [%q]", ends, want)
	}

	// The last request that offered tools (side requests such as title
	// generation offer none) is the one the model answered "done": it ends
	// with the tool's result.
	var last *modelsim.Request
	for _, r := range a.sim.Requests() {
		if len(r.Tools) > 0 {
			last = &r
		}
	}
	if last == nil || len(last.Messages) == 0 {
		t.Fatal("the model got no request with tools")
	}
	if !slices.Contains(last.Tools, "ask_user") {
		t.Errorf("ask_user was not offered to the model: %q", last.Tools)
	}
	if m := last.Messages[len(last.Messages)-1]; m.Role != "tool" || m.Content != want {
		t.Errorf("the model received %s %q, want the tool result %q", m.Role, m.Content, want)
	}
}

// checkDialogs checks the four dialogs of the "all" scenario arrived in
// order with their fields.
func checkDialogs(t *testing.T, got []rpc.UIRequest) {
	t.Helper()
	if len(got) != 4 {
		t.Fatalf("%d dialogs, want 4: %+v", len(got), got)
	}
	s, c, i, e := got[0], got[1], got[2], got[3]
	if s.Method != rpc.UIMethodSelect || s.Title != "Pick a letter" || !slices.Equal(s.Options, []string{"a", "b", "c"}) {
		t.Errorf("select: %+v", s)
	}
	if c.Method != rpc.UIMethodConfirm || c.Title != "Proceed?" || c.Message != "Really proceed with the plan?" {
		t.Errorf("confirm: %+v", c)
	}
	if i.Method != rpc.UIMethodInput || i.Title != "Your name" || i.Placeholder != "type a name" {
		t.Errorf("input: %+v", i)
	}
	if e.Method != rpc.UIMethodEditor || e.Title != "Edit the note" || e.Prefill != "line one\nline two" {
		t.Errorf("editor: %+v", e)
	}
	for _, d := range got {
		if d.ID == "" || d.Timeout != 0 {
			t.Errorf("%s: id %q timeout %d", d.Method, d.ID, d.Timeout)
		}
	}
}

// checkReplies checks the client wrote exactly one extension_ui_response for
// each dialog, with the given payload (the frame without type and id).
func checkReplies(t *testing.T, tap *wireTap, dialogs []rpc.UIRequest, want []string) {
	t.Helper()
	byID := tap.responses(t)
	for n, d := range dialogs {
		rs := byID[d.ID]
		if len(rs) != 1 {
			t.Errorf("%s dialog %s: %d responses, want 1", d.Method, d.ID, len(rs))
			continue
		}
		if got := responsePayload(t, rs[0]); got != want[n] {
			t.Errorf("%s dialog: response %s, want %s", d.Method, got, want[n])
		}
	}
}

// checkWire checks, once the client is closed, that it answered every dialog
// in dialogs exactly once unless the agent resolved it itself (noReply), and
// wrote nothing else: no answer to a fire-and-forget request.
func checkWire(t *testing.T, tap *wireTap, all []rpc.ExtensionUIRequestEvent, dialogs map[string]bool, noReply map[string]string) {
	t.Helper()
	byID := tap.responses(t)
	for id, rs := range byID {
		if !dialogs[id] {
			method := "an unknown request"
			for _, e := range all {
				if e.ID == id {
					method = e.Method
				}
			}
			t.Errorf("the client answered %s (%s): %s", method, id, rs)
		}
	}
	for id := range dialogs {
		want := 1
		if noReply[id] != "" {
			want = 0
		}
		if n := len(byID[id]); n != want {
			t.Errorf("dialog %s (%s): %d responses, want %d", id, noReply[id], n, want)
		}
	}
	var fire int
	for _, e := range all {
		if !dialogMethod(e.Method) {
			fire++
		}
	}
	if fire == 0 {
		t.Error("no fire-and-forget request was seen")
	}
}

func responsePayload(t *testing.T, frame []byte) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(frame, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "type")
	delete(m, "id")
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(b.String())
}

func turnUIEvents(t *testing.T, turn *rpc.Turn) []rpc.ExtensionUIRequestEvent {
	t.Helper()
	var out []rpc.ExtensionUIRequestEvent
	for _, e := range turn.Events {
		if e.Type == rpc.EventExtensionUIRequest {
			var r rpc.ExtensionUIRequestEvent
			if err := e.Decode(&r); err != nil {
				t.Fatal(err)
			}
			out = append(out, r)
		}
	}
	return out
}

func dialogMethod(m string) bool {
	switch m {
	case rpc.UIMethodSelect, rpc.UIMethodConfirm, rpc.UIMethodInput, rpc.UIMethodEditor:
		return true
	}
	return false
}

func countDialogs(l []rpc.ExtensionUIRequestEvent) int {
	n := 0
	for _, e := range l {
		if dialogMethod(e.Method) {
			n++
		}
	}
	return n
}

// wantFire are the fire-and-forget requests of the "all" scenario, as fire
// describes them.
var wantFire = []string{"notify info: asking the user", "setStatus ask_user=asking", "setStatus ask_user cleared"}

// fire describes the extension's own fire-and-forget requests in l. Others
// are left out: omp's bundled autoresearch extension clears its widget
// (setWidget) on every turn.
func fire(l []rpc.ExtensionUIRequestEvent) []string {
	var out []string
	for _, e := range l {
		switch {
		case e.Method == rpc.UIMethodNotify:
			out = append(out, "notify "+e.NotifyType+": "+e.Message)
		case e.Method == rpc.UIMethodSetStatus && e.StatusKey == "ask_user" && e.StatusText == nil:
			out = append(out, "setStatus ask_user cleared")
		case e.Method == rpc.UIMethodSetStatus && e.StatusKey == "ask_user":
			out = append(out, "setStatus ask_user="+*e.StatusText)
		}
	}
	return out
}

// jsString quotes s as JSON.stringify does (no HTML escaping).
func jsString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return strings.TrimSpace(b.String())
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// uiSwitch is a UI handler whose behaviour the test swaps between phases.
type uiSwitch struct {
	mu sync.Mutex
	h  rpc.UIHandler
}

func (s *uiSwitch) set(h rpc.UIHandler) {
	s.mu.Lock()
	s.h = h
	s.mu.Unlock()
}

func (s *uiSwitch) handle(ctx context.Context, req *rpc.UIRequest) rpc.UIResponse {
	s.mu.Lock()
	h := s.h
	s.mu.Unlock()
	if h == nil {
		return rpc.Cancelled()
	}
	return h(ctx, req)
}

// uiEvents collects extension_ui_request events from a listener.
type uiEvents struct {
	mu   sync.Mutex
	evs  []rpc.ExtensionUIRequestEvent
	wake chan struct{}
}

func collectUIEvents(c *rpc.Client) *uiEvents {
	u := &uiEvents{wake: make(chan struct{}, 1)}
	c.On(rpc.EventExtensionUIRequest, func(e rpc.Event) {
		var r rpc.ExtensionUIRequestEvent
		if err := e.Decode(&r); err != nil {
			r = rpc.ExtensionUIRequestEvent{Method: "undecodable: " + err.Error()}
		}
		u.mu.Lock()
		u.evs = append(u.evs, r)
		u.mu.Unlock()
		select {
		case u.wake <- struct{}{}:
		default:
		}
	})
	return u
}

func (u *uiEvents) snapshot() []rpc.ExtensionUIRequestEvent {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.evs)
}

// waitFor waits until ok holds for the events so far, or ctx ends; it
// returns the events and whether ok held.
func (u *uiEvents) waitFor(ctx context.Context, ok func([]rpc.ExtensionUIRequestEvent) bool) ([]rpc.ExtensionUIRequestEvent, bool) {
	for {
		u.mu.Lock()
		evs := slices.Clone(u.evs)
		u.mu.Unlock()
		if ok(evs) {
			return evs, true
		}
		select {
		case <-u.wake:
		case <-ctx.Done():
			return evs, false
		}
	}
}

// wireTap records what the client writes to the agent's stdin.
type wireTap struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	wrote chan struct{} // signalled after each write
}

func newWireTap() *wireTap { return &wireTap{wrote: make(chan struct{}, 1)} }

func (w *wireTap) record(p []byte) {
	w.mu.Lock()
	w.buf.Write(p)
	w.mu.Unlock()
	select {
	case w.wrote <- struct{}{}:
	default:
	}
}

// waitResponse waits until a response to dialog id is on the wire.
func (w *wireTap) waitResponse(ctx context.Context, t *testing.T, id string) {
	t.Helper()
	for len(w.responses(t)[id]) == 0 {
		select {
		case <-w.wrote:
		case <-ctx.Done():
			t.Fatalf("no response to dialog %s reached the wire", id)
		}
	}
}

// responses returns the complete extension_ui_response frames written so
// far, by dialog id.
func (w *wireTap) responses(t *testing.T) map[string][][]byte {
	t.Helper()
	w.mu.Lock()
	data := slices.Clone(w.buf.Bytes())
	w.mu.Unlock()
	out := map[string][][]byte{}
	for line := range bytes.Lines(data) {
		if !bytes.HasSuffix(line, []byte("\n")) {
			break // still being written
		}
		var f struct{ Type, ID string }
		if json.Unmarshal(line, &f) != nil || f.Type != "extension_ui_response" {
			continue
		}
		out[f.ID] = append(out[f.ID], bytes.TrimSpace(line))
	}
	return out
}

// tapStarter starts the agent with the built-in GroupStarter and records
// every frame the client writes to its stdin.
type tapStarter struct{ tap *wireTap }

func (s tapStarter) Start(ctx context.Context, cmd *exec.Cmd) (rpc.Process, error) {
	p, err := rpc.GroupStarter{}.Start(ctx, cmd)
	if err != nil {
		return nil, err
	}
	return tapProcess{Process: p, stdin: tapWriter{p.Stdin(), s.tap}}, nil
}

type tapWriter struct {
	w   io.WriteCloser
	tap *wireTap
}

// Write records p before writing it, so the tap already holds a frame by
// the time the agent can act on it.
func (t tapWriter) Write(p []byte) (int, error) {
	t.tap.record(p)
	return t.w.Write(p)
}

func (t tapWriter) Close() error { return t.w.Close() }

// tapProcess is the started process with its stdin recorded.
type tapProcess struct {
	rpc.Process
	stdin tapWriter
}

func (p tapProcess) Stdin() io.WriteCloser { return p.stdin }
