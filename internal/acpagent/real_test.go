package acpagent

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/roomtest"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
	"go.uber.org/goleak"
)

// These tests host rooms on the real `omp acp`, installed by `make setup`,
// on the scripted model. They fail (never skip) when omp is missing.

func TestMain(m *testing.M) {
	// The launcher of the confined agents the tests start.
	confine.Launch()
	if p := os.Getenv(envDumpEnv); p != "" {
		_ = os.WriteFile(p, []byte(strings.Join(os.Environ(), "\n")), 0o600)
	}
	if os.Getenv(fakePeerEnv) != "" {
		os.Exit(fakePeer())
	}
	goleak.VerifyTestMain(m)
}

type host = roomtest.Host

func startHost(t *testing.T, dir string, sim *modelsim.Server, opts room.Options) *host {
	t.Helper()
	return roomtest.Start(t, dir, sim, opts, func(cust *custody.Custodian, in *agents.Install, url string) (room.Transport, error) {
		return New(Options{Custodian: cust, Install: in, ModelURL: url})
	})
}

func TestRealACPReplyStreamingMultiTurn(t *testing.T) {
	t.Parallel()
	h := startHost(t, "", nil, room.Options{Config: room.Config{Instructions: "Always mention marker-I."}})
	a1 := h.Submit("r", "[[say:hello from acp]]")
	if got := h.Settled("r", a1); got != "hello from acp" {
		t.Fatalf("turn 1: %q", got)
	}
	next := len(h.Sim.Requests())
	if h.Count("r", room.KindText) == 0 {
		t.Fatal("no text.delta: the reply was not streamed")
	}
	a2 := h.Submit("r", "second message")
	d := h.Ended("r", a2)
	if d["outcome"] != room.OutcomeSettled || d["text"] != "ok: second message" {
		t.Fatalf("turn 2: %v", d)
	}
	// What omp acp reports (support matrix): the turn's tokens exactly,
	// and a cost from its usage_update at the registered price.
	want := h.ModelUsage(&next)
	if got := roomtest.TurnUsage(t, d); !roomtest.SameTokens(got, want) || math.Abs(got.CostUSD-want.CostUSD) > 1e-9 || got.CostUSD <= 0 {
		t.Fatalf("turn 2's usage %+v, want %+v", got, want)
	}
	// One session: the model saw the first turn in the second's context.
	reqs := h.Sim.Requests()
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
	h.CheckTurnEvents("r")
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
		{func(id string) { _ = h.M.Approve(t.Context(), "r", id, true) }, true, "person"},
		{func(id string) { _ = h.M.Approve(t.Context(), "r", id, false) }, false, "person"},
		{nil, false, "deadline"},
	} {
		mark := filepath.Join(dir, fmt.Sprintf("ran-%d", i))
		acc := h.Submit("r", "Run it: "+roomtest.BashCall("touch "+mark))
		ev, req := h.Wait("r", acc.Seq, "approval.requested", nil)
		if !strings.Contains(req["input"].(string), "touch "+mark) {
			t.Fatalf("approval: %v", req)
		}
		if tc.decide != nil {
			tc.decide(req["approval_id"].(string))
		}
		_, res := h.Wait("r", ev.Seq, "approval.resolved", nil)
		if res["by"] != tc.by {
			t.Fatalf("resolved: %v", res)
		}
		h.Settled("r", acc)
		if _, err := os.Stat(mark); (err == nil) != tc.ran {
			t.Fatalf("case %d: the command ran: %v, want %v", i, err == nil, tc.ran)
		}
	}
	// omp acp's own default lets workspace writes through: the room's
	// always-ask holds for them too (as over RPC).
	note := filepath.Join(dir, "notes.txt")
	call, _ := json.Marshal(map[string]string{"path": note, "content": "hello"})
	acc := h.Submit("r", "Write it: [[tool:write "+string(call)+"]]")
	ev := h.WaitFirst("r", acc.Seq, "approval.requested", "turn.ended")
	if ev.Type != "approval.requested" {
		t.Fatalf("the write was not asked about: %s", ev.Data)
	}
	if err := h.M.Approve(t.Context(), "r", roomtest.Field(ev.Data, "approval_id"), false); err != nil {
		t.Fatal(err)
	}
	h.Settled("r", acc)
	if _, err := os.Stat(note); err == nil {
		t.Fatal("the denied write was written")
	}
	h.CheckTurnEvents("r")
}

func TestRealACPResumeAfterRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sim := roomtest.StartSim(t)
	h := startHost(t, dir, sim, room.Options{})
	a1 := h.Submit("r", "[[say:remember the word pelican]]")
	h.Settled("r", a1)
	st, err := h.M.State(t.Context(), "r")
	if err != nil || st.SessionID == "" {
		t.Fatalf("state %+v %v", st, err)
	}
	h.Close()

	h2 := startHost(t, dir, sim, room.Options{})
	a2 := h2.Submit("r", "what was the word?")
	if got := h2.Settled("r", a2); got != "ok: what was the word?" {
		t.Fatalf("turn after restart: %q", got)
	}
	st2, err := h2.M.State(t.Context(), "r")
	if err != nil || st2.SessionID != st.SessionID {
		t.Fatalf("session %q after restart, want %q (%v)", st2.SessionID, st.SessionID, err)
	}
	if h2.Count("r", "context.lost") != 0 {
		t.Fatal("the session was not resumed (context.lost)")
	}
	// The resumed session carried the first turn to the model.
	if !h2.LastRequestHas("pelican") {
		t.Fatal("the resumed session lost the first turn")
	}

	// A session the agent no longer has (omp answers its load with an
	// internal error whose data says "session not found") starts fresh,
	// context.lost; it is not taken for a failure that lasts.
	h2.Close()
	var removed int
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.Contains(d.Name(), st.SessionID) && os.Remove(p) == nil {
			removed++
		}
		return nil
	})
	if removed == 0 {
		t.Fatalf("no file of session %s to remove", st.SessionID)
	}
	h3 := startHost(t, dir, sim, room.Options{})
	a3 := h3.Submit("r", "after the loss")
	h3.Settled("r", a3) // its text: the transcript that went with it
	if h3.Count("r", "context.lost") != 1 || !h3.ModelSaw("after the loss") {
		t.Fatal("a lost session gave no context.lost, or the turn never reached the model")
	}
}

func TestRealACPCancelThenNextTurn(t *testing.T) {
	t.Parallel()
	h := startHost(t, "", nil, room.Options{})
	first := h.Submit("r", "[[say:before]]")
	h.Settled("r", first)
	busy := h.Submit("r", "[[slow:60s]]long answer")
	h.Wait("r", busy.Seq, "turn.started", nil)
	// Cancel once the model is answering (no event says so: the model's
	// request log does).
	for deadline := time.Now().Add(60 * time.Second); len(h.Sim.Requests()) < 2; {
		if time.Now().After(deadline) {
			t.Fatal("the slow turn never reached the model")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t0 := time.Now()
	if err := h.M.Cancel(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	d := h.Ended("r", busy)
	if d["outcome"] != room.OutcomeCancelled {
		t.Fatalf("turn ended %v", d)
	}
	took := time.Since(t0)
	t.Logf("cancel to turn.ended: %v", took)
	if took > 30*time.Second {
		t.Fatalf("cancel took %v", took)
	}
	next := h.Submit("r", "after the cancel")
	if got := h.Settled("r", next); got != "ok: after the cancel" {
		t.Fatalf("next turn: %q", got)
	}
}

func TestRealACPCleanupEndsBackgroundWork(t *testing.T) {
	t.Parallel()
	h := startHost(t, "", nil, room.Options{Config: room.Config{ApprovalMode: room.ApprovalYolo}})
	acc := h.Submit("r", "Run it: "+roomtest.BashCall("/bin/sleep 300 & echo pid=$!"))
	_, tool := h.Wait("r", acc.Seq, room.KindToolEnded, nil)
	h.Settled("r", acc)
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
	h.Close()
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		t.Fatalf("the background sleep %d outlived the room's release", pid)
	}
	db, err := store.Open(t.Context(), filepath.Join(filepath.Dir(h.Root), "agenthost.db"), store.Options{})
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
		accs[r] = h.Submit(r, "prompt in "+r)
	}
	if got := h.Settled("ok", accs["ok"]); got != "ok: prompt in ok" {
		t.Fatalf("turn: %q", got)
	}
	for r := range configs {
		if r == "ok" {
			continue
		}
		d := h.Ended(r, accs[r])
		if d["outcome"] != room.OutcomeFailed || !strings.Contains(d["reason"].(string), "model selection refused") {
			t.Fatalf("%s: turn %v", r, d)
		}
		for _, req := range h.Sim.Requests() {
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
	acc := h.Submit("r", ask)
	late := h.Submit("deadline", ask)
	_, q := h.Wait("r", acc.Seq, "question.asked", nil)
	if !strings.Contains(q["title"].(string), "Which color?") || fmt.Sprint(q["options"]) != "[red blue]" {
		t.Fatalf("question: %v", q)
	}
	if err := h.M.Answer(t.Context(), "r", q["question_id"].(string), "blue"); err != nil {
		t.Fatal(err)
	}
	_, tool := h.Wait("r", acc.Seq, room.KindToolEnded, nil)
	if out := tool["output"].(string); !strings.Contains(out, "blue") || strings.Contains(out, "no answer") {
		t.Fatalf("ask result %v", tool)
	}
	h.Settled("r", acc)

	ev, _ := h.Wait("deadline", late.Seq, "question.asked", nil)
	_, ans := h.Wait("deadline", ev.Seq, "question.answered", nil)
	if ans["by"] != "deadline" || ans["cancelled"] != true {
		t.Fatalf("answered: %v", ans)
	}
	h.Settled("deadline", late)
}

// TestRealACPSecretsRedacted: omp acp's tool titles carry the command line;
// no credential in it reaches the room's log, its approvals or its state,
// whatever field the agent put it in (title, input, output).
func TestRealACPSecretsRedacted(t *testing.T) {
	t.Parallel()
	h := startHost(t, "", nil, room.Options{})
	const secret = "sk-live-0123456789abcdefXYZ"
	acc := h.Submit("r", "Run it: "+roomtest.BashCall("echo 'Authorization: Bearer "+secret+"'"))
	_, req := h.Wait("r", acc.Seq, "approval.requested", nil)
	st, err := h.M.State(t.Context(), "r")
	if err != nil {
		t.Fatal(err)
	}
	pending, _ := json.Marshal(st)
	aps, err := h.DB.Approvals(t.Context(), "r", true)
	if err != nil || len(aps) != 1 {
		t.Fatalf("pending approvals %v, %v", aps, err)
	}
	if err := h.M.Approve(t.Context(), "r", req["approval_id"].(string), true); err != nil {
		t.Fatal(err)
	}
	h.Settled("r", acc)
	all := []string{string(pending), fmt.Sprint(aps)}
	for _, ev := range h.Events("r") {
		// The person's own message carries it; what the agent said may not.
		if ev.Type != "message.accepted" {
			all = append(all, string(ev.Data))
		}
	}
	for _, s := range all {
		if strings.Contains(s, secret) {
			t.Fatalf("the credential reached the room: %s", s)
		}
	}
	if req["tool"] != "execute" || !strings.Contains(req["input"].(string), "Bearer [redacted]") {
		t.Fatalf("approval.requested %v: want the short kind as tool, the redacted command as input", req)
	}
}
