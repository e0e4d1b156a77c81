package main

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// waitExited waits (bounded) until pid has exited, through a pidfd (it
// becomes readable then), and closes it: a pidfd of ours left open would
// mark pid as one we wait for ourselves.
func waitExited(t *testing.T, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 30_000)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n != 1 {
			t.Fatalf("pid %d did not exit: %v", pid, err)
		}
		return
	}
}

// The dead daemon's tree collects the zombie children it inherited (a
// child in another session that no exec.Cmd of ours waits for, as a dead
// daemon's orphans are) and never one the server waits for itself: a
// git that exec.Cmd started in a session of its own keeps its exit status
// for Wait, and a child in the server's own session is left to its owner.
// (The one pass before collected every zombie in another session.)
func TestDaemonTree_CollectsOnlyWhatItInherited(t *testing.T) {
	if !pidfdsWork() {
		t.Skip("no pidfds on this kernel: only processes seen as the tree's are collected, which needs a daemon")
	}
	own := exec.Command("/bin/sh", "-c", "exit 7")
	own.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := own.Start(); err != nil {
		t.Fatal(err)
	}
	stray, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", "exit 3"}, &syscall.ProcAttr{Sys: &syscall.SysProcAttr{Setsid: true}})
	if err != nil {
		t.Fatal(err)
	}
	sameSession, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", "exit 4"}, &syscall.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{own.Process.Pid, stray, sameSession} {
		waitExited(t, pid)
	}
	self := os.Getpid()
	st, ok := statOf(self)
	if !ok {
		t.Fatal("no stat of self")
	}
	// Every child above started before the cutoff (its tick included).
	tree := &daemonTree{self: self, sid: st.sid, guarded: true, cutoff: bootTicks() + 1, members: map[procID]bool{}, seen: map[procID]bool{}}
	// (Others may be collected too: zombies earlier tests of this binary
	// left in other sessions, not started through exec.Cmd.)
	if n := tree.collect(); n < 1 {
		t.Errorf("collected %d zombies, want the stray", n)
	}
	if _, ok := statOf(stray); ok {
		t.Error("the stray child in another session is still there")
	}
	err = own.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Errorf("the exec.Cmd child's Wait: %v, want exit status 7", err)
	}
	var ws unix.WaitStatus
	if got, err := unix.Wait4(sameSession, &ws, 0, nil); got != sameSession || ws.ExitStatus() != 4 {
		t.Errorf("the child in our session: wait4 %d %v status %d, want it left with status 4", got, err, ws.ExitStatus())
	}
}
