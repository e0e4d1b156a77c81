//go:build linux

package usage_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/acp"
	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/usage"
	"github.com/agenthost/agenthost/rpc"
)

// These tests drive the real agents (installed by `make setup`; they fail, never skip, without
// them) on the built-in model and check that what each agent path reports, read by this
// package, is exactly the built-in model's usage formula summed over the turn's model requests.

// realTimeout bounds one agent's whole test: a start (1–3 s) and two short turns, with room
// for a loaded machine.
const realTimeout = 3 * time.Minute

// prompts are the two turns every agent runs: one with a tool call (two model requests), one of
// text (one request).
var prompts = map[agents.Kind][2]string{
	agents.OMP:     {`[[tool:bash {"command":"echo hi"}]]`, "hello there"},
	agents.Pi:      {`[[tool:bash {"command":"echo hi"}]]`, "hello there"},
	agents.Claude:  {`[[tool:Bash {"command":"echo hi","description":"say hi"}]]`, "hello there"},
	agents.Codex:   {`[[tool:exec_command {"cmd":"echo hi"}]]`, "hello there"},
	agents.Copilot: {`[[tool:bash {"command":"echo hi","description":"say hi","mode":"sync","initial_wait":30}]]`, "hello there"},
}

// sim is one built-in model per test, and the index of the first request not yet counted.
type sim struct {
	*modelsim.Server
	next int
}

func startSim(t *testing.T) *sim {
	t.Helper()
	s := modelsim.New(modelsim.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &sim{Server: s}
}

// turnUsage is the usage the model reported for the agent's own requests since the last call:
// those that offered tools (claude-agent-acp's title requests offer none, and no agent counts
// them in the turn), priced at the built-in model's registered price.
func (s *sim) turnUsage(t *testing.T) usage.Usage {
	t.Helper()
	reqs := s.Requests()
	var u modelsim.Usage
	n := 0
	for _, r := range reqs[s.next:] {
		if len(r.Tools) > 0 {
			u = u.Add(r.Usage)
			n++
		}
	}
	s.next = len(reqs)
	if n == 0 {
		t.Fatal("the agent made no model request in the turn")
	}
	return usage.Usage{InputTokens: int64(u.Input), OutputTokens: int64(u.Output), CacheReadTokens: int64(u.CacheRead),
		CacheWriteTokens: int64(u.CacheWrite),
		CostUSD:          agents.Cost(int64(u.Input), int64(u.Output), int64(u.CacheRead), int64(u.CacheWrite))}
}

// tokensOf is u without its cost.
func tokensOf(u usage.Usage) usage.Usage { u.CostUSD = 0; return u }

func TestRPC_RealAgents(t *testing.T) {
	in, err := agents.Find()
	if err != nil {
		t.Fatalf("the real agents are needed (run make setup): %v", err)
	}
	for _, kind := range []agents.Kind{agents.OMP, agents.Pi} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), realTimeout)
			defer cancel()
			m := startSim(t)
			argv, err := in.Argv(kind)
			if err != nil {
				t.Fatal(err)
			}
			home := t.TempDir()
			env, err := agents.Home(home, kind, m.URL())
			if err != nil {
				t.Fatal(err)
			}
			c, err := rpc.Spawn(ctx, rpc.Spec{Argv: argv, Model: agents.ModelID, Dir: t.TempDir(), Env: env,
				SessionDir: filepath.Join(home, "sessions")}, rpc.SpawnOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			var total usage.Usage
			for i, p := range prompts[kind] {
				turn, err := c.Run(ctx, p, nil)
				if err != nil {
					t.Fatalf("turn %d: %v", i, err)
				}
				var rt usage.RPCTurn
				for _, ev := range turn.Events {
					if err := rt.Frame(ev.Raw()); err != nil {
						t.Fatalf("turn %d: %v", i, err)
					}
				}
				want := m.turnUsage(t)
				got := rt.Usage()
				if tokensOf(got) != tokensOf(want) || !near(got.CostUSD, want.CostUSD) || got.CostUSD <= 0 {
					t.Errorf("turn %d: %+v, want %+v", i, got, want)
				}
				if wantMsgs := 2 - i; rt.Messages() != wantMsgs {
					t.Errorf("turn %d: %d assistant messages with usage, want %d", i, rt.Messages(), wantMsgs)
				}
				// The session's totals are the turns' sums.
				total = total.Add(want)
				var raw json.RawMessage
				if err := c.Call(ctx, rpc.GetSessionStatsCommand{}, &raw); err != nil {
					t.Fatal(err)
				}
				stats, err := usage.FromRPCStats(raw)
				if err != nil || tokensOf(stats) != tokensOf(total) || !near(stats.CostUSD, total.CostUSD) {
					t.Errorf("after turn %d: session stats %+v, %v; want %+v", i, stats, err, total)
				}
			}
		})
	}
}

// acpAgent is one running ACP agent with its usage follower.
type acpAgent struct {
	c    *acp.Client
	sess *acp.Session

	mu sync.Mutex // the follower is fed from the client's reader goroutine
	u  *usage.ACPSession
}

func startACP(t *testing.T, ctx context.Context, cust *custody.Custodian, in *agents.Install, k agents.Kind,
	home, ws, modelURL, load string, sessionCost float64) *acpAgent {
	t.Helper()
	r, err := in.ACP(k, agents.ACPOptions{Home: home, ModelURL: modelURL, Yolo: true})
	if err != nil {
		t.Fatal(err)
	}
	a := &acpAgent{u: usage.NewACPSession(usage.ACPReportOf(string(k)), sessionCost)}
	c, err := acp.Start(ctx, acp.Spec{Argv: r.Argv, Dir: ws, Env: r.Env}, acp.Options{
		Custodian: cust, SessionMeta: r.SessionMeta,
		Permission: func(context.Context, acp.PermissionRequest) bool { return true },
		Events: func(ev acp.Event) {
			if ev.Type != "usage_update" {
				return
			}
			a.mu.Lock()
			defer a.mu.Unlock()
			if err := a.u.Update(ev.Raw); err != nil {
				t.Errorf("usage_update: %v", err)
			}
		},
	})
	if err != nil {
		t.Fatalf("start %s: %v", k, err)
	}
	a.c = c
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = c.Close(ctx)
	})
	if load == "" {
		a.sess, err = c.NewSession(ctx, ws, nil)
	} else {
		a.sess, err = c.LoadSession(ctx, load, ws, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	if r.Mode != "" {
		if err := c.SetMode(ctx, a.sess.ID, r.Mode); err != nil {
			t.Fatal(err)
		}
	}
	if r.Model != "" {
		if err := c.SelectModel(ctx, a.sess, r.Model); err != nil && !errors.Is(err, acp.ErrNotOffered) {
			t.Fatal(err)
		}
	}
	return a
}

// turn runs one prompt and returns its usage as this package reads it.
func (a *acpAgent) turn(t *testing.T, ctx context.Context, prompt string) (usage.Usage, bool) {
	t.Helper()
	res, err := a.c.Prompt(ctx, a.sess.ID, prompt)
	if err != nil {
		t.Fatal(err)
	}
	if res.StopReason != "end_turn" {
		t.Fatalf("stopReason %q", res.StopReason)
	}
	answer, err := usage.ACPAnswer(res.Usage, res.Meta)
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	u, ok, err := a.u.EndTurn(answer)
	if err != nil {
		t.Fatal(err)
	}
	return u, ok
}

// acpCost says which ACP agents report a cost, and whether it is the built-in model's registered
// price (omp's) or the agent's own (Claude Code prices by its model name).
var acpCost = map[agents.Kind]string{agents.OMP: "registered", agents.Claude: "own", agents.Codex: "none", agents.Copilot: "none"}

func TestACP_RealAgents(t *testing.T) {
	in, err := agents.Find()
	if err != nil {
		t.Fatalf("the real agents are needed (run make setup): %v", err)
	}
	cust, err := custody.New(custody.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cust.Close(); err != nil {
			t.Errorf("custody: %v", err)
		}
	})
	for _, k := range agents.ACPKinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), realTimeout)
			defer cancel()
			m := startSim(t)
			home, ws := t.TempDir(), t.TempDir()
			a := startACP(t, ctx, cust, in, k, home, ws, m.URL(), "", 0)
			for i, p := range prompts[k] {
				got, ok := a.turn(t, ctx, p)
				want := m.turnUsage(t)
				if !ok || tokensOf(got) != tokensOf(want) {
					t.Errorf("turn %d: tokens %+v (reported %v), want %+v", i, tokensOf(got), ok, tokensOf(want))
				}
				switch acpCost[k] {
				case "registered":
					if !near(got.CostUSD, want.CostUSD) || got.CostUSD <= 0 {
						t.Errorf("turn %d: cost %v, want %v", i, got.CostUSD, want.CostUSD)
					}
				case "own":
					if got.CostUSD <= 0 {
						t.Errorf("turn %d: cost %v, want above zero", i, got.CostUSD)
					}
				default:
					if got.CostUSD != 0 {
						t.Errorf("turn %d: cost %v from an agent that reports none", i, got.CostUSD)
					}
				}
			}
			if k != agents.OMP && k != agents.Copilot {
				return
			}
			// A new process on the loaded session: omp resumes its cost total (the follower
			// starts from the total kept), copilot its token total from zero.
			prev := a.u.SessionCost()
			id := a.sess.ID
			cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
			defer ccancel()
			if _, err := a.c.Close(cctx); err != nil {
				t.Fatal(err)
			}
			b := startACP(t, ctx, cust, in, k, home, ws, m.URL(), id, prev)
			m.next = len(m.Requests())
			got, _ := b.turn(t, ctx, "once more")
			want := m.turnUsage(t)
			if tokensOf(got) != tokensOf(want) {
				t.Errorf("after the load: tokens %+v, want %+v", tokensOf(got), tokensOf(want))
			}
			if k == agents.OMP && (!near(got.CostUSD, want.CostUSD) || got.CostUSD <= 0) {
				t.Errorf("after the load: cost %v, want %v", got.CostUSD, want.CostUSD)
			}
		})
	}
}
