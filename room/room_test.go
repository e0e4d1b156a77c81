package room

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/record"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestQueuedMessagesRunInOrderWithEveryStepVisible(t *testing.T) {
	h := newHarness(t, Options{})
	var accs []Accepted
	for i := range 5 {
		accs = append(accs, h.submit("r", fmt.Sprintf("msg %d", i)))
	}
	var lastEnd int64
	for i, acc := range accs {
		d := h.turnEnded("r", acc)
		if d["outcome"] != OutcomeSettled || d["text"] != fmt.Sprintf("ok: msg %d", i) {
			t.Fatalf("turn %d: %v", i, d)
		}
	}
	evs, err := h.db.Events(t.Context(), "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Per message: accepted, queued, then its turn started and ended, and
	// turns in the order of acceptance, one at a time.
	running := ""
	order := []string{}
	for _, ev := range evs {
		switch ev.Type {
		case "turn.started":
			if running != "" {
				t.Fatalf("turn %s started while %s ran", field(ev, "turn_id"), running)
			}
			running = field(ev, "turn_id")
			order = append(order, field(ev, "message_id"))
		case "turn.ended":
			if field(ev, "turn_id") != running {
				t.Fatalf("turn.ended for %s while %s ran", field(ev, "turn_id"), running)
			}
			running = ""
			lastEnd = ev.Seq
		}
	}
	for i, acc := range accs {
		if order[i] != acc.ID {
			t.Fatalf("turn %d ran message %s, want %s", i, order[i], acc.ID)
		}
	}
	if lastEnd == 0 {
		t.Fatal("no turn.ended")
	}
	msgs, _ := h.db.Messages(t.Context(), "r", 0, 0)
	for _, m := range msgs {
		if m.Status != store.MessageEnded || m.Outcome != OutcomeSettled {
			t.Fatalf("message %+v", m)
		}
	}
}

func TestTwoRoomsProgressIndependently(t *testing.T) {
	h := newHarness(t, Options{})
	hung := h.submit("a", "hang")
	h.waitEvent("a", hung.Seq, "turn.started", nil)
	acc := h.submit("b", "hello")
	if d := h.turnEnded("b", acc); d["outcome"] != OutcomeSettled {
		t.Fatalf("room b: %v", d)
	}
	if err := h.m.Cancel(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if d := h.turnEnded("a", hung); d["outcome"] != OutcomeCancelled {
		t.Fatalf("room a: %v", d)
	}
}

func TestTurnEndsTimedOutAndRetiresTheAgent(t *testing.T) {
	h := newHarness(t, Options{Config: Config{TurnTimeout: 300 * time.Millisecond}})
	acc := h.submit("r", "hang")
	if d := h.turnEnded("r", acc); d["outcome"] != OutcomeTimedOut || !strings.Contains(d["reason"].(string), "deadline") {
		t.Fatalf("turn: %v", d)
	}
	rel := h.waitEvent("r", acc.Seq, "agent.released", nil)
	if !strings.Contains(field(rel, "reason"), "timed_out") {
		t.Fatalf("release: %s", rel.Data)
	}
	// The next message gets a new process on the same session.
	next := h.submit("r", "again")
	if d := h.turnEnded("r", next); d["outcome"] != OutcomeSettled {
		t.Fatalf("next turn: %v", d)
	}
	started := h.waitEvent("r", next.Seq, "agent.started", nil)
	if !strings.Contains(string(started.Data), `"resumed":true`) {
		t.Fatalf("second start: %s", started.Data)
	}
}

func TestSilentAgentTripsTheWatchdog(t *testing.T) {
	h := newHarness(t, Options{Config: Config{Liveness: 200 * time.Millisecond}})
	acc := h.submit("r", "hang")
	if d := h.turnEnded("r", acc); d["outcome"] != OutcomeTimedOut || !strings.Contains(d["reason"].(string), "nothing") {
		t.Fatalf("turn: %v", d)
	}
}

// Time spent waiting on a person counts against neither the deadline nor
// the watchdog.
func TestApprovalWaitDoesNotCountAgainstTheTurn(t *testing.T) {
	h := newHarness(t, Options{Config: Config{TurnTimeout: 400 * time.Millisecond, Liveness: 300 * time.Millisecond}})
	acc := h.submit("r", "approve:bash")
	req := h.waitEvent("r", acc.Seq, "approval.requested", nil)
	// Longer than both limits; a timer here is the point of the test.
	time.Sleep(time.Second)
	if err := h.m.Approve(t.Context(), "r", field(req, "approval_id"), true); err != nil {
		t.Fatal(err)
	}
	if d := h.turnEnded("r", acc); d["outcome"] != OutcomeSettled || d["text"] != "allowed" {
		t.Fatalf("turn: %v", d)
	}
}

func TestApprovalsAllowedDeniedExpired(t *testing.T) {
	h := newHarness(t, Options{Config: Config{ApprovalTimeout: 300 * time.Millisecond}})
	for _, tc := range []struct {
		decide func(id string) error
		text   string
		by     string
	}{
		{func(id string) error { return h.m.Approve(t.Context(), "r", id, true) }, "allowed", "person"},
		{func(id string) error { return h.m.Approve(t.Context(), "r", id, false) }, "denied", "person"},
		{nil, "denied", "deadline"},
	} {
		acc := h.submit("r", "approve:bash")
		req := h.waitEvent("r", acc.Seq, "approval.requested", nil)
		id := field(req, "approval_id")
		st, err := h.m.State(t.Context(), "r")
		if err != nil || len(st.Approvals) != 1 || st.Approvals[0].ID != id || st.Approvals[0].Tool != "bash" {
			t.Fatalf("state while pending: %+v, %v", st, err)
		}
		if tc.decide != nil {
			if err := tc.decide(id); err != nil {
				t.Fatal(err)
			}
		}
		res := h.waitEvent("r", req.Seq, "approval.resolved", nil)
		if field(res, "by") != tc.by {
			t.Fatalf("resolved: %s", res.Data)
		}
		if d := h.turnEnded("r", acc); d["text"] != tc.text {
			t.Fatalf("turn: %v", d)
		}
		if err := h.m.Approve(t.Context(), "r", id, true); !errors.Is(err, ErrConflict) {
			t.Fatalf("second decision: %v", err)
		}
	}
	if err := h.m.Approve(t.Context(), "r", "a_nope", true); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown approval: %v", err)
	}
}

func TestPolicyDecidesFirst(t *testing.T) {
	h := newHarness(t, Options{Policy: func(room string, req ApprovalRequest) Decision {
		if req.Tool == "read" {
			return Allow
		}
		return Ask
	}})
	acc := h.submit("r", "approve:read")
	if d := h.turnEnded("r", acc); d["text"] != "allowed" {
		t.Fatalf("turn: %v", d)
	}
	res := h.waitEvent("r", acc.Seq, "approval.resolved", nil)
	if field(res, "by") != "policy" || field(res, "decision") != "allow" {
		t.Fatalf("resolved: %s", res.Data)
	}
}

func TestCancelDeniesPendingApproval(t *testing.T) {
	h := newHarness(t, Options{})
	acc := h.submit("r", "approve:bash")
	req := h.waitEvent("r", acc.Seq, "approval.requested", nil)
	if err := h.m.Cancel(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	res := h.waitEvent("r", req.Seq, "approval.resolved", nil)
	if field(res, "decision") != "deny" || field(res, "by") != "cancel" {
		t.Fatalf("resolved: %s", res.Data)
	}
	if d := h.turnEnded("r", acc); d["outcome"] != OutcomeCancelled {
		t.Fatalf("turn: %v", d)
	}
}

func TestQuestionAnsweredByAPIAndByNextMessage(t *testing.T) {
	h := newHarness(t, Options{})
	acc := h.submit("r", "ask:Which color?")
	q := h.waitEvent("r", acc.Seq, "question.asked", nil)
	if err := h.m.Answer(t.Context(), "r", field(q, "question_id"), "blue"); err != nil {
		t.Fatal(err)
	}
	if d := h.turnEnded("r", acc); d["text"] != "answer: blue" {
		t.Fatalf("turn: %v", d)
	}

	acc = h.submit("r", "ask:Which size?")
	q = h.waitEvent("r", acc.Seq, "question.asked", nil)
	reply := h.submit("r", "large")
	ans := h.waitEvent("r", q.Seq, "question.answered", nil)
	if field(ans, "by") != "message" || field(ans, "answer") != "large" {
		t.Fatalf("answered: %s", ans.Data)
	}
	if d := h.turnEnded("r", acc); d["text"] != "answer: large" {
		t.Fatalf("turn: %v", d)
	}
	msgs, _ := h.db.Messages(t.Context(), "r", reply.Seq-1, 1)
	if len(msgs) != 1 || msgs[0].ID != reply.ID || msgs[0].Status != store.MessageEnded || !strings.Contains(msgs[0].Reason, "answered question") {
		t.Fatalf("reply message: %+v", msgs)
	}
}

func TestUnansweredQuestionIsCancelledAndTheTurnGoesOn(t *testing.T) {
	h := newHarness(t, Options{Config: Config{QuestionTimeout: 200 * time.Millisecond}})
	acc := h.submit("r", "ask:Anyone?")
	if d := h.turnEnded("r", acc); d["outcome"] != OutcomeSettled || d["text"] != "answer: "+NoAnswer {
		t.Fatalf("turn: %v", d)
	}
	ans := h.waitEvent("r", acc.Seq, "question.answered", nil)
	if field(ans, "by") != "deadline" {
		t.Fatalf("answered: %s", ans.Data)
	}
}

// A room's question_timeout replaces the Manager's for that room: its
// question's deadline is the room's, and it is cancelled there; another
// room keeps the default.
func TestRoomQuestionTimeoutSetting(t *testing.T) {
	h := newHarness(t, Options{Config: Config{QuestionTimeout: time.Hour}})
	if _, err := h.m.SetSettings(t.Context(), "r", Settings{QuestionTimeout: Duration(time.Second)}); err != nil {
		t.Fatal(err)
	}
	e, err := h.m.EffectiveSettings(t.Context(), "r")
	if err != nil || time.Duration(e.QuestionTimeout) != time.Second {
		t.Fatalf("effective %+v, %v", e, err)
	}
	if b, _ := json.Marshal(e); !strings.Contains(string(b), `"question_timeout":"1s"`) {
		t.Fatalf("effective JSON %s", b)
	}
	acc := h.submit("r", "ask:Anyone?")
	q := h.waitEvent("r", acc.Seq, "question.asked", nil)
	var asked struct{ Deadline time.Time }
	if err := json.Unmarshal(q.Data, &asked); err != nil || asked.Deadline.Sub(q.Time) > 2*time.Second {
		t.Fatalf("question.asked %s (event at %s), want a deadline within the room's 1s", q.Data, q.Time)
	}
	if d := h.turnEnded("r", acc); d["text"] != "answer: "+NoAnswer {
		t.Fatalf("turn: %v", d)
	}
	if ans := h.waitEvent("r", acc.Seq, "question.answered", nil); field(ans, "by") != "deadline" {
		t.Fatalf("answered: %s", ans.Data)
	}
	acc = h.submit("other", "ask:Anyone?")
	q = h.waitEvent("other", acc.Seq, "question.asked", nil)
	if err := json.Unmarshal(q.Data, &asked); err != nil || asked.Deadline.Sub(q.Time) < 59*time.Minute {
		t.Fatalf("another room's question.asked %s, want the Manager's hour", q.Data)
	}
	if err := h.m.Answer(t.Context(), "other", field(q, "question_id"), "red"); err != nil {
		t.Fatal(err)
	}
	h.turnEnded("other", acc)
	if _, err := h.m.SetSettings(t.Context(), "r", Settings{QuestionTimeout: Duration(time.Millisecond)}); !errors.Is(err, ErrBadSettings) {
		t.Fatalf("a 1ms question_timeout: %v", err)
	}
}

func TestSteerAndFollowUpJoinTheRunningTurn(t *testing.T) {
	h := newHarness(t, Options{})
	acc := h.submit("r", "approve:bash") // holds the turn open until decided
	req := h.waitEvent("r", acc.Seq, "approval.requested", nil)
	st := h.submitAs("r", "look left", DeliverSteer)
	fu := h.submitAs("r", "then right", DeliverFollowUp)
	h.waitEvent("r", fu.Seq, "message.delivered", nil)
	if err := h.m.Approve(t.Context(), "r", field(req, "approval_id"), true); err != nil {
		t.Fatal(err)
	}
	h.turnEnded("r", acc)
	for _, id := range []string{st.ID, fu.ID} {
		msgs, _ := h.db.Messages(t.Context(), "r", 0, 0)
		for _, m := range msgs {
			if m.ID == id && (m.Status != store.MessageEnded || m.Outcome != OutcomeSettled) {
				t.Fatalf("delivered message %+v", m)
			}
		}
	}
	// With no turn running, steer acts like queue.
	idle := h.submitAs("r", "alone", DeliverSteer)
	if d := h.turnEnded("r", idle); d["outcome"] != OutcomeSettled || d["text"] != "ok: alone +look left+then right" {
		t.Fatalf("idle steer: %v", d)
	}
}

func TestLostSessionStartsFreshWithTheTranscript(t *testing.T) {
	for _, silent := range []bool{false, true} {
		t.Run(fmt.Sprintf("silent=%v", silent), func(t *testing.T) {
			h := newHarness(t, Options{})
			first := h.submit("r", "remember marker-A")
			h.turnEnded("r", first)
			if err := h.m.Release(t.Context(), "r"); err != nil {
				t.Fatal(err)
			}
			h.f.mu.Lock()
			h.f.forget, h.f.silent = !silent, silent
			h.f.mu.Unlock()
			next := h.submit("r", "what was it?")
			lost := h.waitEvent("r", next.Seq, "context.lost", nil)
			if field(lost, "previous_session_id") != "sess-1" {
				t.Fatalf("context.lost: %s", lost.Data)
			}
			if d := h.turnEnded("r", next); d["outcome"] != OutcomeSettled {
				t.Fatalf("turn: %v", d)
			}
			p := h.f.lastPrompt()
			if !strings.Contains(p, "user (ann): remember marker-A") || !strings.Contains(p, "assistant: ok: remember marker-A") ||
				!strings.HasSuffix(p, "what was it?") {
				t.Fatalf("prompt after a lost session:\n%s", p)
			}
			st, _ := h.m.State(t.Context(), "r")
			if st.SessionID != "sess-2" {
				t.Fatalf("session %q", st.SessionID)
			}
		})
	}
}

func TestIdleReleaseThenWakeResumes(t *testing.T) {
	h := newHarness(t, Options{IdleAfter: 200 * time.Millisecond})
	acc := h.submit("r", "one")
	h.turnEnded("r", acc)
	rel := h.waitEvent("r", acc.Seq, "agent.released", nil)
	if field(rel, "reason") != "idle" || !strings.Contains(string(rel.Data), `"receipt"`) {
		t.Fatalf("release: %s", rel.Data)
	}
	if n := h.f.resident(); n != 0 {
		t.Fatalf("%d agents resident after idle release", n)
	}
	next := h.submit("r", "two")
	h.turnEnded("r", next)
	started := h.waitEvent("r", next.Seq, "agent.started", nil)
	if !strings.Contains(string(started.Data), `"resumed":true`) || field(started, "session_id") != "sess-1" {
		t.Fatalf("wake: %s", started.Data)
	}
}

func TestEvictionAtMaxResident(t *testing.T) {
	h := newHarness(t, Options{MaxResident: 2})
	for _, room := range []string{"a", "b", "c"} {
		h.turnEnded(room, h.submit(room, "hi"))
	}
	// a was the least recently used when c needed a slot.
	rel := h.waitEvent("a", 0, "agent.released", nil)
	if !strings.Contains(field(rel, "reason"), "evicted") {
		t.Fatalf("release: %s", rel.Data)
	}
	if n := h.f.resident(); n != 2 {
		t.Fatalf("%d resident, want 2", n)
	}
	// A busy room is never evicted: a message for a third room waits.
	hung := h.submit("b", "hang")
	h.waitEvent("b", hung.Seq, "turn.started", nil)
	h.turnEnded("a", h.submit("a", "back")) // evicts c, the idle one
	st, _ := h.m.State(t.Context(), "b")
	if !st.Resident || st.Turn == nil {
		t.Fatalf("busy room b: %+v", st)
	}
	_ = h.m.Cancel(t.Context(), "b")
	h.turnEnded("b", hung)
}

func TestQueueLimit(t *testing.T) {
	h := newHarness(t, Options{QueueLimit: 2})
	hung := h.submit("r", "hang")
	h.waitEvent("r", hung.Seq, "turn.started", nil)
	h.submit("r", "1")
	h.submit("r", "2")
	if _, err := h.m.Submit(t.Context(), "r", Message{Text: "3"}); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third queued: %v", err)
	}
	_ = h.m.Cancel(t.Context(), "r")
}

func TestBadInput(t *testing.T) {
	h := newHarness(t, Options{})
	for _, tc := range []struct {
		room string
		msg  Message
		want error
	}{
		{"", Message{Text: "x"}, ErrBadID},
		{"..", Message{Text: "x"}, ErrBadID},
		{"a/b", Message{Text: "x"}, ErrBadID},
		{"a\x00b", Message{Text: "x"}, ErrBadID},
		{strings.Repeat("x", MaxIDLen+1), Message{Text: "x"}, ErrBadID},
		{"r", Message{Text: ""}, ErrBadMessage},
		{"r", Message{Text: strings.Repeat("x", MaxMessageBytes+1)}, ErrBadMessage},
		{"r", Message{Text: "x", Delivery: "now"}, ErrBadMessage},
	} {
		if _, err := h.m.Submit(t.Context(), tc.room, tc.msg); !errors.Is(err, tc.want) {
			t.Errorf("room %.20q: %v, want %v", tc.room, err, tc.want)
		}
	}
}

func TestHostileRoomIDsMapToSeparateFoldersUnderRoot(t *testing.T) {
	h := newHarness(t, Options{})
	ids := []string{"Room", "room", "ROOM", "ünïcødé 房间", "..a", "a..", "x" + strings.Repeat("é", 60), "-", "_"}
	seen := map[string]string{}
	for _, id := range ids {
		if err := ValidateID(id); err != nil {
			t.Fatalf("%q: %v", id, err)
		}
		d := dirName(id)
		if prev, ok := seen[d]; ok {
			t.Fatalf("%q and %q share folder %q", id, prev, d)
		}
		seen[d] = id
		if d == "." || d == ".." || strings.ContainsAny(d, "/\\\x00") || strings.HasPrefix(d, ".") || len(d) > 80 {
			t.Fatalf("%q maps to unsafe folder %q", id, d)
		}
		h.turnEnded(id, h.submit(id, "hi"))
	}
	entries, err := os.ReadDir(h.m.opts.Root)
	if err != nil || len(entries) != len(ids) {
		t.Fatalf("%d room folders (%v), want %d", len(entries), err, len(ids))
	}
	for _, s := range h.f.starts {
		if !strings.HasPrefix(s.Workspace, h.m.opts.Root+string(filepath.Separator)) {
			t.Fatalf("workspace %q outside the root", s.Workspace)
		}
	}
}

func TestSymlinkedWorkspaceIsRefused(t *testing.T) {
	h := newHarness(t, Options{})
	dir := filepath.Join(h.m.opts.Root, dirName("r"))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(dir, "workspace")); err != nil {
		t.Fatal(err)
	}
	acc := h.submit("r", "hi")
	if d := h.turnEnded("r", acc); d["outcome"] != OutcomeFailed || !strings.Contains(d["reason"].(string), "not a plain directory") {
		t.Fatalf("turn: %v", d)
	}
}

// A room's workspace and home locked (mode 000) by a process of another
// room that shares the server's uid are the room's own again at its next
// start, and its turn settles.
func TestLockedRoomFoldersAreRestored(t *testing.T) {
	h := newHarness(t, Options{})
	if d := h.turnEnded("r", h.submit("r", "hi")); d["outcome"] != OutcomeSettled {
		t.Fatalf("turn: %v", d)
	}
	if err := h.m.Release(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(h.m.opts.Root, dirName("r"))
	for _, d := range []string{filepath.Join(dir, "workspace"), filepath.Join(dir, "home")} {
		if err := os.Chmod(d, 0); err != nil {
			t.Fatal(err)
		}
	}
	if d := h.turnEnded("r", h.submit("r", "again")); d["outcome"] != OutcomeSettled {
		t.Fatalf("turn: %v", d)
	}
	for _, d := range []string{filepath.Join(dir, "workspace"), filepath.Join(dir, "home")} {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v %v", d, fi.Mode(), err)
		}
	}
}

func TestUnsafeFlagsNeedYolo(t *testing.T) {
	for _, cmd := range [][]string{{"omp", "--yolo"}, {"omp", "--approval-mode", "yolo"}, {"omp", "--auto-approve"}, {"omp", "--approval-mode=write"}} {
		_, err := New(Options{Store: SQLite(nil), Transport: newFakeTransport(), Root: t.TempDir(), Config: Config{Command: cmd}})
		if err == nil || !strings.Contains(err.Error(), "yolo") {
			t.Fatalf("%v: %v", cmd, err)
		}
		m, err := New(Options{Store: SQLite(nil), Transport: newFakeTransport(), Root: t.TempDir(), Config: Config{Command: cmd, ApprovalMode: ApprovalYolo}})
		if err != nil || m == nil {
			t.Fatalf("%v in yolo: %v", cmd, err)
		}
		m.cancel()
	}
}

// A host that died leaves running turns, queued messages and pending
// approvals in the store; the next Start ends the turns as failed, denies
// the approvals and runs the queue in order.
func TestStartRecoversWhatADeadHostLeft(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "agenthost.db")
	db, err := store.Open(t.Context(), path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	err = db.Write(t.Context(), func(w *store.Writer) error {
		for i, id := range []string{"m0", "m1", "m2"} {
			ev, err := w.Append("r", "message.accepted", map[string]string{"message_id": id})
			if err != nil {
				return err
			}
			status := store.MessageQueued
			if i == 0 {
				status = store.MessageStarted
			} else if i == 2 {
				status = store.MessageAccepted // accepted, not yet queued, as the host died
			}
			if err := w.PutMessage(store.Message{ID: id, Room: "r", Seq: ev.Seq, Text: "text " + id, Delivery: "queue", Status: status, Accepted: now}); err != nil {
				return err
			}
		}
		if err := w.PutTurn(store.Turn{ID: "t0", Room: "r", MessageID: "m0", Started: now}); err != nil {
			return err
		}
		return w.PutApproval(store.Approval{ID: "a0", Room: "r", TurnID: "t0", Tool: "bash", Options: []string{"Approve", "Deny"}, Created: now, Deadline: now.Add(time.Hour)})
	})
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeTransport()
	m, err := New(Options{Store: SQLite(db), Transport: f, Root: filepath.Join(dir, "rooms")})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, db: db, f: f, m: m}
	t.Cleanup(func() {
		_ = shut(m)
		_ = db.Close()
	})
	ended := h.waitEvent("r", 0, "turn.ended", func(d map[string]any) bool { return d["turn_id"] == "t0" })
	if field(ended, "outcome") != OutcomeFailed || field(ended, "reason") != "host restarted" {
		t.Fatalf("dead turn: %s", ended.Data)
	}
	res := h.waitEvent("r", 0, "approval.resolved", nil)
	if field(res, "decision") != "deny" || field(res, "by") != "restart" {
		t.Fatalf("approval: %s", res.Data)
	}
	d1 := h.turnEnded("r", Accepted{ID: "m1"})
	d2 := h.turnEnded("r", Accepted{ID: "m2"})
	if d1["text"] != "ok: text m1" || d2["text"] != "ok: text m2" {
		t.Fatalf("recovered turns: %v, %v", d1, d2)
	}
	msgs, _ := db.Messages(t.Context(), "r", 0, 0)
	if msgs[0].Outcome != OutcomeFailed || msgs[1].Outcome != OutcomeSettled || msgs[2].Outcome != OutcomeSettled {
		t.Fatalf("messages: %+v", msgs)
	}
	// The cut turn's message ends with it, right after its turn.ended.
	ends := checkMessageEnds(t, h.log("r"))
	if e := ends["m0"]; e["outcome"] != OutcomeFailed || e["turn_id"] != "t0" || e["reason"] != "host restarted" {
		t.Fatalf("m0 ended %v", e)
	}
}

func TestCloseCancelsTurnsReleasesAgentsAndKeepsTheQueue(t *testing.T) {
	dir := t.TempDir()
	db, err := store.Open(t.Context(), filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	f := newFakeTransport()
	m, err := New(Options{Store: SQLite(db), Transport: f, Root: filepath.Join(dir, "rooms")})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, db: db, f: f, m: m}
	h.turnEnded("idle", h.submit("idle", "hi"))
	hung := h.submit("busy", "hang")
	h.waitEvent("busy", hung.Seq, "turn.started", nil)
	waiting := h.submit("busy", "later")
	if err := shut(m); err != nil {
		t.Fatal(err)
	}
	if n := f.resident(); n != 0 {
		t.Fatalf("%d agents left after Close", n)
	}
	if d := h.turnEnded("busy", hung); d["outcome"] != OutcomeCancelled || d["reason"] != "host shutting down" {
		t.Fatalf("running turn: %v", d)
	}
	for _, room := range []string{"idle", "busy"} {
		h.waitEvent(room, 0, "agent.released", func(d map[string]any) bool { return d["reason"] != nil })
	}
	open, _ := db.OpenMessages(t.Context())
	if len(open) != 1 || open[0].ID != waiting.ID || open[0].Status != store.MessageQueued {
		t.Fatalf("open messages after Close: %+v", open)
	}
	if _, err := m.Submit(context.Background(), "idle", Message{Text: "x"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("submit after close: %v", err)
	}
}

// gateStore holds every write while its gate is shut.
type gateStore struct {
	Store
	gate chan struct{}
}

func (s gateStore) Write(ctx context.Context, fn func(tx Tx) error) error {
	select {
	case <-s.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Store.Write(ctx, fn)
}

// Handler.Event never waits for the store: the agent's event stream must
// not go at the disk's pace. The events still land, in order.
func TestAgentEventsDoNotWaitForTheStore(t *testing.T) {
	dir := t.TempDir()
	db, err := store.Open(t.Context(), filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	gate := make(chan struct{})
	m, err := New(Options{Store: gateStore{SQLite(db), gate}, Transport: newFakeTransport(), Root: filepath.Join(dir, "rooms")})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer shut(m)
	r, err := m.room("r")
	if err != nil {
		t.Fatal(err)
	}
	h := &handler{m: m, r: r}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 1000 {
			h.Event(AgentEvent{Kind: KindText, Text: fmt.Sprintf("%d,", i)})
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		close(gate)
		t.Fatal("Handler.Event waited for the store")
	}
	close(gate)
	r.events.flush()
	evs, err := db.Events(t.Context(), "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	for _, ev := range evs {
		all.WriteString(field(ev, "text"))
	}
	var want strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&want, "%d,", i)
	}
	if all.String() != want.String() {
		t.Fatalf("recorded text %.80q…, want %.80q…", all.String(), want.String())
	}
}

func TestWorkspacesApartFromHomes(t *testing.T) {
	dir := t.TempDir()
	db, err := store.Open(t.Context(), filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	f := newFakeTransport()
	m, err := New(Options{Store: SQLite(db), Transport: f, Root: filepath.Join(dir, "homes"), Workspaces: filepath.Join(dir, "ws")})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer shut(m)
	h := &harness{t: t, db: db, f: f, m: m}
	h.turnEnded("r", h.submit("r", "hi"))
	s := f.starts[0]
	if filepath.Dir(s.Workspace) != filepath.Join(dir, "ws") || !strings.HasPrefix(s.Home, filepath.Join(dir, "homes")+string(filepath.Separator)) {
		t.Fatalf("workspace %s, home %s", s.Workspace, s.Home)
	}
}

// A turn's usage, as its agent reported it, is on its turn.ended, settled
// or not, and the room's totals count it, by sender too.
func TestTurnUsageIsRecordedWhateverTheOutcome(t *testing.T) {
	h := newHarness(t, Options{})
	usageOf := func(d map[string]any) record.Usage {
		t.Helper()
		b, _ := json.Marshal(d["usage"])
		var u record.Usage
		if err := json.Unmarshal(b, &u); err != nil {
			t.Fatal(err)
		}
		return u
	}
	acc := h.submit("r", "spend")
	if d := h.turnEnded("r", acc); d["outcome"] != OutcomeSettled || usageOf(d) != spendUsage {
		t.Fatalf("settled turn: %v", d)
	}
	acc = h.submit("r", "spend-fail")
	if d := h.turnEnded("r", acc); d["outcome"] != OutcomeFailed || usageOf(d) != spendFailUsage {
		t.Fatalf("failed turn: %v", d)
	}
	acc = h.submit("r", "hello")
	if d := h.turnEnded("r", acc); d["outcome"] != OutcomeSettled || !usageOf(d).IsZero() {
		t.Fatalf("a turn without usage: %v", d)
	}
	st, err := h.m.State(t.Context(), "r")
	if err != nil {
		t.Fatal(err)
	}
	total := spendUsage.Add(spendFailUsage)
	if st.Turns != 3 || st.Usage != total || st.UsageBySender["ann"] != (record.SenderUsage{Turns: 3, Usage: total}) {
		t.Fatalf("state: %d turns, %+v, %+v", st.Turns, st.Usage, st.UsageBySender)
	}
}
