//go:build linux

package roomclaims

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/roomtest"
	"github.com/agenthost/agenthost/record"
	"github.com/agenthost/agenthost/room"
)

// The claims. Each runs on the path's host as the path's rooms are left by the claims before it
// (their order is the table's).

func claimReply(r *pathRun) {
	acc := r.submit(roomMain, "[[say:hello from the room]]")
	if got := r.answerText(r.settled(roomMain, acc)); got != "hello from the room" {
		r.t.Fatalf("turn text %q, want %q", got, "hello from the room")
	}
}

func claimStreaming(r *pathRun) {
	acc := r.submit(roomMain, "[[say:streamed in pieces]]")
	end, d := r.ended(roomMain, acc)
	if d["outcome"] != room.OutcomeSettled {
		r.t.Fatalf("turn ended %v", d)
	}
	evs, err := r.h.db.Events(r.t.Context(), roomMain, acc.Seq, int(end.Seq-acc.Seq))
	if err != nil {
		r.t.Fatal(err)
	}
	var deltas []string
	for _, ev := range evs {
		if ev.Type == room.KindText && ev.Seq < end.Seq {
			var x struct{ Text string }
			_ = json.Unmarshal(ev.Data, &x)
			deltas = append(deltas, x.Text)
		}
	}
	if len(deltas) == 0 {
		r.t.Fatal("no text.delta before turn.ended: the answer was not streamed")
	}
	if got, want := strings.Join(deltas, ""), d["text"]; got != want {
		r.t.Fatalf("the deltas make %q, the turn's text is %q", got, want)
	}
}

// roomTool is the name the path's agent calls the room's tool by.
func (r *pathRun) roomTool(name string) string {
	if r.p.transport == "rpc" {
		return name
	}
	return r.p.mcpName(room.ReservedName, name)
}

func claimRoomTools(r *pathRun) {
	acc := r.submit(roomMain, `[[tool:`+r.roomTool("room_post")+` {"text":"hello people"}]]`)
	r.settled(roomMain, acc)
	_, post := r.wait(roomMain, acc.Seq, "room.post", nil)
	if post["text"] != "hello people" {
		r.t.Fatalf("room.post: %v", post)
	}
	acc = r.submit(roomMain, `[[tool:`+r.roomTool("room_info")+` {}]]`)
	r.settled(roomMain, acc)
	if !r.modelSaw("tool", `"room":"main"`) {
		r.t.Fatal("room_info's result never reached the model")
	}
}

// claimRoomToolsAsked: under always-ask a room tool's call waits for a person, once, and the
// approval shows its arguments; denied, the tool does nothing and the turn settles; allowed, it runs.
func claimRoomToolsAsked(r *pathRun) {
	r.askPerson.Store(true)
	defer r.askPerson.Store(false)
	for _, allow := range []bool{false, true} {
		text := fmt.Sprintf("post-%v-%s", allow, r.p.kind)
		acc := r.submit(roomMain, `[[tool:`+r.roomTool("room_post")+` {"text":"`+text+`"}]]`)
		ev, req := r.wait(roomMain, acc.Seq, "approval.requested", nil)
		if in, _ := req["input"].(string); !strings.Contains(in, text) || !strings.HasSuffix(req["tool"].(string), "room_post") {
			r.t.Fatalf("approval.requested does not show the call: %v", req)
		}
		if err := r.h.m.Approve(r.t.Context(), roomMain, req["approval_id"].(string), allow); err != nil {
			r.t.Fatal(err)
		}
		r.wait(roomMain, ev.Seq, "approval.resolved", nil)
		r.settled(roomMain, acc)
		if n := len(r.events(roomMain, acc.Seq, "approval.requested")); n != 1 {
			r.t.Fatalf("%d approvals for one call of room_post", n)
		}
		posted := 0
		for _, p := range r.events(roomMain, acc.Seq, "room.post") {
			if p["text"] == text {
				posted++
			}
		}
		if want := map[bool]int{false: 0, true: 1}[allow]; posted != want {
			r.t.Fatalf("allowed %v: %d room.post events, want %d", allow, posted, want)
		}
	}
}

// approval runs a shell command that creates name in the approvals room's workspace, lets decide
// settle the approval, and reports whether the command ran and who resolved it.
func approval(r *pathRun, name string, decide func(id string)) (ran bool, by string) {
	r.askPerson.Store(true)
	defer r.askPerson.Store(false)
	acc := r.submit(roomMain, "Run it: "+r.p.shell("touch "+name))
	ev, req := r.wait(roomMain, acc.Seq, "approval.requested", nil)
	if in, _ := req["input"].(string); !strings.Contains(in, "touch "+name) {
		r.t.Fatalf("approval.requested does not show the command: %v", req)
	}
	if decide != nil {
		decide(req["approval_id"].(string))
	}
	_, res := r.wait(roomMain, ev.Seq, "approval.resolved", nil)
	r.settled(roomMain, acc)
	_, err := os.Stat(filepath.Join(r.workspace(roomMain), name))
	by, _ = res["by"].(string)
	return err == nil, by
}

func claimAllow(r *pathRun) {
	ran, by := approval(r, "allowed.txt", func(id string) {
		if err := r.h.m.Approve(r.t.Context(), roomMain, id, true); err != nil {
			r.t.Fatal(err)
		}
	})
	if !ran || by != "person" {
		r.t.Fatalf("allowed by %q; the command ran: %v", by, ran)
	}
}

func claimDeny(r *pathRun) {
	ran, by := approval(r, "denied.txt", func(id string) {
		if err := r.h.m.Approve(r.t.Context(), roomMain, id, false); err != nil {
			r.t.Fatal(err)
		}
	})
	if ran || by != "person" {
		r.t.Fatalf("denied by %q; the command ran: %v", by, ran)
	}
}

func claimDeadline(r *pathRun) {
	ran, by := approval(r, "expired.txt", nil)
	if ran || by != "deadline" {
		r.t.Fatalf("resolved by %q (want deadline); the command ran: %v", by, ran)
	}
}

func claimWorkspace(r *pathRun) {
	acc := r.submit(roomMain, "Where? "+r.p.shell("pwd > where.txt"))
	r.settled(roomMain, acc)
	ws := r.workspace(roomMain)
	got, err := os.ReadFile(filepath.Join(ws, "where.txt"))
	if err != nil {
		r.t.Fatalf("the tool's relative write did not land in the workspace: %v", err)
	}
	if strings.TrimSpace(string(got)) != ws {
		r.t.Fatalf("the tool ran in %q, the room's workspace is %q", strings.TrimSpace(string(got)), ws)
	}
	// Nothing of the agent's home (configuration, sessions) lands in the workspace: it holds what
	// the claims' tools wrote and the planted MCP files only.
	want := map[string]bool{"where.txt": true, "allowed.txt": true}
	for _, n := range plantedMCP {
		want[n] = true
	}
	ents, _ := os.ReadDir(ws)
	for _, e := range ents {
		if !want[e.Name()] {
			r.t.Errorf("the workspace holds %q, which no claim wrote", e.Name())
		}
	}
}

// roomOther is a room whose workspace holds a file the main room's agent must not read.
const roomOther = "other"

func claimConfinement(r *pathRun) {
	other := r.workspaceOf(roomOther)
	if err := os.MkdirAll(other, 0o700); err != nil {
		r.t.Fatal(err)
	}
	secret := filepath.Join(other, "secret.txt")
	if err := os.WriteFile(secret, []byte("the other room's secret"), 0o600); err != nil {
		r.t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		r.t.Fatal(err)
	}
	defer ln.Close()
	ws := r.workspace(roomMain)
	probe := roomtest.Probe{Other: secret, Store: filepath.Join(r.dir, "agenthost.db"), PID: os.Getpid(),
		Port: ln.Addr().(*net.TCPAddr).Port}
	probe.WriteProbe(r.t, ws)
	defer roomtest.RemoveProbe(ws)
	acc := r.submit(roomMain, "Probe: "+r.p.shell("bash "+roomtest.ProbeScript))
	r.settled(roomMain, acc)
	roomtest.CheckConfined(r.t, roomtest.ProbeResults(r.sim), true)
	// The room says how its agent is confined.
	st, err := r.h.m.State(r.t.Context(), roomMain)
	if err != nil {
		r.t.Fatal(err)
	}
	if c := st.Confinement; c == nil || c.Mode != "landlock" || c.ABI != min(confine.KernelABI(), confine.MaxABI) ||
		c.Signals != (c.ABI >= 6) || c.Net == nil {
		r.t.Fatalf("the room's confinement: %+v", st.Confinement)
	}
}

func claimMCP(r *pathRun) {
	acc := r.submit(roomMain, `[[tool:`+r.p.mcpName("probe", "echo_upper")+` {"text":"hi"}]]`)
	r.settled(roomMain, acc)
	if _, err := os.Stat(r.mcp); err != nil {
		var tools []string
		if reqs := r.sim.Requests(); len(reqs) > 0 {
			tools = reqs[len(reqs)-1].Tools
		}
		r.t.Fatalf("the room's MCP server never started (%v); the model was offered %v", err, tools)
	}
	if !r.modelSaw("tool", "probe:HI") {
		var tools []string
		if reqs := r.sim.Requests(); len(reqs) > 0 {
			tools = reqs[len(reqs)-1].Tools
		}
		r.t.Fatalf("the MCP tool's result never reached the model; the model was offered %v", tools)
	}
	// The workspace's own MCP files were there before the agent started.
	if _, err := os.Stat(r.injected()); err == nil {
		r.t.Fatal("the agent started an MCP server from the workspace's own configuration")
	}
}

func claimMultiTurn(r *pathRun) {
	a1 := r.submit(roomMain, "remember the word pelican")
	r.settled(roomMain, a1)
	a2 := r.submit(roomMain, "which word?")
	if got := r.answerText(r.settled(roomMain, a2)); got != "ok: which word?" {
		r.t.Fatalf("second turn %q", got)
	}
	if !r.modelSawTogether("which word?", "pelican") {
		r.t.Fatal("no model request of the second turn carries the first turn")
	}
}

// usageCost says how each agent prices a turn: at the price agenthost
// registers for the built-in model, at its own, or not at all.
var usageCost = map[agents.Kind]string{agents.OMP: "registered", agents.Pi: "registered", agents.Claude: "own", agents.Codex: "none", agents.Copilot: "none"}

func claimUsage(r *pathRun) {
	next := len(r.sim.Requests())
	acc := r.submit(roomMain, "how much was that?")
	_, d := r.ended(roomMain, acc)
	if d["outcome"] != room.OutcomeSettled {
		r.t.Fatalf("turn ended %v", d)
	}
	// The agent's own requests (those offering tools: claude's title
	// requests offer none) at the built-in model's registered price.
	var m modelsim.Usage
	for _, q := range r.sim.Requests()[next:] {
		if len(q.Tools) > 0 {
			m = m.Add(q.Usage)
		}
	}
	if m.Output == 0 {
		r.t.Fatal("the turn made no model request")
	}
	want := record.Usage{InputTokens: int64(m.Input), OutputTokens: int64(m.Output), CacheReadTokens: int64(m.CacheRead),
		CacheWriteTokens: int64(m.CacheWrite), CostUSD: agents.Cost(int64(m.Input), int64(m.Output), int64(m.CacheRead), int64(m.CacheWrite))}
	b, _ := json.Marshal(d["usage"])
	var got record.Usage
	if err := json.Unmarshal(b, &got); err != nil {
		r.t.Fatalf("turn.ended usage %s: %v", b, err)
	}
	cost := got.CostUSD
	got.CostUSD = 0
	if tokens := (record.Usage{InputTokens: want.InputTokens, OutputTokens: want.OutputTokens, CacheReadTokens: want.CacheReadTokens,
		CacheWriteTokens: want.CacheWriteTokens}); got != tokens {
		r.t.Fatalf("tokens %+v, the model's %+v", got, tokens)
	}
	switch usageCost[r.p.kind] {
	case "registered":
		if math.Abs(cost-want.CostUSD) > 1e-9 || cost <= 0 {
			r.t.Fatalf("cost %v, want %v", cost, want.CostUSD)
		}
	case "own":
		if cost <= 0 {
			r.t.Fatalf("cost %v, want above zero", cost)
		}
	default:
		if cost != 0 {
			r.t.Fatalf("cost %v from an agent that reports none", cost)
		}
	}
	r.t.Logf("usage %+v, cost %v", got, cost)
}

func claimCancel(r *pathRun) {
	acc := r.submit(roomMain, "[[slow:60s]]a long answer")
	r.wait(roomMain, acc.Seq, "turn.started", nil)
	// The model's request log is the only sign the agent is answering.
	for deadline := time.Now().Add(waitTimeout); !r.modelSaw("user", "a long answer"); {
		if time.Now().After(deadline) {
			r.t.Fatal("the slow turn never reached the model")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t0 := time.Now()
	if err := r.h.m.Cancel(r.t.Context(), roomMain); err != nil {
		r.t.Fatal(err)
	}
	if _, d := r.ended(roomMain, acc); d["outcome"] != room.OutcomeCancelled {
		r.t.Fatalf("turn ended %v", d)
	}
	r.t.Logf("cancel → turn.ended %v", time.Since(t0).Round(time.Millisecond))
	next := r.submit(roomMain, "after the cancel")
	if got := r.answerText(r.settled(roomMain, next)); got != "ok: after the cancel" {
		r.t.Fatalf("next turn %q", got)
	}
}

// bgCmd starts a process that outlives its command, detached from the tool's output.
const bgCmd = "sh -c 'tail -f /dev/null >/dev/null 2>&1 & echo pid=$!'"

func claimBackground(r *pathRun) {
	acc := r.submit(roomMain, "Start it: "+r.p.shell(bgCmd))
	r.settled(roomMain, acc)
	var pid int
	for _, q := range r.sim.Requests() {
		for _, m := range q.Messages {
			if m.Role == "tool" {
				if sm := pidRE.FindStringSubmatch(m.Content); sm != nil {
					pid, _ = strconv.Atoi(sm[1])
				}
			}
		}
	}
	if pid == 0 {
		if os.Getenv("ROOMCLAIMS_DEBUG") != "" {
			reqs := r.sim.Requests()
			for _, m := range reqs[len(reqs)-1].Messages {
				r.t.Logf("%s: %.300q", m.Role, m.Content)
			}
		}
		r.t.Fatal("the tool's result never told the model the background pid")
	}
	var bg *markerProc
	for _, p := range markerProcs() {
		if p.pid == pid {
			bg = &p
		}
	}
	if bg == nil {
		r.t.Fatalf("the background process %d is not running in custody after the turn settled", pid)
	}
	if !strings.Contains(bg.cmd, "tail -f /dev/null") {
		r.t.Fatalf("pid %d is %q", pid, bg.cmd)
	}
	r.bgPid = pid
}

func claimQuestions(r *pathRun) {
	acc := r.submit(roomMain, r.p.ask)
	_, q := r.wait(roomMain, acc.Seq, "question.asked", nil)
	// The title is the question; an agent may add its header on a line of its own (claude).
	if title, _ := q["title"].(string); strings.Split(title, "\n")[0] != "Which color?" {
		r.t.Fatalf("question: %q", q)
	}
	if err := r.h.m.Answer(r.t.Context(), roomMain, q["question_id"].(string), "blue"); err != nil {
		r.t.Fatal(err)
	}
	r.settled(roomMain, acc)
	if !r.modelSaw("tool", "blue") {
		r.t.Fatal("the answer never reached the model")
	}
}

func claimModel(r *pathRun) {
	acc := r.submit(roomModel, "which model?")
	r.settled(roomModel, acc)
	// The turn's request is the first to carry the message: an agent may
	// send it again later in a side request of its own on another model
	// (codex titles a thread on a small one, when its turn is over).
	var seen string
requests:
	for _, q := range r.sim.Requests() {
		for _, m := range q.Messages {
			if m.Role == "user" && strings.Contains(m.Content, "which model?") {
				seen = q.Model
				break requests
			}
		}
	}
	if seen != r.p.modelSeen {
		r.t.Fatalf("the model server saw model %q, want %q", seen, r.p.modelSeen)
	}
	bad := r.submit(roomBad, "unknown model")
	if _, d := r.ended(roomBad, bad); d["outcome"] != room.OutcomeFailed {
		r.t.Fatalf("a turn on an unknown model ended %v", d)
	}
	if r.modelSaw("user", "unknown model") {
		r.t.Fatal("a turn reached a model the room did not select")
	}
}

func claimCleanup(r *pathRun) {
	scope := r.scopeOf(roomMain)
	var tree []markerProc
	for _, p := range markerProcs() {
		if p.scope == scope {
			tree = append(tree, p)
		}
	}
	if err := r.h.m.Release(r.t.Context(), roomMain); err != nil {
		r.t.Fatal(err)
	}
	_, rel := r.wait(roomMain, 0, "agent.released", func(d map[string]any) bool {
		rec, _ := json.Marshal(d["receipt"])
		return strings.Contains(string(rec), scope)
	})
	for _, p := range tree {
		if p.alive() {
			r.t.Errorf("after release, pid %d (%s) of the agent's tree still runs", p.pid, p.cmd)
		}
	}
	rec, _ := json.Marshal(rel["receipt"])
	if r.bgPid != 0 && !strings.Contains(string(rec), `"pid":`+strconv.Itoa(r.bgPid)+",") {
		r.t.Errorf("the receipt lacks the background process %d: %s", r.bgPid, rec)
	}
	r.t.Logf("released %d processes of scope %s", len(tree), scope)
}

func claimResume(r *pathRun) {
	st, err := r.h.m.State(r.t.Context(), roomMain)
	if err != nil || st.SessionID == "" {
		r.t.Fatalf("state %+v, %v", st, err)
	}
	r.h.close()
	r.h = r.startHost()
	acc := r.submit(roomMain, "what was the word?")
	_, started := r.wait(roomMain, acc.Seq, "agent.started", nil)
	if got := r.answerText(r.settled(roomMain, acc)); got != "ok: what was the word?" {
		r.t.Fatalf("turn after the restart %q", got)
	}
	if started["session_id"] != st.SessionID || started["resumed"] != true {
		r.t.Fatalf("agent.started %v, want session %s resumed", started, st.SessionID)
	}
	if len(r.events(roomMain, acc.Seq, "context.lost")) != 0 {
		r.t.Fatal("the session was lost (context.lost)")
	}
	if !r.modelSawTogether("what was the word?", "pelican") {
		r.t.Fatal("no model request of the resumed session carries the earlier turns")
	}
}
