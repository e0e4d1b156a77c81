//go:build linux

package roomclaims

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/acpagent"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/rpcagent"
	"github.com/agenthost/agenthost/room"
)

// idleSettle is how long an agent is left alone before its idle memory is read: the agents load
// lazily for a moment after their session is ready.
const idleSettle = 2 * time.Second

// BenchmarkAgents measures each agent path through its room transport, on the scripted model:
// start (spawn → session ready, the transport's Start), idle RSS of the agent's whole process
// tree, one turn's latency (ns/op, a one-line answer), and what Close found and ended (logged
// from the receipt). Run it with a fixed count:
//
//	go test ./internal/roomclaims -run '^$' -bench Agents -benchtime 5x
func BenchmarkAgents(b *testing.B) {
	in, err := agents.Find()
	if err != nil {
		b.Fatalf("the real agents are needed (run make setup): %v", err)
	}
	for _, p := range paths {
		b.Run(strings.ReplaceAll(p.id, " ", "-"), func(b *testing.B) { benchPath(b, in, p) })
	}
}

func benchPath(b *testing.B, in *agents.Install, p path) {
	ctx := b.Context()
	sim := modelsim.New(modelsim.Options{})
	if err := sim.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	cust, err := custody.New(custody.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer cust.Close()
	var tr room.Transport
	if p.transport == "rpc" {
		tr, err = rpcagent.New(rpcagent.Options{Custodian: cust, Install: in, ModelURL: sim.URL()})
	} else {
		tr, err = acpagent.New(acpagent.Options{Custodian: cust, Install: in, ModelURL: sim.URL()})
	}
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	ws := filepath.Join(dir, "ws")
	if err := os.MkdirAll(ws, 0o700); err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	a, err := tr.Start(ctx, room.AgentSpec{
		Room: "bench", Workspace: ws, Home: filepath.Join(dir, "home"),
		Config:  room.Config{Agent: string(p.kind), ApprovalMode: room.ApprovalAsk},
		Handler: nopHandler{},
	})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Since(t0)
	closed := false
	defer func() {
		if !closed {
			_, _ = a.Close(context.Background())
		}
	}()
	// Idle memory: the agent's whole tree (claude's CLI, codex's binary) once it settled.
	time.Sleep(idleSettle)
	rss := treeRSS(ws)

	b.ResetTimer()
	for i := range b.N {
		if _, err := a.Run(ctx, "[[say:turn "+strconv.Itoa(i)+"]]"); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(start.Milliseconds()), "start-ms")
	b.ReportMetric(float64(rss)/(1<<20), "idle-RSS-MB")

	rec, err := a.Close(context.Background())
	closed = true
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%s: start %v, idle RSS %.0f MB; close: %s", p.id, start.Round(time.Millisecond), float64(rss)/(1<<20), receiptSummary(rec))
}

// nopHandler denies approvals and cancels questions; the benchmark's turns ask for neither.
type nopHandler struct{}

func (nopHandler) Event(room.AgentEvent)                                    {}
func (nopHandler) Approve(context.Context, room.ApprovalRequest) bool       { return false }
func (nopHandler) Ask(context.Context, room.QuestionRequest) (string, bool) { return "", false }

// treeRSS sums the resident memory of this test's custody processes whose scope owns a process
// running in ws (the agent's leader runs there).
func treeRSS(ws string) int64 {
	scopes := map[string]bool{}
	procs := markerProcs()
	for _, p := range procs {
		if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", p.pid)); err == nil && cwd == ws {
			scopes[p.scope] = true
		}
	}
	var sum int64
	for _, p := range procs {
		if !scopes[p.scope] {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				sum += kb << 10
			}
		}
	}
	return sum
}

// receiptSummary says how many processes a receipt owned and how each ended.
func receiptSummary(raw json.RawMessage) string {
	var rec custody.Receipt
	if err := json.Unmarshal(raw, &rec); err != nil {
		return "no receipt"
	}
	ended := map[custody.Ended]int{}
	var names []string
	for _, e := range rec.Processes {
		ended[e.Ended]++
		cmd := e.Cmdline
		if f := strings.Fields(cmd); len(f) > 0 {
			cmd = filepath.Base(f[0])
			if len(f) > 1 && strings.HasSuffix(f[1], ".js") {
				cmd += " " + filepath.Base(filepath.Dir(filepath.Dir(f[1])))
			}
		}
		names = append(names, fmt.Sprintf("%s:%s", cmd, e.Ended))
	}
	return fmt.Sprintf("%d process(es) in %v (%s) [%s]", len(rec.Processes), rec.Duration.Round(time.Millisecond), rec.Containment, strings.Join(names, ", "))
}
