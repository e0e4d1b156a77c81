//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/internal/roomtest"
	"github.com/agenthost/agenthost/room"
	"github.com/chromedp/chromedp"
	"golang.org/x/sys/unix"
)

// The rooms' limits, with omp on the built-in model: each test runs a
// server on this machine (root; cgroup v1 controllers on a hybrid host, or
// v2 ones) and checks what a room's tools meet, and that another room's
// turn at the same time goes on. Every workload is bounded: memory and
// processes stay small, loops end on their own.

// python is the interpreter the rooms' tools run (a system one: a confined
// agent reads and runs what the system has).
const python = "/usr/bin/python3"

// needRoomLimits skips where this machine cannot limit rooms by cgroups,
// saying why (the fallback has its own test).
func needRoomLimits(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(python); err != nil {
		t.Skipf("no %s for the rooms' workloads", python)
	}
	needCgroupLimits(t)
}

// lastCPU is the last CPU this test may run on.
func lastCPU(t *testing.T) int {
	t.Helper()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	for cpu := 1023; cpu >= 0; cpu-- { // IsSet is false past the set's end
		if set.IsSet(cpu) {
			return cpu
		}
	}
	t.Fatal("no CPU in this test's affinity")
	return 0
}

// needCgroupLimits skips where this machine cannot limit rooms by
// cgroups, saying why.
func needCgroupLimits(t testing.TB) {
	t.Helper()
	c, err := custody.New(custody.Options{Resources: true, NoSubreaper: true})
	if err != nil {
		t.Fatal(err)
	}
	s := c.Support()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if !s.Enforced() {
		t.Skipf("rooms' limits are not enforced by cgroups here: %s", s.Why)
	}
}

// roomRun is what one message's turn left in the room's log.
type roomRun struct {
	end    event.TurnEnded
	tools  []event.ToolEnded
	limits []event.RoomLimit
	types  []string
}

// output is the tools' outputs, joined.
func (r roomRun) output() string {
	var b strings.Builder
	for _, te := range r.tools {
		b.WriteString(te.Output + "\n")
	}
	return b.String()
}

// runInRoom posts text to room and follows its log to the message's
// turn.ended.
func runInRoom(t *testing.T, url, token, room, text string) roomRun {
	t.Helper()
	r, err := postAndFollow(t, url, token, room, text, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// postAndFollow is runInRoom for any goroutine: it returns its errors;
// onEvent, if set, sees each event.
func postAndFollow(t testing.TB, url, token, room, text string, onEvent func(typ string)) (roomRun, error) {
	body, _ := json.Marshal(map[string]string{"text": text})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"v1/rooms/"+room+"/messages", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return roomRun{}, err
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var acc struct {
		ID  string `json:"id"`
		Seq int64  `json:"seq"`
	}
	if res.StatusCode != 202 || json.Unmarshal(b, &acc) != nil {
		return roomRun{}, fmt.Errorf("post to %s: %d %s", room, res.StatusCode, b)
	}
	var r roomRun
	fctx, fcancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer fcancel()
	err = newTestClient(t, url, token).events(fctx, room, acc.Seq-1, true, func(typ string, raw []byte) (bool, error) {
		if onEvent != nil {
			onEvent(typ)
		}
		r.types = append(r.types, typ)
		switch typ {
		case event.TypeToolEnded:
			var te event.ToolEnded
			if err := json.Unmarshal(raw, &te); err != nil {
				return false, err
			}
			r.tools = append(r.tools, te)
		case event.TypeRoomLimit:
			var rl event.RoomLimit
			if err := json.Unmarshal(raw, &rl); err != nil {
				return false, err
			}
			r.limits = append(r.limits, rl)
		case event.TypeTurnEnded:
			var te event.TurnEnded
			if err := json.Unmarshal(raw, &te); err != nil {
				return false, err
			}
			if te.MessageID == acc.ID {
				r.end = te
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return r, fmt.Errorf("room %s: %w", room, err)
	}
	return r, nil
}

// inParallel runs fns at once and fails t with their errors.
func inParallel(t *testing.T, fns ...func() error) {
	t.Helper()
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Go(func() { errs[i] = fn() })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// roomState reads GET /v1/rooms/{room}.
func roomState(t *testing.T, url, token, room string) (st struct {
	Resources *event.Resources `json:"resources"`
	Compute   json.RawMessage  `json:"compute"`
}) {
	t.Helper()
	code, b := call(t, "GET", url+"v1/rooms/"+room, token, "")
	if code != 200 || json.Unmarshal(b, &st) != nil {
		t.Fatalf("room %s: %d %s", room, code, b)
	}
	return st
}

// A tool allocating 4x the room's memory limit is killed (and only it):
// its call fails, room.limit is written, the turn settles (or, had the
// kernel picked the agent, fails naming the limit); another room's turn,
// running at the same time, settles; the state reports the limits held.
// A room's settings lower its limit (and cannot raise it), and a hostile
// tool can neither leave its groups nor lift their limit.
func TestServe_RoomMemoryLimit(t *testing.T) {
	needRoomLimits(t)
	const limit = 1 << 30
	data := t.TempDir()
	url, token, _ := startServe(t, "--data", data, "--approval-mode", "yolo", "--room-memory", "1G")
	big := fmt.Sprintf(`%s -c "a=[b'x'*(64<<20) for i in range(64)]; print('survived', len(a))"`, python)
	var hog, calm roomRun
	inParallel(t, func() (err error) {
		hog, err = postAndFollow(t, url, token, "hog", "Allocate: "+roomtest.BashCall(big), nil)
		return err
	}, func() (err error) {
		calm, err = postAndFollow(t, url, token, "calm", "Say it: "+roomtest.BashCall("echo calm-room"), nil)
		return err
	})

	if calm.end.Outcome != "settled" || !strings.Contains(calm.output(), "calm-room") {
		t.Errorf("the other room's turn: %+v, tools %q", calm.end, calm.output())
	}
	if strings.Contains(hog.output(), "survived") || len(hog.tools) == 0 || !hog.tools[0].IsError {
		t.Errorf("the allocation was not stopped: %+v", hog.tools)
	}
	if len(hog.limits) == 0 || hog.limits[0].Limit != event.LimitMemory || hog.limits[0].Count < 1 || hog.limits[0].Value != limit {
		t.Fatalf("room.limit: %+v (events %v)", hog.limits, hog.types)
	}
	switch {
	case hog.end.Outcome == "settled" && !hog.limits[0].AgentKilled:
	case hog.end.Outcome == "failed" && hog.limits[0].AgentKilled && strings.Contains(hog.end.Reason, "memory limit (1 GiB)"):
		t.Log("the kernel killed the agent itself")
	default:
		t.Fatalf("the allocating room's turn: %+v, limits %+v", hog.end, hog.limits)
	}
	if c := hog.end.Compute; c == nil || c.PeakMemoryBytes < limit/2 || c.PeakMemoryBytes > limit+1<<20 {
		t.Errorf("the turn's compute: %+v", hog.end.Compute)
	}
	st := roomState(t, url, token, "hog")
	if st.Resources == nil || !st.Resources.Enforced || st.Resources.Memory != limit || st.Resources.Why != "" {
		t.Errorf("the room's resources: %+v", st.Resources)
	}
	// The room goes on.
	if next := runInRoom(t, url, token, "hog", "hello again"); next.end.Outcome != "settled" {
		t.Errorf("the room's next turn: %+v", next.end)
	}
	// A room's settings lower its limit (never above the server's): the
	// escaping room runs under 768 MiB (above what omp holds itself, so
	// that the kernel picks the tool).
	if code, b := call(t, "PUT", url+"v1/rooms/escape/config", token, `{"resources":{"memory":"2G"}}`); code != 400 || !strings.Contains(string(b), "over the server's ceiling, 1 GiB") {
		t.Fatalf("a room's memory over the server's: %d %s", code, b)
	}
	if code, b := call(t, "PUT", url+"v1/rooms/escape/config", token, `{"resources":{"memory":"768M"}}`); code != 200 {
		t.Fatalf("a room's memory under the server's: %d %s", code, b)
	}
	// A hostile tool tries to leave its groups for the server's (its own
	// group's parent, in every hierarchy it is in) and to raise its
	// memory limit, then allocates: refused, and killed at the limit.
	if r := runInRoom(t, url, token, "escape", "hello"); r.end.Outcome != "settled" {
		t.Fatalf("the escaping room's first turn: %+v", r.end)
	}
	ws, _ := filepath.Glob(filepath.Join(data, "workspaces", "escape-*"))
	if len(ws) != 1 {
		t.Fatalf("the escaping room's workspace: %v", ws)
	}
	if err := os.WriteFile(filepath.Join(ws[0], "escape.py"), []byte(escapePy), 0o644); err != nil {
		t.Fatal(err)
	}
	escape := python + " escape.py"
	esc := runInRoom(t, url, token, "escape", "Escape: "+roomtest.BashCall(escape))
	t.Logf("the escaping tool: %q", esc.output())
	if esc.end.Outcome != "settled" || !strings.Contains(esc.output(), "attempts-done") {
		t.Fatalf("the escaping turn: %+v, its tool's output %q", esc.end, esc.output())
	}
	if out := esc.output(); strings.Contains(out, "escaped") || strings.Contains(out, "raised") || strings.Contains(out, "survived") {
		t.Errorf("a tool left its room's limits: %q", out)
	}
	if len(esc.limits) == 0 || esc.limits[0].Limit != event.LimitMemory || esc.limits[0].Value != 768<<20 {
		t.Errorf("the escaping tool was not killed at its room's limit: %+v %q", esc.limits, esc.output())
	}
	if c := esc.end.Compute; c == nil || c.PeakMemoryBytes > 768<<20+1<<20 {
		t.Errorf("the escaping turn's compute, under 768 MiB: %+v", esc.end.Compute)
	}
	if st := roomState(t, url, token, "escape"); st.Resources == nil || !st.Resources.Enforced || st.Resources.Memory != 768<<20 {
		t.Errorf("the escaping room's resources: %+v", st.Resources)
	}
}

// The agent itself killed at its room's memory limit (a custom agent
// that allocates 4 GiB): the turn fails with a reason naming the limit,
// room.limit says the agent was killed, the room's next message starts
// the agent again and settles, and another room's turn at the same time
// settles.
func TestServe_AgentKilledAtItsRoomsMemoryLimit(t *testing.T) {
	needCgroupLimits(t)
	url, token, _ := startServe(t, append([]string{"--data", t.TempDir(), "--confine", "off", "--room-memory", "256M"}, fakeAgentArgs(t)...)...)
	var hog, calm roomRun
	inParallel(t, func() (err error) {
		hog, err = postAndFollow(t, url, token, "hog", "eat memory", nil)
		return err
	}, func() (err error) {
		calm, err = postAndFollow(t, url, token, "calm", "hello", nil)
		return err
	})
	if calm.end.Outcome != "settled" {
		t.Errorf("the other room's turn: %+v", calm.end)
	}
	if hog.end.Outcome != "failed" || !strings.Contains(hog.end.Reason, "killed at the room's memory limit (256 MiB)") {
		t.Fatalf("the turn of the agent killed at the limit: %+v (events %v)", hog.end, hog.types)
	}
	if len(hog.limits) != 1 || hog.limits[0].Limit != event.LimitMemory || !hog.limits[0].AgentKilled || hog.limits[0].Count < 1 || hog.limits[0].Value != 256<<20 {
		t.Fatalf("room.limit: %+v", hog.limits)
	}
	if c := hog.end.Compute; c == nil || c.PeakMemoryBytes < 128<<20 || c.PeakMemoryBytes > 256<<20+1<<20 {
		t.Errorf("the failed turn's compute: %+v", hog.end.Compute)
	}
	next := runInRoom(t, url, token, "hog", "hello again")
	if next.end.Outcome != "settled" || !slices.Contains(next.types, event.TypeAgentStarted) || len(next.limits) != 0 {
		t.Errorf("the room's next turn: %+v, events %v, limits %+v", next.end, next.types, next.limits)
	}
}

// escapePy is a hostile tool: for every cgroup hierarchy it is in, it
// tries to move itself into its group's parent and to lift its group's
// memory limit, says what it managed (at once: a killed process's
// buffered output is lost), then allocates 4 GiB.
const escapePy = `import os
mounts = {}
for line in open("/proc/self/mountinfo"):
    f = line.split()
    rest = f[f.index("-") + 1:]
    if rest[0] == "cgroup2":
        mounts[""] = f[4]
    elif rest[0] == "cgroup":
        for opt in rest[2].split(","):
            mounts[opt] = f[4]
for line in open("/proc/self/cgroup"):
    _, ctrls, path = line.strip().split(":", 2)
    mnt = mounts.get(ctrls.split(",")[0] if ctrls else "")
    if not mnt:
        continue
    own = mnt + path
    for target, what, value in ((os.path.dirname(own) + "/cgroup.procs", "escaped", str(os.getpid())),
                                (own + "/memory.limit_in_bytes", "raised", "-1"), (own + "/memory.max", "raised", "max")):
        try:
            with open(target, "w") as fh:
                fh.write(value)
            print(what, target, flush=True)
        except OSError:
            pass
print("attempts-done", flush=True)
a = [b"x" * (64 << 20) for i in range(64)]
print("survived", len(a))
`

// A fork bomb (bounded: 200 forks at most) stops at the room's pids limit
// while another room's turn settles.
func TestServe_RoomPidsLimit(t *testing.T) {
	needRoomLimits(t)
	const limit = 96
	url, token, _ := startServe(t, "--data", t.TempDir(), "--approval-mode", "yolo", "--room-pids", strconv.Itoa(limit))
	// dash ends at the first fork refused: the last number is how many ran.
	bomb := `sh -c 'i=0; for j in $(seq 200); do /bin/sleep 20 >/dev/null 2>&1 & i=$((i+1)); echo $i; done' 2>&1; echo bomb-done`
	var bombed, calm roomRun
	inParallel(t, func() (err error) {
		bombed, err = postAndFollow(t, url, token, "bomb", "Fork: "+roomtest.BashCall(bomb), nil)
		return err
	}, func() (err error) {
		calm, err = postAndFollow(t, url, token, "calm", "Say it: "+roomtest.BashCall("echo calm-room"), nil)
		return err
	})

	if calm.end.Outcome != "settled" || !strings.Contains(calm.output(), "calm-room") {
		t.Errorf("the other room's turn: %+v, tools %q", calm.end, calm.output())
	}
	nums := regexp.MustCompile(`(?m)^(\d+)$`).FindAllStringSubmatch(bombed.output(), -1)
	started := 0
	for _, m := range nums {
		n, _ := strconv.Atoi(m[1])
		started = max(started, n)
	}
	t.Logf("the bomb started %d of 200; turn %s %q", started, bombed.end.Outcome, bombed.end.Reason)
	if started == 0 || started >= 200 || started > limit {
		t.Errorf("the fork bomb started %d processes under a limit of %d tasks: %q", started, limit, bombed.output())
	}
	// The refused fork is an error the agent reads in the tool's output
	// (dash's words, or bash's).
	if !regexp.MustCompile(`(?i)cannot fork|fork: .*resource temporarily unavailable`).MatchString(bombed.output()) {
		t.Errorf("the tool's output does not say a fork was refused: %q", bombed.output())
	}
	if len(bombed.limits) == 0 || bombed.limits[0].Limit != event.LimitPids || bombed.limits[0].Count < 1 || bombed.limits[0].Value != limit {
		t.Fatalf("room.limit: %+v (events %v)", bombed.limits, bombed.types)
	}
	if o := bombed.end.Outcome; o != "settled" && !(o == "failed" && strings.Contains(bombed.end.Reason, "pids limit")) {
		t.Errorf("the bomb's turn: %+v", bombed.end)
	}
}

// Two rooms busy at once get the same CPU (within 20%) under the equal
// share, although one runs twice the loops of the other. The loops start
// together (a file the test makes in both workspaces) and end on their
// own (timeout). Both rooms' loops run on one CPU, where the kernel splits
// the time between groups by their shares alone (over several CPUs its
// load balancing, which other load on a busy machine moves, decides too:
// see custody's TestResources_EqualShare).
func TestServe_RoomsShareCPU(t *testing.T) {
	needRoomLimits(t)
	data := t.TempDir()
	url, token, _ := startServe(t, "--data", data, "--approval-mode", "yolo")
	cpuN := lastCPU(t)
	// Each pins its shell to cpuN, waits for the file go in its
	// workspace, then runs n loops that end on their own.
	loops := func(n int) string {
		return `sh -c '` + python + ` -c "import os; os.sched_setaffinity($$, {` + strconv.Itoa(cpuN) + `})" || exit 1; ` +
			`while [ ! -e go ]; do sleep 0.2; done; ` + strings.Repeat(`timeout 15 sh -c "while :; do :; done" & `, n) + `wait; echo loops-done'`
	}
	var mu sync.Mutex
	var runs [2]roomRun
	started := map[string]bool{}
	ready := make(chan struct{})
	var fns []func() error
	for i, n := range []int{4, 2} {
		room := fmt.Sprintf("busy%d", n)
		fns = append(fns, func() (err error) {
			runs[i], err = postAndFollow(t, url, token, room, "Spin: "+roomtest.BashCall(loops(n)), func(typ string) {
				if typ != event.TypeToolStarted {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if !started[room] {
					if started[room] = true; len(started) == 2 {
						close(ready)
					}
				}
			})
			return err
		})
	}
	fns = append(fns, func() error {
		select {
		case <-ready:
		case <-time.After(4 * time.Minute):
			return fmt.Errorf("the rooms' tools did not start")
		}
		for _, n := range []int{4, 2} {
			ws, _ := filepath.Glob(filepath.Join(data, "workspaces", fmt.Sprintf("busy%d-*", n)))
			if len(ws) != 1 {
				return fmt.Errorf("busy%d's workspace: %v", n, ws)
			}
			if err := os.WriteFile(filepath.Join(ws[0], "go"), nil, 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	inParallel(t, fns...)
	var cpu [2]float64
	for i, r := range runs {
		if r.end.Outcome != "settled" || !strings.Contains(r.output(), "loops-done") || r.end.Compute == nil {
			t.Fatalf("room %d's turn: %+v %q", i, r.end, r.output())
		}
		cpu[i] = r.end.Compute.CPUSeconds
	}
	t.Logf("4 loops: %.2f s of CPU, 2 loops: %.2f s", cpu[0], cpu[1])
	if cpu[1] <= 0 || cpu[0]/cpu[1] > 1.2 || cpu[1]/cpu[0] > 1.2 {
		t.Fatalf("unequal shares: 4 loops %.2f s, 2 loops %.2f s", cpu[0], cpu[1])
	}
}

// A known workload's compute on turn.ended is what /proc accounting says
// (within 10%): the tool's own CPU time (os.times, its children's too)
// and the agent's over the turn (its /proc stat), the tool's peak
// memory, the processes it started.
func TestServe_TurnComputeMatchesProc(t *testing.T) {
	needRoomLimits(t)
	data := t.TempDir()
	url, token, _ := startServe(t, "--data", data, "--approval-mode", "yolo")
	// The agent first (its own CPU is read before and after the turn).
	if r := runInRoom(t, url, token, "known", "hello"); r.end.Outcome != "settled" {
		t.Fatalf("first turn: %+v", r.end)
	}
	agent := agentPid(t, filepath.Join(data, "rooms"))
	before := procCPU(t, agent)
	// 300 MiB held, 2 s of CPU, 5 children that live a second each.
	work := python + ` -c "
import os, resource, subprocess, time
a = b'x' * (300 << 20)
end = time.process_time() + 2
while time.process_time() < end: pass
ps = [subprocess.Popen(['/bin/sleep', '1']) for i in range(5)]
for p in ps: p.wait()
t = os.times()
print('cpu', t.user + t.system + t.children_user + t.children_system)
print('maxrss', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"`
	r := runInRoom(t, url, token, "known", "Work: "+roomtest.BashCall(work))
	after := procCPU(t, agent)
	if r.end.Outcome != "settled" || r.end.Compute == nil {
		t.Fatalf("the workload's turn: %+v %q", r.end, r.output())
	}
	var toolCPU float64
	var maxRSS int64
	for _, l := range strings.Split(r.output(), "\n") {
		if v, ok := strings.CutPrefix(l, "cpu "); ok {
			toolCPU, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
		if v, ok := strings.CutPrefix(l, "maxrss "); ok {
			maxRSS, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	if toolCPU < 1.5 || maxRSS < 300<<20 {
		t.Fatalf("the workload said %q", r.output())
	}
	c := *r.end.Compute
	want := toolCPU + (after - before)
	t.Logf("compute %+v; /proc: tool %.3f s + agent %.3f s = %.3f s, the tool's max RSS %d MiB, the agent's RSS %d MiB",
		c, toolCPU, after-before, want, maxRSS>>20, procRSS(t, agent)>>20)
	if c.CPUSeconds < want*0.9 || c.CPUSeconds > want*1.1 {
		t.Errorf("cpu_seconds %.3f, /proc accounting %.3f", c.CPUSeconds, want)
	}
	// The room held the tool's memory, and the agent's beside it.
	if agentRSS := procRSS(t, agent); c.PeakMemoryBytes < maxRSS || c.PeakMemoryBytes > (maxRSS+agentRSS)*11/10+64<<20 {
		t.Errorf("peak_memory_bytes %d, the tool's max RSS %d and the agent's RSS %d", c.PeakMemoryBytes, maxRSS, agentRSS)
	}
	// python and its five sleeps (each lives longer than custody's look).
	if c.Processes < 6 || c.Processes > 12 {
		t.Errorf("processes %d, want the tool's 6 (and the agent's own helpers, if any)", c.Processes)
	}
	var totals struct {
		CPUSeconds float64 `json:"cpu_seconds"`
	}
	if err := json.Unmarshal(roomState(t, url, token, "known").Compute, &totals); err != nil || totals.CPUSeconds < c.CPUSeconds {
		t.Errorf("the room's compute totals %+v, %v", totals, err)
	}
	code, b := call(t, "GET", url+"metrics", token, "")
	if code != 200 || !regexp.MustCompile(`(?m)^agenthost_room_cpu_seconds_total [1-9]`).Match(b) {
		t.Errorf("metrics lack the rooms' CPU: %d", code)
	}
}

// agentPid is the pid of the one agent running under rooms (its command
// line names its home there).
func agentPid(t *testing.T, rooms string) int {
	t.Helper()
	var found []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if strings.Contains(string(b), rooms+"/") && strings.Contains(string(b), "omp") {
			if st, _ := os.ReadFile("/proc/" + e.Name() + "/stat"); len(st) > 0 {
				found = append(found, pid)
			}
		}
	}
	// The agent is the oldest (a tool it ran would name the rooms too).
	slices.Sort(found)
	if len(found) == 0 {
		t.Fatal("no agent process found")
	}
	return found[0]
}

// procCPU is a process's user+system CPU time, from /proc/PID/stat.
func procCPU(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// procRSS is a process's resident memory, from /proc/PID/status.
func procRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n << 10
		}
	}
	return 0
}

// nobodyServe runs serve as uid 65534 (from a copy of the test binary it
// can run), in the cgroups moveTo names (their cgroup.procs, written
// before the server drops root), and returns its address, its start lines
// and its data dir. A test that is not root runs it as its own user (and
// moves it nowhere).
func nobodyServe(t *testing.T, moveTo []string, args ...string) (url string, lines []string) {
	t.Helper()
	root := os.Getuid() == 0
	if _, err := exec.LookPath("setpriv"); root && err != nil {
		t.Skip("no setpriv to run the server as uid 65534")
	}
	script := `exec setpriv --reuid=65534 --regid=65534 --clear-groups "$0" "$@"`
	if !root {
		script = `exec "$0" "$@"`
	}
	var move strings.Builder
	for _, p := range moveTo {
		fmt.Fprintf(&move, "echo $$ > %s && ", p)
	}
	return helperServe(t, root, move.String()+script, args...)
}

// readOnlyCgroupsServe runs serve as root in a mount namespace of its own
// where every cgroup hierarchy is mounted read-only (as in a container
// whose /sys/fs/cgroup is not its to write), and returns what
// nobodyServe does.
func readOnlyCgroupsServe(t *testing.T, args ...string) (url string, lines []string) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("not root: the mounts of a namespace of its own are root's to change")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare to give the server a mount namespace of its own")
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var remount strings.Builder
	for _, l := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(l)
		if i := slices.Index(f, "-"); i > 0 && i+1 < len(f) && (f[i+1] == "cgroup" || f[i+1] == "cgroup2") {
			fmt.Fprintf(&remount, "mount -o remount,bind,ro %s && ", f[4])
		}
	}
	inner := remount.String() + `exec "$0" "$@"`
	return helperServe(t, false, `exec unshare -m --propagation private /bin/sh -c '`+inner+`' "$0" "$@"`, args...)
}

// helperServe runs serve from a copy of the test binary under script (sh
// -c, the binary as $0, serve's arguments after it), with a data dir
// given to uid 65534 if nobody, and returns its address and start lines.
func helperServe(t *testing.T, nobody bool, script string, args ...string) (url string, lines []string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "agenthost-nobody")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "agenthost.test")
	src, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if nobody {
		if err := os.Chown(data, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	tools, _ := filepath.Abs("../../.tools")
	cmd := exec.Command("/bin/sh", append([]string{"-c", script, bin, "serve", "--listen", "127.0.0.1:0", "--data", data}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), serveHelperEnv+"=1", "AGENTHOST_TOKEN=nobody-token", "HOME="+data, "TMPDIR="+data,
		"AGENTHOST_TOOLS="+tools, "GORACE=atexit_sleep_ms=0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errOut syncBuf
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("the server's log:\n%s", errOut.String())
		}
	})
	got := make(chan []string, 1)
	go func() {
		var ls []string
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ls = append(ls, sc.Text())
			if strings.HasPrefix(sc.Text(), "agenthost: room limits:") {
				got <- ls
				_, _ = io.Copy(io.Discard, out)
				return
			}
		}
		got <- ls
	}()
	select {
	case lines = <-got:
	case <-time.After(2 * time.Minute):
		t.Fatalf("no start lines; stderr:\n%s", errOut.String())
	}
	if len(lines) == 0 {
		t.Fatalf("serve ended at start: %s", errOut.String())
	}
	url, _, _ = strings.Cut(strings.TrimPrefix(lines[0], "agenthost: serving rooms at "), " ")
	return url, lines
}

// Without a cgroup it may write (uid 65534 here), the server says so at
// start and in the room's state, and the limits it can still apply hold:
// an allocation past the address space limit fails, a fork bomb stops at
// RLIMIT_NPROC.
func TestServe_ResourcesWithoutCgroups(t *testing.T) {
	if _, err := os.Stat(python); err != nil {
		t.Skipf("no %s", python)
	}
	url, lines := nobodyServe(t, nil, "--approval-mode", "yolo", "--room-memory", "4G", "--room-pids", "128")
	last := lines[len(lines)-1]
	if os.Getuid() != 0 && !strings.Contains(last, "NOT enforced by cgroups") {
		t.Skipf("this user (uid %d) has cgroups it may write: no fallback to see (%q)", os.Getuid(), last)
	}
	if !strings.Contains(last, "NOT enforced by cgroups") || !strings.Contains(last, "RLIMIT_AS") {
		t.Fatalf("the start line: %q", last)
	}
	checkRlimitFallback(t, url, 300, 0)
}

// A root server whose cgroups are read-only (a container's usual
// /sys/fs/cgroup) says at start and in the room's state that its limits
// are not enforced by cgroups, and the rlimits hold: an allocation past
// the address space limit fails, and a fork bomb stops at RLIMIT_NPROC,
// counted over the agent's own uid (each room's agent runs as a uid of its
// own under root).
func TestServe_ResourcesWithReadOnlyCgroupsAsRoot(t *testing.T) {
	if _, err := os.Stat(python); err != nil {
		t.Skipf("no %s", python)
	}
	url, lines := readOnlyCgroupsServe(t, "--approval-mode", "yolo", "--room-memory", "4G", "--room-pids", "128")
	last := lines[len(lines)-1]
	t.Logf("start lines: %q", lines)
	if !strings.Contains(last, "NOT enforced by cgroups") || !strings.Contains(last, "RLIMIT_AS") || !strings.Contains(last, "per room user") ||
		!strings.Contains(last, "read-only") || strings.Contains(last, "not root") {
		t.Fatalf("the start line: %q", last)
	}
	checkRlimitFallback(t, url, 128, 128)
}

// checkRlimitFallback checks a room of a server whose limits are rlimits
// (--room-memory 4G): an allocation past RLIMIT_AS fails with nothing
// measured, a fork bomb stops below bombMax at RLIMIT_NPROC, and the room's
// state says the limits are rlimits, not enforced by cgroups (pids: its
// limit, 0 not checked).
func checkRlimitFallback(t *testing.T, url string, bombMax int, pids int64) {
	t.Helper()
	token := "nobody-token"
	// 6 GiB of address space past RLIMIT_AS (4 GiB): refused at once,
	// nothing touched.
	r := runInRoom(t, url, token, "r", "Reserve: "+roomtest.BashCall(python+` -c "b = bytearray(6 << 30); print('reserved')"`))
	if r.end.Outcome != "settled" || !strings.Contains(r.output(), "MemoryError") || strings.Contains(r.output(), "reserved") {
		t.Errorf("a 6 GiB allocation under RLIMIT_AS: %+v %q", r.end, r.output())
	}
	if r.end.Compute != nil || len(r.limits) != 0 {
		t.Errorf("compute %+v, room.limit %+v: nothing is measured without cgroups", r.end.Compute, r.limits)
	}
	bomb := `sh -c 'i=0; for j in $(seq 300); do /bin/sleep 20 >/dev/null 2>&1 & i=$((i+1)); echo $i; done' 2>&1; echo bomb-done`
	r = runInRoom(t, url, token, "r", "Fork: "+roomtest.BashCall(bomb))
	started := 0
	for _, m := range regexp.MustCompile(`(?m)^(\d+)$`).FindAllStringSubmatch(r.output(), -1) {
		n, _ := strconv.Atoi(m[1])
		started = max(started, n)
	}
	t.Logf("the bomb started %d of 300 under RLIMIT_NPROC", started)
	if started == 0 || started >= bombMax || !regexp.MustCompile(`(?i)cannot fork|fork: .*resource temporarily unavailable`).MatchString(r.output()) {
		t.Errorf("a fork bomb under RLIMIT_NPROC started %d: %q", started, r.output())
	}
	st := roomState(t, url, token, "r")
	if res := st.Resources; res == nil || res.Enforced || res.Why == "" || res.By.Memory != "rlimit" || res.By.Pids != "rlimit" ||
		res.By.CPU != "none" || res.Memory != 4<<30 || (pids != 0 && res.Pids != pids) {
		t.Errorf("the room's resources: %+v", st.Resources)
	}
}

// A server that is not root, in cgroups delegated to its user (as systemd
// gives a service with Delegate=yes), finds them and limits its rooms
// there. Emulated here: the test (root) makes a group for uid 65534 in the
// cgroup v2 hierarchy and in each v1 hierarchy of the controllers, gives
// it to that user, and starts the server in them.
func TestServe_FindsItsDelegatedCgroups(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("not root: no group can be delegated to another user")
	}
	needRoomLimits(t)
	name := fmt.Sprintf("agenthost-test-deleg-%d", os.Getpid())
	var made, procs []string
	// After the server's end (cleanups run last first).
	t.Cleanup(func() {
		for i := len(made) - 1; i >= 0; i-- {
			removeCgroupTree(made[i])
		}
	})
	delegate := func(dir string, files ...string) {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		made = append(made, dir)
		for _, f := range append([]string{""}, files...) {
			if err := os.Chown(filepath.Join(dir, f), 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}
		procs = append(procs, filepath.Join(dir, "cgroup.procs"))
	}
	if m := cgroup2Dir(); m != "" {
		// On a pure v2 host this test's custodian (needRoomLimits) moved
		// this process into a leaf and enabled the controllers in the
		// group above it: the delegated group goes beside the leaf, where
		// it gets them (a group below the leaf, which holds processes,
		// could not).
		if filepath.Base(m) == "agenthost.host" {
			m = filepath.Dir(m)
		}
		delegate(filepath.Join(m, name), "cgroup.procs", "cgroup.subtree_control", "cgroup.threads")
	}
	for _, c := range []string{"memory", "pids", "cpu", "cpuacct"} {
		own := ownV1Dir(c)
		if own == "" || slices.ContainsFunc(made, func(d string) bool { return filepath.Dir(d) == own }) {
			continue
		}
		delegate(filepath.Join(own, name), "cgroup.procs", "tasks")
	}
	url, lines := nobodyServe(t, procs, "--approval-mode", "yolo", "--room-memory", "1G")
	last := lines[len(lines)-1]
	if strings.Contains(last, "NOT enforced") {
		t.Fatalf("the server did not find its delegated groups: %q", last)
	}
	token := "nobody-token"
	big := fmt.Sprintf(`%s -c "a=[b'x'*(64<<20) for i in range(64)]; print('survived', len(a))"`, python)
	r := runInRoom(t, url, token, "hog", "Allocate: "+roomtest.BashCall(big))
	if strings.Contains(r.output(), "survived") || len(r.limits) == 0 || r.limits[0].Limit != event.LimitMemory {
		t.Fatalf("a 4 GiB allocation in a delegated group limited to 1 GiB: %+v %q, limits %+v", r.end, r.output(), r.limits)
	}
	if st := roomState(t, url, token, "hog"); st.Resources == nil || !st.Resources.Enforced {
		t.Errorf("the room's resources: %+v", st.Resources)
	}
	t.Logf("start line: %s", last)
}

// removeCgroupTree removes a cgroup directory and those below it (their
// processes gone), deepest first.
func removeCgroupTree(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			removeCgroupTree(filepath.Join(dir, e.Name()))
		}
	}
	for range 50 {
		if err := os.Remove(dir); err == nil || os.IsNotExist(err) {
			return
		}
		time.Sleep(100 * time.Millisecond) // a member's exit is not yet seen by the cgroup
	}
}

// cgroup2Dir is this process's cgroup v2 directory ("" without one).
func cgroup2Dir() string {
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	mnt := ""
	for _, l := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(l); len(f) > 8 && slices.Contains(f, "cgroup2") {
			mnt = f[4]
		}
	}
	b, _ := os.ReadFile("/proc/self/cgroup")
	for _, l := range strings.Split(string(b), "\n") {
		if rel, ok := strings.CutPrefix(l, "0::"); ok && mnt != "" {
			return filepath.Join(mnt, rel)
		}
	}
	return ""
}

// ownV1Dir is this process's group in the v1 hierarchy of controller c.
func ownV1Dir(c string) string {
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	mnt := ""
	for _, l := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(l)
		i := slices.Index(f, "-")
		if i > 0 && i+3 < len(f) && f[i+1] == "cgroup" && slices.Contains(strings.Split(f[i+3], ","), c) {
			mnt = f[4]
		}
	}
	b, _ := os.ReadFile("/proc/self/cgroup")
	for _, l := range strings.Split(string(b), "\n") {
		p := strings.SplitN(l, ":", 3)
		if len(p) == 3 && slices.Contains(strings.Split(p[1], ","), c) && mnt != "" {
			return filepath.Join(mnt, p[2])
		}
	}
	return ""
}

// The shipped systemd unit runs serve with its cgroup delegated, its data
// dir and a user of its own.
func TestSystemdUnit(t *testing.T) {
	b, err := os.ReadFile("../../contrib/systemd/agenthost.service")
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(l, "#") {
			keys[k] += v + "\n"
		}
	}
	for k, want := range map[string]string{
		"Delegate": "yes", "User": "agenthost", "StateDirectory": "agenthost", "StateDirectoryMode": "0700",
		"ExecStart": "/usr/local/bin/agenthost serve",
	} {
		if strings.TrimSpace(keys[k]) != want {
			t.Errorf("%s=%q, want %q", k, strings.TrimSpace(keys[k]), want)
		}
	}
	if !strings.Contains(keys["Environment"], "AGENTHOST_DATA=/var/lib/agenthost") {
		t.Errorf("the data dir is not the state directory: %q", keys["Environment"])
	}
	// Every variable it names is one serve reads.
	for _, m := range regexp.MustCompile(`AGENTHOST_[A-Z_]+`).FindAllString(string(b), -1) {
		known := m == "AGENTHOST_TOOLS" || m == tokenEnv || m == "AGENTHOST_DAEMON"
		for _, env := range serveEnv {
			known = known || env == m
		}
		if !known {
			t.Errorf("the unit names %s, which serve does not read", m)
		}
	}
}

// agenthost config sets a room's limits (a size for memory), refuses one
// over the server's ceiling naming it, and keeps them when another
// setting changes.
func TestConfigCommand_Resources(t *testing.T) {
	s := newClientServer(t)
	out, errs, code := s.cli("config", "lim", "--set", "resources.memory=512M", "--set", "resources.pids=256")
	if code != 0 || !strings.Contains(out, "resources.memory: 512 MiB\n") || !strings.Contains(out, "resources.pids:   256\n") {
		t.Fatalf("config --set resources: %d %q %q", code, out, errs)
	}
	if _, errs, code := s.cli("config", "lim", "--set", "resources.pids=999999"); code != exitUsage || !strings.Contains(errs, "over the server's ceiling, 4096") {
		t.Fatalf("a limit over the ceiling: %d %q", code, errs)
	}
	if _, errs, code := s.cli("config", "lim", "--set", "resources.memory=lots"); code != exitUsage || !strings.Contains(errs, "resources.memory") {
		t.Fatalf("a size that is none: %d %q", code, errs)
	}
	out, errs, code = s.cli("config", "lim", "--set", "instructions=Be brief.")
	if code != 0 || !strings.Contains(out, "resources.memory: 512 MiB\n") || !strings.Contains(out, "resources.pids:   256\n") {
		t.Fatalf("the limits after another setting changed: %d %q %q", code, out, errs)
	}
}

// With --daemon the room's agent runs in the process daemon under the
// room's limits, and keeps them across a planned restart: the new server
// attaches the agent (no new start), and a tool allocating 4x the memory
// limit is killed there, recorded by the new server with the turn's
// compute.
func TestServeDaemon_LimitsCarryAcrossAHandoff(t *testing.T) {
	needRoomLimits(t)
	data := t.TempDir()
	addr := freeAddr(t)
	args := []string{"--approval-mode", "yolo", "--room-memory", "1G"}
	s1 := startDaemonServer(t, data, addr, args...)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	s1.post("r", "hello")
	if _, err := follow(ctx, s1.url, s1.token, "r", func(ev sseEvent) bool { return ev.typ == "turn.ended" }); err != nil {
		t.Fatal(err)
	}
	s1.stop(syscall.SIGUSR2)
	s2 := startDaemonServer(t, data, addr, args...)
	big := fmt.Sprintf(`%s -c "a=[b'x'*(64<<20) for i in range(64)]; print('survived', len(a))"`, python)
	s2.post("r", "Allocate: "+roomtest.BashCall(big))
	turns := 0
	evs, err := follow(ctx, s2.url, s2.token, "r", func(ev sseEvent) bool {
		if ev.typ == "turn.ended" {
			turns++
		}
		return turns == 2
	})
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	var limit, ended map[string]any
	var output string
	for _, ev := range evs {
		count[ev.typ]++
		switch ev.typ {
		case "room.limit":
			limit = ev.data
		case "turn.ended":
			ended = ev.data
		case "tool.ended":
			output, _ = ev.data["output"].(string)
		}
	}
	if count["agent.started"] != 1 || count["agent.attached"] != 1 {
		t.Fatalf("agent.started %d, agent.attached %d: the agent was not kept across the restart", count["agent.started"], count["agent.attached"])
	}
	if strings.Contains(output, "survived") || limit == nil || limit["limit"] != "memory" || limit["value"] != float64(1<<30) {
		t.Fatalf("the allocation in the attached agent: output %q, room.limit %v", output, limit)
	}
	if c, _ := ended["compute"].(map[string]any); ended["outcome"] != "settled" || c == nil || c["peak_memory_bytes"].(float64) > 1<<30+1<<20 {
		t.Fatalf("the turn: %v", ended)
	}
	s2.stop(syscall.SIGTERM)
	checkNothingLeft(t, data, "r")
}

// BenchmarkServe_TurnBesideAMemoryHog is what a room pressing on its
// memory limit costs another room: the latency of a short turn (omp on
// the built-in model, one bash call) in a calm room alone, then while a
// second room's tool allocates 4x its 1 GiB limit over and over (each
// allocation killed by the kernel at the limit). It reports both medians
// and their ratio (the goal: within 1.5x), and the kills the hog
// met meanwhile. Run with -benchtime=Nx: N turns each way.
func BenchmarkServe_TurnBesideAMemoryHog(b *testing.B) {
	needRoomLimits(b)
	data := b.TempDir()
	url, token, _ := startServe(b, "--data", data, "--approval-mode", "yolo", "--room-memory", "1G")
	calm := func() time.Duration {
		t0 := time.Now()
		r, err := postAndFollow(b, url, token, "calm", "Say it: "+roomtest.BashCall("echo calm-room"), nil)
		if err != nil {
			b.Fatal(err)
		}
		if r.end.Outcome != "settled" || !strings.Contains(r.output(), "calm-room") {
			b.Fatalf("the calm room's turn: %+v %q", r.end, r.output())
		}
		return time.Since(t0)
	}
	// Both agents started (not measured).
	calm()
	if r, err := postAndFollow(b, url, token, "hog", "hello", nil); err != nil || r.end.Outcome != "settled" {
		b.Fatalf("the hog's first turn: %+v %v", r.end, err)
	}
	ws, _ := filepath.Glob(filepath.Join(data, "workspaces", "hog-*"))
	if len(ws) != 1 {
		b.Fatalf("the hog's workspace: %v", ws)
	}
	n := b.N
	alone := make([]time.Duration, 0, n)
	beside := make([]time.Duration, 0, n)
	b.ResetTimer()
	for range n {
		alone = append(alone, calm())
	}
	// The hog allocates until the file stop appears (or 10 minutes pass).
	hogCmd := fmt.Sprintf(`sh -c 'end=$(($(date +%%s)+600)); k=0; while [ ! -e stop ] && [ $(date +%%s) -lt $end ]; do %s -c "a=[b\"x\"*(64<<20) for i in range(64)]" 2>/dev/null; k=$((k+1)); done; echo hog-runs $k'`, python)
	hogStarted := make(chan struct{})
	var once sync.Once
	hogDone := make(chan roomRun, 1)
	hogErr := make(chan error, 1)
	go func() {
		r, err := postAndFollow(b, url, token, "hog", "Allocate: "+roomtest.BashCall(hogCmd), func(typ string) {
			if typ == event.TypeToolStarted {
				once.Do(func() { close(hogStarted) })
			}
		})
		hogErr <- err
		hogDone <- r
	}()
	select {
	case <-hogStarted:
	case err := <-hogErr:
		b.Fatalf("the hog ended before its tool started: %v", err)
	case <-time.After(4 * time.Minute):
		b.Fatal("the hog's tool did not start")
	}
	for range n {
		beside = append(beside, calm())
	}
	b.StopTimer()
	if err := os.WriteFile(filepath.Join(ws[0], "stop"), nil, 0o644); err != nil {
		b.Fatal(err)
	}
	if err := <-hogErr; err != nil {
		b.Fatal(err)
	}
	hog := <-hogDone
	kills := int64(0)
	for _, l := range hog.limits {
		if l.Limit == event.LimitMemory {
			kills += l.Count
		}
	}
	if hog.end.Outcome != "settled" || kills == 0 {
		b.Fatalf("the hog's turn: %+v, limits %+v, %q", hog.end, hog.limits, hog.output())
	}
	med := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1e3
	}
	b.ReportMetric(med(alone), "ms-alone")
	b.ReportMetric(med(beside), "ms-beside-hog")
	b.ReportMetric(med(beside)/med(alone), "ratio")
	b.ReportMetric(float64(kills), "hog-kills")
	b.Logf("alone %v; beside the hog %v; the hog: %q", alone, beside, strings.TrimSpace(hog.output()))
}

// The page shows a room's limits and what its turns used: a tool killed
// at the memory limit is a note in the conversation, the turn's compute
// is beside its tokens and the room's totals beside the room's, and the
// Settings form shows the room's limits (the server's, until lowered)
// and lowers them.
func TestServePage_RoomResources(t *testing.T) {
	needRoomLimits(t)
	ctx := newBrowser(t)
	t.Setenv("AGENTHOST_TOKEN", "")
	url, token, _ := startServe(t, "--data", t.TempDir(), "--approval-mode", "yolo", "--room-memory", "1G")
	act(t, ctx, "opening the printed address", chromedp.Navigate(url+"#token="+token))
	waitFor(t, ctx, "the rooms list", `!document.getElementById("layout").hidden && document.getElementById("login").hidden`)
	act(t, ctx, "opening a room",
		chromedp.SetValue(chromedp.CSS("#open-id"), "res"),
		chromedp.Click(chromedp.CSS(`#open-form button[type="submit"]`)))
	waitFor(t, ctx, "the room", `!document.getElementById("room").hidden`)
	big := fmt.Sprintf(`%s -c "a=[b'x'*(64<<20) for i in range(64)]; print('survived', len(a))"`, python)
	sendFromPage(t, ctx, "Allocate: "+roomtest.BashCall(big))
	waitFor(t, ctx, "the limit's note", `[...document.querySelectorAll("#log .msg.system")].some(n => /^the room's memory limit \(1 GiB\) was reached: \d+ process(es)? killed$/.test(n.textContent))`)
	waitFor(t, ctx, "the turn's compute beside its tokens", `/tokens · \$[0-9.e-]+ · [0-9.]+ s CPU · [0-9.]+ (MiB|GiB) peak · \d+ process/.test(document.querySelector("#log .msg.assistant .turn-usage")?.textContent ?? "")`)
	waitFor(t, ctx, "the room's compute beside its usage", `/^1 turn, [0-9,]+ tokens .*; [0-9.]+ s CPU · [0-9.]+ (MiB|GiB) peak · \d+ process/.test(document.getElementById("room-usage").textContent)`)

	act(t, ctx, "opening the settings", chromedp.Click(chromedp.CSS("#room-config summary")))
	waitFor(t, ctx, "the room's limits in the settings", `document.getElementById("cfg-res-memory").value === "1G" && document.getElementById("cfg-res-pids").value === "4096"`)
	act(t, ctx, "a limit over the server's",
		chromedp.SetValue(chromedp.CSS("#cfg-res-memory"), "2G"),
		chromedp.Click(chromedp.CSS("#config-save")))
	waitFor(t, ctx, "the refusal", `document.getElementById("config-error").textContent.includes("over the server's ceiling, 1 GiB")`)
	act(t, ctx, "a lower limit",
		chromedp.SetValue(chromedp.CSS("#cfg-res-memory"), "512M"),
		chromedp.Click(chromedp.CSS("#config-save")))
	waitFor(t, ctx, "the settings saved", `document.getElementById("config-status").textContent.startsWith("Saved.") && document.getElementById("config-error").textContent === ""`)
	code, b := call(t, "GET", url+"v1/rooms/res/config", token, "")
	var cfg struct {
		Resources struct {
			Memory int64 `json:"memory"`
		} `json:"resources"`
		NextStart []string `json:"next_start"`
	}
	if code != 200 || json.Unmarshal(b, &cfg) != nil || cfg.Resources.Memory != 512<<20 || !slices.Contains(cfg.NextStart, "resources") {
		t.Fatalf("the room's settings after the page saved them: %d %s", code, b)
	}
}

// The start line says what limits the rooms and how they hold: by which
// cgroup hierarchy (each, where they differ), or that they are not
// enforced by cgroups and why.
func TestLimitsReport(t *testing.T) {
	l := room.Limits{Memory: 1 << 30, Pids: 256, CPU: 1.5}
	for _, c := range []struct {
		s    custody.Support
		want string
	}{
		{custody.Support{Memory: custody.ByCgroupV2, Pids: custody.ByCgroupV2, CPU: custody.ByCgroupV2, Metered: true},
			"memory 1 GiB, 256 tasks, 1.5 cores per room (cgroup-v2, with an equal CPU share each)"},
		{custody.Support{Memory: custody.ByCgroupV2, Pids: custody.ByCgroupV1, CPU: custody.ByCgroupV1, Metered: true},
			"memory 1 GiB, 256 tasks, 1.5 cores per room (memory by cgroup-v2, tasks by cgroup-v1, CPU by cgroup-v1, with an equal CPU share each)"},
		{custody.Support{Memory: custody.ByRlimit, Pids: custody.ByRlimit, CPU: custody.ByNothing, Why: "not root"},
			"memory 1 GiB, 256 tasks, 1.5 cores per room, NOT enforced by cgroups: not root"},
	} {
		if got := limitsReport(l, c.s); got != c.want {
			t.Errorf("limitsReport(%+v):\n got %q\nwant %q", c.s, got, c.want)
		}
	}
}

// A pi server without a cgroup it may write (uid 65534 here) limits
// memory by RLIMIT_AS, which leaves V8 no room for its Wasm guard regions:
// pi's node runs without the trap handler, so that its Wasm (Node's fetch,
// photon's image codec) works under the limit. The pool's agent starts and
// is bound to a new room, whose turn runs (pooled); a cold room's read of
// an image decodes it with photon; and a tool's allocation past RLIMIT_AS
// still fails.
func TestServe_PiUnderRlimit(t *testing.T) {
	if _, err := os.Stat(python); err != nil {
		t.Skipf("no %s", python)
	}
	for _, pool := range []string{"1", "0"} {
		t.Run("pool="+pool, func(t *testing.T) {
			url, lines := nobodyServe(t, nil, "--agent", "pi", "--approval-mode", "yolo", "--room-memory", "4G", "--pool", pool)
			last := lines[len(lines)-1]
			if os.Getuid() != 0 && !strings.Contains(last, "NOT enforced by cgroups") {
				t.Skipf("this user (uid %d) has cgroups it may write: no fallback to see (%q)", os.Getuid(), last)
			}
			if !strings.Contains(last, "RLIMIT_AS") {
				t.Fatalf("the start line: %q", last)
			}
			token := "nobody-token"
			if pool == "1" {
				// The pool's agent boots in the background: /metrics says
				// when it is ready (no event does).
				ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
				defer cancel()
				for metric(t, url, token, `agenthost_pool_agents{state="idle"}`) != "1" {
					select {
					case <-ctx.Done():
						t.Fatal("the pool's agent never became ready under RLIMIT_AS")
					case <-time.After(100 * time.Millisecond):
					}
				}
			}
			// A 1x1 PNG, then pi's read of it: photon (Wasm) decodes it
			// to check its size; without photon pi omits the image ("could
			// not be resized"; the built-in model's own note that it takes
			// no images is another).
			const png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
			r := runInRoom(t, url, token, "r", "Write: "+roomtest.BashCall("echo "+png+" | base64 -d > dot.png && echo written"))
			if r.end.Outcome != "settled" || !strings.Contains(r.output(), "written") {
				t.Fatalf("the first turn: %+v %q", r.end, r.output())
			}
			if started := followEvents(t, url, token, "r", "agent.started"); (started["pooled"] == true) != (pool == "1") {
				t.Errorf("agent.started %v with --pool %s", started, pool)
			}
			r = runInRoom(t, url, token, "r", `Read: [[tool:read {"path":"dot.png"}]]`)
			if r.end.Outcome != "settled" || !strings.Contains(r.output(), "Read image file [image/png]") ||
				strings.Contains(r.output(), "could not be resized") {
				t.Errorf("pi's read of an image under RLIMIT_AS: %+v %q", r.end, r.output())
			}
			// The limit still holds: 6 GiB past RLIMIT_AS (4 GiB) is
			// refused.
			r = runInRoom(t, url, token, "r", "Reserve: "+roomtest.BashCall(python+` -c "b = bytearray(6 << 30); print('reserved')"`))
			if r.end.Outcome != "settled" || !strings.Contains(r.output(), "MemoryError") || strings.Contains(r.output(), "reserved") {
				t.Errorf("a 6 GiB allocation under RLIMIT_AS: %+v %q", r.end, r.output())
			}
		})
	}
}
