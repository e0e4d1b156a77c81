package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

func spawnFake(t *testing.T, name string, opts SpawnOptions, env ...string) *Client {
	t.Helper()
	spec := fakeSpec(t, name)
	spec.Env = append(spec.Env, env...)
	c, err := Spawn(ctxT(t, 30*time.Second), spec, opts)
	if err != nil {
		t.Fatalf("spawn %s: %v", name, err)
	}
	t.Cleanup(func() { _ = closeAndWait(t, c) })
	return c
}

func TestSpawn_PlainTurn(t *testing.T) {
	c := spawnFake(t, "plain", SpawnOptions{})
	turn, err := c.Run(ctxT(t, 30*time.Second), "hello", nil)
	if err != nil {
		t.Fatal(err)
	}
	if turn.Text != "echo: hello" || turn.StopReason != "stop" || turn.Usage.TotalTokens != 12 {
		t.Fatalf("turn = %+v", turn)
	}
	if len(turn.Events) != 4 || turn.Events[0].Type != "agent_start" || turn.Events[3].Type != "agent_end" {
		t.Fatalf("events: %d", len(turn.Events))
	}
	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}

func TestSpawn_BrokenFirstFrameFailsStart(t *testing.T) {
	_, err := Spawn(ctxT(t, 30*time.Second), fakeSpec(t, "broken-first"), SpawnOptions{})
	if err == nil || !strings.Contains(err.Error(), "cannot find module") || !strings.Contains(err.Error(), "not a JSON object") {
		t.Fatalf("err = %v", err)
	}
}

// An agent that exits at start is reported as that exit, once: whichever
// of the handshake's failed call and the reader's end comes first, the
// error is the agent's exit, not a call failure wrapping it again.
func TestSpawn_ExitAtStartReportsStderr(t *testing.T) {
	for i := 0; i < 5; i++ {
		_, err := Spawn(ctxT(t, 30*time.Second), fakeSpec(t, "stderr-exit"), SpawnOptions{})
		if !errors.Is(err, ErrAgentExited) || !strings.Contains(err.Error(), "no model configured") ||
			!strings.HasPrefix(err.Error(), "rpc: agent exited") {
			t.Fatalf("try %d: err = %v", i, err)
		}
	}
}

func TestSpawn_LatePromptFailureFailsTurn(t *testing.T) {
	c := spawnFake(t, "late-fail", SpawnOptions{})
	_, err := c.Run(ctxT(t, 30*time.Second), "x", nil)
	var re *ResponseError
	if !errors.Is(err, ErrPromptFailed) || !errors.As(err, &re) || !re.Late || re.Message != "Agent is busy" {
		t.Fatalf("err = %v", err)
	}
}

func TestSpawn_InvalidJSONMidStream(t *testing.T) {
	c := spawnFake(t, "bad-json", SpawnOptions{})
	turn, err := c.Run(ctxT(t, 30*time.Second), "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	if turn.Text != "survived" {
		t.Fatalf("text = %q", turn.Text)
	}
	// Frequent event types are validated on the dispatcher; Wait sees
	// everything queued delivered, so every report is in by then.
	if err := closeAndWait(t, c); err != nil {
		t.Fatal(err)
	}
	errs := c.Errors()
	if len(errs) != 2 || !errors.Is(errs[0], ErrProtocol) || !errors.Is(errs[1], ErrProtocol) {
		t.Fatalf("errors = %v", errs)
	}
	for _, e := range errs {
		if strings.Contains(e.Error(), "broken") && len(e.Error()) > 400 {
			t.Fatalf("error carries too much of the frame: %v", e)
		}
	}
}

// A turn that never ends is ended by the context, and Run aborts it.
func TestSpawn_HangEndedByContext(t *testing.T) {
	c := spawnFake(t, "hang", SpawnOptions{Grace: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := c.Run(ctx, "x", nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
}

// Close releases a waiter on a hung turn at once, before the agent (which
// ignores stdin EOF and SIGTERM) has been killed.
func TestSpawn_HangEndedByClose(t *testing.T) {
	c := spawnFake(t, "hang", SpawnOptions{Grace: 2 * time.Second})
	ctx := ctxT(t, 30*time.Second)
	if err := c.Prompt(ctx, "x", nil); err != nil {
		t.Fatal(err)
	}
	waitErr := make(chan error, 1)
	go func() {
		_, err := c.WaitTurn(ctx)
		waitErr <- err
	}()
	closed := make(chan error, 1)
	start := time.Now()
	go func() { closed <- c.Close() }()
	select {
	case err := <-waitErr:
		// Released by the host's own Close: ErrClosed, not an agent exit.
		if !errors.Is(err, ErrClosed) || errors.Is(err, ErrAgentExited) {
			t.Fatalf("waiter err = %v", err)
		}
		t.Logf("waiter released %v after Close began", time.Since(start))
	case <-closed:
		t.Fatal("Close finished before releasing the waiter")
	}
	select {
	case <-closed:
		// Two grace periods: stdin EOF ignored, SIGTERM ignored, SIGKILL.
		if d := time.Since(start); d < 4*time.Second {
			t.Fatalf("Close took %v; the fake ignores EOF and TERM, so escalation should take two graces", d)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close hung")
	}
}

// A run the agent starts once Close has begun is not tracked as a turn:
// a waiter gets ErrClosed at once, not when the agent is at last killed.
// (The reader may read such a run's agent_start after Close settled the
// turn; it used to open an unsolicited turn that only the agent's death
// ended.)
func TestSpawn_RunStartedAfterCloseIsNotWaitedFor(t *testing.T) {
	started := make(chan struct{}, 1)
	c := spawnFake(t, "start-after-eof", SpawnOptions{Grace: time.Second, Options: Options{OnEvent: func(ev Event) {
		if ev.Type == EventAgentStart {
			select {
			case started <- struct{}{}:
			default:
			}
		}
	}}})
	ctx := ctxT(t, 30*time.Second)
	if err := c.Prompt(ctx, "x", nil); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	// The fake writes agent_start only after stdin's EOF, which Close
	// sends after settling the turn.
	select {
	case <-started:
	case <-closed:
		t.Fatal("Close ended before the run's agent_start was read")
	}
	_, err := c.WaitTurn(ctx)
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("WaitTurn = %v, want ErrClosed", err)
	}
	select {
	case <-closed:
		t.Fatal("WaitTurn returned only once Close had ended")
	default:
	}
	<-closed
}

func TestSpawn_FloodOverflowsBacklog(t *testing.T) {
	c := spawnFake(t, "flood", SpawnOptions{Options: Options{Backlog: 16, StallTimeout: 50 * time.Millisecond}}, "FAKE_FLOOD=20000")
	block := make(chan struct{})
	c.On(EventMessageUpdate, func(Event) { <-block })
	_, err := c.Run(ctxT(t, 30*time.Second), "x", nil)
	close(block)
	if !errors.Is(err, ErrBacklogOverflow) {
		t.Fatalf("err = %v", err)
	}
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("not retired")
	}
}

// Without a slow listener the same flood arrives whole: no event lost.
func TestSpawn_FloodNoLoss(t *testing.T) {
	c := spawnFake(t, "flood", SpawnOptions{}, "FAKE_FLOOD=20000")
	n := 0
	c.On(EventMessageUpdate, func(Event) { n++ })
	turn, err := c.Run(ctxT(t, 60*time.Second), "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := closeAndWait(t, c); err != nil {
		t.Fatal(err)
	}
	if n != 20000 || turn.Text != "flooded" || len(turn.Events) != 20003 {
		t.Fatalf("listener saw %d updates, turn kept %d events, text %q", n, len(turn.Events), turn.Text)
	}
}

// A 100 MiB line is capped (64 MiB by default), reported and skipped; the
// client keeps working and memory stays bounded by the cap.
func TestSpawn_HugeLine(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 100 MiB through a pipe")
	}
	c := spawnFake(t, "huge-line", SpawnOptions{})
	turn, err := c.Run(ctxT(t, 120*time.Second), "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	if turn.Text != "after the huge line" {
		t.Fatalf("text = %q", turn.Text)
	}
	errs := c.Errors()
	var tl *LineTooLongError
	if len(errs) != 1 || !errors.As(errs[0], &tl) || tl.Len < 100<<20 || tl.Max != DefaultMaxLineBytes {
		t.Fatalf("errors = %v", errs)
	}
	if _, err := c.GetState(ctxT(t, 30*time.Second)); err != nil {
		t.Fatalf("client after the huge line: %v", err)
	}
}

func TestSpawn_CloseIdempotentAndConcurrent(t *testing.T) {
	c := spawnFake(t, "plain", SpawnOptions{})
	errs := make(chan error, 3)
	for i := 0; i < 3; i++ {
		go func() { errs <- c.Close() }()
	}
	for i := 0; i < 3; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.GetState(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after close: %v", err)
	}
}

func TestSpec_Args(t *testing.T) {
	s := Spec{Argv: []string{"bun", "cli.js"}, Model: "p/m", Thinking: "low", AppendSystemPrompt: "be brief",
		Tools: []string{"bash", "read"}, NoSession: true, SessionDir: "/s", Extensions: []string{"a.ts"}, ExtraArgs: []string{"--x"}}
	got := fmt.Sprint(s.Args())
	want := "[bun cli.js --mode rpc --model p/m --thinking low --append-system-prompt be brief --tools bash,read --no-session --session-dir /s -e a.ts --x]"
	if got != want {
		t.Fatalf("args = %s", got)
	}
	if got := fmt.Sprint(Spec{Argv: []string{"x", "y"}, Model: "m", Verbatim: true}.Args()); got != "[x y]" {
		t.Fatalf("verbatim args = %s", got)
	}
}

// A descendant out of the process group's reach that keeps stdout and
// stderr open does not hold Close: the pipes are cut after the leader is
// gone. (Custody would also end the descendant; GroupStarter cannot.)
func TestSpawn_EscapedDescendantHoldsPipes(t *testing.T) {
	c, err := Spawn(ctxT(t, 30*time.Second), fakeSpec(t, "escape"), SpawnOptions{Grace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Request(ctxT(t, 10*time.Second), "where", nil)
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	var m struct{ Pid int }
	if err := json.Unmarshal(resp.Data, &m); err != nil || m.Pid == 0 {
		c.Close()
		t.Fatalf("where: %s %v", resp.Data, err)
	}
	defer func() {
		if p, err := os.FindProcess(m.Pid); err == nil {
			p.Kill()
			p.Wait()
		}
	}()
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %v with a descendant holding the pipes", d)
	}
}
