package acpagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
	"go.uber.org/goleak"
)

// These tests host rooms on the real `omp acp`, installed by `make setup`,
// on the scripted model. They fail (never skip) when omp is missing.

func TestMain(m *testing.M) {
	if os.Getenv(fakePeerEnv) != "" {
		os.Exit(fakePeer())
	}
	goleak.VerifyTestMain(m)
}

type host struct {
	t    *testing.T
	sim  *modelsim.Server
	db   *store.DB
	cust *custody.Custodian
	m    *room.Manager
	root string
}

func startHost(t *testing.T, dir string, sim *modelsim.Server, opts room.Options) *host {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if sim == nil {
		sim = startSim(t)
	}
	in, err := agents.Find()
	if err != nil {
		t.Fatalf("the real agents are needed (run make setup): %v", err)
	}
	db, err := store.Open(ctx, filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cust, err := custody.New(custody.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := New(Options{Custodian: cust, Install: in, ModelURL: sim.URL()})
	if err != nil {
		t.Fatal(err)
	}
	opts.Store, opts.Transport, opts.Root = room.SQLite(db), tr, filepath.Join(dir, "rooms")
	m, err := room.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	h := &host{t: t, sim: sim, db: db, cust: cust, m: m, root: opts.Root}
	t.Cleanup(h.close)
	return h
}

func startSim(t *testing.T) *modelsim.Server {
	t.Helper()
	sim := modelsim.New(modelsim.Options{})
	if err := sim.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}

func (h *host) close() {
	if h.m == nil {
		return
	}
	if err := h.m.Close(); err != nil && !errors.Is(err, room.ErrClosed) {
		h.t.Errorf("closing the rooms: %v", err)
	}
	if err := h.cust.Close(); err != nil {
		h.t.Errorf("closing custody: %v", err)
	}
	_ = h.db.Close()
	h.m = nil
}

func (h *host) submit(roomID, text string) room.Accepted {
	h.t.Helper()
	acc, err := h.m.Submit(h.t.Context(), roomID, room.Message{Text: text, Sender: "ann", Delivery: room.DeliverQueue})
	if err != nil {
		h.t.Fatalf("submit to %q: %v", roomID, err)
	}
	return acc
}

// wait returns the room's first event of type typ after seq that match
// accepts (nil: any).
func (h *host) wait(roomID string, after int64, typ string, match func(map[string]any) bool) (store.Event, map[string]any) {
	h.t.Helper()
	watch, stop := h.db.Watch(roomID)
	defer stop()
	deadline := time.NewTimer(120 * time.Second)
	defer deadline.Stop()
	for {
		evs, err := h.db.Events(h.t.Context(), roomID, after, 0)
		if err != nil {
			h.t.Fatal(err)
		}
		for _, ev := range evs {
			after = ev.Seq
			if ev.Type != typ {
				continue
			}
			var d map[string]any
			_ = json.Unmarshal(ev.Data, &d)
			if match == nil || match(d) {
				return ev, d
			}
		}
		select {
		case <-watch:
		case <-deadline.C:
			h.t.Fatalf("room %q: no %s event after seq %d", roomID, typ, after)
		}
	}
}

func (h *host) ended(roomID string, acc room.Accepted) map[string]any {
	h.t.Helper()
	_, d := h.wait(roomID, acc.Seq, "turn.ended", func(d map[string]any) bool { return d["message_id"] == acc.ID })
	return d
}

func (h *host) settled(roomID string, acc room.Accepted) string {
	h.t.Helper()
	d := h.ended(roomID, acc)
	if d["outcome"] != room.OutcomeSettled {
		h.t.Fatalf("room %q: turn ended %v", roomID, d)
	}
	return d["text"].(string)
}

func (h *host) count(roomID, typ string) int {
	h.t.Helper()
	evs, err := h.db.Events(h.t.Context(), roomID, 0, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	n := 0
	for _, ev := range evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

func bashCall(cmd string) string {
	b, _ := json.Marshal(map[string]string{"command": cmd})
	return "[[tool:bash " + string(b) + "]]"
}

func TestRealACPReplyStreamingMultiTurn(t *testing.T) {
	t.Parallel()
	h := startHost(t, "", nil, room.Options{Config: room.Config{Instructions: "Always mention marker-I."}})
	a1 := h.submit("r", "[[say:hello from acp]]")
	if got := h.settled("r", a1); got != "hello from acp" {
		t.Fatalf("turn 1: %q", got)
	}
	if h.count("r", room.KindText) == 0 {
		t.Fatal("no text.delta: the reply was not streamed")
	}
	a2 := h.submit("r", "second message")
	if got := h.settled("r", a2); got != "ok: second message" {
		t.Fatalf("turn 2: %q", got)
	}
	// One session: the model saw the first turn in the second's context.
	reqs := h.sim.Requests()
	last := reqs[len(reqs)-1]
	var saw bool
	for _, m := range last.Messages {
		saw = saw || strings.Contains(m.Content, "hello from acp")
	}
	if !saw {
		t.Fatal("the second turn did not carry the first (not one session)")
	}
	var instructed bool
	for _, m := range last.Messages {
		instructed = instructed || m.Role == "system" && strings.Contains(m.Content, "Always mention marker-I.")
	}
	if !instructed {
		t.Fatal("the room's instructions are not in the system prompt")
	}
	h.checkTurnEvents("r")
}

// checkTurnEvents checks that every text delta and tool event of the room
// lies inside its own turn: after turn.started, before turn.ended.
func (h *host) checkTurnEvents(roomID string) {
	h.t.Helper()
	evs, err := h.db.Events(h.t.Context(), roomID, 0, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	running := ""
	for _, ev := range evs {
		var d map[string]any
		_ = json.Unmarshal(ev.Data, &d)
		id, _ := d["turn_id"].(string)
		switch ev.Type {
		case "turn.started":
			running = id
		case "turn.ended":
			running = ""
		case room.KindText, room.KindToolStarted, room.KindToolEnded:
			if id == "" || id != running {
				h.t.Fatalf("room %q: %s at seq %d for turn %q while turn %q runs", roomID, ev.Type, ev.Seq, id, running)
			}
		}
	}
}

func TestRealACPApprovalsAllowDenyDeadline(t *testing.T) {
	t.Parallel()
	h := startHost(t, "", nil, room.Options{Config: room.Config{ApprovalTimeout: 2 * time.Second}})
	dir := t.TempDir()
	for i, tc := range []struct {
		decide func(id string)
		ran    bool
		by     string
	}{
		{func(id string) { _ = h.m.Approve(t.Context(), "r", id, true) }, true, "person"},
		{func(id string) { _ = h.m.Approve(t.Context(), "r", id, false) }, false, "person"},
		{nil, false, "deadline"},
	} {
		mark := filepath.Join(dir, fmt.Sprintf("ran-%d", i))
		acc := h.submit("r", "Run it: "+bashCall("touch "+mark))
		ev, req := h.wait("r", acc.Seq, "approval.requested", nil)
		if !strings.Contains(req["input"].(string), "touch "+mark) {
			t.Fatalf("approval: %v", req)
		}
		if tc.decide != nil {
			tc.decide(req["approval_id"].(string))
		}
		_, res := h.wait("r", ev.Seq, "approval.resolved", nil)
		if res["by"] != tc.by {
			t.Fatalf("resolved: %v", res)
		}
		h.settled("r", acc)
		if _, err := os.Stat(mark); (err == nil) != tc.ran {
			t.Fatalf("case %d: the command ran: %v, want %v", i, err == nil, tc.ran)
		}
	}
	h.checkTurnEvents("r")
}

func TestRealACPResumeAfterRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sim := startSim(t)
	h := startHost(t, dir, sim, room.Options{})
	a1 := h.submit("r", "[[say:remember the word pelican]]")
	h.settled("r", a1)
	st, err := h.m.State(t.Context(), "r")
	if err != nil || st.SessionID == "" {
		t.Fatalf("state %+v %v", st, err)
	}
	h.close()

	h2 := startHost(t, dir, sim, room.Options{})
	a2 := h2.submit("r", "what was the word?")
	if got := h2.settled("r", a2); got != "ok: what was the word?" {
		t.Fatalf("turn after restart: %q", got)
	}
	st2, err := h2.m.State(t.Context(), "r")
	if err != nil || st2.SessionID != st.SessionID {
		t.Fatalf("session %q after restart, want %q (%v)", st2.SessionID, st.SessionID, err)
	}
	if h2.count("r", "context.lost") != 0 {
		t.Fatal("the session was not resumed (context.lost)")
	}
	// The resumed session carried the first turn to the model.
	reqs := sim.Requests()
	var saw bool
	for _, m := range reqs[len(reqs)-1].Messages {
		saw = saw || strings.Contains(m.Content, "pelican")
	}
	if !saw {
		t.Fatal("the resumed session lost the first turn")
	}
}

func TestRealACPCancelThenNextTurn(t *testing.T) {
	t.Parallel()
	h := startHost(t, "", nil, room.Options{})
	first := h.submit("r", "[[say:before]]")
	h.settled("r", first)
	busy := h.submit("r", "[[slow:60s]]long answer")
	h.wait("r", busy.Seq, "turn.started", nil)
	// Cancel once the model is answering (no event says so: the model's
	// request log does).
	for deadline := time.Now().Add(60 * time.Second); len(h.sim.Requests()) < 2; {
		if time.Now().After(deadline) {
			t.Fatal("the slow turn never reached the model")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t0 := time.Now()
	if err := h.m.Cancel(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	d := h.ended("r", busy)
	if d["outcome"] != room.OutcomeCancelled {
		t.Fatalf("turn ended %v", d)
	}
	took := time.Since(t0)
	t.Logf("cancel to turn.ended: %v", took)
	if took > 30*time.Second {
		t.Fatalf("cancel took %v", took)
	}
	next := h.submit("r", "after the cancel")
	if got := h.settled("r", next); got != "ok: after the cancel" {
		t.Fatalf("next turn: %q", got)
	}
}

func TestRealACPCleanupEndsBackgroundWork(t *testing.T) {
	t.Parallel()
	h := startHost(t, "", nil, room.Options{Config: room.Config{ApprovalMode: room.ApprovalYolo}})
	acc := h.submit("r", "Run it: "+bashCall("/bin/sleep 300 & echo pid=$!"))
	_, tool := h.wait("r", acc.Seq, room.KindToolEnded, nil)
	h.settled("r", acc)
	out, _ := tool["output"].(string)
	var pid int
	if i := strings.LastIndex(out, "pid="); i < 0 {
		t.Fatalf("tool output %q", out)
	} else if _, err := fmt.Sscanf(out[i:], "pid=%d", &pid); err != nil {
		t.Fatalf("tool output %q: %v", out, err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
		t.Fatalf("the background sleep %d is not running: %v", pid, err)
	}
	h.close()
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		t.Fatalf("the background sleep %d outlived the room's release", pid)
	}
	db, err := store.Open(t.Context(), filepath.Join(filepath.Dir(h.root), "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rs, err := db.Receipts(t.Context(), "r")
	if err != nil || len(rs) == 0 {
		t.Fatalf("receipts %v, %v", rs, err)
	}
	// By pid: omp may end the sleep itself on stdin EOF, before custody
	// read its command line.
	var rec struct{ Processes []struct{ PID int } }
	if err := json.Unmarshal(rs[len(rs)-1].Receipt, &rec); err != nil {
		t.Fatal(err)
	}
	var listed bool
	for _, p := range rec.Processes {
		listed = listed || p.PID == pid
	}
	if !listed {
		t.Fatalf("the receipt lacks the background sleep %d: %s", pid, rs[len(rs)-1].Receipt)
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// omp acp offers its model and thinking level as config options: the
// room's are selected, and one it does not offer, or does not take (omp
// offers "auto" thinking but keeps a model without reasoning "off"), fails
// the turn before any prompt reaches a model.
func TestRealACPModelAndThinkingSelection(t *testing.T) {
	t.Parallel()
	configs := map[string]room.Config{
		"ok":       {Model: agents.ModelID, Thinking: "off"},
		"no-model": {Model: "fake/no-such-model"},
		"ultra":    {Thinking: "ultra"},
		"auto":     {Thinking: "auto"},
	}
	h := startHost(t, "", nil, room.Options{RoomConfig: func(r string) room.Config { return configs[r] }})
	accs := map[string]room.Accepted{}
	for r := range configs {
		accs[r] = h.submit(r, "prompt in "+r)
	}
	if got := h.settled("ok", accs["ok"]); got != "ok: prompt in ok" {
		t.Fatalf("turn: %q", got)
	}
	for r := range configs {
		if r == "ok" {
			continue
		}
		d := h.ended(r, accs[r])
		if d["outcome"] != room.OutcomeFailed || !strings.Contains(d["reason"].(string), "model selection refused") {
			t.Fatalf("%s: turn %v", r, d)
		}
		for _, req := range h.sim.Requests() {
			for _, m := range req.Messages {
				if strings.Contains(m.Content, "prompt in "+r) {
					t.Fatalf("%s: a prompt reached the model", r)
				}
			}
		}
	}
}

// omp's ask tool reaches the room over ACP elicitation forms: answered
// through the Manager, or cancelled at its deadline with the turn going on.
func TestRealACPQuestions(t *testing.T) {
	t.Parallel()
	h := startHost(t, "", nil, room.Options{RoomConfig: func(r string) room.Config {
		if r == "deadline" {
			return room.Config{QuestionTimeout: 3 * time.Second}
		}
		return room.Config{}
	}})
	ask := `[[tool:ask {"questions":[{"id":"c","question":"Which color?","options":[{"label":"red"},{"label":"blue"}]}]}]]`
	acc := h.submit("r", ask)
	late := h.submit("deadline", ask)
	_, q := h.wait("r", acc.Seq, "question.asked", nil)
	if !strings.Contains(q["title"].(string), "Which color?") || fmt.Sprint(q["options"]) != "[red blue]" {
		t.Fatalf("question: %v", q)
	}
	if err := h.m.Answer(t.Context(), "r", q["question_id"].(string), "blue"); err != nil {
		t.Fatal(err)
	}
	_, tool := h.wait("r", acc.Seq, room.KindToolEnded, nil)
	if out := tool["output"].(string); !strings.Contains(out, "blue") || strings.Contains(out, "no answer") {
		t.Fatalf("ask result %v", tool)
	}
	h.settled("r", acc)

	ev, _ := h.wait("deadline", late.Seq, "question.asked", nil)
	_, ans := h.wait("deadline", ev.Seq, "question.answered", nil)
	if ans["by"] != "deadline" || ans["cancelled"] != true {
		t.Fatalf("answered: %v", ans)
	}
	h.settled("deadline", late)
}
