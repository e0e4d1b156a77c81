package rpc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/rpc"
)

// These tests drive the real omp and pi, installed by `make setup`, on the
// scripted model. They fail (never skip) when the agents are missing.

type realAgent struct {
	c   *rpc.Client
	sim *modelsim.Server
	dir string // the agent's workspace
}

func startReal(t *testing.T, kind agents.Kind, opts rpc.Options, extra ...string) *realAgent {
	t.Helper()
	return startRealWith(t, kind, rpc.SpawnOptions{Options: opts}, func(s *rpc.Spec) { s.ExtraArgs = extra })
}

// startRealWith starts kind on a fresh scripted model and agent home;
// adjust may change the spec before the spawn.
func startRealWith(t *testing.T, kind agents.Kind, sopts rpc.SpawnOptions, adjust func(*rpc.Spec)) *realAgent {
	t.Helper()
	in, err := agents.Find()
	if err != nil {
		t.Fatalf("the real agents are needed (run make setup): %v", err)
	}
	argv, err := in.Argv(kind)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sim := modelsim.New(modelsim.Options{})
	if err := sim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	home := t.TempDir()
	env, err := agents.Home(home, kind, sim.URL())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	spec := rpc.Spec{Argv: argv, Model: agents.ModelID, Dir: dir, Env: env, SessionDir: filepath.Join(home, "sessions")}
	if adjust != nil {
		adjust(&spec)
	}
	c, err := rpc.Spawn(ctx, spec, sopts)
	if err != nil {
		t.Fatalf("spawn %s: %v", kind, err)
	}
	t.Cleanup(func() {
		if err := closeJoin(t, c); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return &realAgent{c: c, sim: sim, dir: dir}
}

// closeJoin closes c and waits for its callbacks (Close does not).
func closeJoin(t *testing.T, c *rpc.Client) error {
	err := c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if werr := c.Wait(ctx); werr != nil {
		t.Errorf("wait: %v", werr)
	}
	return err
}

func bothAgents(t *testing.T, f func(t *testing.T, kind agents.Kind)) {
	for _, k := range []agents.Kind{agents.OMP, agents.Pi} {
		t.Run(string(k), func(t *testing.T) { f(t, k) })
	}
}

func tctx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestReal_ToolsStateAndCommands(t *testing.T) {
	bothAgents(t, func(t *testing.T, kind agents.Kind) {
		a := startReal(t, kind, rpc.Options{})
		ctx := tctx(t, 120*time.Second)

		// A bash tool call: the model asks, the agent runs it, the model
		// answers "done" after seeing the result.
		turn, err := a.c.Run(ctx, `[[tool:bash {"command":"echo hi-from-bash"}]]`, nil)
		if err != nil {
			t.Fatalf("bash turn: %v", err)
		}
		if turn.Text != "done" || turn.StopReason != "stop" {
			t.Fatalf("bash turn: text %q stop %q", turn.Text, turn.StopReason)
		}
		var sawTool bool
		for _, e := range turn.Events {
			if e.Type == rpc.EventToolExecutionEnd {
				var te rpc.ToolExecutionEvent
				if err := e.Decode(&te); err != nil {
					t.Fatal(err)
				}
				sawTool = te.ToolName == "bash" && strings.Contains(string(te.Result), "hi-from-bash")
			}
		}
		if !sawTool {
			t.Fatal("no tool_execution_end for bash with its output")
		}
		if !modelSaw(a.sim, "hi-from-bash") {
			t.Fatal("the model never received the tool result")
		}

		// The write tool writes into the workspace.
		if _, err := a.c.Run(ctx, `[[tool:write {"path":"note.txt","content":"written by the agent"}]]`, nil); err != nil {
			t.Fatalf("write turn: %v", err)
		}
		if b, err := os.ReadFile(filepath.Join(a.dir, "note.txt")); err != nil || string(b) != "written by the agent" {
			t.Fatalf("note.txt: %q %v", b, err)
		}

		st, err := a.c.GetState(ctx)
		if err != nil || st.IsStreaming || st.SessionID == "" || st.Model == nil || st.Model.ID != "fake-model" {
			t.Fatalf("get_state: %+v %v", st, err)
		}
		msgs, err := a.c.GetMessages(ctx)
		if err != nil || len(msgs) < 6 || msgs[0].Role != "user" {
			t.Fatalf("get_messages: %d messages, %v", len(msgs), err)
		}
		res, err := a.c.Bash(ctx, "echo rpc-bash; exit 3")
		if err != nil || !strings.Contains(res.Output, "rpc-bash") || res.ExitCode == nil || *res.ExitCode != 3 {
			t.Fatalf("bash command: %+v %v", res, err)
		}

		// Earlier context reaches the model on the next turn.
		if _, err := a.c.Run(ctx, "and now?", nil); err != nil {
			t.Fatal(err)
		}
		reqs := a.sim.Requests()
		last := reqs[len(reqs)-1]
		if !strings.Contains(flatten(last), "hi-from-bash") {
			t.Fatal("the last model request lacks the earlier turns")
		}

		// An unknown command and a malformed line get id-less errors,
		// matched to the right caller; the agent keeps going.
		_, err = a.c.Request(ctx, "no_such_command", nil)
		var re *rpc.ResponseError
		if !errors.As(err, &re) || !strings.Contains(re.Message, "no_such_command") {
			t.Fatalf("unknown command: %v", err)
		}
		_, err = a.c.RequestLine(ctx, []byte(`{"type":"get_state",`))
		if !errors.As(err, &re) || re.Command != "parse" {
			t.Fatalf("parse error: %v", err)
		}
		if _, err := a.c.GetState(ctx); err != nil {
			t.Fatalf("after the errors: %v", err)
		}

		// Model switch: list, switch, and a refused switch.
		models, err := a.c.GetAvailableModels(ctx)
		if err != nil || len(models) == 0 {
			t.Fatalf("get_available_models: %v %v", models, err)
		}
		m, err := a.c.SetModel(ctx, models[0].Provider, models[0].ID)
		if err != nil || m.ID != models[0].ID {
			t.Fatalf("set_model: %+v %v", m, err)
		}
		if _, err := a.c.SetModel(ctx, "fake", "no-such-model"); !errors.As(err, &re) {
			t.Fatalf("set_model to a missing model: %v", err)
		}

		// Session commands.
		if err := a.c.SetSessionName(ctx, "room-42"); err != nil {
			t.Fatalf("set_session_name: %v", err)
		}
		stats, err := a.c.GetSessionStats(ctx)
		if err != nil || stats.UserMessages < 3 {
			t.Fatalf("get_session_stats: %+v %v", stats, err)
		}
		old := st.SessionFile
		if cancelled, err := a.c.NewSession(ctx, ""); err != nil || cancelled {
			t.Fatalf("new_session: %v %v", cancelled, err)
		}
		st2, err := a.c.GetState(ctx)
		if err != nil || st2.SessionID == st.SessionID || st2.MessageCount != 0 {
			t.Fatalf("after new_session: %+v %v", st2, err)
		}
		if old != "" {
			if cancelled, err := a.c.SwitchSession(ctx, old); err != nil || cancelled {
				t.Fatalf("switch_session: %v %v", cancelled, err)
			}
			st3, err := a.c.GetState(ctx)
			if err != nil || st3.SessionID != st.SessionID {
				t.Fatalf("after switch_session: %+v %v", st3, err)
			}
		}
	})
}

// writeFile writes content to path, creating its directory.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func modelSaw(sim *modelsim.Server, s string) bool {
	for _, r := range sim.Requests() {
		if strings.Contains(flatten(r), s) {
			return true
		}
	}
	return false
}

func flatten(r modelsim.Request) string {
	b, _ := json.Marshal(r.Messages)
	return string(b)
}

func TestReal_AbortMidTurn(t *testing.T) {
	bothAgents(t, func(t *testing.T, kind agents.Kind) {
		a := startReal(t, kind, rpc.Options{})
		ctx := tctx(t, 120*time.Second)
		started := make(chan struct{}, 1)
		a.c.On(rpc.EventMessageUpdate, func(rpc.Event) {
			select {
			case started <- struct{}{}:
			default:
			}
		})
		if err := a.c.Prompt(ctx, "[[slow:500ms]] [[big:20000]]", nil); err != nil {
			t.Fatal(err)
		}
		select {
		case <-started:
		case <-ctx.Done():
			t.Fatal("the answer never started streaming")
		}
		if err := a.c.Abort(ctx); err != nil {
			t.Fatalf("abort: %v", err)
		}
		turn, err := a.c.WaitTurn(ctx)
		if err != nil {
			t.Fatalf("aborted turn: %v", err)
		}
		if turn.StopReason != "aborted" {
			t.Fatalf("stop reason %q (%s)", turn.StopReason, turn.ErrorMessage)
		}
		// The agent is usable afterwards.
		if turn, err := a.c.Run(ctx, "[[say:after abort]]", nil); err != nil || turn.Text != "after abort" {
			t.Fatalf("turn after abort: %v %v", turn, err)
		}
	})
}

// Large frames: omp over protocol v2 (chunked, reassembled), pi as one long
// line. Both must arrive losslessly.
//
// The answer is just over omp's 1 MiB frame limit (it was 1.5 MB), so every
// frame that carries it, even once (message_end, the get_messages page),
// is chunked; each update carries it twice or three times, and a
// megabyte less through the race detector saves seconds.
func TestReal_LargeMessage(t *testing.T) {
	const n = 1_100_000
	bothAgents(t, func(t *testing.T, kind agents.Kind) {
		a := startReal(t, kind, rpc.Options{})
		ctx := tctx(t, 120*time.Second)
		if kind == agents.OMP && a.c.ProtocolVersion() != 2 {
			t.Fatalf("omp protocol v%d, want 2", a.c.ProtocolVersion())
		}
		turn, err := a.c.Run(ctx, fmt.Sprintf("[[big:%d]]", n), nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(turn.Text) != n || strings.Contains(turn.Text, "elided") {
			t.Fatalf("text %d bytes, want %d: %.200q stop %s err %s", len(turn.Text), n, turn.Text, turn.StopReason, turn.ErrorMessage)
		}
		if kind == agents.OMP {
			// A chunked frame takes more of the stream than its JSON (base64
			// and chunk envelopes): message_end must have, or the answer was
			// too small to cover reassembly.
			var chunked bool
			for _, e := range turn.Events {
				if e.Type == rpc.EventMessageEnd && e.End()-e.Start() >= int64(e.Len())*4/3 {
					chunked = true
				}
			}
			if !chunked {
				t.Fatal("omp's message_end was not chunked; the test no longer covers reassembly")
			}
		}
		msgs, err := a.c.GetMessages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := msgs[len(msgs)-1].Text(); got != turn.Text {
			t.Fatalf("get_messages returned %d bytes, the turn %d", len(got), len(turn.Text))
		}
		if errs := a.c.Errors(); len(errs) != 0 {
			t.Fatalf("protocol errors: %v", errs)
		}
	})
}

func TestReal_HostTools(t *testing.T) {
	a := startReal(t, agents.OMP, rpc.Options{})
	ctx := tctx(t, 120*time.Second)
	var mu sync.Mutex
	var gotArgs string
	blocking := make(chan struct{})
	cancelled := make(chan struct{})
	err := a.c.SetHostTools(ctx, []rpc.HostTool{
		{
			Name: "lookup", Description: "Look up a key in the host's table.",
			Parameters: json.RawMessage(`{"type":"object","properties":{"key":{"type":"string"}},"required":["key"]}`),
			Run: func(ctx context.Context, call *rpc.HostToolCall) (*rpc.HostToolResult, error) {
				mu.Lock()
				gotArgs = string(call.Arguments)
				mu.Unlock()
				if err := call.Update(rpc.TextResult("looking…")); err != nil {
					return nil, err
				}
				return rpc.TextResult("value-of-alpha"), nil
			},
		},
		{
			Name: "fails", Description: "Always fails.",
			Run: func(ctx context.Context, call *rpc.HostToolCall) (*rpc.HostToolResult, error) {
				return nil, errors.New("host tool failure text")
			},
		},
		{
			Name: "wait", Description: "Waits until cancelled.",
			Run: func(ctx context.Context, call *rpc.HostToolCall) (*rpc.HostToolResult, error) {
				close(blocking)
				<-ctx.Done()
				close(cancelled)
				return nil, ctx.Err()
			},
		},
	})
	if err != nil {
		t.Fatalf("set_host_tools: %v", err)
	}
	updates := make(chan struct{}, 4)
	a.c.On(rpc.EventToolExecutionUpdate, func(rpc.Event) {
		select {
		case updates <- struct{}{}:
		default:
		}
	})
	turn, err := a.c.Run(ctx, `[[tool:lookup {"key":"alpha"}]]`, nil)
	if err != nil || turn.Text != "done" {
		t.Fatalf("lookup turn: %+v %v", turn, err)
	}
	mu.Lock()
	if !strings.Contains(gotArgs, `"alpha"`) {
		t.Fatalf("arguments %s", gotArgs)
	}
	mu.Unlock()
	if !modelSaw(a.sim, "value-of-alpha") {
		t.Fatal("the model never saw the host tool's result")
	}
	select {
	case <-updates:
	default:
		t.Fatal("no tool_execution_update for the streamed partial result")
	}

	if _, err := a.c.Run(ctx, `[[tool:fails {}]]`, nil); err != nil {
		t.Fatal(err)
	}
	if !modelSaw(a.sim, "host tool failure text") {
		t.Fatal("the model never saw the failing tool's error")
	}

	// Abort while the host tool runs: omp sends host_tool_cancel and the
	// tool's context ends.
	if err := a.c.Prompt(ctx, `[[tool:wait {}]]`, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-blocking:
	case <-ctx.Done():
		t.Fatal("the wait tool was never called")
	}
	if err := a.c.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cancelled:
	case <-ctx.Done():
		t.Fatal("the host tool's context was never cancelled")
	}
	if _, err := a.c.WaitTurn(ctx); err != nil {
		t.Fatal(err)
	}
}

// Closing stdin while idle: both agents exit by themselves, status 0 (not
// stopped by a signal after the grace period). Stdin is closed first and
// the exit awaited with a generous deadline, so a busy machine's slow exit
// is still an exit on EOF.
func TestReal_StdinEOF(t *testing.T) {
	bothAgents(t, func(t *testing.T, kind agents.Kind) {
		a := startReal(t, kind, rpc.Options{})
		p := a.c.Process()
		t0 := time.Now()
		if err := p.Stdin().Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.Exited():
		case <-time.After(60 * time.Second):
			t.Fatal("the agent did not exit on stdin EOF")
		}
		if err := p.ExitErr(); err != nil {
			t.Fatalf("the agent ended %v after stdin EOF, want status 0", err)
		}
		t.Logf("%s exited %v after stdin EOF", kind, time.Since(t0))
		if err := a.c.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// Provider errors: the agents retry (pi ends the failed run with agent_end
// before it announces the retry). The turn must end with the retried answer,
// not at the first failure.
//
// pi: three failures exhaust its SDK's two quick retries, so pi's own
// auto-retry runs (the agent_end before auto_retry_start under test); its
// project settings shorten that retry's delay from the default 2 s, which
// only waited. omp retries inside its HTTP transport (0.5 s, 1 s, 2 s,
// not configurable), invisibly to RPC: one failure takes that same path
// with one wait, and its turn shows the same events as with three.
func TestReal_RetryAfterProviderErrors(t *testing.T) {
	bothAgents(t, func(t *testing.T, kind agents.Kind) {
		prompt := "[[status:500 x3]] [[say:recovered]]"
		if kind == agents.OMP {
			prompt = "[[status:500]] [[say:recovered]]"
		}
		a := startRealWith(t, kind, rpc.SpawnOptions{}, func(s *rpc.Spec) {
			if kind == agents.Pi {
				writeFile(t, filepath.Join(s.Dir, ".pi", "settings.json"), `{"retry":{"baseDelayMs":50}}`)
			}
		})
		ctx := tctx(t, 120*time.Second)
		turn, err := a.c.Run(ctx, prompt, nil)
		if err != nil {
			t.Fatal(err)
		}
		var types []string
		for _, e := range turn.Events {
			types = append(types, e.Type)
		}
		t.Logf("%s events: %v", kind, types)
		if kind == agents.Pi && !strings.Contains(strings.Join(types, " "), "agent_end auto_retry_start agent_start") {
			t.Fatalf("pi did not end the failed run before retrying; the test no longer covers that: %v", types)
		}
		if turn.Text != "recovered" {
			t.Fatalf("text %q stop %q err %q; events %v", turn.Text, turn.StopReason, turn.ErrorMessage, types)
		}
	})
}

// Steering, follow-ups, abort-and-prompt and wait-for-idle on a running
// turn: the turn goes on through them and ends with the last answer.
//
// The slow answers pause 300 ms between pieces: six pauses after the first
// update leave the command, one round trip, well over a second to arrive
// while the answer runs. Follow-up and steer wait for the whole answer, so
// a longer pause (it was 500 ms) only waited.
func TestReal_QueueIntoRunningTurn(t *testing.T) {
	bothAgents(t, func(t *testing.T, kind agents.Kind) {
		a := startReal(t, kind, rpc.Options{})
		ctx := tctx(t, 120*time.Second)
		streaming := make(chan struct{}, 1)
		a.c.On(rpc.EventMessageUpdate, func(rpc.Event) {
			select {
			case streaming <- struct{}{}:
			default:
			}
		})
		waitStreaming := func() {
			t.Helper()
			for {
				select {
				case <-streaming:
				default:
				}
				select {
				case <-streaming:
					return
				case <-ctx.Done():
					t.Fatal("no streaming")
				}
			}
		}

		// Follow-up: delivered once the agent would stop.
		if err := a.c.Prompt(ctx, "[[slow:300ms]] [[big:2000]]", nil); err != nil {
			t.Fatal(err)
		}
		waitStreaming()
		if err := a.c.FollowUp(ctx, "[[say:followed up]]", nil); err != nil {
			t.Fatalf("follow_up: %v", err)
		}
		turn, err := a.c.WaitTurn(ctx)
		if err != nil || turn.Text != "followed up" {
			t.Fatalf("follow-up turn: %q %v", turn.Text, err)
		}

		// Steer: delivered after the current assistant message.
		if err := a.c.Prompt(ctx, "[[slow:300ms]] [[big:2000]]", nil); err != nil {
			t.Fatal(err)
		}
		waitStreaming()
		if err := a.c.Steer(ctx, "[[say:steered]]", nil); err != nil {
			t.Fatalf("steer: %v", err)
		}
		turn, err = a.c.WaitTurn(ctx)
		if err != nil || turn.Text != "steered" {
			t.Fatalf("steered turn: %q %v", turn.Text, err)
		}
		if err := a.c.WaitForIdle(ctx); err != nil {
			t.Fatalf("wait for idle: %v", err)
		}

		if kind != agents.OMP {
			return
		}
		// abort_and_prompt (omp): the running answer is cut, the new prompt
		// answers, and the one turn ends with it.
		if err := a.c.Prompt(ctx, "[[slow:300ms]] [[big:20000]]", nil); err != nil {
			t.Fatal(err)
		}
		waitStreaming()
		if err := a.c.AbortAndPrompt(ctx, "[[say:replaced]]", nil); err != nil {
			t.Fatalf("abort_and_prompt: %v", err)
		}
		turn, err = a.c.WaitTurn(ctx)
		if err != nil || turn.Text != "replaced" {
			t.Fatalf("abort_and_prompt turn: %q %v", turn.Text, err)
		}
		if err := a.c.WaitForIdle(ctx); err != nil {
			t.Fatalf("wait for idle: %v", err)
		}
	})
}
