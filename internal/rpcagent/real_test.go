package rpcagent

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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

// These tests host rooms on the real omp and pi, installed by `make
// setup`, on the scripted model. They fail (never skip) when the agents
// are missing.

func TestMain(m *testing.M) {
	// The launcher of the confined agents the tests start.
	confine.Launch()
	if os.Getenv(envDumpEnv) != "" {
		envDump()
	}
	if os.Getenv(hostHelperEnv) != "" {
		os.Exit(hostHelper())
	}
	if os.Getenv(mcpHelperEnv) != "" {
		os.Exit(mcpHelper())
	}
	if os.Getenv(benchAgentEnv) != "" {
		os.Exit(benchAgent())
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

func TestRealRoomsRunTurnsInOrderAndIndependently(t *testing.T) {
	h := startHost(t, "", nil, room.Options{})
	var accs []room.Accepted
	for i := range 5 {
		accs = append(accs, h.Submit("queue", fmt.Sprintf("message %d", i)))
	}
	other := h.Submit("other", "[[say:from the other room]]")
	if got := h.Settled("other", other); got != "from the other room" {
		t.Fatalf("other room: %q", got)
	}
	for i, acc := range accs {
		if got, want := h.Settled("queue", acc), fmt.Sprintf("ok: message %d", i); got != want {
			t.Fatalf("turn %d: %q, want %q", i, got, want)
		}
	}
	st, err := h.M.State(t.Context(), "queue")
	if err != nil || !st.Resident || st.SessionID == "" || st.Queued != 0 {
		t.Fatalf("state: %+v, %v", st, err)
	}
	h.CheckTurnEvents("queue")
}

func TestRealApprovalsAllowDenyExpire(t *testing.T) {
	h := startHost(t, "", nil, room.Options{Config: room.Config{ApprovalTimeout: 2 * time.Second}})
	for _, tc := range []struct {
		decide func(id string)
		output string
		by     string
	}{
		{func(id string) { _ = h.M.Approve(t.Context(), "r", id, true) }, "approved-run", "person"},
		{func(id string) { _ = h.M.Approve(t.Context(), "r", id, false) }, "denied by user", "person"},
		{nil, "denied by user", "deadline"},
	} {
		// The credential in the command must reach neither the input nor
		// the output in the room's log (see the end).
		acc := h.Submit("r", "Run it: "+roomtest.BashCall("echo approved-run 'Authorization: Bearer "+secretInCommand+"'"))
		ev, req := h.Wait("r", acc.Seq, "approval.requested", nil)
		if req["tool"] != "bash" || !strings.Contains(req["input"].(string), "echo approved-run") {
			t.Fatalf("approval: %v", req)
		}
		if tc.decide != nil {
			tc.decide(req["approval_id"].(string))
		}
		_, res := h.Wait("r", ev.Seq, "approval.resolved", nil)
		if res["by"] != tc.by {
			t.Fatalf("resolved: %v", res)
		}
		_, tool := h.Wait("r", ev.Seq, "tool.ended", nil)
		if !strings.Contains(strings.ToLower(tool["output"].(string)), tc.output) {
			t.Fatalf("tool output %q, want %q", tool["output"], tc.output)
		}
		if got := h.Settled("r", acc); got != "done" {
			t.Fatalf("turn text %q", got)
		}
	}
	h.CheckTurnEvents("r")
	for _, ev := range h.Events("r") {
		// The person's own message carries it; what the agent said may not.
		if ev.Type != "message.accepted" && strings.Contains(string(ev.Data), secretInCommand) {
			t.Fatalf("the credential reached the room's log: %s %s", ev.Type, ev.Data)
		}
	}
}

// secretInCommand is a credential a tool call carries.
const secretInCommand = "sk-live-0123456789abcdefXYZ"

func TestRealQuestionsByAPIAndByNextMessage(t *testing.T) {
	h := startHost(t, "", nil, room.Options{})
	ask := `[[tool:ask {"questions":[{"id":"c","question":"Which color?","options":[{"label":"red"},{"label":"blue"}]}]}]]`
	acc := h.Submit("r", ask)
	_, q := h.Wait("r", acc.Seq, "question.asked", nil)
	if q["title"] != "Which color?" {
		t.Fatalf("question: %v", q)
	}
	if err := h.M.Answer(t.Context(), "r", q["question_id"].(string), "blue"); err != nil {
		t.Fatal(err)
	}
	_, tool := h.Wait("r", acc.Seq, "tool.ended", nil)
	if !strings.Contains(tool["output"].(string), "blue") {
		t.Fatalf("ask result %q", tool["output"])
	}
	h.Settled("r", acc)

	acc = h.Submit("r", ask)
	ev, _ := h.Wait("r", acc.Seq, "question.asked", nil)
	h.Submit("r", "green-ish")
	_, ans := h.Wait("r", ev.Seq, "question.answered", nil)
	if ans["by"] != "message" {
		t.Fatalf("answered: %v", ans)
	}
	_, tool = h.Wait("r", ev.Seq, "tool.ended", nil)
	if !strings.Contains(tool["output"].(string), "green-ish") {
		t.Fatalf("ask result %q", tool["output"])
	}
	h.Settled("r", acc)
}

// A question nobody answers is cancelled for the room, and omp's turn
// goes on (a cancelled ask dialog would abort it).
func TestRealUnansweredQuestionLetsTheTurnGoOn(t *testing.T) {
	h := startHost(t, "", nil, room.Options{Config: room.Config{QuestionTimeout: 2 * time.Second}})
	acc := h.Submit("r", `[[tool:ask {"questions":[{"id":"c","question":"Anyone?","options":[{"label":"yes"},{"label":"no"}]}]}]]`)
	ev, _ := h.Wait("r", acc.Seq, "question.asked", nil)
	_, ans := h.Wait("r", ev.Seq, "question.answered", nil)
	if ans["by"] != "deadline" || ans["cancelled"] != true {
		t.Fatalf("answered: %v", ans)
	}
	if got := h.Settled("r", acc); got != "done" {
		t.Fatalf("turn text %q", got)
	}
}

func TestRealSteerAndFollowUp(t *testing.T) {
	h := startHost(t, "", nil, room.Options{})
	acc := h.Submit("r", "[[slow:2s]]take your time")
	// Steer once the model is answering the prompt (the model's request
	// log is the only sign of that).
	for deadline := time.Now().Add(60 * time.Second); !h.ModelSaw("take your time"); {
		if time.Now().After(deadline) {
			t.Fatal("the prompt never reached the model")
		}
		time.Sleep(20 * time.Millisecond)
	}
	steer := h.SubmitAs("r", "steer marker-S", room.DeliverSteer)
	fu := h.SubmitAs("r", "follow marker-F", room.DeliverFollowUp)
	h.Wait("r", steer.Seq, "message.delivered", nil)
	h.Wait("r", fu.Seq, "message.delivered", nil)
	h.Settled("r", acc)
	for _, marker := range []string{"marker-S", "marker-F"} {
		if !h.ModelSaw(marker) {
			t.Fatalf("the model never saw %s", marker)
		}
	}
	msgs, _ := h.DB.Messages(t.Context(), "r", 0, 0)
	for _, m := range msgs {
		if m.Status != store.MessageEnded || m.Outcome != room.OutcomeSettled {
			t.Fatalf("message %+v", m)
		}
	}
}

// agentPid finds the room agent whose session dir lies under root.
func agentPid(t *testing.T, root string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmd), "--session-dir\x00"+root) {
			return pid
		}
	}
	t.Fatalf("no agent under %s", root)
	return 0
}

func TestRealKilledAgentFailsTheTurnAndTheNextResumes(t *testing.T) {
	h := startHost(t, "", nil, room.Options{Config: room.Config{ApprovalMode: room.ApprovalYolo}})
	first := h.Submit("r", "remember marker-A")
	h.Settled("r", first)
	st, _ := h.M.State(t.Context(), "r")
	sess := st.SessionID

	acc := h.Submit("r", "Run it: "+roomtest.BashCall("sleep 60"))
	h.Wait("r", acc.Seq, "tool.started", nil)
	if err := syscall.Kill(agentPid(t, h.Root), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if d := h.Ended("r", acc); d["outcome"] != room.OutcomeFailed {
		t.Fatalf("killed turn: %v", d)
	}
	_, rel := h.Wait("r", acc.Seq, "agent.released", nil)
	if rel["receipt"] == nil {
		t.Fatalf("release without a receipt: %v", rel)
	}

	next := h.Submit("r", "what did I ask you to remember?")
	_, started := h.Wait("r", next.Seq, "agent.started", nil)
	if started["session_id"] != sess || started["resumed"] != true {
		t.Fatalf("restart: %v (session was %s)", started, sess)
	}
	h.Settled("r", next)
	// The resumed session carried the earlier turn to the model.
	reqs := h.Sim.Requests()
	last := reqs[len(reqs)-1]
	seen := false
	for _, m := range last.Messages {
		seen = seen || strings.Contains(m.Content, "marker-A")
	}
	if !seen {
		t.Fatalf("the resumed turn's request lacks the earlier context: %+v", last.Messages)
	}
}

func TestRealLostSessionStartsFreshWithTheTranscript(t *testing.T) {
	h := startHost(t, "", nil, room.Options{})
	first := h.Submit("r", "remember marker-T")
	h.Settled("r", first)
	if err := h.M.Release(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	h.Wait("r", first.Seq, "agent.released", nil)
	// The agent's session files are gone (a wiped disk, a moved host).
	files, _ := filepath.Glob(filepath.Join(h.Root, "*", "home", "sessions", "*.jsonl"))
	if len(files) == 0 {
		t.Fatal("no session file to lose")
	}
	for _, f := range files {
		_ = os.Remove(f)
	}
	next := h.Submit("r", "and now?")
	_, lost := h.Wait("r", next.Seq, "context.lost", nil)
	if lost["previous_session_id"] == "" {
		t.Fatalf("context.lost: %v", lost)
	}
	h.Settled("r", next)
	reqs := h.Sim.Requests()
	last := reqs[len(reqs)-1]
	var user string
	for _, m := range last.Messages {
		if m.Role == "user" {
			user = m.Content
		}
	}
	if !strings.Contains(user, "remember marker-T") || !strings.Contains(user, "and now?") {
		t.Fatalf("the fresh session's prompt lacks the transcript: %q", user)
	}
}

func TestRealIdleReleaseWakeAndEviction(t *testing.T) {
	h := startHost(t, "", nil, room.Options{IdleAfter: 2 * time.Second, MaxResident: 1})
	a := h.Submit("a", "remember marker-I")
	h.Settled("a", a)
	_, rel := h.Wait("a", a.Seq, "agent.released", nil)
	if rel["reason"] != "idle" {
		t.Fatalf("release: %v", rel)
	}
	wake := h.Submit("a", "wake up")
	_, started := h.Wait("a", wake.Seq, "agent.started", nil)
	if started["resumed"] != true {
		t.Fatalf("wake: %v", started)
	}
	h.Settled("a", wake)
	if !h.ModelSaw("marker-I") {
		t.Fatal("lost context across idle release")
	}
	// One slot: room b evicts the idle room a.
	b := h.Submit("b", "hello")
	h.Settled("b", b)
	_, ev := h.Wait("a", wake.Seq, "agent.released", nil)
	if !strings.Contains(ev["reason"].(string), "evicted") {
		t.Fatalf("eviction: %v", ev)
	}
}

// markerProcs lists live processes whose custody marker names this host.
func markerProcs(t *testing.T) []int {
	t.Helper()
	self := strconv.Itoa(os.Getpid())
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 && len(stat) > i+2 && stat[i+2] == 'Z' {
			continue
		}
		for _, kv := range strings.Split(string(env), "\x00") {
			// <pid namespace>.<host pid>.<host start>.<scope>
			if m, ok := strings.CutPrefix(kv, custody.MarkerEnv+"="); ok {
				if parts := strings.Split(m, "."); len(parts) == 4 && parts[1] == self {
					out = append(out, pid)
				}
			}
		}
	}
	return out
}

func TestRealShutdownLeavesNothingBehind(t *testing.T) {
	h := startHost(t, "", nil, room.Options{Config: room.Config{ApprovalMode: room.ApprovalYolo}})
	// Both rooms first, then their ends: the two agents start side by
	// side (an agent's start is most of a turn's time).
	accs := map[string]room.Accepted{}
	for _, r := range []string{"a", "b"} {
		accs[r] = h.Submit(r, "Run it: "+roomtest.BashCall("/bin/sleep 300 & echo started"))
	}
	for _, r := range []string{"a", "b"} {
		h.Settled(r, accs[r])
	}
	busy := h.Submit("a", "[[slow:30s]]long answer")
	h.Wait("a", busy.Seq, "turn.started", nil)
	// The background sleeps alive now, by custody scope: each must be on
	// its scope's receipt. (omp has been seen to end one itself under
	// load; then custody records it as exited, maybe unnamed.)
	var sleeps map[string]bool
	for deadline := time.Now().Add(30 * time.Second); ; {
		if sleeps = sleepScopes(t); len(sleeps) == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // no event says a background process runs
	}
	if len(sleeps) == 0 {
		t.Fatal("no background sleep ran before the shutdown")
	}
	h.Close()
	if left := markerProcs(t); len(left) > 0 {
		t.Fatalf("processes left after shutdown: %v", left)
	}
	db, err := store.Open(t.Context(), filepath.Join(filepath.Dir(h.Root), "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, r := range []string{"a", "b"} {
		rs, err := db.Receipts(t.Context(), r)
		if err != nil || len(rs) == 0 {
			t.Fatalf("room %s: receipts %v, %v", r, rs, err)
		}
		var rec struct{ Scope string }
		_ = json.Unmarshal(rs[len(rs)-1].Receipt, &rec)
		if sleeps[rec.Scope] && !strings.Contains(string(rs[len(rs)-1].Receipt), "/bin/sleep 300") {
			t.Fatalf("room %s's receipt lacks its background sleep: %s", r, rs[len(rs)-1].Receipt)
		}
	}
	evs, _ := db.Events(t.Context(), "a", busy.Seq, 0)
	found := false
	for _, ev := range evs {
		found = found || ev.Type == "turn.ended" && strings.Contains(string(ev.Data), `"outcome":"cancelled"`)
	}
	if !found {
		t.Fatal("the running turn did not end cancelled at shutdown")
	}
}

func TestRealPiRoomResumesAcrossRelease(t *testing.T) {
	h := startHost(t, "", nil, room.Options{Config: room.Config{Agent: "pi"}})
	first := h.Submit("r", "remember marker-P")
	if got := h.Settled("r", first); got != "ok: remember marker-P" {
		t.Fatalf("pi: %q", got)
	}
	if err := h.M.Release(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	next := h.Submit("r", "again")
	_, started := h.Wait("r", next.Seq, "agent.started", nil)
	if started["resumed"] != true {
		t.Fatalf("pi resume: %v", started)
	}
	h.Settled("r", next)
	if !h.LastRequestHas("marker-P") {
		t.Fatal("pi's resumed session lacks the earlier turn")
	}
}

// pi appends onto a torn last line and then loses the history before it;
// the room repairs the tail (keeping the torn copy) before resuming.
func TestRealPiTornSessionTailIsRepaired(t *testing.T) {
	h := startHost(t, "", nil, room.Options{Config: room.Config{Agent: "pi"}})
	h.Settled("r", h.Submit("r", "remember marker-Q"))
	if err := h.M.Release(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(h.Root, "*", "home", "sessions", "*.jsonl"))
	if len(files) != 1 {
		t.Fatalf("session files: %v", files)
	}
	f, err := os.OpenFile(files[0], os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString(`{"type":"message","id":"torn","message":{"role":"user","content":[{"type":"te`)
	_ = f.Close()
	// Two resumes: pi's damage shows on the second.
	for i, text := range []string{"first resume", "second resume"} {
		acc := h.Submit("r", text)
		_, started := h.Wait("r", acc.Seq, "agent.started", nil)
		if started["resumed"] != true {
			t.Fatalf("resume %d: %v", i, started)
		}
		h.Settled("r", acc)
		if err := h.M.Release(t.Context(), "r"); err != nil {
			t.Fatal(err)
		}
		if !h.LastRequestHas("marker-Q") {
			t.Fatalf("resume %d lost the history before the torn line", i)
		}
	}
	if _, err := os.Stat(files[0] + ".torn"); err != nil {
		t.Fatalf("the torn copy was not kept: %v", err)
	}
}

// A model the agent does not run fails the turn and keeps the selection:
// the next turn fails the same way, never silently on another model.
func TestRealRefusedModelFailsTheTurnAndIsKept(t *testing.T) {
	h := startHost(t, "", nil, room.Options{Config: room.Config{Model: "fake/no-such-model"}})
	for range 2 {
		acc := h.Submit("r", "hello")
		d := h.Ended("r", acc)
		// omp refuses an unknown --model at start (exit 1, models.yml
		// named in its stderr); a model it accepts but does not run is
		// caught by the state check (ErrSelectionRefused).
		if d["outcome"] != room.OutcomeFailed || !strings.Contains(d["reason"].(string), "starting the agent") {
			t.Fatalf("turn: %v", d)
		}
	}
	if h.ModelSaw("hello") {
		t.Fatal("a turn reached a model the room did not select")
	}
}

// sleepScopes returns the custody scopes of this host's live
// "/bin/sleep 300" processes.
func sleepScopes(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, pid := range markerProcs(t) {
		dir := filepath.Join("/proc", strconv.Itoa(pid))
		cmd, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil || string(cmd) != "/bin/sleep\x00300\x00" {
			continue
		}
		env, _ := os.ReadFile(filepath.Join(dir, "environ"))
		for _, kv := range strings.Split(string(env), "\x00") {
			if m, ok := strings.CutPrefix(kv, custody.MarkerEnv+"="); ok {
				if parts := strings.Split(m, "."); len(parts) == 4 {
					out[parts[3]] = true
				}
			}
		}
	}
	return out
}
