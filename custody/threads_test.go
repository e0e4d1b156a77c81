//go:build linux

package custody

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// zthread (a helper role) is a thread group whose main thread exits while
// its other threads run, which the kernel shows as a zombie: it prints its
// pid once ready, and on SIGUSR1 moves to the cgroup directory in
// AGENTHOST_CUSTODY_CGOUT (if set) and ends its main thread. SIGTERM and
// SIGKILL by pid end it; a signal to the exited main thread alone does
// not.
func zthread() {
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		for {
			time.Sleep(time.Hour) // the threads that keep running
		}
	}()
	fmt.Println(os.Getpid())
	<-usr1
	if dir := os.Getenv("AGENTHOST_CUSTODY_CGOUT"); dir != "" {
		_ = os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0)
	}
	unix.RawSyscall(unix.SYS_EXIT, 0, 0, 0) // this thread only, not exit_group
}

// leaderExited says whether pid is a thread group whose main thread exited
// while others run.
func leaderExited(pid int) bool {
	pi, ok := readStat(pid)
	return ok && pi.state == 'Z' && threadCount(pid) > 1
}

// threadCount reads the Threads line of pid's status.
func threadCount(pid int) int {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// endMainThread makes the zthread pid end its main thread, and waits
// until it has.
func endMainThread(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 20*time.Second, "the main thread to exit", func() bool { return leaderExited(pid) })
}

// ownsPid says whether the scope has pid alive.
func ownsPid(s *Scope, pid int) bool {
	for _, id := range s.liveIdents() {
		if id.pid == pid {
			return true
		}
	}
	return false
}

// scanUntilOwned scans until the scope owns pid.
func scanUntilOwned(c *Custodian, s *Scope, pid int) error {
	deadline := time.Now().Add(20 * time.Second)
	for !ownsPid(s, pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d was never found", pid)
		}
		c.scan()
	}
	return nil
}

func killIfAlive(pid int) {
	if pi, ok := readStat(pid); ok && !pi.dead() {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// Issue 23 item 1: a process whose main thread exited while its other
// threads run shows as a zombie. It was recorded "exited", never signalled,
// and survived Close (or, in the scope's cgroup, made Close fail: the
// cgroup stayed busy). It counts as alive now: Close ends it and says so.
// It is owned while it runs normally; then its main thread exits, a scan
// runs (the one that took it for dead), and the scope closes.
func TestScope_ThreadGroupWithExitedLeader(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bothPaths(t, func(t *testing.T, opts Options) {
		opts.ScanInterval = time.Hour // the scans are the test's
		c := newCustodian(t, opts)
		type variant struct {
			name, script string
			cgout        bool // leaves the scope's cgroup first
		}
		variants := []variant{
			{"in the agent's group", `"$0" & exec cat`, false},
			{"in a session of its own", `setsid "$0" & exec cat`, false},
		}
		if c.plat.(*linuxPlatform).cgRoot != "" && !opts.NoCgroup {
			variants = append(variants, variant{"in a session of its own, out of the cgroup", `setsid "$0" & exec cat`, true})
		}
		for _, tc := range variants {
			t.Run(tc.name, func(t *testing.T) {
				cmd := exec.Command("/bin/sh", "-c", tc.script, exe)
				cmd.Env = append(os.Environ(), helperEnv+"=zthread")
				if tc.cgout {
					cmd.Env = append(cmd.Env, "AGENTHOST_CUSTODY_CGOUT="+c.plat.(*linuxPlatform).cgRoot)
				}
				s, err := c.Start(ctxFor(t, 10*time.Second), cmd)
				if err != nil {
					t.Fatal(err)
				}
				line, err := bufio.NewReader(s.Stdout()).ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				pid, err := strconv.Atoi(strings.TrimSpace(line))
				if err != nil {
					t.Fatalf("helper said %q", line)
				}
				defer killIfAlive(pid)
				if err := scanUntilOwned(c, s, pid); err != nil {
					t.Fatal(err)
				}
				endMainThread(t, pid)
				c.scan()
				r, err := s.Close(ctxFor(t, 20*time.Second))
				if err != nil {
					t.Fatalf("close: %v", err)
				}
				if alive(pid) {
					t.Fatalf("pid %d (main thread exited, other threads running) survived Close:\n%s", pid, r)
				}
				checkGone(t, r, pid)
				for _, e := range r.Processes {
					if e.PID == pid && e.Ended != EndedTerm {
						t.Errorf("pid %d ended %q, want term (SIGTERM ended it):\n%s", pid, e.Ended, r)
					}
				}
			})
		}
	})
}

// zthreadHost (a helper role) is a host whose scope starts a zthread in a
// session of its own. Once the scope owns it, its main thread is ended, a
// scan runs, and the scope is closed. It prints the zthread's pid, then
// "closed err=... ended=...".
func zthreadHost() {
	fail := func(err error) {
		fmt.Println("error", err)
		os.Exit(1)
	}
	c, err := New(Options{TermGrace: 500 * time.Millisecond, ScanInterval: time.Hour})
	if err != nil {
		fail(err)
	}
	exe, err := os.Executable()
	if err != nil {
		fail(err)
	}
	cmd := exec.Command("/bin/sh", "-c", `setsid "$0" & exec cat`, exe)
	cmd.Env = append(os.Environ(), helperEnv+"=zthread")
	s, err := c.Start(context.Background(), cmd)
	if err != nil {
		fail(err)
	}
	line, err := bufio.NewReader(s.Stdout()).ReadString('\n')
	if err != nil {
		fail(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		fail(fmt.Errorf("zthread said %q", line))
	}
	fmt.Println(pid)
	if err := scanUntilOwned(c, s, pid); err != nil {
		fail(err)
	}
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		fail(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !leaderExited(pid) {
		if time.Now().After(deadline) {
			fail(fmt.Errorf("the main thread of %d never exited", pid))
		}
		time.Sleep(5 * time.Millisecond) // polling /proc: nothing to wait on
	}
	c.scan()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := s.Close(ctx)
	ended := Ended("not-on-receipt")
	if r != nil {
		for _, e := range r.Processes {
			if e.PID == pid {
				ended = e.Ended
			}
		}
	}
	fmt.Printf("closed err=%v ended=%s containment=%s\n", err, ended, c.plat.containment(s.cg != nil))
	if err := c.Close(); err != nil {
		fail(err)
	}
}

// Issue 23 item 1, as an unprivileged host (portable containment: no
// cgroup): the same process escaped Close with a receipt saying "exited".
// Run as root, the test runs the host as nobody; otherwise as itself.
func TestScope_ThreadGroupWithExitedLeaderUnprivileged(t *testing.T) {
	host, out := startNobodyHost(t, "zthread-host")
	line, err := out.ReadString('\n')
	if err != nil {
		t.Fatalf("host: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("host said %q", line)
	}
	defer killIfAlive(pid)
	line, err = out.ReadString('\n')
	if err != nil {
		t.Fatalf("host: %v", err)
	}
	if err := host.Wait(); err != nil {
		t.Errorf("host: %v", err)
	}
	if !strings.Contains(line, "err=<nil>") || !strings.Contains(line, "ended=term") {
		t.Errorf("host's Close: %s", strings.TrimSpace(line))
	}
	if !strings.Contains(line, string(ContainPortable)) {
		t.Errorf("the unprivileged host did not use portable containment: %s", strings.TrimSpace(line))
	}
	if alive(pid) {
		t.Errorf("pid %d (main thread exited, other threads running) survived the unprivileged host's Close", pid)
	}
}

// startNobodyHost runs the test binary as a helper host with role: as
// nobody when the test runs as root (from a copy nobody can run, with a
// TMPDIR and HOME of its own), as itself otherwise. It returns the host and
// its stdout.
func startNobodyHost(t *testing.T, role string) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	root := os.Getuid() == 0
	dir, err := os.MkdirTemp("", "custody-nobody")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	if root {
		if err := os.Chown(tmp, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "custody.test")
	copyExecutable(t, exe, bin, 0o755)
	host := exec.Command(bin, "-test.run=^$")
	host.Dir = dir
	host.Env = append(os.Environ(), helperEnv+"="+role, "TMPDIR="+tmp, "HOME="+tmp)
	if root {
		host.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	out, err := host.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		host.Process.Kill()
		host.Wait()
	})
	return host, bufio.NewReader(out)
}

// Issue 23 item 1: cgroup.kill sends its SIGKILL to the thread group's
// leader thread, which a group whose main thread exited never takes; the
// group's members are killed by pid too.
func TestCgroupKill_ThreadGroupWithExitedLeader(t *testing.T) {
	root, rel := probeCgroup()
	if root == "" {
		t.Skip("no cgroup v2 group can be made here: the portable path has no cgroup.kill")
	}
	cg := makeCgroup(root, rel, fmt.Sprintf("test-%d-kill", os.Getpid()))
	if cg == nil {
		t.Fatal("no cgroup")
	}
	defer cg.remove()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=zthread")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cg.fd}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cg.started()
	defer killIfAlive(cmd.Process.Pid)
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	endMainThread(t, cmd.Process.Pid)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	cg.kill()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "killed") {
			t.Errorf("wait: %v, want killed", err)
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatal("cgroup kill left the thread group running")
	}
	if !cg.waitEmpty(ctxFor(t, 10*time.Second), 10*time.Second) {
		t.Fatal("the cgroup did not empty")
	}
}

// Issue 23 item 1, after a host's kill -9: reap lists such a process (in
// the dead host's cgroup, or by its marker, read through a live thread)
// and ends it.
func TestReap_ThreadGroupWithExitedLeader(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, nocg := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoCgroup=%v", nocg), func(t *testing.T) {
			env := []string{"AGENTHOST_CUSTODY_SCRIPT=" + helperEnv + "=zthread setsid " + exe + " & exec cat"}
			if nocg {
				env = append(env, "AGENTHOST_CUSTODY_NOCGROUP=1")
			}
			host, pid, _ := startHost(t, env...)
			defer killIfAlive(pid)
			endMainThread(t, pid)
			host.Process.Kill()
			host.Wait()
			reapOrphan(t, pid, "a process whose main thread exited, other threads running")
		})
	}
}
