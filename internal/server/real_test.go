package server

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/roomsqlite"
	"github.com/agenthost/agenthost/internal/rpcagent"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// newRealHarness serves rooms on the real agent kind (omp or pi), on the
// scripted model. It fails (never skips) when the agents are missing.
func newRealHarness(t *testing.T, kind string) *harness {
	t.Helper()
	return newRealHarnessWith(t, room.Options{Config: room.Config{Agent: kind}})
}

// newRealHarnessWith is newRealHarness with the rooms' options (the
// agent kind in ropts.Config.Agent).
func newRealHarnessWith(t *testing.T, ropts room.Options, hopts ...harnessOption) *harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	sim := modelsim.New(modelsim.Options{})
	if err := sim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	in, err := agents.Find()
	if err != nil {
		t.Fatalf("the real agents are needed (run make setup): %v", err)
	}
	dir := t.TempDir()
	db, err := store.Open(ctx, filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cust, err := custody.New(custody.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := rpcagent.New(rpcagent.Options{Custodian: cust, Install: in, ModelURL: sim.URL()})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, db: db, seen: &observed{m: map[string]map[int]bool{}}, sim: sim}
	ropts.Store, ropts.Transport, ropts.Root = roomsqlite.New(db), tr, filepath.Join(dir, "rooms")
	h.root = ropts.Root
	h.m, err = room.New(ropts)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if h.s, err = New(Options{Manager: h.m, Token: testToken}); err != nil {
		t.Fatal(err)
	}
	var handler http.Handler = h.s
	for _, o := range hopts {
		if o.wrap != nil {
			handler = o.wrap(h.s)(handler)
		}
	}
	h.ts = httptest.NewServer(handler)
	t.Cleanup(func() {
		h.s.Close()
		h.ts.Close()
		_ = h.m.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := h.m.Wait(ctx); err != nil {
			t.Errorf("closing the rooms: %v", err)
		}
		if err := cust.Close(); err != nil {
			t.Errorf("closing custody: %v", err)
		}
		_ = db.Close()
	})
	return h
}

func bashCall(cmd string) string {
	b, _ := json.Marshal(map[string]string{"command": cmd})
	return "[[tool:bash " + string(b) + "]]"
}

// modelUsage is the usage the scripted model reported for the agent's
// requests from the next'th on (those that offered tools: the agent's
// own), at the price agenthost registers for it: what the agent must
// report for them.
func modelUsage(t *testing.T, sim *modelsim.Server, next *int) store.Usage {
	t.Helper()
	reqs := sim.Requests()
	var u modelsim.Usage
	for _, r := range reqs[*next:] {
		if len(r.Tools) > 0 {
			u = u.Add(r.Usage)
		}
	}
	*next = len(reqs)
	if u.Output == 0 {
		t.Fatal("the agent made no model request in the turn")
	}
	return store.Usage{InputTokens: int64(u.Input), OutputTokens: int64(u.Output), CacheReadTokens: int64(u.CacheRead),
		CacheWriteTokens: int64(u.CacheWrite),
		CostUSD:          agents.Cost(int64(u.Input), int64(u.Output), int64(u.CacheRead), int64(u.CacheWrite))}
}

// usageOf reads a usage object of the API (turn.ended's, a room's).
func usageOf(t *testing.T, v any) store.Usage {
	t.Helper()
	b, _ := json.Marshal(v)
	var u store.Usage
	if err := json.Unmarshal(b, &u); err != nil {
		t.Fatalf("usage %s: %v", b, err)
	}
	return u
}

// sameUsage: the same tokens, and costs equal but for float rounding.
func sameUsage(a, b store.Usage) bool {
	ca, cb := a.CostUSD, b.CostUSD
	a.CostUSD, b.CostUSD = 0, 0
	return a == b && math.Abs(ca-cb) <= 1e-12+1e-9*math.Abs(cb)
}

func realFlow(t *testing.T, kind string) {
	h := newRealHarness(t, kind)
	next := 0
	acc := h.post("real", "hello there")
	// The first turn starts the agent, which on a loaded machine takes
	// longer than until's 30 s.
	d := h.endedWithin("real", acc, 120*time.Second)
	if d["outcome"] != "settled" || d["text"] != "ok: hello there" {
		t.Fatalf("turn: %v", d)
	}
	// The turn's usage is the agent's report of the model's, exactly, and
	// costs something at the price registered for the built-in model.
	spent := modelUsage(t, h.sim, &next)
	if got := usageOf(t, d["usage"]); !sameUsage(got, spent) || got.CostUSD <= 0 {
		t.Fatalf("turn.ended usage %+v, want %+v", got, spent)
	}
	turns := int64(1)
	if kind == "omp" {
		// An approval answered through the API.
		acc = h.post("real", "Run it: "+bashCall("echo approved-run"))
		req := h.until("real", acc.Seq, func(ev sse) bool { return ev.typ == "approval.requested" })
		st := h.do("GET", "/v1/rooms/real", nil).json(t)
		if aps := st["approvals"].([]any); len(aps) != 1 || aps[0].(map[string]any)["tool"] != "bash" {
			t.Fatalf("room state: %v", st)
		}
		if r := h.do("POST", "/v1/rooms/real/approvals/"+req.data["approval_id"].(string), map[string]string{"decision": "allow"}); r.status != http.StatusOK {
			t.Fatalf("approve: %d %s", r.status, r.body)
		}
		tool := h.until("real", req.id, func(ev sse) bool { return ev.typ == "tool.ended" })
		if !strings.Contains(tool.data["output"].(string), "approved-run") {
			t.Fatalf("tool output %v", tool.data)
		}
		d := h.ended("real", acc)
		if d["outcome"] != "settled" {
			t.Fatalf("turn: %v", d)
		}
		// Two model requests (the tool call, then the answer): both count.
		u := modelUsage(t, h.sim, &next)
		if got := usageOf(t, d["usage"]); !sameUsage(got, u) {
			t.Fatalf("turn.ended usage %+v, want %+v", got, u)
		}
		spent = spent.Add(u)
		turns++
	}
	// The room's totals, by sender too, in the room and in the list; and
	// the server's counters.
	st := h.do("GET", "/v1/rooms/real", nil).json(t)
	if st["turns"] != float64(turns) || !sameUsage(usageOf(t, st["usage"]), spent) {
		t.Fatalf("room: turns %v usage %v, want %d %+v", st["turns"], st["usage"], turns, spent)
	}
	by, _ := st["usage_by_sender"].(map[string]any)
	ann, _ := by["ann"].(map[string]any)
	if len(by) != 1 || ann["turns"] != float64(turns) || !sameUsage(usageOf(t, ann), spent) {
		t.Fatalf("room: usage_by_sender %v", st["usage_by_sender"])
	}
	list := h.do("GET", "/v1/rooms", nil).json(t)
	if rs, _ := list["rooms"].([]any); len(rs) != 1 || !sameUsage(usageOf(t, rs[0].(map[string]any)["usage"]), spent) {
		t.Fatalf("room list: %v", list)
	}
	metrics := string(h.do("GET", "/metrics", nil).body)
	for _, line := range []string{
		fmt.Sprintf(`agenthost_tokens_total{kind="input"} %d`, spent.InputTokens),
		fmt.Sprintf(`agenthost_tokens_total{kind="output"} %d`, spent.OutputTokens),
		fmt.Sprintf(`agenthost_tokens_total{kind="cache_read"} %d`, spent.CacheReadTokens),
	} {
		if !strings.Contains(metrics, line+"\n") {
			t.Errorf("metrics lack %q", line)
		}
	}
	if !strings.Contains(metrics, "agenthost_cost_usd_total ") {
		t.Errorf("metrics lack agenthost_cost_usd_total")
	}
	r := h.do("DELETE", "/v1/rooms/real", nil)
	d = r.json(t)
	if r.status != http.StatusOK || d["released"] != true {
		t.Fatalf("release: %d %s", r.status, r.body)
	}
	receipt, _ := d["receipt"].(map[string]any)
	procs, _ := receipt["processes"].([]any)
	if len(procs) == 0 {
		t.Fatalf("release: no processes in the receipt %s", r.body)
	}
	for _, p := range procs {
		if p.(map[string]any)["ended"] == "" {
			t.Fatalf("a process outlived its release: %v", p)
		}
	}
}

func TestRealOmpThroughTheAPI(t *testing.T) { realFlow(t, "omp") }

func TestRealPiThroughTheAPI(t *testing.T) { realFlow(t, "pi") }

// TestRealOmpSlotsAndMessageEnds, on omp: with two agent slots, both held
// by rooms whose turns wait on a person, a third room's turn waits for a
// slot (turn.waiting) and gets one as soon as one of those turns ends
// (the idle room is evicted); a message sent while a question is pending
// ends "answered" right after question.answered; every message of every
// room ends with one message.ended. Three agents start, one per room.
func TestRealOmpSlotsAndMessageEnds(t *testing.T) {
	h := newRealHarnessWith(t, room.Options{MaxResident: 2, Config: room.Config{Agent: "omp"}})
	holds := map[string]room.Accepted{}
	approvals := map[string]string{}
	for _, rm := range []string{"a", "b"} {
		holds[rm] = h.post(rm, "Run it: "+bashCall("echo "+rm))
		req := h.untilWithin(rm, holds[rm].Seq, 120*time.Second, func(ev sse) bool { return ev.typ == "approval.requested" })
		approvals[rm] = req.data["approval_id"].(string)
	}
	c := h.post("c", "hello from c")
	w := h.untilWithin("c", c.Seq, 60*time.Second, func(ev sse) bool { return ev.typ == "turn.waiting" })
	if w.data["message_id"] != c.ID || w.data["slots"] != float64(2) || w.data["resident"] != float64(2) {
		t.Fatalf("turn.waiting %v", w.data)
	}
	approve := func(rm string) {
		if r := h.do("POST", "/v1/rooms/"+rm+"/approvals/"+approvals[rm], map[string]string{"decision": "allow"}); r.status != http.StatusOK {
			t.Fatalf("approve in %s: %d %s", rm, r.status, r.body)
		}
	}
	approve("a")
	if d := h.endedWithin("a", holds["a"], 120*time.Second); d["outcome"] != "settled" {
		t.Fatalf("room a: %v", d)
	}
	if d := h.endedWithin("c", c, 120*time.Second); d["outcome"] != "settled" || d["text"] != "ok: hello from c" {
		t.Fatalf("room c: %v", d)
	}
	rel := h.untilWithin("a", holds["a"].Seq, 30*time.Second, func(ev sse) bool { return ev.typ == "agent.released" })
	if !strings.Contains(rel.data["reason"].(string), "evicted") {
		t.Fatalf("room a released: %v", rel.data)
	}

	// c's agent is resident: a question it asks takes the next message
	// as its answer.
	ask := h.post("c", `[[tool:ask {"questions":[{"id":"c","question":"Which color?","options":[{"label":"red"},{"label":"blue"}]}]}]]`)
	q := h.untilWithin("c", ask.Seq, 120*time.Second, func(ev sse) bool { return ev.typ == "question.asked" })
	reply := h.post("c", "blue")
	ans := h.until("c", q.id, func(ev sse) bool { return ev.typ == "question.answered" })
	next := h.until("c", ans.id, func(sse) bool { return true })
	if ans.data["message_id"] != reply.ID || next.typ != "message.ended" || next.data["message_id"] != reply.ID ||
		next.data["outcome"] != "answered" || next.data["turn_id"] != nil {
		t.Fatalf("question.answered %v, then %s %v", ans.data, next.typ, next.data)
	}
	if d := h.endedWithin("c", ask, 120*time.Second); d["outcome"] != "settled" {
		t.Fatalf("the asking turn: %v", d)
	}
	approve("b")
	h.endedWithin("b", holds["b"], 120*time.Second)
	for _, rm := range []string{"a", "b", "c"} {
		checkMessageEnds(t, h, rm)
	}
}

// realSettings, on the real agent: a room's settings over the API reach
// the agent (its instructions are in the model's system prompt), and its
// budget refuses a message once reached, until raised.
func realSettings(t *testing.T, kind string) {
	h := newRealHarness(t, kind)
	r := h.do("PUT", "/v1/rooms/set/config", map[string]any{"instructions": "Always mention marker-S7.", "budget": map[string]any{"turns": 1}})
	if r.status != http.StatusOK {
		t.Fatalf("PUT config: %d %s", r.status, r.body)
	}
	acc := h.post("set", "hello there")
	if d := h.endedWithin("set", acc, 120*time.Second); d["outcome"] != "settled" {
		t.Fatalf("turn: %v", d)
	}
	var instructed bool
	for _, req := range h.sim.Requests() {
		for _, m := range req.Messages {
			instructed = instructed || m.Role == "system" && strings.Contains(m.Content, "Always mention marker-S7.")
		}
	}
	if !instructed {
		t.Fatal("the room's instructions are not in the model's system prompt")
	}
	h.until("set", acc.Seq, func(ev sse) bool { return ev.typ == "budget.exhausted" })
	over := h.do("POST", "/v1/rooms/set/messages", map[string]string{"text": "more"})
	if over.status != http.StatusTooManyRequests || !strings.Contains(string(over.body), "room budget exhausted: 1 of 1 turns run") {
		t.Fatalf("over the budget: %d %s", over.status, over.body)
	}
	if r := h.do("PUT", "/v1/rooms/set/config", map[string]any{"instructions": "Always mention marker-S7.", "budget": map[string]any{"turns": 2}}); r.status != http.StatusOK {
		t.Fatalf("raising the budget: %d %s", r.status, r.body)
	}
	acc = h.post("set", "once more")
	if d := h.ended("set", acc); d["outcome"] != "settled" || d["text"] != "ok: once more" {
		t.Fatalf("after raising the budget: %v", d)
	}
}

func TestRealOmpSettingsAndBudget(t *testing.T) { realSettings(t, "omp") }

func TestRealPiSettingsAndBudget(t *testing.T) { realSettings(t, "pi") }
