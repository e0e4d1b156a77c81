package rpc

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// The test binary doubles as small fake agents for faults the real agents
// cannot be made to show. fakeAgentEnv selects one; see fakeAgents.
const fakeAgentEnv = "AGENTHOST_RPC_FAKE_AGENT"

func TestMain(m *testing.M) {
	if name := os.Getenv(fakeAgentEnv); name != "" {
		fn, ok := fakeAgents[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "unknown fake agent %q\n", name)
			os.Exit(2)
		}
		fn()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// fakeSpec runs the test binary as the named fake agent.
func fakeSpec(t testing.TB, name string) Spec {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// GORACE: a race-enabled binary otherwise sleeps 1 s at exit.
	return Spec{Argv: []string{exe, "-test.run=^$"}, Verbatim: true, Env: append(os.Environ(), fakeAgentEnv+"="+name, "GORACE=atexit_sleep_ms=0")}
}

type fakeIO struct {
	in  *bufio.Scanner
	out *bufio.Writer
}

func newFakeIO() *fakeIO {
	s := bufio.NewScanner(os.Stdin)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	return &fakeIO{in: s, out: bufio.NewWriterSize(os.Stdout, 1<<16)}
}

func (f *fakeIO) send(v any) {
	b, _ := json.Marshal(v)
	f.out.Write(b)
	f.out.WriteByte('\n')
	f.out.Flush()
}

func (f *fakeIO) raw(s string) {
	f.out.WriteString(s)
	f.out.WriteByte('\n')
	f.out.Flush()
}

// serve reads commands until EOF and calls on for each; get_state is
// answered by default.
func (f *fakeIO) serve(on func(cmd map[string]any) bool) {
	for f.in.Scan() {
		var cmd map[string]any
		if err := json.Unmarshal(f.in.Bytes(), &cmd); err != nil {
			f.send(map[string]any{"type": "response", "command": "parse", "success": false, "error": "Failed to parse command"})
			continue
		}
		if on != nil && on(cmd) {
			continue
		}
		switch cmd["type"] {
		case "get_state":
			f.send(map[string]any{"id": cmd["id"], "type": "response", "command": "get_state", "success": true,
				"data": map[string]any{"isStreaming": false, "sessionId": "fake", "messageCount": 0, "pendingMessageCount": 0}})
		default:
			f.send(map[string]any{"type": "response", "command": cmd["type"], "success": false, "error": fmt.Sprintf("Unknown command: %v", cmd["type"])})
		}
	}
}

// hangAgent acknowledges prompts and starts a run it never ends: at once,
// or with lateStart only once stdin is closed. It ignores SIGTERM and,
// after stdin's EOF, hangs until killed.
func hangAgent(lateStart bool) {
	signal.Ignore(syscall.SIGTERM)
	f := newFakeIO()
	f.serve(func(cmd map[string]any) bool {
		if cmd["type"] != "prompt" {
			return false
		}
		f.send(map[string]any{"id": cmd["id"], "type": "response", "command": "prompt", "success": true})
		if !lateStart {
			f.send(map[string]any{"type": "agent_start"})
		}
		return true
	})
	if lateStart {
		f.send(map[string]any{"type": "agent_start"})
	}
	time.Sleep(time.Hour)
}

func assistantEnd(text string) map[string]any {
	return map[string]any{"type": "message_end", "message": map[string]any{
		"role": "assistant", "content": []any{map[string]any{"type": "text", "text": text}}, "stopReason": "stop",
		"usage": map[string]any{"input": 10, "output": 2, "totalTokens": 12}}}
}

func (f *fakeIO) turn(id any, text string) {
	f.send(map[string]any{"id": id, "type": "response", "command": "prompt", "success": true})
	f.send(map[string]any{"type": "agent_start"})
	f.send(map[string]any{"type": "message_update", "message": map[string]any{"role": "assistant"}})
	f.send(assistantEnd(text))
	f.send(map[string]any{"type": "agent_end", "messages": []any{}})
}

var fakeAgents = map[string]func(){
	// plain: answers prompts with one short turn that echoes the message.
	"plain": func() {
		f := newFakeIO()
		f.serve(func(cmd map[string]any) bool {
			if cmd["type"] == "prompt" {
				f.turn(cmd["id"], "echo: "+fmt.Sprint(cmd["message"]))
				return true
			}
			return false
		})
	},
	// broken-first: its first frame is not JSON.
	"broken-first": func() {
		f := newFakeIO()
		f.raw("Error: cannot find module 'x' (this is not JSON)")
		f.serve(nil)
	},
	// late-fail: acknowledges a prompt, starts, then fails it with a second
	// response under the same id, as omp does for a refused prompt.
	"late-fail": func() {
		f := newFakeIO()
		f.serve(func(cmd map[string]any) bool {
			if cmd["type"] == "prompt" {
				f.send(map[string]any{"id": cmd["id"], "type": "response", "command": "prompt", "success": true})
				f.send(map[string]any{"id": cmd["id"], "type": "response", "command": "prompt", "success": false, "error": "Agent is busy"})
				return true
			}
			return false
		})
	},
	// bad-json: emits invalid JSON in the middle of a turn, then finishes it.
	"bad-json": func() {
		f := newFakeIO()
		f.serve(func(cmd map[string]any) bool {
			if cmd["type"] == "prompt" {
				f.send(map[string]any{"id": cmd["id"], "type": "response", "command": "prompt", "success": true})
				f.send(map[string]any{"type": "agent_start"})
				f.raw(`{"type":"message_update", broken`)
				f.raw(`[1,2,3]`)
				f.send(assistantEnd("survived"))
				f.send(map[string]any{"type": "agent_end", "messages": []any{}})
				return true
			}
			return false
		})
	},
	// hang: starts a turn and never ends it; ignores SIGTERM; exits on
	// stdin EOF only after a long time (so Close must escalate).
	"hang": func() { hangAgent(false) },
	// start-after-eof: like hang, but acknowledges a prompt and starts its
	// run only once stdin is closed (the host's Close has begun).
	"start-after-eof": func() { hangAgent(true) },
	// flood: on a prompt, writes FAKE_FLOOD message_update events (default
	// 100000) as fast as it can, then ends the turn.
	"flood": func() {
		n := 100000
		fmt.Sscan(os.Getenv("FAKE_FLOOD"), &n)
		f := newFakeIO()
		f.serve(func(cmd map[string]any) bool {
			if cmd["type"] == "prompt" {
				f.send(map[string]any{"id": cmd["id"], "type": "response", "command": "prompt", "success": true})
				f.send(map[string]any{"type": "agent_start"})
				line := `{"type":"message_update","message":{"role":"assistant","content":[{"type":"text","text":"` + strings.Repeat("z", 200) + `"}]}}`
				for i := 0; i < n; i++ {
					f.raw(line)
				}
				f.send(assistantEnd("flooded"))
				f.send(map[string]any{"type": "agent_end", "messages": []any{}})
				return true
			}
			return false
		})
	},
	// huge-line: on a prompt, writes one line of FAKE_HUGE bytes (default
	// 100 MiB), then a normal turn.
	"huge-line": func() {
		n := 100 << 20
		fmt.Sscan(os.Getenv("FAKE_HUGE"), &n)
		f := newFakeIO()
		f.serve(func(cmd map[string]any) bool {
			if cmd["type"] == "prompt" {
				f.send(map[string]any{"id": cmd["id"], "type": "response", "command": "prompt", "success": true})
				f.send(map[string]any{"type": "agent_start"})
				f.out.WriteString(`{"type":"message_update","text":"`)
				chunk := strings.Repeat("h", 1<<20)
				for w := 0; w < n; w += len(chunk) {
					f.out.WriteString(chunk)
				}
				f.out.WriteString("\"}\n")
				f.send(assistantEnd("after the huge line"))
				f.send(map[string]any{"type": "agent_end", "messages": []any{}})
				return true
			}
			return false
		})
	},
	// escape: starts a setsid'd /bin/sleep that inherits stdout and stderr
	// (out of the process group's reach); "where" answers its pid.
	"escape": func() {
		cmd := exec.Command("setsid", "/bin/sleep", "60")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			os.Exit(3)
		}
		f := newFakeIO()
		f.serve(func(c map[string]any) bool {
			if c["type"] == "where" {
				f.send(map[string]any{"id": c["id"], "type": "response", "command": "where", "success": true, "data": map[string]any{"pid": cmd.Process.Pid}})
				return true
			}
			return false
		})
	},
	"stderr-exit": func() {
		fmt.Fprintln(os.Stderr, "fatal: no model configured")
		os.Exit(3)
	},
}
