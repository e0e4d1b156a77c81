package acp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/coder/acp-go-sdk"
)

// Faults of a misbehaving agent, on the fake (the real agents do not show
// them): each test fails on the client before these were handled.

func TestLineRange(t *testing.T) {
	lines := []string{"a\n", "b\n", "c\n", "d"}
	p := func(n int) *int { return &n }
	for _, tc := range []struct {
		line, limit *int
		want        string
	}{
		{nil, nil, "a\nb\nc\nd"},
		{p(2), p(2), "b\nc\n"},
		{p(0), p(1), "a\n"},
		{p(-5), nil, "a\nb\nc\nd"},
		{p(3), p(-1), "c\nd"},
		{p(1000), p(math.MaxInt), ""},
		{p(2), p(math.MaxInt - 1), "b\nc\nd"},
		{p(math.MaxInt), p(math.MaxInt), ""},
		{p(4), p(0), ""},
	} {
		if got := lineRange(lines, tc.line, tc.limit); got != tc.want {
			t.Errorf("lineRange(%v, %v) = %q, want %q", deref(tc.line), deref(tc.limit), got, tc.want)
		}
	}
}

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestFSReadHugeLimit: a line and limit whose sum overflows is a range like
// any other, not a panic that ends the host.
func TestFSReadHugeLimit(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "lines.txt"), []byte(strings.Repeat("x\n", 2000)), 0o644); err != nil {
		t.Fatal(err)
	}
	c, _ := startFake(t, Options{FSRoot: dir})
	s := newSession(t, c)
	if r := prompt(t, c, s, "limit:"+filepath.Join(dir, "lines.txt")); !strings.HasPrefix(r.Text, "ok ") || strings.Count(r.Text, "x") != 1001 {
		t.Fatalf("the agent got %.200q", r.Text)
	}
}

// TestHandlerPanicAnswersInternalError: a panic in a handler the SDK runs
// is an internal error answer; the host and the connection go on.
func TestHandlerPanicAnswersInternalError(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	c, _ := startFake(t, Options{Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil)),
		Permission: func(context.Context, PermissionRequest) bool { panic("boom in the callback") }})
	s := newSession(t, c)
	// The fake reports an error answer as the result it could not read.
	if r := prompt(t, c, s, "permission"); r.Text != "" && !strings.Contains(r.Text, "null") {
		t.Fatalf("the agent got %q, want an error answer", r.Text)
	}
	if r := prompt(t, c, s, "hello"); r.Text != "hi there" {
		t.Fatalf("next turn %q", r.Text)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "panicked") {
		t.Fatalf("the panic was not logged: %s", logs.String())
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestFSFIFORefused: an fs request for a FIFO is refused at once (the open
// would block forever without a writer), and Close is prompt.
func TestFSFIFORefused(t *testing.T) {
	for _, scenario := range []string{"fifo", "fifow"} {
		t.Run(scenario, func(t *testing.T) {
			dir := t.TempDir()
			c, _ := startFake(t, Options{FSRoot: dir})
			s := newSession(t, c)
			if r := prompt(t, c, s, scenario+":"+filepath.Join(dir, "fifo")); r.Text != "error" {
				t.Fatalf("the agent got %q, want an error answer", r.Text)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			if _, err := c.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if err := c.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRequestWithoutIDMalformed: a request method sent as a notification is
// reported and dropped (the SDK would run it on its one notification
// goroutine, blocked on a person, its queue overflowing behind it), and a
// flood of notifications the client does not act on does not stop the turn.
func TestRequestWithoutIDMalformed(t *testing.T) {
	asked := false
	c, evs := startFake(t, Options{Permission: func(context.Context, PermissionRequest) bool { asked = true; return true }})
	s := newSession(t, c)
	if r := prompt(t, c, s, "permnotify"); r.Text != "after" {
		t.Fatalf("result %+v", r)
	}
	var reasons []string
	for _, ev := range evs.all() {
		if ev.Type == TypeMalformed {
			reasons = append(reasons, ev.Err.Error())
		}
	}
	if len(reasons) != 1 || !strings.Contains(reasons[0], "without an id") || asked {
		t.Fatalf("malformed reports %q (asked %v)", reasons, asked)
	}
}

// TestCancelAnswersPendingPermissionCancelled: once a turn is cancelled,
// its pending permission request is answered "cancelled" (ACP), not with
// the reject option.
func TestCancelAnswersPendingPermissionCancelled(t *testing.T) {
	pending := make(chan struct{})
	c, evs := startFake(t, Options{CancelTimeout: 10 * time.Second, Permission: func(ctx context.Context, _ PermissionRequest) bool {
		close(pending)
		<-ctx.Done() // the turn's cancel cuts it short
		return false
	}})
	s := newSession(t, c)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := c.Prompt(ctx, s, "permission")
		done <- err
	}()
	select {
	case <-pending:
	case <-time.After(30 * time.Second):
		t.Fatal("the permission request never came")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("prompt: %v", err)
	}
	var got []string
	for _, ev := range evs.all() {
		got = append(got, ev.Text())
	}
	if all := strings.Join(got, ""); !strings.Contains(all, `"outcome":"cancelled"`) || strings.Contains(all, `"optionId"`) {
		t.Fatalf("the agent got %q, want the cancelled outcome", all)
	}
}

// TestCollidingOptionIDsCancelled: options that share an id cannot say
// which one was meant; the answer is "cancelled", for an allow and a deny.
func TestCollidingOptionIDsCancelled(t *testing.T) {
	for _, allow := range []bool{true, false} {
		c, _ := startFake(t, Options{Permission: func(context.Context, PermissionRequest) bool { return allow }})
		if r := prompt(t, c, newSession(t, c), "dupid"); !strings.Contains(r.Text, `"outcome":"cancelled"`) {
			t.Fatalf("allow %v: the agent got %s", allow, r.Text)
		}
	}
	if o := pick([]sdk.PermissionOption{{OptionId: "a", Kind: sdk.PermissionOptionKindAllowOnce}, {OptionId: "r", Kind: sdk.PermissionOptionKindRejectOnce}}, true); o.Selected == nil || o.Selected.OptionId != "a" {
		t.Fatalf("distinct ids: %+v", o)
	}
}

// TestMalformedErrorAnswersPrompt: an error that is not an object ends the
// request at once (an internal error), reported, its payload nowhere.
func TestMalformedErrorAnswersPrompt(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	c, evs := startFake(t, Options{Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	s := newSession(t, c)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := c.Prompt(ctx, s, "errstr")
	var re *sdk.RequestError
	if !errors.As(err, &re) || re.Code != -32603 || ctx.Err() != nil {
		t.Fatalf("prompt: %v, want an internal error at once", err)
	}
	var n int
	for _, ev := range evs.all() {
		if ev.Type == TypeMalformed {
			n++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if n != 1 || strings.Contains(logs.String(), "secret-in-error") || strings.Contains(err.Error(), "secret-in-error") {
		t.Fatalf("%d malformed reports; logs %s; err %v", n, logs.String(), err)
	}
	if r := prompt(t, c, s, "hello"); r.Text != "hi there" {
		t.Fatalf("next turn %q", r.Text)
	}
}

// TestNullIDUpdateIsANotification: "id": null is no id; the update is one.
func TestNullIDUpdateIsANotification(t *testing.T) {
	c, _ := startFake(t, Options{})
	if r := prompt(t, c, newSession(t, c), "idnull"); r.Text != "from-null" {
		t.Fatalf("result %q", r.Text)
	}
}

// TestLateUpdatesDropped: updates read after the prompt's answer belong to
// no turn: reported and dropped, never the next turn's. (One that comes
// after the next prompt went out cannot be told from that turn's own: ACP
// has no turn ids.)
func TestLateUpdatesDropped(t *testing.T) {
	evs := &events{}
	late := make(chan error, 8)
	c, _ := startFake(t, Options{Events: func(ev Event) {
		evs.add(ev)
		if ev.Type == TypeMalformed {
			late <- ev.Err
		}
	}})
	s := newSession(t, c)
	if r := prompt(t, c, s, "after"); r.Text != "" {
		t.Fatalf("turn 1 %q", r.Text)
	}
	var reports []string
	for len(reports) < 2 {
		select {
		case err := <-late:
			reports = append(reports, err.Error())
		case <-time.After(30 * time.Second):
			t.Fatalf("late updates reported: %q", reports)
		}
	}
	if !strings.Contains(reports[0], "agent_message_chunk") || !strings.Contains(reports[1], "tool_call") {
		t.Fatalf("reports %q", reports)
	}
	if r := prompt(t, c, s, "hello"); r.Text != "hi there" {
		t.Fatalf("turn 2 %q (a late update was taken for its own)", r.Text)
	}
	for _, ev := range evs.all() {
		if ev.Text() == "late" || ev.Type == "tool_call" {
			t.Fatalf("a late update was passed on: %+v", ev)
		}
	}
}

// TestLoadSessionTransientError: only a session the agent does not have is
// ErrSessionNotFound; busy or an internal error is not (the room would drop
// its context for good).
func TestLoadSessionTransientError(t *testing.T) {
	c, _ := startFake(t, Options{})
	for _, id := range []string{"busy", "internal"} {
		_, err := c.LoadSession(t.Context(), id, t.TempDir(), nil)
		if err == nil || errors.Is(err, ErrSessionNotFound) {
			t.Fatalf("load %s: %v, want an error that is not ErrSessionNotFound", id, err)
		}
	}
	// A code that says so, or an internal error whose data says so (omp,
	// codex).
	for _, id := range []string{"nope", "omp-gone", "codex-gone"} {
		if _, err := c.LoadSession(t.Context(), id, t.TempDir(), nil); !errors.Is(err, ErrSessionNotFound) {
			t.Fatalf("load %s: %v, want ErrSessionNotFound", id, err)
		}
	}
}

// TestWatchSDKUnblocksTheReader: if the SDK stops reading on its own (its
// notification queue overflowed behind a handler that waits), a write into
// its input fails instead of blocking the reader, and the turn, forever.
// (read no longer hands the SDK what could stall it; this is the backstop.)
func TestWatchSDKUnblocksTheReader(t *testing.T) {
	block := make(chan struct{})
	c := &Client{opts: Options{Logger: slog.New(slog.DiscardHandler), PermissionTimeout: time.Minute,
		Permission: func(context.Context, PermissionRequest) bool { <-block; return false }},
		readerDone: make(chan struct{}), watchDone: make(chan struct{})}
	c.sdkR, c.sdkW = io.Pipe()
	c.conn = sdk.NewClientSideConnection((*sdkClient)(c), io.Discard, c.sdkR)
	c.conn.SetLogger(slog.New(slog.DiscardHandler))
	go c.watchSDK()
	defer func() {
		close(block)
		close(c.readerDone)
		c.sdkW.Close()
		<-c.watchDone
		c.handlers.Wait()
	}()
	written := make(chan error, 1)
	go func() {
		// A request as a notification holds the SDK's one notification
		// goroutine; the queue behind it overflows.
		line := `{"jsonrpc":"2.0","method":"session/request_permission","params":{"sessionId":"s","toolCall":{"toolCallId":"t"},"options":[]}}` + "\n"
		if _, err := c.sdkW.Write([]byte(line)); err != nil {
			written <- err
			return
		}
		for {
			if _, err := c.sdkW.Write([]byte(`{"jsonrpc":"2.0","method":"_noise","params":{}}` + "\n")); err != nil {
				written <- err
				return
			}
		}
	}()
	select {
	case err := <-written:
		if !errors.Is(err, ErrConnectionStopped) {
			t.Fatalf("write: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the write into the stopped SDK still blocks")
	}
}
