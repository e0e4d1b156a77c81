package agentproc_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agentproc"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/rpc"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Both real agents leave background /bin/sleep children behind (measured:
// they survive the agent's exit). In custody, Close ends them all and the
// receipt names them.
func TestRealAgents_BackgroundChildrenReaped(t *testing.T) {
	in, err := agents.Find()
	if err != nil {
		t.Fatalf("the real agents are needed (run make setup): %v", err)
	}
	cust, err := custody.New(custody.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cust.Close(); err != nil {
			t.Error(err)
		}
	}()
	for _, kind := range []agents.Kind{agents.OMP, agents.Pi} {
		t.Run(string(kind), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			sim := modelsim.New(modelsim.Options{})
			if err := sim.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer sim.Close()
			home := t.TempDir()
			env, err := agents.Home(home, kind, sim.URL())
			if err != nil {
				t.Fatal(err)
			}
			argv, err := in.Argv(kind)
			if err != nil {
				t.Fatal(err)
			}
			c, err := rpc.Spawn(ctx, rpc.Spec{Argv: argv, Model: agents.ModelID, Dir: t.TempDir(), Env: env, NoSession: true},
				rpc.SpawnOptions{Starter: agentproc.Starter{Custodian: cust}})
			if err != nil {
				t.Fatal(err)
			}
			// One background child from the model's bash tool, one from the
			// RPC bash command; each prints its pid.
			turn, err := c.Run(ctx, `[[tool:bash {"command":"/bin/sleep 4001 >/dev/null 2>&1 & echo tool-child=$!"}]]`, nil)
			if err != nil {
				t.Fatal(err)
			}
			pids := []int{pidAfter(t, toolOutput(t, turn), "tool-child=")}
			res, err := c.Bash(ctx, "/bin/sleep 4002 >/dev/null 2>&1 & echo bash-child=$!")
			if err != nil {
				t.Fatal(err)
			}
			pids = append(pids, pidAfter(t, res.Output, "bash-child="))
			for _, pid := range pids {
				if !running(pid) {
					t.Fatalf("pid %d is not running before Close; nothing to test", pid)
				}
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			if err := c.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			r := agentproc.Receipt(c)
			if r == nil {
				t.Fatal("no receipt")
			}
			t.Logf("%s", r)
			for _, pid := range pids {
				if running(pid) {
					t.Errorf("pid %d still running after Close", pid)
				}
				found := false
				for _, e := range r.Processes {
					found = found || e.PID == pid && e.Ended != custody.EndedUnknown
				}
				if !found {
					t.Errorf("pid %d not in the receipt", pid)
				}
			}
		})
	}
}

func toolOutput(t *testing.T, turn *rpc.Turn) string {
	for _, e := range turn.Events {
		if e.Type == rpc.EventToolExecutionEnd {
			return string(e.Raw())
		}
	}
	t.Fatal("no tool_execution_end in the turn")
	return ""
}

func pidAfter(t *testing.T, s, key string) int {
	i := strings.Index(s, key)
	if i < 0 {
		t.Fatalf("%q not in %.300q", key, s)
	}
	j := i + len(key)
	k := j
	for k < len(s) && s[k] >= '0' && s[k] <= '9' {
		k++
	}
	pid, err := strconv.Atoi(s[j:k])
	if err != nil {
		t.Fatalf("no pid after %q", key)
	}
	return pid
}

// running: the process exists and is not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z'
}
