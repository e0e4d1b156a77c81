//go:build linux

package custody

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// FindOrphans lists processes of this user that carry a MarkerEnv whose host
// (pid and start time) no longer runs. A process without a marker, of
// another user, or whose host is alive is never listed.
func FindOrphans() ([]Orphan, error) {
	p := &linuxPlatform{self: os.Getpid(), markers: map[ident]string{}}
	t := p.table()
	if t == nil {
		return nil, fmt.Errorf("custody: reading /proc failed")
	}
	uid := os.Getuid()
	var out []Orphan
	for _, pi := range t.byStart {
		if pi.pid == p.self || pi.state == 'Z' {
			continue
		}
		m := p.marker(pi)
		if m == "" || !ownedByUID(pi.pid, uid) {
			continue
		}
		host, hostStart, ok := parseMarker(m)
		if !ok {
			continue
		}
		if hs, alive := readStat(host); alive && hs.start == hostStart && hs.state != 'Z' {
			continue // its host runs: not an orphan
		}
		out = append(out, Orphan{PID: pi.pid, Cmdline: t.cmdline(pi), Marker: m, Host: host, start: pi.start})
	}
	return out, nil
}

// parseMarker reads "<host pid>.<host start>.<scope>".
func parseMarker(m string) (pid int, start uint64, ok bool) {
	parts := strings.Split(m, ".")
	if len(parts) != 3 {
		return 0, 0, false
	}
	pid, err1 := strconv.Atoi(parts[0])
	start, err2 := strconv.ParseUint(parts[1], 10, 64)
	return pid, start, err1 == nil && err2 == nil && pid > 0
}

func ownedByUID(pid, uid int) bool {
	fi, err := os.Stat("/proc/" + strconv.Itoa(pid))
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == uid
}

// KillOrphans ends the listed orphans: SIGTERM, up to grace for them to
// exit, then SIGKILL, each signal after re-checking the process's identity.
// It returns the pids not confirmed gone within ctx.
func KillOrphans(ctx context.Context, orphans []Orphan, grace time.Duration) ([]int, error) {
	p := &linuxPlatform{self: os.Getpid(), markers: map[ident]string{}}
	alive := func() []Orphan {
		var left []Orphan
		for _, o := range orphans {
			if a, z, ppid := p.state(ident{o.PID, o.start}); a || (z && ppid == p.self && !p.reap(o.PID)) {
				left = append(left, o)
			}
		}
		return left
	}
	for _, sig := range []sysSignal{sigTerm, sigKill} {
		for _, o := range alive() {
			p.signal(ident{o.PID, o.start}, sig)
		}
		deadline := time.Now().Add(grace)
		for len(alive()) > 0 && time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return pids(alive()), ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	if left := alive(); len(left) > 0 {
		return pids(left), fmt.Errorf("%w: %d orphan(s) survived SIGKILL", ErrNotConfirmed, len(left))
	}
	return nil, nil
}

func pids(os []Orphan) []int {
	out := make([]int, len(os))
	for i, o := range os {
		out[i] = o.PID
	}
	return out
}
