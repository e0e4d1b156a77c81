//go:build linux

package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/client"
	"github.com/agenthost/agenthost/procd"
)

// daemonPID is the pid the data dir's daemon registered.
func daemonPID(t *testing.T, data string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(data, "procd", "service.json"))
	if err != nil {
		t.Fatal(err)
	}
	var svc struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(b, &svc); err != nil || svc.PID <= 0 {
		t.Fatalf("service.json %s: %v", b, err)
	}
	return svc.PID
}

// healthz is the status /healthz answers.
func healthz(t *testing.T, url string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"healthz", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// zombieChildren lists pid's children that are zombies.
func zombieChildren(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := statOf(n); ok && st.ppid == pid && st.state == 'Z' {
			out = append(out, n)
		}
	}
	return out
}

// noZombieChildren waits (bounded) until the server has no zombie
// children, and names those left when it fails.
func noZombieChildren(t *testing.T, s *daemonServer) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		zs := zombieChildren(s.cmd.Process.Pid)
		if len(zs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			var left []string
			for _, z := range zs {
				b, _ := os.ReadFile("/proc/" + strconv.Itoa(z) + "/stat")
				left = append(left, strings.TrimSpace(string(b)))
			}
			t.Fatalf("zombie children of the server left: %q; stderr:\n%s", left, s.errOut.String())
		}
		time.Sleep(50 * time.Millisecond) // polled, bounded
	}
}

// eventually polls cond (bounded) where no event tells.
func eventually(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond) // polled, bounded
	}
}

// turnsEnded follows room from the start until n turns ended, and
// returns their turn.ended data.
func turnsEnded(t *testing.T, s *daemonServer, room string, n int) []map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	var ends []map[string]any
	_, err := follow(ctx, s.url, s.token, room, func(ev sseEvent) bool {
		if ev.typ == "turn.ended" {
			ends = append(ends, ev.data)
		}
		return len(ends) == n
	})
	if err != nil {
		t.Fatalf("%v; stderr:\n%s", err, s.errOut.String())
	}
	return ends
}

// The process daemon killed under serve --daemon: the server notices,
// reaps what it left (no zombies), and starts a new one, saying unhealthy
// on /healthz until it runs (here while the test keeps new daemons from
// starting); the turn that was running ends failed with the reason, and
// the rooms go on: a message sent meanwhile, and a new room, are answered
// by new agents. (The server answered 200 for ever while every turn failed
// with "no daemon running", and kept the daemon and its agents as
// zombies.)
func TestServeDaemon_DaemonKilled(t *testing.T) {
	data := t.TempDir()
	block := filepath.Join(t.TempDir(), "block")
	s := startDaemonServerEnv(t, data, "127.0.0.1:0", []string{blockProcdEnv + "=" + block})
	s.post("r", "[[say:first]]")
	if end := turnsEnded(t, s, "r", 1)[0]; end["outcome"] != "settled" {
		t.Fatalf("first turn %v", end)
	}
	s.post("r", "[[slow:500ms]] [[say:a b c d e f g h i j k l]]")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if _, err := follow(ctx, s.url, s.token, "r", deltaOfTurn(2)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(block, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	old := daemonPID(t, data)
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	end := turnsEnded(t, s, "r", 2)[1]
	if end["outcome"] != "failed" || !strings.Contains(end["reason"].(string), "process daemon ended") {
		t.Fatalf("the turn running when the daemon died ended %v", end)
	}
	eventually(t, "/healthz to say unhealthy", 60*time.Second, func() bool { return healthz(t, s.url) == http.StatusServiceUnavailable })
	s.post("r", "[[say:after]]")
	if err := os.Remove(block); err != nil {
		t.Fatal(err)
	}
	ends := turnsEnded(t, s, "r", 3)
	if ends[2]["outcome"] != "settled" || ends[2]["text"] != "after" {
		t.Fatalf("the turn after the daemon died ended %v", ends[2])
	}
	s.post("r2", "[[say:new room]]")
	if end := turnsEnded(t, s, "r2", 1)[0]; end["outcome"] != "settled" || end["text"] != "new room" {
		t.Fatalf("a new room's turn ended %v", end)
	}
	if code := healthz(t, s.url); code != http.StatusOK {
		t.Fatalf("/healthz %d with a new daemon", code)
	}
	if pid := daemonPID(t, data); pid == old {
		t.Fatal("no new daemon registered")
	}
	noZombieChildren(t, s)
	s.stop(syscall.SIGTERM)
	checkNothingLeft(t, data, "r")
}

// findFile is the path of the first file named name under dir.
func findFile(dir, name string) string {
	var found string
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == name {
			found = path
			return filepath.SkipAll
		}
		return nil
	})
	return found
}

// A tool's background job of the room's agent, in a session of its own,
// when the process daemon dies: it is ended and collected, or, where it
// outlives the server's first reaping pass (a process custody's orphan
// search does not find, or one that exits on its own later, as omp does
// under load when its stdio closes), collected when it exits: no zombie is
// left under the server either way. (It stayed the server's zombie for
// good: the server looked for zombies once, right after the death, and
// custody's search missed agents on uids of their own. Now that it finds
// them, the job here is ended by the first pass wherever custody sees it;
// TestDaemonTree_CollectsOnlyWhatItInherited drives the late path.)
func TestServeDaemon_DaemonTreeExitsLate(t *testing.T) {
	data := t.TempDir()
	s := startDaemonServer(t, data, "127.0.0.1:0")
	s.post("r", "Run it: "+bashStep(t, "setsid sh -c 'echo $$ > late.pid; while [ ! -e release ]; do sleep 0.1; done' </dev/null >/dev/null 2>&1 & echo started"))
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	var end map[string]any
	_, err := follow(ctx, s.url, s.token, "r", func(ev sseEvent) bool {
		if ev.typ == "approval.requested" {
			id := ev.data["approval_id"].(string)
			if code, body := call(t, "POST", s.url+"v1/rooms/r/approvals/"+id, s.token, `{"decision":"allow"}`); code != 200 {
				t.Errorf("approve: %d %s", code, body)
			}
		}
		if ev.typ == "turn.ended" {
			end = ev.data
		}
		return end != nil
	})
	if err != nil || end["outcome"] != "settled" {
		t.Fatalf("the tool's turn ended %v: %v; stderr:\n%s", end, err, s.errOut.String())
	}
	var late int
	eventually(t, "the background job to write its pid", 60*time.Second, func() bool {
		if f := findFile(data, "late.pid"); f != "" {
			b, _ := os.ReadFile(f)
			late, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		return late > 0
	})
	release := filepath.Join(filepath.Dir(findFile(data, "late.pid")), "release")
	old := daemonPID(t, data)
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The server noticed (it says unhealthy from the death until a new
	// daemon runs), reaped, and runs a new daemon.
	eventually(t, "a new daemon, and /healthz 200", 120*time.Second, func() bool {
		pid := daemonPID(t, data)
		return pid != old && healthz(t, s.url) == http.StatusOK
	})
	if st, ok := statOf(late); ok && st.state != 'Z' {
		// It outlived the first pass: let it exit now, late.
		if err := os.WriteFile(release, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the late job to be collected", 30*time.Second, func() bool {
		_, ok := statOf(late)
		return !ok
	})
	noZombieChildren(t, s)
	// The room goes on with the new daemon (and its agent leaves a
	// receipt).
	s.post("r", "[[say:after]]")
	if ends := turnsEnded(t, s, "r", 2); ends[1]["outcome"] != "settled" || ends[1]["text"] != "after" {
		t.Fatalf("the turn after the daemon died ended %v", ends[1])
	}
	s.stop(syscall.SIGTERM)
	checkNothingLeft(t, data, "r")
}

// modelPID is the pid and URL of the built-in model running in the
// daemon.
func modelPID(t *testing.T, data string) (int, string) {
	t.Helper()
	var pid int
	var url string
	eventually(t, "the built-in model to serve", 60*time.Second, func() bool {
		pid, url = modelPIDOrZero(data)
		return pid != 0
	})
	return pid, url
}

// The built-in model killed under serve --daemon is started again on its
// address: the room's agent goes on (its turn settles, not at the turn
// timeout). A model dead at a planned restart is started again on its
// address by the next server, and the agent attached there goes on too.
// (Turns hung to the timeout, and a restart kept the agents pointed at
// the dead model's address.)
func TestServeDaemon_ModelKilled(t *testing.T) {
	data := t.TempDir()
	addr := freeAddr(t)
	// A turn that reaches no model ends at this timeout: well before the
	// test's own bounds.
	args := []string{"--turn-timeout", "90s"}
	s1 := startDaemonServer(t, data, addr, args...)
	s1.post("r", "[[say:one]]")
	if end := turnsEnded(t, s1, "r", 1)[0]; end["outcome"] != "settled" {
		t.Fatalf("first turn %v", end)
	}
	pid, url := modelPID(t, data)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the model to run again", 60*time.Second, func() bool {
		p, _ := modelPIDOrZero(data)
		return p != 0 && p != pid
	})
	if _, u := modelPID(t, data); u != url {
		t.Fatalf("the model serves at %s after its restart, not %s", u, url)
	}
	s1.post("r", "[[say:two]]")
	if end := turnsEnded(t, s1, "r", 2)[1]; end["outcome"] != "settled" || end["text"] != "two" {
		t.Fatalf("the turn after the model's restart ended %v", end)
	}
	s1.stop(syscall.SIGUSR2)
	pid, _ = modelPID(t, data)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the model's exit to be recorded", 30*time.Second, func() bool {
		p, _ := modelPIDOrZero(data)
		return p == 0
	})
	s2 := startDaemonServer(t, data, addr, args...)
	if _, u := modelPID(t, data); u != url {
		t.Fatalf("the next server's model serves at %s, not %s", u, url)
	}
	s2.post("r", "[[say:three]]")
	if end := turnsEnded(t, s2, "r", 3)[2]; end["outcome"] != "settled" || end["text"] != "three" {
		t.Fatalf("the attached agent's turn after the restart ended %v", end)
	}
	starts, attaches := countEvents(t, s2, "r")
	if starts != 1 || attaches != 1 {
		t.Fatalf("agent.started %d, agent.attached %d: the agent should have gone on", starts, attaches)
	}
	s2.stop(syscall.SIGTERM)
	checkNothingLeft(t, data, "r")
}

// modelPIDOrZero is modelPID, 0 when no model runs (or one starting has
// not said its address yet).
func modelPIDOrZero(data string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := procd.Dial(ctx, data)
	if err != nil {
		return 0, ""
	}
	defer c.Close()
	ps, err := c.List(ctx, procd.ModePipe)
	if err != nil {
		return 0, ""
	}
	for _, p := range ps {
		var m modelMeta
		if json.Unmarshal(p.Metadata, &m) == nil && m.Role == modelRole && p.Running && m.URL != "" {
			return p.PID, m.URL
		}
	}
	return 0, ""
}

// countEvents counts a room's agent.started and agent.attached events.
func countEvents(t *testing.T, s *daemonServer, room string) (starts, attaches int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	evs, err := followOnce(ctx, s, room)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		switch ev.typ {
		case "agent.started":
			starts++
		case "agent.attached":
			attaches++
		}
	}
	return starts, attaches
}

// followOnce reads a room's stored events (no follow).
func followOnce(ctx context.Context, s *daemonServer, room string) ([]sseEvent, error) {
	c, err := client.New(s.url, client.Options{Token: s.token})
	if err != nil {
		return nil, err
	}
	var evs []sseEvent
	for e, err := range c.Events(ctx, room, 0) {
		if err != nil {
			return evs, err
		}
		ev := sseEvent{id: e.Seq, typ: e.Type}
		_ = json.Unmarshal(e.Data, &ev.data)
		evs = append(evs, ev)
	}
	return evs, nil
}

// A planned restart onto other settings does not keep the agents started
// under the old ones: after a yolo server hands over to an always-ask one,
// the room's agent is not attached (agent.released says why) and a new
// one resumes its session; a tool call then asks for approval. (The
// attached yolo agent ran it unasked.)
func TestServeDaemon_RestartWithOtherSettings(t *testing.T) {
	data := t.TempDir()
	addr := freeAddr(t)
	s1 := startDaemonServer(t, data, addr, "--approval-mode", "yolo")
	s1.post("r", "[[say:one]]")
	if end := turnsEnded(t, s1, "r", 1)[0]; end["outcome"] != "settled" {
		t.Fatalf("first turn %v", end)
	}
	s1.stop(syscall.SIGUSR2)
	s2 := startDaemonServer(t, data, addr)
	marker := filepath.Join(t.TempDir(), "ran-without-approval")
	s2.post("r", `Run it: [[tool:bash {"command":"touch `+marker+`"}]]`)
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	var evs []sseEvent
	asked := false
	evs, err := follow(ctx, s2.url, s2.token, "r", func(ev sseEvent) bool {
		if ev.typ == "approval.requested" && !asked {
			asked = true
			if _, err := os.Stat(marker); err == nil {
				t.Error("the tool ran before its approval was asked")
			}
			id := ev.data["approval_id"].(string)
			if code, body := call(t, "POST", s2.url+"v1/rooms/r/approvals/"+id, s2.token, `{"decision":"deny"}`); code != 200 {
				t.Errorf("deny: %d %s", code, body)
			}
		}
		return ev.typ == "turn.ended" && asked
	})
	if err != nil {
		t.Fatalf("%v (asked %v); stderr:\n%s", err, asked, s2.errOut.String())
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the tool ran although its approval was denied")
	}
	var released string
	var starts []map[string]any
	for _, ev := range evs {
		switch ev.typ {
		case "agent.released":
			if r, _ := ev.data["reason"].(string); strings.HasPrefix(r, "not attached at restart") {
				released = r
			}
		case "agent.started":
			starts = append(starts, ev.data)
		}
	}
	if !strings.Contains(released, "other settings") {
		t.Fatalf("agent.released %q: the yolo agent must not be attached", released)
	}
	if len(starts) != 2 || starts[1]["resumed"] != true || starts[1]["session_id"] != starts[0]["session_id"] {
		t.Fatalf("agent.started %v: a new agent should resume the session", starts)
	}
	s2.stop(syscall.SIGTERM)
	checkNothingLeft(t, data, "r")
}
