package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agenthost/agenthost/custody"
	"golang.org/x/sys/unix"
)

// deadChildWait bounds waiting for a dead daemon to become a zombie (its
// exit is under way when its sockets close).
const deadChildWait = 5 * time.Second

// Bounds of following a dead daemon's tree (daemonTree.follow): it ends
// when the tree is gone, at the latest after treeDeadline; between the
// SIGCHLDs that wake it, it looks again every treeRescan for processes of
// the tree that started, or ended under a parent that still runs.
const (
	treeDeadline = 2 * time.Minute
	treeRescan   = time.Second
)

// reapDeadChild waits for pid, a child of this process that is exiting,
// to be a zombie and collects it; a pid that is not our child is left.
func reapDeadChild(ctx context.Context, pid int) {
	if pid <= 0 {
		return
	}
	deadline := time.Now().Add(deadChildWait)
	for {
		st, ok := statOf(pid)
		if !ok || st.ppid != os.Getpid() {
			return
		}
		if st.dead() {
			var ws unix.WaitStatus
			_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		time.Sleep(10 * time.Millisecond) // no event says a process became a zombie: polled, bounded
	}
}

// procID is a process by pid and start time (field 22 of its stat): a
// pid alone may be reused.
type procID struct {
	pid   int
	start uint64
}

// daemonTree is what a dead process daemon left this server, a child
// subreaper: the daemon's children and orphans are reparented to the
// server when it dies, and each of them, and each of their descendants
// whose parent dies, becomes the server's zombie when it exits, at any
// time after (omp ends when its stdio closes, later under load; an agent
// running as a uid of its own is not custody's orphan to end, and ends
// when it will). One pass after the death leaves what exits later a
// zombie for ever, so the tree is followed until it is gone.
//
// A process is the tree's when it carries custody's marker naming the
// dead daemon as its host (read while it runs: a zombie's environment is
// gone), descends from one of the tree's, or is a child of the server in
// another session than the server's, started before the daemon was found
// dead (not the next daemon), that the server did not start: those
// it starts and waits for itself through exec.Cmd (the next daemon's
// detaching start, git, npm) each hold a pidfd in the server from their
// fork until their Wait (Go starts children with CLONE_PIDFD), and a
// child whose pid a pidfd of the server's holds is never collected here,
// nor one in the server's own session. Where Go cannot use pidfds (older
// kernels) only processes seen as the tree's while they ran are.
type daemonTree struct {
	dead    procID
	self    int
	sid     int
	guarded bool            // the server's children hold pidfds: unheld ones are inherited
	cutoff  uint64          // start times (clock ticks since boot) below it are from before the death's discovery
	members map[procID]bool // the tree's, seen running
	seen    map[procID]bool // every process looked at: its environment is read once
	running []int           // the tree's processes running at the last pass
}

// newDaemonTree is the tree of the daemon pid, a dead child of this
// process not collected yet (its start time is read from its zombie);
// nil if pid is no such child.
func newDaemonTree(pid int) *daemonTree {
	st, ok := statOf(pid)
	self := os.Getpid()
	own, ok2 := statOf(self)
	if pid <= 0 || !ok || !ok2 || st.ppid != self {
		return nil
	}
	return &daemonTree{
		dead: procID{pid, st.start}, self: self, sid: own.sid, guarded: pidfdsWork(), cutoff: bootTicks(),
		members: map[procID]bool{}, seen: map[procID]bool{},
	}
}

// bootTicks is the time since boot in the clock ticks of a stat's start
// time (USER_HZ, 100 in Linux's ABI; /proc/uptime counts in hundredths
// too, on the same boot-time clock), rounded down: a process started from
// now on has a start time at least this. 0 if unreadable (then only the
// tree's marked processes and their descendants are collected).
func bootTicks() uint64 {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	secs, hundredths, _ := strings.Cut(f[0], ".")
	s, err1 := strconv.ParseUint(secs, 10, 64)
	h, err2 := strconv.ParseUint(hundredths, 10, 64)
	if err1 != nil || err2 != nil || len(hundredths) != 2 {
		return 0
	}
	return s*100 + h
}

// inherited says whether a child of the server is one the dead daemon
// left it: in another session, started before the death was found (the
// tick it was found in excluded: the next daemon may start in it), and
// no pidfd of the server's (but those excluded) holds it.
func (t *daemonTree) inherited(id procID, st procStat, exclude ...int) bool {
	return st.ppid == t.self && st.sid != t.sid && id.start < t.cutoff && t.guarded && !t.heldBySelf(id.pid, exclude...)
}

// pidfdsWork says whether Go starts children with pidfds here, checked as
// Go checks it (pidfd_open, waitid on a pidfd, pidfd_send_signal).
func pidfdsWork() bool {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PIDFD, fd, &info, unix.WEXITED|unix.WNOHANG, nil); err != unix.ECHILD {
		return false
	}
	return unix.PidfdSendSignal(fd, 0, nil, 0) == nil
}

// collect looks at every process once: it adds the tree's new processes,
// collects the tree's zombies that are the server's children, and
// reports how many it collected.
func (t *daemonTree) collect() int {
	if t == nil {
		return 0
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	type proc struct {
		id procID
		st procStat
	}
	var all []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == t.self {
			continue
		}
		if st, ok := statOf(pid); ok {
			all = append(all, proc{procID{pid, st.start}, st})
		}
	}
	// Markers first, then descent (parents may come after their
	// children in /proc's order: repeat until nothing is added).
	live := map[int]procID{}
	for _, p := range all {
		if p.st.dead() {
			continue
		}
		live[p.id.pid] = p.id
		if !t.seen[p.id] {
			t.seen[p.id] = true
			if t.markedByDead(p.id.pid) {
				t.members[p.id] = true
			}
		}
	}
	for added := true; added; {
		added = false
		for _, p := range all {
			if p.st.dead() || t.members[p.id] {
				continue
			}
			parent, ok := live[p.st.ppid]
			if (ok && t.members[parent]) || t.inherited(p.id, p.st) {
				t.members[p.id] = true
				added = true
			}
		}
	}
	n := 0
	t.running = t.running[:0]
	for _, p := range all {
		switch {
		case !p.st.dead():
			if t.members[p.id] {
				t.running = append(t.running, p.id.pid)
			}
		case p.st.ppid == t.self && p.st.sid != t.sid:
			if t.reap(p.id) {
				n++
			}
		}
	}
	// Forget what is gone (a zombie is not yet): pids are reused.
	exists := make(map[procID]bool, len(all))
	for _, p := range all {
		exists[p.id] = true
	}
	for id := range t.members {
		if !exists[id] {
			delete(t.members, id)
		}
	}
	for id := range t.seen {
		if !exists[id] {
			delete(t.seen, id)
		}
	}
	return n
}

// reap collects id, a zombie child of the server in another session,
// if it is the tree's: one seen running as the tree's, or one inherited. The pidfd opened here pins the process
// checked: collecting it cannot take another that got its pid.
func (t *daemonTree) reap(id procID) bool {
	fd, err := unix.PidfdOpen(id.pid, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	st, ok := statOf(id.pid)
	if !ok || st.start != id.start || !st.dead() || st.ppid != t.self {
		return false
	}
	if !t.members[id] && !t.inherited(id, st, fd) {
		return false
	}
	var info unix.Siginfo
	return unix.Waitid(unix.P_PIDFD, fd, &info, unix.WEXITED|unix.WNOHANG, nil) == nil
}

// heldBySelf says whether a pidfd of this process (other than those
// excluded) refers to pid: exec.Cmd's, for a child it waits for itself.
// Unreadable, it says yes: nothing is collected on a doubt.
func (t *daemonTree) heldBySelf(pid int, exclude ...int) bool {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return true
	}
	want := []byte("Pid:\t" + strconv.Itoa(pid) + "\n")
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || slices.Contains(exclude, fd) {
			continue
		}
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || l != "anon_inode:[pidfd]" {
			continue
		}
		b, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil || bytes.Contains(b, want) {
			return true
		}
	}
	return false
}

// markedByDead says whether pid carries custody's marker naming the dead
// daemon as its host ("[<pid ns>.]<host pid>.<host start>.<scope>").
func (t *daemonTree) markedByDead(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		v, ok := bytes.CutPrefix(kv, []byte(custody.MarkerEnv+"="))
		if !ok {
			continue
		}
		f := strings.Split(string(v), ".")
		if len(f) == 4 {
			f = f[1:]
		}
		return len(f) == 3 && f[0] == strconv.Itoa(t.dead.pid) && f[1] == strconv.FormatUint(t.dead.start, 10)
	}
	return false
}

// follow collects the tree until it is gone (no process of it runs, and
// no zombie of it is left), ctx ends or treeDeadline passed. A SIGCHLD
// (a child exited, or a zombie was reparented to the server) wakes it.
func (t *daemonTree) follow(ctx context.Context, log *slog.Logger) {
	if t == nil {
		return
	}
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, unix.SIGCHLD)
	defer signal.Stop(chld)
	deadline := time.NewTimer(treeDeadline)
	defer deadline.Stop()
	tick := time.NewTicker(treeRescan)
	defer tick.Stop()
	total := 0
	for {
		total += t.collect()
		if len(t.running) == 0 {
			// A last pass: what exited while this one ran.
			total += t.collect()
			if len(t.running) == 0 {
				log.Info("the dead process daemon's processes are all collected", "daemon_pid", t.dead.pid, "collected_late", total)
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			log.Warn("the dead process daemon's processes still run; no longer following them", "daemon_pid", t.dead.pid, "pids", t.running, "collected_late", total)
			return
		case <-chld:
		case <-tick.C:
		}
	}
}

type procStat struct {
	state   byte
	ppid    int
	sid     int
	threads int
	start   uint64
}

// dead says whether the process has exited: a zombie whose main thread
// exited while other threads run (omp's, as it ends) still runs.
func (s procStat) dead() bool {
	return (s.state == 'Z' || s.state == 'X') && s.threads <= 1
}

// statOf reads a process's state, parent, session, threads and start
// time from /proc.
func statOf(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return procStat{}, false
	}
	f := bytes.Fields(b[i+2:]) // from field 3 (state)
	if len(f) < 20 {
		return procStat{}, false
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	sid, err2 := strconv.Atoi(string(f[3]))
	threads, err3 := strconv.Atoi(string(f[17]))
	start, err4 := strconv.ParseUint(string(f[19]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || len(f[0]) != 1 {
		return procStat{}, false
	}
	return procStat{state: f[0][0], ppid: ppid, sid: sid, threads: threads, start: start}, true
}
