//go:build unix

package agents_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
)

const (
	// turnTimeout bounds spawn → agent_end; omp alone needs ~1.5 s to start.
	turnTimeout = 90 * time.Second
	// exitTimeout bounds stdin EOF → exit; both agents exit in well under a second.
	exitTimeout = 15 * time.Second
)

// TestAgents_ToolRoundTrip runs each real agent in RPC mode against modelsim: the model asks for
// bash, the agent runs it, the model sees the result and answers "done".
func TestAgents_ToolRoundTrip(t *testing.T) {
	in, err := agents.Find()
	if err != nil {
		t.Skipf("agents not installed (run `make setup`; CI always does): %v", err)
	}
	cases := []struct {
		name string
		kind agents.Kind
		api  string
	}{
		{"omp/completions", agents.OMP, agents.APICompletions},
		{"pi/completions", agents.Pi, agents.APICompletions},
		{"omp/responses", agents.OMP, agents.APIResponses},
		{"pi/responses", agents.Pi, agents.APIResponses},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runToolRoundTrip(t, in, tc.kind, tc.api)
		})
	}
}

func runToolRoundTrip(t *testing.T, in *agents.Install, kind agents.Kind, api string) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	sim := modelsim.New(modelsim.Options{})
	if err := sim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sim.Close(); err != nil {
			t.Errorf("modelsim close: %v", err)
		}
	})

	argv, err := in.Argv(kind)
	if err != nil {
		t.Fatal(err)
	}
	env, err := agents.HomeWith(t.TempDir(), kind, sim.URL(), agents.HomeOptions{API: api})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], append(argv[1:], "--mode", "rpc", "--model", agents.ModelID)...)
	cmd.Env = env
	cmd.Dir = t.TempDir()
	// A process group lets a timeout kill the agent and whatever its bash tool started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &tailBuffer{max: 16 << 10}
	cmd.Stderr = stderr

	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}

	// One goroutine owns stdout: it passes lines on until stop closes, and after EOF reaps the
	// agent, so Wait runs only once the pipe is drained. done closes when it has returned.
	lines := make(chan []byte, 64)
	stop := make(chan struct{})
	done := make(chan struct{})
	var waitErr error
	go func() {
		defer close(done)
		r := bufio.NewReaderSize(stdout, 1<<20)
		for {
			line, err := r.ReadBytes('\n')
			if len(line) > 0 {
				select {
				case lines <- line:
				case <-stop:
				}
			}
			if err != nil {
				break
			}
		}
		close(lines)
		waitErr = cmd.Wait()
	}()
	var stopOnce sync.Once
	stopReading := func() { stopOnce.Do(func() { close(stop) }) }
	// killGroup kills the agent and anything its bash tool started, unless it is already reaped.
	killGroup := func() {
		select {
		case <-done:
		default:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	}
	t.Cleanup(func() {
		stopReading()
		killGroup()
		<-done
	})

	prompt := `{"id":"1","type":"prompt","message":"[[tool:bash {\"command\":\"echo hi\"}]]"}` + "\n"
	if _, err := io.WriteString(stdin, prompt); err != nil {
		t.Fatalf("writing prompt: %v; stderr:\n%s", err, stderr)
	}

	var end *agentEnd
	deadline := time.NewTimer(turnTimeout)
	defer deadline.Stop()
	for end == nil {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("%s exited before agent_end; stderr:\n%s", kind, stderr)
			}
			end = parseAgentEnd(t, line)
		case <-deadline.C:
			t.Fatalf("no agent_end from %s within %v; stderr:\n%s", kind, turnTimeout, stderr)
		}
	}
	turn := time.Since(start)
	stopReading()

	if got := end.finalText(); got != "done" {
		t.Errorf("final assistant text = %q, want %q", got, "done")
	}
	if !sawToolResult(sim.Requests(), "hi") {
		t.Errorf("modelsim saw no request ending in a tool result containing %q; requests: %v", "hi", summarize(sim.Requests()))
	}

	// Keep stdin open until agent_end (EOF cuts a running turn short), then expect a clean exit.
	exitStart := time.Now()
	if err := stdin.Close(); err != nil {
		t.Errorf("closing stdin: %v", err)
	}
	select {
	case <-done:
		if waitErr != nil {
			t.Errorf("%s exit: %v; stderr:\n%s", kind, waitErr, stderr)
		}
	case <-time.After(exitTimeout):
		killGroup()
		<-done
		t.Errorf("%s did not exit within %v of stdin EOF", kind, exitTimeout)
	}
	t.Logf("%s over %s: spawn → agent_end %v, stdin EOF → exit %v, %d model requests",
		kind, api, turn.Round(time.Millisecond), time.Since(exitStart).Round(time.Millisecond), len(sim.Requests()))
}

// agentEnd is the part of an agent_end event the test reads.
type agentEnd struct {
	Type       string `json:"type"`
	IsTerminal *bool  `json:"isTerminal"`
	Messages   []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

// parseAgentEnd returns the event if line is a terminal agent_end (omp marks non-terminal ones
// with isTerminal:false), else nil. Other frames pass by.
func parseAgentEnd(t *testing.T, line []byte) *agentEnd {
	t.Helper()
	if !bytes.Contains(line, []byte(`"agent_end"`)) {
		return nil
	}
	var ev agentEnd
	if err := json.Unmarshal(line, &ev); err != nil || ev.Type != "agent_end" {
		return nil
	}
	if ev.IsTerminal != nil && !*ev.IsTerminal {
		return nil
	}
	return &ev
}

// finalText returns the text of the last assistant message.
func (e *agentEnd) finalText() string {
	for i := len(e.Messages) - 1; i >= 0; i-- {
		m := e.Messages[i]
		if m.Role != "assistant" {
			continue
		}
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			return s
		}
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		_ = json.Unmarshal(m.Content, &parts)
		var texts []string
		for _, p := range parts {
			if p.Type == "text" {
				texts = append(texts, p.Text)
			}
		}
		return strings.Join(texts, "")
	}
	return ""
}

func sawToolResult(reqs []modelsim.Request, want string) bool {
	for _, r := range reqs {
		if n := len(r.Messages); n > 0 && r.Messages[n-1].Role == "tool" && strings.Contains(r.Messages[n-1].Content, want) {
			return true
		}
	}
	return false
}

// summarize keeps failure messages short: path and the role of each message.
func summarize(reqs []modelsim.Request) []string {
	var out []string
	for _, r := range reqs {
		var roles []string
		for _, m := range r.Messages {
			roles = append(roles, m.Role)
		}
		out = append(out, r.Path+" "+strings.Join(roles, ","))
	}
	return out
}

// tailBuffer keeps the last max bytes written, for stderr in failure messages.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = b.buf[over:]
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
