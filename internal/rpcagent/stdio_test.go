package rpcagent

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/daemonproc"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/roomtest"
	"github.com/agenthost/agenthost/room"
)

// stdioAttack is the bash command of the stdio attack (review-people A2c,
// repro people/a2e): it walks up from its own shell (omp runs it in the
// agent's process, pi in a bash of its own) to the agent, the first
// process titled pi or running --mode rpc (not the tool's own shell,
// whose command line holds this command), then opens the agent's stdout and stderr
// for reading (frames read there are frames the host never sees: approval
// requests, their ids), writes a command of its own into the agent's
// stdin (what an answer to an approval dialog would be), and writes into
// its stderr. Each result is a line a2e-NAME=opened or a2e-NAME=denied:ERROR.
const stdioAttack = `p=$(awk '/^PPid:/{print $2}' /proc/self/status) m=--mode
while [ "$p" -gt 1 ]; do
  case "$(tr '\0' ' ' < /proc/$p/cmdline)" in "pi "*|*"$m rpc"*) break;; esac
  p=$(awk '/^PPid:/{print $2}' /proc/$p/status)
done
echo "a2e-agent=$p $(readlink /proc/$p/fd/0) $(readlink /proc/$p/fd/1)"
try() { if out=$( (eval "$2") 2>&1 ); then echo "a2e-$1=opened$out"; else echo "a2e-$1=denied:$out"; fi; }
try stdout 'true </proc/$p/fd/1 && { timeout 2 cat </proc/$p/fd/1 >stolen.txt; echo ":read $(wc -c <stolen.txt) bytes"; }'
try stderr-read 'true </proc/$p/fd/2'
try stdin 'echo "{\"type\":\"get_state\",\"id\":\"injected-1\"}" >/proc/$p/fd/0'
try stderr-write 'echo spoofed >/proc/$p/fd/2'
true`

// TestRealStdioNotReopenable: a process in the room (here the agent's own
// tool, in a yolo room: what a process an earlier command left behind
// could do) cannot reopen the agent's stdin, stdout or stderr through
// /proc/PID/fd, though it runs in the agent's Landlock domain as the
// agent's user: they are sockets, not pipes. So it can neither read the
// frames the host answers approvals by nor write a command of its own into
// the agent: the turn settles with its tool call in the log, the next turn
// settles, and the client saw no frame it did not expect (no "response to
// unknown request"). On omp and pi, and on omp run by the process daemon
// (serve --daemon).
func TestRealStdioNotReopenable(t *testing.T) {
	for _, tc := range []struct {
		name, agent string
		daemon      bool
	}{{"pi", "pi", false}, {"omp", "omp", false}, {"omp-daemon", "omp", true}} {
		t.Run(tc.name, func(t *testing.T) {
			var logs syncBuffer
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			dir := t.TempDir()
			var runner *daemonproc.Runner
			if tc.daemon {
				r, err := daemonproc.NewRunner(startDaemon(t, dir))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { r.Close() }) // registered first: runs after the host's cleanup
				runner = r
			}
			h := roomtest.Start(t, dir, nil, room.Options{Config: room.Config{Agent: tc.agent, ApprovalMode: room.ApprovalYolo}},
				func(cust *custody.Custodian, in *agents.Install, url string) (room.Transport, error) {
					cf, err := confine.New(confine.Options{Mode: confine.ModeLandlock, Tools: in.Dir})
					if err != nil {
						return nil, err
					}
					return New(Options{Custodian: cust, Install: in, ModelURL: url, Daemon: runner, Confine: cf, Logger: log})
				})
			h.Settled("a", h.Submit("a", "hello"))
			h.Settled("a", h.Submit("a", "Attack: "+roomtest.BashCall(stdioAttack)))
			res := stdioResults(h.Sim)
			if res == nil {
				t.Fatal("no tool result carries the attack's output")
			}
			t.Logf("attack: %q", res)
			if !strings.Contains(res["agent"], "socket:") {
				t.Errorf("the agent's stdio: %q, want sockets", res["agent"])
			}
			for _, k := range []string{"stdout", "stderr-read", "stdin", "stderr-write"} {
				if !strings.HasPrefix(res[k], "denied:") || !strings.Contains(res[k], "No such device or address") {
					t.Errorf("%s: %q, want denied: No such device or address (ENXIO)", k, res[k])
				}
			}
			if h.Count("a", "tool.ended") == 0 {
				t.Error("no tool.ended in the room's log for the attack's call")
			}
			if got := h.Settled("a", h.Submit("a", "after the attack")); got != "ok: after the attack" {
				t.Errorf("the next turn: %q", got)
			}
			if l := logs.String(); strings.Contains(l, "protocol error") {
				t.Errorf("the client saw a frame it did not expect:\n%s", l)
			}
		})
	}
}

// stdioResults finds the attack's output in what the agent sent the model
// (a tool result): each a2e-NAME=VALUE line, nil when none carries it.
func stdioResults(sim *modelsim.Server) map[string]string {
	for _, r := range sim.Requests() {
		for _, m := range r.Messages {
			i := strings.Index(m.Content, "a2e-agent=")
			if i < 0 || strings.Contains(m.Content, "/proc/self/status") { // the command itself, not its output
				continue
			}
			out := map[string]string{}
			for _, line := range strings.Split(m.Content[i:], "\n") {
				if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && strings.HasPrefix(k, "a2e-") {
					out[strings.TrimPrefix(k, "a2e-")] = v
				}
			}
			return out
		}
	}
	return nil
}

// syncBuffer is a bytes.Buffer safe for the client's logger and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
