package rpcagent

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/roomsqlite"
	"github.com/agenthost/agenthost/internal/roomtest"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// hostHelperEnv makes the test binary a room host (dir and model URL,
// separated by a space) that accepts three messages, says "ready" once the
// first one's bash tool runs, and waits to be killed. With a third field
// "pi" it hosts pi under always-ask instead, accepts one message and says
// "ready" once its bash call waits on an approval.
const hostHelperEnv = "RPCAGENT_TEST_HOST"

func hostHelper() int {
	fields := strings.Fields(os.Getenv(hostHelperEnv))
	dir, modelURL := fields[0], fields[1]
	pi := len(fields) > 2 && fields[2] == "pi"
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "host helper:", err)
		return 1
	}
	ctx := context.Background()
	in, err := agents.Find()
	if err != nil {
		return fail(err)
	}
	db, err := store.Open(ctx, filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		return fail(err)
	}
	cust, err := custody.New(custody.Options{})
	if err != nil {
		return fail(err)
	}
	tr, err := New(Options{Custodian: cust, Install: in, ModelURL: modelURL})
	if err != nil {
		return fail(err)
	}
	// The background sleep leaves omp's process group (setsid): omp ends
	// its shell's group itself when its host dies, and which of omp and
	// the test's look came first was the scheduler's choice. A process
	// that escaped the group is what only custody's marker finds.
	cfg, texts, ready := room.Config{ApprovalMode: room.ApprovalYolo},
		[]string{"Run it: " + roomtest.BashCall("setsid /bin/sleep 3600 & sleep 3600"), "queued one", "queued two"}, "tool.started"
	if pi {
		cfg, texts, ready = room.Config{Agent: "pi"}, []string{"Run it: " + roomtest.BashCall("echo ran > killed.txt")}, "approval.requested"
	}
	m, err := room.New(room.Options{Store: roomsqlite.New(db), Transport: tr, Root: filepath.Join(dir, "rooms"), Config: cfg})
	if err != nil {
		return fail(err)
	}
	if err := m.Start(ctx); err != nil {
		return fail(err)
	}
	watch, _ := db.Watch("r")
	for _, text := range texts {
		if _, err := m.Submit(ctx, "r", room.Message{Text: text}); err != nil {
			return fail(err)
		}
	}
	var after int64
	for range watch {
		evs, _ := db.Events(ctx, "r", after, 0)
		for _, ev := range evs {
			after = ev.Seq
			if ev.Type == ready {
				fmt.Println("ready")
			}
		}
	}
	return 0
}

// startHostHelper runs hostHelper (with the fields after dir and model
// URL) and returns once it said "ready".
func startHostHelper(t *testing.T, dir, modelURL string, extra ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), hostHelperEnv+"="+strings.Join(append([]string{dir, modelURL}, extra...), " "))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := false
		for sc.Scan() {
			if sc.Text() == "ready" && !ok {
				ok = true
				ready <- true
			}
		}
		if !ok {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			_ = cmd.Wait()
			t.Fatalf("host helper ended: %s", stderr.String())
		}
	case <-time.After(120 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("host helper never got ready: %s", stderr.String())
	}
	return cmd
}

// reapOrphansOf waits for what the killed host left (found by marker)
// until want says it is all there or 30 s pass, reaps it and returns it.
func reapOrphansOf(t *testing.T, host int, want func([]custody.Orphan) bool) []custody.Orphan {
	t.Helper()
	var left []custody.Orphan
	deadline := time.Now().Add(30 * time.Second)
	for {
		all, err := custody.FindOrphans()
		if err != nil {
			t.Fatal(err)
		}
		left = left[:0]
		for _, o := range all {
			if o.Host == host {
				left = append(left, o)
			}
		}
		if want(left) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // the agent may still be exiting; no event to wait on
	}
	if alive, err := custody.KillOrphans(t.Context(), left, time.Second); err != nil {
		t.Fatalf("reaping the orphans: %v (alive %v)", err, alive)
	}
	return left
}

// A host killed with SIGKILL mid-turn, then restarted on the same data:
// the queued messages run in order, the running turn ends failed ("host
// restarted"), and the processes the dead host left are found by their
// marker and reaped.
func TestRealHostKilledAndRestarted(t *testing.T) {
	dir := t.TempDir()
	sim := roomtest.StartSim(t)
	cmd := startHostHelper(t, dir, sim.URL())
	// The background sleep runs (tool.started comes before the command).
	for deadline := time.Now().Add(60 * time.Second); !sleepRuns(cmd.Process.Pid); {
		if time.Now().After(deadline) {
			t.Fatal("the background /bin/sleep never started")
		}
		time.Sleep(20 * time.Millisecond) // no event for another process's start
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	// What the dead host left: found by marker, reaped.
	left := reapOrphansOf(t, cmd.Process.Pid, func(left []custody.Orphan) bool {
		return slices.ContainsFunc(left, func(o custody.Orphan) bool { return strings.Contains(o.Cmdline, "sleep 3600") })
	})
	sleeps := 0
	for _, o := range left {
		if strings.Contains(o.Cmdline, "sleep 3600") {
			sleeps++
		}
	}
	if sleeps == 0 {
		t.Fatalf("the dead host's background sleep is not among its orphans: %+v", left)
	}

	h := startHost(t, dir, sim, room.Options{Config: room.Config{ApprovalMode: room.ApprovalYolo}})
	evs, err := h.DB.Events(t.Context(), "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var accepted []string
	for _, ev := range evs {
		if ev.Type == "message.accepted" {
			accepted = append(accepted, roomtest.Field(ev.Data, "message_id"))
		}
	}
	if len(accepted) != 3 {
		t.Fatalf("%d messages accepted before the kill", len(accepted))
	}
	if d := h.Ended("r", room.Accepted{ID: accepted[0]}); d["outcome"] != room.OutcomeFailed || d["reason"] != "host restarted" {
		t.Fatalf("the running turn: %v", d)
	}
	// The first answer may open with the room's transcript, when the agent
	// had not written its session file before the kill (context.lost).
	for i, id := range accepted[1:] {
		if got, want := h.Settled("r", room.Accepted{ID: id}), []string{"queued one", "queued two"}[i]; !strings.HasPrefix(got, "ok: ") || !strings.HasSuffix(got, want) {
			t.Fatalf("recovered turn %d: %q", i, got)
		}
	}
}

// A host killed with SIGKILL while pi's bash call waits on the room's
// approval: the command never runs, and the restarted host denies the
// approval (by restart) and fails the turn, as with omp.
func TestRealPiHostKilledDuringApproval(t *testing.T) {
	dir := t.TempDir()
	sim := roomtest.StartSim(t)
	cmd := startHostHelper(t, dir, sim.URL(), "pi")
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	reapOrphansOf(t, cmd.Process.Pid, func(left []custody.Orphan) bool { return len(left) == 0 })

	h := startHost(t, dir, sim, room.Options{Config: room.Config{Agent: "pi"}})
	var msg string
	for _, ev := range h.Events("r") {
		if ev.Type == "message.accepted" {
			msg = roomtest.Field(ev.Data, "message_id")
		}
	}
	if d := h.Ended("r", room.Accepted{ID: msg}); d["outcome"] != room.OutcomeFailed || d["reason"] != "host restarted" {
		t.Fatalf("the turn: %v", d)
	}
	_, res := h.Wait("r", 0, "approval.resolved", nil)
	if res["decision"] != "deny" || res["by"] != "restart" {
		t.Fatalf("the pending approval: %v", res)
	}
	ws, _ := filepath.Glob(filepath.Join(h.Root, "*", "workspace", "killed.txt"))
	if len(ws) != 0 {
		t.Fatalf("the command ran: %v", ws)
	}
}

// sleepRuns reports whether a "/bin/sleep 3600" of host's custody runs
// (other tests on the machine may run their own).
func sleepRuns(host int) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || string(cmd) != "/bin/sleep\x003600\x00" {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		for _, kv := range strings.Split(string(env), "\x00") {
			// <pid namespace>.<host pid>.<host start>.<scope>
			m, ok := strings.CutPrefix(kv, custody.MarkerEnv+"=")
			if parts := strings.Split(m, "."); ok && len(parts) == 4 && parts[1] == strconv.Itoa(host) {
				return true
			}
		}
	}
	return false
}
