package acp

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	sdk "github.com/coder/acp-go-sdk"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(fakeEnv) != "" {
		os.Exit(fakeAgent())
	}
	goleak.VerifyTestMain(m)
}

// events collects a client's events.
type events struct {
	mu  sync.Mutex
	evs []Event
}

func (e *events) add(ev Event) {
	e.mu.Lock()
	e.evs = append(e.evs, ev)
	e.mu.Unlock()
}

func (e *events) all() []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Event(nil), e.evs...)
}

// startFake starts the fake agent under a fresh custodian; the test's
// cleanup closes both and checks the receipt.
func startFake(t *testing.T, opts Options) (*Client, *events) {
	t.Helper()
	cust, err := custody.New(custody.Options{})
	if err != nil {
		t.Fatal(err)
	}
	evs := &events{}
	opts.Custodian = cust
	if opts.Events == nil {
		opts.Events = evs.add
	}
	if opts.CloseGrace == 0 {
		opts.CloseGrace = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	mode := cmp.Or(os.Getenv("TEST_FAKE_MODE"), "1")
	c, err := Start(ctx, Spec{Argv: []string{os.Args[0]}, Env: append(os.Environ(), fakeEnv+"="+mode)}, opts)
	if err != nil {
		_ = cust.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := c.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
		if err := c.Wait(ctx); err != nil {
			t.Errorf("wait: %v", err)
		}
		if err := cust.Close(); err != nil {
			t.Errorf("custody: %v", err)
		}
	})
	return c, evs
}

func newSession(t *testing.T, c *Client) string {
	t.Helper()
	s, err := c.NewSession(t.Context(), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return s.ID
}

func prompt(t *testing.T, c *Client, s, text string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	r, err := c.Prompt(ctx, s, text)
	if err != nil {
		t.Fatalf("prompt %q: %v", text, err)
	}
	return r
}

func TestPromptCollectsText(t *testing.T) {
	c, evs := startFake(t, Options{})
	if !c.Initialize().AgentCapabilities.LoadSession {
		t.Fatal("the agent's capabilities were not recorded")
	}
	s := newSession(t, c)
	r := prompt(t, c, s, "hello")
	if r.Text != "hi there" || r.StopReason != sdk.StopReasonEndTurn {
		t.Fatalf("result %+v", r)
	}
	var got []string
	for _, ev := range evs.all() {
		got = append(got, ev.Type+"="+ev.Text())
	}
	if strings.Join(got, ",") != "agent_message_chunk=hi ,agent_message_chunk=there" {
		t.Fatalf("events %v", got)
	}
}

func TestMalformedLinesReportedAndReadingGoesOn(t *testing.T) {
	c, evs := startFake(t, Options{})
	s := newSession(t, c)
	r := prompt(t, c, s, "malformed")
	if r.Text != "after" {
		t.Fatalf("the turn after the malformed lines: %+v", r)
	}
	var bad []error
	for _, ev := range evs.all() {
		if ev.Type == TypeMalformed {
			bad = append(bad, ev.Err)
		}
	}
	if len(bad) != 4 || c.Malformed() != 4 {
		t.Fatalf("malformed reports %v (count %d), want 4", bad, c.Malformed())
	}
	for _, err := range bad {
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%v does not match ErrMalformed", err)
		}
		if strings.Contains(err.Error(), "not json") || strings.Contains(err.Error(), "jsonrpc") {
			t.Errorf("the report carries the payload: %v", err)
		}
	}
	// The connection still works.
	if r := prompt(t, c, s, "hello"); r.Text != "hi there" {
		t.Fatalf("next turn: %+v", r)
	}
}

func TestLongLineSkipped(t *testing.T) {
	c, evs := startFake(t, Options{MaxLineBytes: 1 << 20})
	s := newSession(t, c)
	if r := prompt(t, c, s, "long"); r.Text != "after" {
		t.Fatalf("result %+v", r)
	}
	var le *LineError
	for _, ev := range evs.all() {
		if ev.Type == TypeMalformed && errors.As(ev.Err, &le) {
			break
		}
	}
	if le == nil || le.Len <= 1<<20 || !strings.Contains(le.Reason, "cap") {
		t.Fatalf("no too-long report: %+v", le)
	}
}

func TestUnknownUpdateKeptRaw(t *testing.T) {
	c, evs := startFake(t, Options{})
	s := newSession(t, c)
	if r := prompt(t, c, s, "unknown"); r.Text != "after" {
		t.Fatalf("result %+v", r)
	}
	var found bool
	for _, ev := range evs.all() {
		if ev.Type == "future_chunk" && (ev.Known || ev.Update != (sdk.SessionUpdate{}) || ev.Text() != "" || !strings.Contains(string(ev.Raw), "not a reply")) {
			t.Fatalf("an unknown kind shaped like a chunk was decoded as a known one: %+v", ev)
		}
		if ev.Type == "future_thing" {
			found = true
			var v map[string]any
			if ev.Known || json.Unmarshal(ev.Raw, &v) != nil || v["x"] != float64(1) || ev.SessionID != s {
				t.Fatalf("unknown update not kept raw: %+v", ev)
			}
		}
	}
	if !found {
		t.Fatal("the unknown update kind was dropped")
	}
}

func TestAgentExitMidPrompt(t *testing.T) {
	c, _ := startFake(t, Options{})
	s := newSession(t, c)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := c.Prompt(ctx, s, "exit")
	var ee *ExitError
	if !errors.Is(err, ErrAgentExited) || !errors.As(err, &ee) {
		t.Fatalf("err %v, want an ExitError", err)
	}
	var xe interface{ ExitCode() int }
	if !errors.As(ee.Status, &xe) || xe.ExitCode() != 3 || !strings.Contains(ee.Stderr, "exiting mid-turn") {
		t.Fatalf("exit status %v, stderr %q", ee.Status, ee.Stderr)
	}
	select {
	case <-c.Done():
	default:
		t.Fatal("Done is open after the agent exited")
	}
}

func TestPermission(t *testing.T) {
	for _, allow := range []bool{true, false} {
		t.Run(strconv.FormatBool(allow), func(t *testing.T) {
			var got PermissionRequest
			c, _ := startFake(t, Options{Permission: func(ctx context.Context, req PermissionRequest) bool {
				got = req
				return allow
			}})
			s := newSession(t, c)
			r := prompt(t, c, s, "permission")
			want := `"optionId":"no"`
			if allow {
				want = `"optionId":"yes"`
			}
			if !strings.Contains(r.Text, want) || !strings.Contains(r.Text, `"outcome":"selected"`) {
				t.Fatalf("the agent got %s, want %s", r.Text, want)
			}
			if got.Title != "bash" || got.Kind != "execute" || got.ToolCallID != "t1" || !strings.Contains(string(got.RawInput), "echo hi") {
				t.Fatalf("request %+v", got)
			}
		})
	}
}

func TestPermissionNobodyAnswersDeniedAtDeadline(t *testing.T) {
	asked := make(chan struct{})
	c, _ := startFake(t, Options{PermissionTimeout: 300 * time.Millisecond, Permission: func(ctx context.Context, req PermissionRequest) bool {
		close(asked)
		<-ctx.Done() // nobody answers
		return true
	}})
	s := newSession(t, c)
	r := prompt(t, c, s, "permission")
	<-asked
	if !strings.Contains(r.Text, `"optionId":"no"`) {
		t.Fatalf("an unanswered permission was not denied: %s", r.Text)
	}
}

func TestPermissionWithoutCallbackDenied(t *testing.T) {
	c, _ := startFake(t, Options{})
	s := newSession(t, c)
	if r := prompt(t, c, s, "permission"); !strings.Contains(r.Text, `"optionId":"no"`) {
		t.Fatalf("got %s", r.Text)
	}
}

func TestHangTimesOutAndIsReleased(t *testing.T) {
	c, _ := startFake(t, Options{CloseGrace: 500 * time.Millisecond})
	s := newSession(t, c)
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	_, err := c.Prompt(ctx, s, "hang")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want the deadline", err)
	}
	cctx, ccancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer ccancel()
	r, err := c.Close(cctx)
	if err != nil {
		t.Fatal(err)
	}
	if c.Closure().StdoutEOF {
		t.Fatal("a hung agent reported stdout EOF")
	}
	if len(r.Processes) == 0 || r.Processes[0].Ended == custody.EndedSelf || r.Processes[0].Ended == custody.EndedUnknown {
		t.Fatalf("receipt %v", r)
	}
	if err := syscall.Kill(c.Pid(), 0); err == nil {
		t.Fatalf("pid %d still runs", c.Pid())
	}
}

func TestCancelEndsTurn(t *testing.T) {
	c, _ := startFake(t, Options{})
	s := newSession(t, c)
	type res struct {
		r   Result
		err error
	}
	done := make(chan res, 1)
	go func() {
		r, err := c.Prompt(t.Context(), s, "cancel")
		done <- res{r, err}
	}()
	// Cancel only once the prompt is registered.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := c.Cancel(t.Context(), s)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrNoTurn) || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	r := <-done
	if r.err != nil || r.r.StopReason != sdk.StopReasonCancelled {
		t.Fatalf("%+v", r)
	}
}

func TestCancelBounded(t *testing.T) {
	c, _ := startFake(t, Options{CancelTimeout: 300 * time.Millisecond, CloseGrace: 200 * time.Millisecond})
	s := newSession(t, c)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Prompt(ctx, s, "hang")
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := c.Cancel(t.Context(), s)
		if errors.Is(err, ErrCancelTimeout) {
			break
		}
		if !errors.Is(err, ErrNoTurn) || time.Now().After(deadline) {
			t.Fatalf("cancel: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("prompt: %v", err)
	}
}

// TestSessionMeta: Options.SessionMeta reaches the agent in session/new and
// session/load (claude's strictMcpConfig travels this way); none is sent
// without it.
func TestSessionMeta(t *testing.T) {
	c, _ := startFake(t, Options{SessionMeta: map[string]any{"claudeCode": map[string]any{"options": map[string]any{"strictMcpConfig": true}}}})
	const want = `{"claudeCode":{"options":{"strictMcpConfig":true}}}`
	s := newSession(t, c)
	if r := prompt(t, c, s, "meta"); r.Text != want {
		t.Fatalf("session/new _meta %q, want %q", r.Text, want)
	}
	if _, err := c.LoadSession(t.Context(), s, t.TempDir(), nil); err != nil {
		t.Fatal(err)
	}
	if r := prompt(t, c, s, "meta"); r.Text != want {
		t.Fatalf("session/load _meta %q, want %q", r.Text, want)
	}
	plain, _ := startFake(t, Options{})
	if r := prompt(t, plain, newSession(t, plain), "meta"); r.Text != "" {
		t.Fatalf("_meta %q sent without SessionMeta", r.Text)
	}
}

func TestLoadSessionStrict(t *testing.T) {
	c, evs := startFake(t, Options{})
	if _, err := c.LoadSession(t.Context(), "nope", t.TempDir(), nil); !errors.Is(err, ErrSessionNotFound) {
		t.Fatalf("err %v, want ErrSessionNotFound", err)
	}
	s, err := c.LoadSession(t.Context(), "s-1", t.TempDir(), nil)
	if err != nil || s.ID != "s-1" {
		t.Fatalf("%+v %v", s, err)
	}
	// The replay arrived before the load's answer.
	if all := evs.all(); len(all) != 1 || all[0].Text() != "replayed" {
		t.Fatalf("events %+v", all)
	}
}

func TestCloseAtStdinEOF(t *testing.T) {
	cust, err := custody.New(custody.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cust.Close()
	c, err := Start(t.Context(), Spec{Argv: []string{os.Args[0]}, Env: append(os.Environ(), fakeEnv+"=1")}, Options{Custodian: cust})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Close(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if cl := c.Closure(); !cl.StdoutEOF {
		t.Fatalf("closure %+v", cl)
	}
	if len(r.Processes) != 1 || r.Processes[0].Ended != custody.EndedSelf {
		t.Fatalf("receipt %v", r)
	}
	if _, err := c.NewSession(t.Context(), t.TempDir(), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}

// A tool shell in its own session (claude, copilot) is ended by custody.
func TestSetsidDescendantEnded(t *testing.T) {
	c, _ := startFake(t, Options{})
	s := newSession(t, c)
	r := prompt(t, c, s, "setsid")
	pid, err := strconv.Atoi(r.Text)
	if err != nil {
		t.Fatalf("fake: %s", r.Text)
	}
	rc, err := c.Close(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var seen bool
	for _, e := range rc.Processes {
		if e.PID == pid {
			seen = e.Ended != custody.EndedUnknown
		}
	}
	if !seen {
		t.Fatalf("the setsid sleeper %d is not on the receipt as ended: %v", pid, rc)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("pid %d still runs", pid)
	}
}

func TestFSConfined(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "in.txt"), []byte("inside"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	c, _ := startFake(t, Options{FSRoot: root})
	if fs := c.init.AgentCapabilities; fs.LoadSession != true {
		t.Fatal("init")
	}
	s := newSession(t, c)
	for _, tc := range []struct{ prompt, want string }{
		{"read:" + filepath.Join(root, "in.txt"), `ok {"content":"inside"}`},
		{"read:" + filepath.Join(root, "link", "secret"), "error"},
		{"read:" + filepath.Join(root, "..", filepath.Base(outside), "secret"), "error"},
		{"read:" + filepath.Join(outside, "secret"), "error"},
		{"read:in.txt", "error"},
		{"write:" + filepath.Join(root, "sub", "new.txt"), "ok {}"},
		{"write:" + filepath.Join(root, "link", "evil"), "error"},
	} {
		if r := prompt(t, c, s, tc.prompt); r.Text != tc.want {
			t.Errorf("%s: got %q, want %q", tc.prompt, r.Text, tc.want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(root, "sub", "new.txt")); err != nil || string(b) != "written" {
		t.Fatalf("write inside: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(outside, "evil")); err == nil {
		t.Fatal("a write through a symlink left the workspace")
	}
}

// With FSOwner (the agent runs as a user of its own), what a write
// creates is that user's, folders included; a file that was there keeps
// its owner.
func TestFSWriteOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving files to another user needs root")
	}
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "old.txt"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c, _ := startFake(t, Options{FSRoot: root, FSOwner: &FileOwner{UID: 4321, GID: 4322}})
	s := newSession(t, c)
	for _, p := range []string{filepath.Join(root, "a", "b", "new.txt"), filepath.Join(root, "old.txt")} {
		if r := prompt(t, c, s, "write:"+p); r.Text != "ok {}" {
			t.Fatalf("write %s: %q", p, r.Text)
		}
	}
	for p, want := range map[string]uint32{"a": 4321, "a/b": 4321, "a/b/new.txt": 4321, "old.txt": 0} {
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != want || want != 0 && st.Gid != 4322 {
			t.Errorf("%s: owned by %d:%d, want %d", p, st.Uid, st.Gid, want)
		}
	}
}

func TestFSNotAdvertisedWithoutRoot(t *testing.T) {
	c, _ := startFake(t, Options{})
	s := newSession(t, c)
	if r := prompt(t, c, s, "read:/etc/hostname"); r.Text != "error" {
		t.Fatalf("got %q", r.Text)
	}
}

// A prompt whose ctx ends is cancelled on the wire; an agent that ends
// the turn stays usable.
func TestPromptCtxEndCancelsOnTheWire(t *testing.T) {
	c, _ := startFake(t, Options{})
	s := newSession(t, c)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	r, err := c.Prompt(ctx, s, "cancel")
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrCancelTimeout) || r.StopReason != sdk.StopReasonCancelled {
		t.Fatalf("%+v %v", r, err)
	}
	if r := prompt(t, c, s, "hello"); r.Text != "hi there" {
		t.Fatalf("after the cancel: %+v", r)
	}
}

// An agent that ignores session/cancel is given CancelTimeout, no more.
func TestPromptCtxEndCancelBounded(t *testing.T) {
	c, _ := startFake(t, Options{CancelTimeout: 300 * time.Millisecond, CloseGrace: 200 * time.Millisecond})
	s := newSession(t, c)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Prompt(ctx, s, "hang")
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrCancelTimeout) {
			t.Fatalf("err %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Prompt did not return after its ctx and the cancel bound")
	}
}

func TestFormQuestions(t *testing.T) {
	schema := sdk.UnstableElicitationSchema{
		Required: []string{"q0", "n"},
		Properties: map[string]any{
			"q0":        map[string]any{"type": "string", "enum": []any{"red", "blue"}},
			"q0__other": map[string]any{"type": "string", "title": "Other"},
			"n":         map[string]any{"type": "integer", "title": "How many?"},
			"opt":       map[string]any{"type": "string"},
		},
	}
	qs := formQuestions("Pick", schema)
	if len(qs) != 2 || qs[0].Field != "n" || qs[0].Title != "Pick\nHow many?" || qs[1].Field != "q0" ||
		fmt.Sprint(qs[1].Options) != "[red blue]" || qs[1].other != "q0__other" {
		t.Fatalf("%+v", qs)
	}
	if v := answerValue(qs[0], " 3 "); fmt.Sprint(v) != "3" {
		t.Fatalf("integer answer %v", v)
	}
}

// TestFormQuestionsClaudeAsk: claude-agent-acp's AskUserQuestion form (no
// required fields; each choice field "question_N" has an optional free-text
// partner "question_N_custom") is one room question per choice field: asking
// the partner too left a second question nobody answered, and the turn hung.
func TestFormQuestionsClaudeAsk(t *testing.T) {
	schema := sdk.UnstableElicitationSchema{Properties: map[string]any{
		"question_0": map[string]any{"type": "string", "title": "Color", "oneOf": []any{
			map[string]any{"const": "red", "title": "red"}, map[string]any{"const": "blue", "title": "blue"}}},
		"question_0_custom": map[string]any{"type": "string", "title": "Other", "description": "Type your own answer (optional)."},
	}}
	qs := formQuestions("Which color?", schema)
	if len(qs) != 1 || qs[0].Field != "question_0" || qs[0].Title != "Which color?\nColor" ||
		fmt.Sprint(qs[0].Options) != "[red blue]" || qs[0].other != "question_0_custom" {
		t.Fatalf("%+v", qs)
	}
}

// A prompt to an agent that stopped reading its stdin (the write blocks on
// a full pipe) still returns within its ctx and the cancel bound, and
// Close releases the agent.
func TestPromptToDeafAgentBounded(t *testing.T) {
	t.Setenv("TEST_FAKE_MODE", "deaf")
	c, _ := startFake(t, Options{CancelTimeout: 300 * time.Millisecond, CloseGrace: 200 * time.Millisecond})
	s := newSession(t, c)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Prompt(ctx, s, strings.Repeat("x", 1<<20))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrCancelTimeout) {
			t.Fatalf("err %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Prompt blocked on a write to an agent that does not read")
	}
}

// The agent's requests are handled at most maxInbound at once; the rest
// are refused (a permission denied) at once, and every one is answered.
func TestInboundRequestsBounded(t *testing.T) {
	var mu sync.Mutex
	cur, peak := 0, 0
	c, _ := startFake(t, Options{PermissionTimeout: time.Second, Permission: func(ctx context.Context, req PermissionRequest) bool {
		mu.Lock()
		cur++
		peak = max(peak, cur)
		mu.Unlock()
		<-ctx.Done()
		mu.Lock()
		cur--
		mu.Unlock()
		return true
	}})
	s := newSession(t, c)
	if r := prompt(t, c, s, "flood"); r.Text != "40" {
		t.Fatalf("answers: %q", r.Text)
	}
	mu.Lock()
	defer mu.Unlock()
	// 40 > maxInbound requests block at once: exactly maxInbound are held.
	if peak != maxInbound {
		t.Fatalf("peak concurrent permissions %d (max %d)", peak, maxInbound)
	}
}

// MoveFSRoot: once the root's folder is renamed (a warm pool's slot bound
// to a room), the agent's paths are taken under its new name, the same
// folder; the old name leads nowhere, even if a folder is made there.
func TestFSRootMoved(t *testing.T) {
	parent := t.TempDir()
	root, moved := filepath.Join(parent, "slot"), filepath.Join(parent, "room")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "in.txt"), []byte("inside"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _ := startFake(t, Options{FSRoot: root})
	s := newSession(t, c)
	if err := os.Rename(root, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "in.txt"), []byte("another"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.MoveFSRoot(moved); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ prompt, want string }{
		{"read:" + filepath.Join(moved, "in.txt"), `ok {"content":"inside"}`},
		{"read:" + filepath.Join(root, "in.txt"), "error"},
		{"write:" + filepath.Join(moved, "new.txt"), "ok {}"},
	} {
		if r := prompt(t, c, s, tc.prompt); r.Text != tc.want {
			t.Errorf("%s: got %q, want %q", tc.prompt, r.Text, tc.want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(moved, "new.txt")); err != nil || string(b) != "written" {
		t.Fatalf("write under the new name: %q %v", b, err)
	}
}
