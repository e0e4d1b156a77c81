//go:build linux

package custody

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

const helperEnv = "AGENTHOST_CUSTODY_HELPER"

func init() {
	if os.Getenv(helperEnv) == "zthread" {
		// The main goroutine stays on the main thread, which the helper
		// ends on its own (see zthread).
		runtime.LockOSThread()
	}
}

// TestMain lets the test binary play a host (see runHelper) when
// helperEnv names a role.
func TestMain(m *testing.M) {
	if role := os.Getenv(helperEnv); role != "" {
		runHelper(role)
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// runHelper plays a host:
//   - "host": starts a scope whose command leaves a child behind (the
//     script in AGENTHOST_CUSTODY_SCRIPT, or a /bin/sleep), prints the
//     child's pid and the scope's marker, and waits to be killed;
//   - "ns-host": the same as the init of a new pid namespace, with its own
//     /proc;
//   - "agent-host": runs ssh-agent the way a shell tool does, prints the
//     agent's pid, closes the scope and prints the outcome;
//   - "zthread": not a host: see zthread;
//   - "zthread-host": see zthreadHost.
//
// AGENTHOST_CUSTODY_NOCGROUP=1 makes a host use no cgroup,
// AGENTHOST_CUSTODY_RESOURCES=1 one that limits its scope (a group of its
// own in each cgroup v1 hierarchy, on a hybrid host).
func runHelper(role string) {
	fail := func(err error) {
		fmt.Println("error", err)
		os.Exit(1)
	}
	switch role {
	case "zthread":
		zthread()
		return
	case "zthread-host":
		zthreadHost()
		return
	case "alloc", "spin", "pin":
		limitHelper(role)
		return
	case "reserve":
		reserve()
		return
	case "limits-host":
		limitsHost()
		return
	}
	signal.Ignore(syscall.SIGTERM)
	if role == "ns-host" {
		if err := unix.Mount("", "/", "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
			fail(err)
		}
		if err := unix.Mount("proc", "/proc", "proc", 0, ""); err != nil {
			fail(err)
		}
	}
	c, err := New(Options{NoCgroup: role == "ns-host" || os.Getenv("AGENTHOST_CUSTODY_NOCGROUP") == "1",
		Resources: os.Getenv("AGENTHOST_CUSTODY_RESOURCES") == "1"})
	if err != nil {
		fail(err)
	}
	script := os.Getenv("AGENTHOST_CUSTODY_SCRIPT")
	if script == "" {
		script = "/bin/sleep 3001 & echo $!; exec cat"
	}
	if role == "agent-host" {
		script = `eval "$(ssh-agent -s)" >/dev/null; echo $SSH_AGENT_PID; exec cat`
	}
	s, err := c.StartWith(context.Background(), exec.Command("/bin/sh", "-c", script), StartOptions{Limits: Limits{Memory: 256 << 20, Pids: 64}})
	if err != nil {
		fail(err)
	}
	line, _ := bufio.NewReader(s.Stdout()).ReadString('\n')
	if role != "agent-host" {
		fmt.Println(strings.TrimSpace(line), s.Marker())
		time.Sleep(time.Hour) // killed by the test
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	_, err = os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	fmt.Println(pid, "environ-readable="+strconv.FormatBool(err == nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := s.Close(ctx)
	onReceipt := false
	if r != nil {
		for _, e := range r.Processes {
			onReceipt = onReceipt || e.PID == pid
		}
	}
	fmt.Printf("closed err=%v onreceipt=%v\n", err, onReceipt)
	if err := c.Close(); err != nil {
		fail(err)
	}
}

func newCustodian(t *testing.T, opts Options) *Custodian {
	t.Helper()
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("custodian close: %v", err)
		}
	})
	return c
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// startSh starts script under /bin/sh in a scope and returns the pids it
// prints on its first line (space separated), read from stdout.
func startSh(t *testing.T, c *Custodian, script string) (*Scope, []int, *bufio.Reader) {
	t.Helper()
	s, err := c.Start(ctxFor(t, 10*time.Second), exec.Command("/bin/sh", "-c", script))
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(s.Stdout())
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("reading pids: %v", err)
	}
	var ps []int
	for _, f := range strings.Fields(line) {
		n, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("bad pid line %q", line)
		}
		ps = append(ps, n)
	}
	return s, ps, r
}

// alive: running, a thread group whose main thread exited included.
func alive(pid int) bool {
	pi, ok := readStat(pid)
	return ok && !pi.dead()
}

func checkGone(t *testing.T, r *Receipt, pids ...int) {
	t.Helper()
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("pid %d still running after Close", pid)
		}
		if pi, ok := readStat(pid); ok && pi.dead() {
			t.Errorf("pid %d left a zombie", pid)
		}
		found := false
		for _, e := range r.Processes {
			if e.PID == pid {
				found = true
				if e.Ended == EndedUnknown {
					t.Errorf("pid %d: no end recorded", pid)
				}
			}
		}
		if !found {
			t.Errorf("pid %d missing from the receipt:\n%s", pid, r)
		}
	}
}

func TestScope_Escapes(t *testing.T) {
	c := newCustodian(t, Options{TermGrace: 500 * time.Millisecond})
	tests := []struct {
		name   string
		script string
		ended  Ended // how the escaped process must end
	}{
		{"setsid grandchild", `setsid /bin/sleep 3002 & echo $!; exec cat`, EndedTerm},
		{"double fork", `(/bin/sleep 3003 & echo $!) ; exec cat`, EndedTerm},
		{"nohup", `nohup /bin/sleep 3004 >/dev/null 2>&1 & echo $!; exec cat`, EndedTerm},
		{"ignores SIGTERM", `trap "" TERM; /bin/sleep 3005 & echo $!; exec cat`, EndedKill},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, pids, _ := startSh(t, c, tt.script)
			r, err := s.Close(ctxFor(t, 10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			checkGone(t, r, pids...)
			for _, e := range r.Processes {
				if e.PID == pids[0] && e.Ended != tt.ended {
					t.Errorf("escaped pid ended %q, want %q\n%s", e.Ended, tt.ended, r)
				}
				if e.PID == s.Pid() && e.Ended != EndedSelf {
					t.Errorf("leader ended %q, want exited (it exits on stdin EOF)", e.Ended)
				}
			}
		})
	}
}

// A descendant holding the stdout pipe does not hold Close: it is killed,
// and the reader then sees EOF.
func TestScope_DescendantHoldsStdout(t *testing.T) {
	c := newCustodian(t, Options{Grace: 100 * time.Millisecond, TermGrace: 300 * time.Millisecond})
	s, pids, r := startSh(t, c, `/bin/sleep 3006 & echo $!; exec cat`)
	eof := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, r)
		eof <- err
	}()
	rec, err := s.Close(ctxFor(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	checkGone(t, rec, pids...)
	select {
	case err := <-eof:
		if err != nil {
			t.Fatalf("reader: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stdout never reached EOF after Close")
	}
}

func TestScope_SpawnLoop(t *testing.T) {
	c := newCustodian(t, Options{Grace: 100 * time.Millisecond, TermGrace: 500 * time.Millisecond})
	s, pids, _ := startSh(t, c, `p=""; i=0; while [ $i -lt 200 ]; do /bin/sleep 3007 & p="$p $!"; i=$((i+1)); done; echo $p; exec cat`)
	if len(pids) != 200 {
		t.Fatalf("%d pids", len(pids))
	}
	r, err := s.Close(ctxFor(t, 20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	checkGone(t, r, pids...)
}

// A pid whose start time no longer matches is never signalled.
func TestPlatform_ReusedPidNotSignalled(t *testing.T) {
	p := &linuxPlatform{self: os.Getpid(), markers: map[ident]string{}}
	cmd := exec.Command("/bin/sleep", "3008")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	real := p.startTime(cmd.Process.Pid)
	if !p.signal(ident{cmd.Process.Pid, real + 1}, sigKill) {
		t.Fatal("a start-time mismatch was not reported as reuse")
	}
	if !alive(cmd.Process.Pid) {
		t.Fatal("the process was signalled despite the mismatch")
	}
	if p.signal(ident{cmd.Process.Pid, real}, sigKill) {
		t.Fatal("the right identity was reported as reuse")
	}
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("wait: %v", err)
	}
}

// A Close cut short by its context keeps custody; a second Close finishes
// the job on the same processes.
func TestScope_CancelledCloseThenRetry(t *testing.T) {
	c := newCustodian(t, Options{Grace: 100 * time.Millisecond, TermGrace: 2 * time.Second})
	s, pids, _ := startSh(t, c, `trap "" TERM; /bin/sleep 3009 & echo $!; exec cat`)
	short, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := s.Close(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("short close: %v", err)
	}
	if !alive(pids[0]) {
		t.Fatal("the TERM-ignoring child died before SIGKILL")
	}
	r, err := s.Close(ctxFor(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	checkGone(t, r, pids...)
	r2, err := s.Close(ctxFor(t, time.Second))
	if err != nil || r2 != r {
		t.Fatalf("third close: %v (same receipt: %v)", err, r2 == r)
	}
}

// Close racing the command's own exit, many times.
func TestScope_CloseRacesExit(t *testing.T) {
	c := newCustodian(t, Options{})
	for i := 0; i < 20; i++ {
		s, err := c.Start(ctxFor(t, 10*time.Second), exec.Command("/bin/true"))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { io.Copy(io.Discard, s.Stdout()); close(done) }()
		r, err := s.Close(ctxFor(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		<-done
		if len(r.Processes) == 0 || r.Processes[0].Ended != EndedSelf {
			t.Fatalf("receipt: %s", r)
		}
	}
}

// Concurrent Close calls all get the one receipt.
func TestScope_ConcurrentClose(t *testing.T) {
	c := newCustodian(t, Options{})
	s, err := c.Start(ctxFor(t, 10*time.Second), exec.Command("/bin/cat"))
	if err != nil {
		t.Fatal(err)
	}
	type res struct {
		r   *Receipt
		err error
	}
	ch := make(chan res, 4)
	for i := 0; i < 4; i++ {
		go func() {
			r, err := s.Close(ctxFor(t, 10*time.Second))
			ch <- res{r, err}
		}()
	}
	var first *Receipt
	for i := 0; i < 4; i++ {
		x := <-ch
		if x.err != nil {
			t.Fatal(x.err)
		}
		if first == nil {
			first = x.r
		} else if x.r != first {
			t.Fatal("different receipts")
		}
	}
}

func TestScope_ReceiptSaysContainment(t *testing.T) {
	c := newCustodian(t, Options{})
	s, err := c.Start(ctxFor(t, 10*time.Second), exec.Command("/bin/cat"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Close(ctxFor(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	want := ContainPortable
	if c.plat.(*linuxPlatform).cgRoot != "" {
		want = ContainCgroup
	}
	if r.Containment != want {
		t.Fatalf("containment %q, want %q", r.Containment, want)
	}
	t.Logf("containment here: %s", r.Containment)
	c2 := newCustodian(t, Options{NoCgroup: true})
	s2, err := c2.Start(ctxFor(t, 10*time.Second), exec.Command("/bin/cat"))
	if err != nil {
		t.Fatal(err)
	}
	if r2, err := s2.Close(ctxFor(t, 10*time.Second)); err != nil || r2.Containment != ContainPortable {
		t.Fatalf("NoCgroup: %v %v", r2, err)
	}
}

// The host is killed with SIGKILL; its scope's child survives (reparented
// away) and FindOrphans + KillOrphans clean it up. Processes of live hosts
// are not touched.
func TestReap_AfterHostKilled(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	host := exec.Command(exe, "-test.run=^$")
	host.Env = append(os.Environ(), helperEnv+"=host")
	out, err := host.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("host: %v", err)
	}
	child, err := strconv.Atoi(strings.Fields(line + " x")[0])
	if err != nil {
		t.Fatalf("host said %q", line)
	}
	// A live custodian of our own, with a scope, must not be reaped.
	c := newCustodian(t, Options{})
	mine, err := c.Start(ctxFor(t, 10*time.Second), exec.Command("/bin/cat"))
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close(ctxFor(t, 10*time.Second))

	orphans, err := FindOrphans()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range orphans {
		if o.PID == child || o.PID == mine.Pid() {
			t.Fatalf("a process of a live host listed as orphan: %+v", o)
		}
	}
	host.Process.Kill()
	host.Wait()
	if !alive(child) {
		t.Fatal("the child died with its host; nothing to reap")
	}
	var found []Orphan
	for _, o := range mustOrphans(t) {
		if o.PID == child {
			found = append(found, o)
		}
		if o.PID == mine.Pid() {
			t.Fatal("a live scope listed as orphan")
		}
	}
	if len(found) == 0 {
		t.Fatalf("child %d not found as orphan", child)
	}
	left, err := KillOrphans(ctxFor(t, 10*time.Second), found, time.Second)
	if err != nil || len(left) != 0 {
		t.Fatalf("kill: %v left %v", err, left)
	}
	if alive(child) {
		t.Fatal("orphan still running")
	}
	// Its host's cgroup directory (where there was one) is gone too.
	if root, _ := probeCgroup(); root != "" {
		f := strings.Fields(line)
		scopeID := f[len(f)-1][strings.LastIndexByte(f[len(f)-1], '.')+1:]
		if m, _ := filepath.Glob(filepath.Join(root, cgroupPrefix+"*"+scopeID)); len(m) != 0 {
			t.Fatalf("the dead host's cgroup directory is left: %v", m)
		}
	}
}

// startHost runs the test binary as a "host" helper (see runHelper), with
// env added, and returns it with the pid and the marker it printed. The
// host is killed when the test ends.
func startHost(t *testing.T, env ...string) (host *exec.Cmd, pid int, marker string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	host = exec.Command(exe, "-test.run=^$")
	host.Env = append(append(os.Environ(), helperEnv+"=host"), env...)
	out, err := host.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Process.Kill(); host.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("host: %v", err)
	}
	f := strings.Fields(line)
	if len(f) != 2 {
		t.Fatalf("host said %q", line)
	}
	if pid, err = strconv.Atoi(f[0]); err != nil {
		t.Fatalf("host said %q", line)
	}
	return host, pid, f[1]
}

// reapOrphan finds pid among the orphans (as what) and ends it with
// KillOrphans.
func reapOrphan(t *testing.T, pid int, what string) {
	t.Helper()
	var found []Orphan
	for _, o := range mustOrphans(t) {
		if o.PID == pid {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s (pid %d) is not listed as an orphan", what, pid)
	}
	left, err := KillOrphans(ctxFor(t, 20*time.Second), found, time.Second)
	if err != nil || len(left) != 0 {
		t.Fatalf("kill: %v left %v", err, left)
	}
	if alive(pid) {
		t.Fatalf("%s (pid %d) still runs after KillOrphans", what, pid)
	}
}

func mustOrphans(t *testing.T) []Orphan {
	o, err := FindOrphans()
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func TestParseStat(t *testing.T) {
	line := "1234 (we ird) (name)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615\n"
	pi, ok := parseStat(1234, []byte(line))
	if !ok || pi.state != 'S' || pi.ppid != 1 || pi.pgid != 1234 || pi.sid != 1234 || pi.start != 987654 {
		t.Fatalf("%+v %v", pi, ok)
	}
	if _, ok := parseStat(1, []byte("1 (x) S 1 2")); ok {
		t.Fatal("short line accepted")
	}
	self, ok := readStat(os.Getpid())
	if !ok || self.pid != os.Getpid() || self.ppid != os.Getppid() || self.start == 0 {
		t.Fatalf("self: %+v", self)
	}
}

// Custody reaps by pid only: an unrelated child of the host, started and
// waited for with exec while scopes are open and discovery runs, keeps its
// exit status.
func TestCustodian_NeverStealsExitStatus(t *testing.T) {
	c := newCustodian(t, Options{ScanInterval: time.Millisecond})
	s, err := c.Start(ctxFor(t, 10*time.Second), exec.Command("/bin/cat"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctxFor(t, 10*time.Second))
	for i := 0; i < 50; i++ {
		err := exec.Command("/bin/sh", "-c", "exit 7").Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 7 {
			t.Fatalf("run %d: exit status lost: %v", i, err)
		}
	}
}
