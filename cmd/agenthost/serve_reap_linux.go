package main

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// deadChildWait bounds waiting for a dead daemon to become a zombie (its
// exit is under way when its sockets close).
const deadChildWait = 5 * time.Second

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
		if st.state == 'Z' {
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

// reapStrays collects this process's zombie children in other sessions
// than its own (see reapDaemon for why they are the dead daemon's) and
// reports how many.
func reapStrays() int {
	self := os.Getpid()
	own, ok := statOf(self)
	if !ok {
		return 0
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, ok := statOf(pid)
		if !ok || st.ppid != self || st.state != 'Z' || st.sid == own.sid {
			continue
		}
		var ws unix.WaitStatus
		if got, _ := unix.Wait4(pid, &ws, unix.WNOHANG, nil); got == pid {
			n++
		}
	}
	return n
}

type procStat struct {
	state byte
	ppid  int
	sid   int
}

// statOf reads a process's state, parent and session from /proc.
func statOf(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return procStat{}, false
	}
	f := bytes.Fields(b[i+2:])
	if len(f) < 5 {
		return procStat{}, false
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	sid, err2 := strconv.Atoi(string(f[3]))
	if err1 != nil || err2 != nil || len(f[0]) != 1 {
		return procStat{}, false
	}
	return procStat{state: f[0][0], ppid: ppid, sid: sid}, true
}
