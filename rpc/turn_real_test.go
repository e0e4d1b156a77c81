package rpc_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/rpc"
)

// Turns on the real agents' edge cases: each must end on its own, well
// before the test's deadline, and leave the client usable.

// waitTurnBounded waits for the turn with a deadline far below the test's:
// a turn that only ends with its context is the defect under test.
func waitTurnBounded(t *testing.T, c *rpc.Client, d time.Duration) *rpc.Turn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	turn, err := c.WaitTurn(ctx)
	if err != nil {
		t.Fatalf("the turn did not end on its own: %v", err)
	}
	return turn
}

// Item 1: omp acknowledges a prompt and an abort sent right after it and
// starts no run; the turn ends (aborted) and the next prompt works. The
// answer is slow, so that should omp start the run after all, the abort
// still cuts it and the outcome is the same.
func TestRealTurn_AbortBeforeRunStarts(t *testing.T) {
	a := startReal(t, agents.OMP, rpc.Options{})
	ctx := tctx(t, 120*time.Second)
	if err := a.c.Prompt(ctx, "[[slow:1s]] [[say:never]]", nil); err != nil {
		t.Fatal(err)
	}
	if err := a.c.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	turn := waitTurnBounded(t, a.c, 30*time.Second)
	var types []string
	for _, e := range turn.Events {
		types = append(types, e.Type)
	}
	t.Logf("events %v, stop %q, invoked %v", types, turn.StopReason, turn.AgentInvoked)
	if turn.StopReason != rpc.StopReasonAborted {
		t.Fatalf("stop reason %q, want aborted", turn.StopReason)
	}
	if turn, err := a.c.Run(ctx, "[[say:after]]", nil); err != nil || turn.Text != "after" {
		t.Fatalf("next turn: %v %v", turn, err)
	}
}

// Item 2: pi, aborted while it waits to retry a failed request: it ends
// the retry with auto_retry_end {success:false} and starts no run.
func TestRealTurn_AbortDuringRetryDelay(t *testing.T) {
	a := startReal(t, agents.Pi, rpc.Options{})
	ctx := tctx(t, 120*time.Second)
	retrying := make(chan struct{}, 1)
	a.c.On(rpc.EventAutoRetryStart, func(rpc.Event) {
		select {
		case retrying <- struct{}{}:
		default:
		}
	})
	if err := a.c.Prompt(ctx, "[[status:500 x5]] [[say:unreached]]", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-retrying:
	case <-ctx.Done():
		t.Fatal("pi never announced a retry")
	}
	if err := a.c.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	turn := waitTurnBounded(t, a.c, 30*time.Second)
	var types []string
	for _, e := range turn.Events {
		types = append(types, e.Type)
	}
	t.Logf("events %v, stop %q (%s)", types, turn.StopReason, turn.ErrorMessage)
	if !strings.Contains(strings.Join(types, " "), "auto_retry_end") {
		t.Fatalf("no auto_retry_end: the test no longer covers the cancelled retry: %v", types)
	}
	if turn, err := a.c.Run(ctx, "[[say:after]]", nil); err != nil || turn.Text != "after" {
		t.Fatalf("next turn: %v %v", turn, err)
	}
}

// Item 3: pi acknowledges a prompt an extension command consumed and sends
// nothing more; the turn ends with AgentInvoked false.
func TestRealTurn_PromptConsumedByExtensionCommand(t *testing.T) {
	ext, err := filepath.Abs("testdata/ext/probe_cmd.ts")
	if err != nil {
		t.Fatal(err)
	}
	a := startRealWith(t, agents.Pi, rpc.SpawnOptions{}, func(s *rpc.Spec) { s.Extensions = []string{ext} })
	ctx := tctx(t, 120*time.Second)
	if err := a.c.Prompt(ctx, "/probe", nil); err != nil {
		t.Fatal(err)
	}
	turn := waitTurnBounded(t, a.c, 30*time.Second)
	if turn.AgentInvoked || len(turn.Events) != 0 {
		t.Fatalf("consumed prompt: invoked %v, %d events", turn.AgentInvoked, len(turn.Events))
	}
	if len(a.sim.Requests()) != 0 {
		t.Fatal("the model was called for a consumed prompt")
	}
	if turn, err := a.c.Run(ctx, "[[say:after]]", nil); err != nil || turn.Text != "after" || !turn.AgentInvoked {
		t.Fatalf("next turn: %v %v", turn, err)
	}
}

// Item 4: pi refuses abort_and_prompt (an omp command); the running turn is
// left as it was and ends with its own agent_end.
func TestRealTurn_RefusedAbortAndPrompt(t *testing.T) {
	a := startReal(t, agents.Pi, rpc.Options{})
	ctx := tctx(t, 120*time.Second)
	streaming := make(chan struct{}, 1)
	a.c.On(rpc.EventMessageUpdate, func(rpc.Event) {
		select {
		case streaming <- struct{}{}:
		default:
		}
	})
	// The refusal must come while the answer runs, or the test covers an
	// idle agent only: listeners see frames in stream order, so the
	// refusal's response must come before the run's agent_end.
	var mu sync.Mutex
	var order []string
	a.c.On("", func(e rpc.Event) {
		var r struct{ Command string }
		switch {
		case e.Type == rpc.EventResponse && e.Decode(&r) == nil && r.Command == "abort_and_prompt",
			e.Type == rpc.EventAgentEnd:
			mu.Lock()
			order = append(order, e.Type+" "+r.Command)
			mu.Unlock()
		}
	})
	// 300 ms between the answer's pieces (six after the first update) leave
	// the refusal, one round trip, well over a second; the turn waits for
	// all of them, so a longer pause (it was 1 s) only waited.
	if err := a.c.Prompt(ctx, "[[slow:300ms]] [[say:own answer]]", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-streaming:
	case <-ctx.Done():
		t.Fatal("no streaming")
	}
	err := a.c.AbortAndPrompt(ctx, "[[say:replaced]]", nil)
	var re *rpc.ResponseError
	if !errors.As(err, &re) || !errors.Is(err, rpc.ErrPromptFailed) {
		t.Fatalf("abort_and_prompt on pi: %v", err)
	}
	turn := waitTurnBounded(t, a.c, 30*time.Second)
	if turn.Text != "own answer" {
		t.Fatalf("turn text %q", turn.Text)
	}
	if err := a.c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(order) < 2 || order[0] != "response abort_and_prompt" || order[1] != "agent_end " {
		t.Fatalf("the refusal did not come while the answer ran: %q", order)
	}
	mu.Unlock()
	// With no turn running, the refusal leaves no turn open either.
	if err := a.c.AbortAndPrompt(ctx, "[[say:x]]", nil); !errors.Is(err, rpc.ErrPromptFailed) {
		t.Fatalf("abort_and_prompt on idle pi: %v", err)
	}
	if turn, err := a.c.Run(ctx, "[[say:after]]", nil); err != nil || turn.Text != "after" {
		t.Fatalf("next turn: %v %v", turn, err)
	}
}

// Item 5: a prompt with streamingBehavior followUp that reaches an idle
// agent runs as a new run; WaitTurn returns that run, not the last text.
func TestRealTurn_FollowUpToIdleAgent(t *testing.T) {
	bothAgents(t, func(t *testing.T, kind agents.Kind) {
		a := startReal(t, kind, rpc.Options{})
		ctx := tctx(t, 120*time.Second)
		if turn, err := a.c.Run(ctx, "[[say:first]]", nil); err != nil || turn.Text != "first" {
			t.Fatalf("first turn: %v %v", turn, err)
		}
		if err := a.c.Prompt(ctx, "[[say:second]]", &rpc.PromptOptions{StreamingBehavior: "followUp"}); err != nil {
			t.Fatal(err)
		}
		turn := waitTurnBounded(t, a.c, 60*time.Second)
		if turn.Text != "second" {
			t.Fatalf("WaitTurn after a follow-up to an idle agent: text %q", turn.Text)
		}
		if err := a.c.WaitForIdle(ctx); err != nil {
			t.Fatal(err)
		}
		if turn, err := a.c.Run(ctx, "[[say:third]]", nil); err != nil || turn.Text != "third" {
			t.Fatalf("next turn: %v %v", turn, err)
		}
	})
}
