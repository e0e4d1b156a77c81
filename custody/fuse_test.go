//go:build linux

package custody

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fuseHelperEnv makes the test binary a fuse ("fuse") or a host that
// holds a scope through one ("fuse-host"): see init.
const fuseHelperEnv = "AGENTHOST_FUSE_HELPER"

func init() {
	switch os.Getenv(fuseHelperEnv) {
	case "fuse":
		if err := RunFuse(os.Stdin); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	case "fuse-host":
		runFuseHost()
		os.Exit(0)
	}
}

// fuseDetachEnv, set to a folder, makes the fuse host's scope a shell
// that starts two jobs which leave its process group (setsid), one with
// the scope's environment (its marker) and one with none, each writing
// its pid to the folder and then ticking into a file there, and waits;
// the scope has no cgroup (custody's portable path).
const fuseDetachEnv = "AGENTHOST_FUSE_DETACH"

// runFuseHost plays a host in a cluster: a scope held through a fuse to a
// deadline 1 s ahead, renewed every 100 ms (as a lease is) until this
// process is stopped or killed. It prints the scope leader's pid.
func runFuseHost() {
	fail := func(err error) {
		fmt.Println("error", err)
		os.Exit(1)
	}
	exe, err := os.Executable()
	if err != nil {
		fail(err)
	}
	f, err := StartFuse([]string{"/usr/bin/env", fuseHelperEnv + "=fuse", exe, "-test.run=^$"})
	if err != nil {
		fail(err)
	}
	cmd := exec.Command("/bin/sleep", "3001")
	opts := Options{Fuse: f}
	if dir := os.Getenv(fuseDetachEnv); dir != "" {
		opts.NoCgroup = true
		tick := `echo $$ > %[1]s/%[2]s.pid; while :; do echo tick >> %[1]s/%[2]s.ticks; sleep 0.02; done`
		cmd = exec.Command("/bin/sh", "-c", fmt.Sprintf(`setsid /bin/sh -c '%s' & env -i /usr/bin/setsid /bin/sh -c '%s' & exec /bin/sleep 3001`,
			fmt.Sprintf(tick, dir, "marked"), fmt.Sprintf(tick, dir, "bare")))
	}
	c, err := New(opts)
	if err != nil {
		fail(err)
	}
	s, err := c.Start(context.Background(), cmd)
	if err != nil {
		fail(err)
	}
	// Held before the pid is told: the test stops this process as soon
	// as it reads it.
	if err := s.HoldUntil(time.Now().Add(time.Second)); err != nil {
		fail(err)
	}
	fmt.Println(s.Pid())
	for {
		time.Sleep(100 * time.Millisecond) // a renewal period
		if err := s.HoldUntil(time.Now().Add(time.Second)); err != nil {
			fail(err)
		}
	}
}

// procState is the state letter of pid in /proc ('T' stopped, 'Z'
// zombie), or 0 when it is gone.
func procState(pid int) byte {
	pi, ok := readStat(pid)
	if !ok {
		return 0
	}
	return pi.state
}

// waitState waits until ok(pid) (polling /proc: no event tells a process
// was stopped by another).
func waitState(t *testing.T, pid int, what string, ok func(int) bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !ok(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d never %s (state %q)", pid, what, procState(pid))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// frozen reports whether pid is frozen: its cgroup v2 group is (a frozen
// task sleeps there, and a SIGSTOP waits for the thaw), or it is stopped.
func frozen(pid int) bool {
	if s := procState(pid); s == 't' || s == 'T' {
		return true
	}
	rel := newLinuxPlatform().cgroupOf(pid)
	mnt := cgroup2Mount()
	if rel == "" || mnt == "" {
		return false
	}
	b, err := os.ReadFile(filepath.Join(mnt, rel, "cgroup.events"))
	return err == nil && strings.Contains(string(b), "frozen 1")
}
func gone(pid int) bool {
	s := procState(pid)
	return s == 0 || s == 'Z' || s == 'X'
}

// TestScope_HoldUntilFreezesAtItsDeadline: a scope held to a deadline is
// frozen when it passes, thawed by a later hold, and killed at once by
// Kill.
func TestScope_HoldUntilFreezesAtItsDeadline(t *testing.T) {
	c := newCustodian(t, Options{})
	s, err := c.Start(ctxFor(t, 10*time.Second), exec.Command("/bin/sleep", "3001"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.HoldUntil(time.Now().Add(100 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	waitState(t, s.Pid(), "frozen at its deadline", frozen)
	if err := s.HoldUntil(time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	waitState(t, s.Pid(), "thawed by a later hold", func(pid int) bool { return !frozen(pid) })
	if err := s.Freeze(); err != nil {
		t.Fatal(err)
	}
	waitState(t, s.Pid(), "frozen", frozen)
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("a frozen scope did not die of Kill")
	}
	if _, err := s.Close(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestFuse_HoldsWhileTheHostIsPausedAndKillsWhenItDies: a host (a
// process of its own) holds a scope through its fuse and renews the hold;
// stopped (SIGSTOP), it renews nothing and its scope is frozen at the
// deadline all the same; killed (SIGKILL), its scope is killed by the
// fuse.
func TestFuse_HoldsWhileTheHostIsPausedAndKillsWhenItDies(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	host := exec.Command(exe, "-test.run=^$")
	host.Env = append(os.Environ(), fuseHelperEnv+"=fuse-host")
	out, err := host.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = host.Process.Kill()
		_ = host.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	pid, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil {
		t.Fatalf("the host said %q (%v)", line, err)
	}
	if frozen(pid) {
		t.Fatal("the scope is frozen while its host renews the hold")
	}
	if err := host.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitState(t, pid, "frozen while its host was paused", frozen)
	if err := host.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = host.Wait()
	waitState(t, pid, "killed when its host died", gone)
}

// TestFuse_FreezesJobsThatLeftTheGroupWithoutACgroup: without a cgroup, a
// scope's jobs that left its process group (setsid; one with the scope's
// environment, one with none) are frozen by the fuse when their paused
// host's deadline passes, and killed when the host dies. Only the group
// was: a detached job went on writing beside the next holder's agent.
func TestFuse_FreezesJobsThatLeftTheGroupWithoutACgroup(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	host := exec.Command(exe, "-test.run=^$")
	host.Env = append(os.Environ(), fuseHelperEnv+"=fuse-host", fuseDetachEnv+"="+dir)
	out, err := host.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = host.Process.Kill()
		_ = host.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	leader, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil {
		t.Fatalf("the host said %q (%v)", line, err)
	}
	jobs := map[string]int{}
	for _, name := range []string{"marked", "bare"} {
		waitState(t, 0, "written its pid", func(int) bool {
			b, err := os.ReadFile(filepath.Join(dir, name+".pid"))
			if err != nil {
				return false
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			jobs[name] = pid
			return err == nil && pid > 0
		})
		if pi, ok := readStat(jobs[name]); !ok || pi.pgid == leader {
			t.Fatalf("job %s (pid %d) did not leave the scope's group (%+v)", name, jobs[name], pi)
		}
	}
	if err := host.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitState(t, leader, "frozen while its host was paused", frozen)
	for name, pid := range jobs {
		waitState(t, pid, "frozen while its host was paused ("+name+" job)", frozen)
	}
	// Frozen: the ticks stop.
	before := map[string]int64{}
	for name := range jobs {
		fi, err := os.Stat(filepath.Join(dir, name+".ticks"))
		if err != nil {
			t.Fatal(err)
		}
		before[name] = fi.Size()
	}
	time.Sleep(200 * time.Millisecond) // ten ticks' time: the frozen jobs write none
	for name := range jobs {
		fi, _ := os.Stat(filepath.Join(dir, name+".ticks"))
		if fi.Size() != before[name] {
			t.Errorf("job %s went on writing while frozen", name)
		}
	}
	if err := host.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = host.Wait()
	waitState(t, leader, "killed when its host died", gone)
	for name, pid := range jobs {
		waitState(t, pid, "killed when its host died ("+name+" job)", gone)
	}
}
