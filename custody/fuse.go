package custody

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A scope can be held to a deadline: past it, its processes are frozen
// (the cgroup's freezer where the scope is contained, else SIGSTOP to its
// process group and every owned process). A host in a cluster holds each
// room's agent to the room's lease this way, so that an agent whose host
// lost the lease stops acting even when the host cannot act itself.
//
// Without a cgroup, the fuse stops, besides the scope's process group,
// every process the host last listed as the scope's (with the hold), every
// process carrying the scope's marker, and every descendant of those it
// stops (a job that left the group with setsid: it kept working beside the
// next holder's agent); it looks again until it finds nothing new, and
// sends those the same SIGCONT or SIGKILL later. A process born between
// two of its looks, of a parent not stopped yet, that cleared its
// environment and left the group, is not found: only a cgroup (a delegated
// cgroup v2) contains every descendant.
//
// A hold made in this process is kept by a timer here, which a paused
// host (SIGSTOP, swap) does not run. A Fuse keeps it in a small process
// of its own instead: it freezes a scope whose deadline passes while the
// host is paused, and kills every scope it holds when the host dies.

// ErrNoFreeze is returned by Freeze and HoldUntil on a platform that
// cannot stop a process where it is (Windows).
var ErrNoFreeze = errors.New("custody: this platform cannot freeze processes")

// HoldUntil freezes the scope's processes at deadline unless HoldUntil is
// called again before with a later one (which also thaws a scope frozen
// by an earlier deadline). With Options.Fuse the hold is kept by the fuse
// process; otherwise by a timer in this process.
func (s *Scope) HoldUntil(deadline time.Time) error {
	if s.getPhase() >= 4 {
		return ErrScopeClosed
	}
	if !canFreeze {
		return ErrNoFreeze
	}
	if f := s.c.opts.Fuse; f != nil {
		err := f.hold(s, deadline)
		if err == nil {
			return nil
		}
		s.c.log.Error("custody: the fuse did not take a hold; holding in this process", "scope", s.id, "err", err)
	}
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	if s.holdTimer != nil {
		s.holdTimer.Stop()
	}
	if s.heldFrozen && time.Until(deadline) > 0 {
		s.heldFrozen = false
		_ = s.thaw()
	}
	s.holdTimer = time.AfterFunc(time.Until(deadline), func() {
		s.holdMu.Lock()
		defer s.holdMu.Unlock()
		s.heldFrozen = true
		_ = s.Freeze()
	})
	return nil
}

// Freeze stops every process of the scope at once, where it is (the
// cgroup's freezer where contained, and SIGSTOP to the group and to every
// owned process, each after its identity is re-checked). A frozen process
// still dies of SIGKILL: Kill and Close end it.
func (s *Scope) Freeze() error {
	if s.getPhase() >= 4 {
		return ErrScopeClosed
	}
	if !canFreeze {
		return ErrNoFreeze
	}
	cgroupFreeze(s.cg, true)
	return s.Signal(sigStopSyscall)
}

// thaw resumes a frozen scope.
func (s *Scope) thaw() error {
	if s.getPhase() >= 4 {
		return ErrScopeClosed
	}
	// SIGCONT first: sent, it discards a SIGSTOP still pending in a
	// frozen group, which would stop the processes once thawed.
	err := s.Signal(sigContSyscall)
	cgroupFreeze(s.cg, false)
	return err
}

// Kill ends every process of the scope at once (SIGKILL; cgroup.kill where
// contained), without the grace Close gives. Close still confirms them
// gone, reaps them and makes the receipt.
func (s *Scope) Kill() error {
	if s.getPhase() >= 4 {
		return ErrScopeClosed
	}
	s.cg.kill()
	return s.Signal(sigKillSyscall)
}

// Fuse is the process that keeps scopes' holds (see HoldUntil) while this
// one may be paused. Start it with StartFuse before the Custodian (its
// Options.Fuse), and Close it after the Custodian.
type Fuse struct {
	cmd    *exec.Cmd
	exited chan struct{}

	mu  sync.Mutex
	w   io.WriteCloser
	err error // the fuse is gone: holds are kept in this process
}

// StartFuse starts the fuse process: argv runs RunFuse with its stdin
// (e.g. the host's own binary with a hidden command). It runs in its own
// process group, so that a signal to the host's group (a terminal's ^C or
// ^Z) does not reach it, in the host's session, so that custody never
// takes it for an orphan of a scope.
func StartFuse(argv []string) (*Fuse, error) {
	if len(argv) == 0 {
		return nil, errors.New("custody: StartFuse needs a command")
	}
	if !canFreeze {
		return nil, ErrNoFreeze
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = stripMarker(os.Environ())
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	fuseGroup(cmd)
	w, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("custody: starting the fuse: %w", err)
	}
	f := &Fuse{cmd: cmd, w: w, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(f.exited)
	}()
	return f, nil
}

// Pid is the fuse process's pid.
func (f *Fuse) Pid() int { return f.cmd.Process.Pid }

func (f *Fuse) hold(s *Scope, deadline time.Time) error {
	// The deadline goes as a reading of the system's monotonic clock,
	// which the fuse reads too: taken after the clock, time.Until is no
	// later than the deadline, however long this process is paused in
	// between.
	now := monoNow()
	at := now + time.Until(deadline).Nanoseconds()
	// Without a cgroup, what the fuse stops besides the group: the
	// processes custody found the scope's (bounded), and its marker.
	members := "-"
	if s.cg == nil {
		var b strings.Builder
		for i, id := range s.liveIdents() {
			if i == maxHoldMembers {
				break
			}
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%d:%d", id.pid, id.start)
		}
		members = orDash(b.String())
	}
	line := fmt.Sprintf("hold %s %d %d %s %d %s %s\n", s.id, s.leader.pid, s.leader.start, orDash(cgroupDir(s.cg)), at, orDash(s.marker), members)
	return f.send(line)
}

// maxHoldMembers bounds the processes a hold lists.
const maxHoldMembers = 512

func (f *Fuse) send(line string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	if _, err := io.WriteString(f.w, line); err != nil {
		f.err = fmt.Errorf("custody: the fuse is gone: %w", err)
		return f.err
	}
	return nil
}

// Close ends the fuse: it kills any scope it still holds (none, after the
// Custodian closed) and exits.
func (f *Fuse) Close() error {
	f.mu.Lock()
	if f.err == nil {
		f.err = errors.New("custody: the fuse is closed")
	}
	_ = f.w.Close()
	f.mu.Unlock()
	select {
	case <-f.exited:
	case <-time.After(5 * time.Second):
		_ = f.cmd.Process.Kill()
		<-f.exited
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// fuseTarget is a scope the fuse holds.
type fuseTarget struct {
	pid    int
	start  uint64 // the leader's start time (0: not known here)
	cgroup string // its cgroup directory ("" for none)
	until  int64  // monotonic clock, ns
	frozen bool
	// Without a cgroup: the scope's marker ("" unknown), the processes
	// its host listed as the scope's, and those a freeze stopped one by
	// one (a thaw continues them).
	marker  string
	members []ident
	stopped []ident
}

// alive reports whether the target's leader is still the process it was.
func (t *fuseTarget) alive() bool {
	st, ok := procStart(t.pid)
	return ok && (t.start == 0 || st == t.start)
}

// RunFuse is the fuse process's main. It reads its host's holds from r,
// one a line ("hold ID PID START CGROUP UNTIL", UNTIL on the system's
// monotonic clock), freezes each scope whose deadline passes (and thaws it
// when a later hold comes), forgets a scope whose leader is gone, and when
// r ends (its host exited, or died) kills every scope it holds and
// returns.
func RunFuse(r io.Reader) error {
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	targets := map[string]*fuseTarget{}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	prune := time.NewTicker(5 * time.Second)
	defer prune.Stop()
	for {
		// The earliest deadline not passed yet.
		next := int64(-1)
		for _, t := range targets {
			if !t.frozen && (next < 0 || t.until < next) {
				next = t.until
			}
		}
		if next >= 0 {
			timer.Reset(max(time.Duration(next-monoNow()), 0))
		} else {
			timer.Reset(time.Hour)
		}
		select {
		case line, ok := <-lines:
			if !ok {
				for _, t := range targets {
					if t.alive() || t.cgroup != "" {
						killTarget(t)
					}
				}
				return nil
			}
			id, t, ok := parseHold(line)
			if !ok {
				fmt.Fprintf(os.Stderr, "agenthost fuse: ignoring a line it cannot read\n")
				continue
			}
			old := targets[id]
			targets[id] = t
			if old != nil && old.frozen {
				t.stopped = old.stopped
				if t.until > monoNow() {
					thawTarget(t)
				} else {
					t.frozen = true
				}
			}
		case <-timer.C:
			now := monoNow()
			for id, t := range targets {
				if t.frozen || t.until > now {
					continue
				}
				if !t.alive() && t.cgroup == "" {
					delete(targets, id)
					continue
				}
				freezeTarget(t)
				t.frozen = true
			}
		case <-prune.C:
			for id, t := range targets {
				if !t.alive() && !cgroupExists(t.cgroup) {
					delete(targets, id)
				}
			}
		}
	}
}

func parseHold(line string) (string, *fuseTarget, bool) {
	f := strings.Fields(line)
	if (len(f) != 6 && len(f) != 8) || f[0] != "hold" {
		return "", nil, false
	}
	pid, err1 := strconv.Atoi(f[2])
	start, err2 := strconv.ParseUint(f[3], 10, 64)
	until, err3 := strconv.ParseInt(f[5], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || pid <= 1 {
		return "", nil, false
	}
	t := &fuseTarget{pid: pid, start: start, until: until}
	if f[4] != "-" {
		t.cgroup = f[4]
	}
	if len(f) == 8 {
		if f[6] != "-" {
			t.marker = f[6]
		}
		if f[7] != "-" {
			for _, m := range strings.Split(f[7], ",") {
				p, s, ok := strings.Cut(m, ":")
				mpid, err1 := strconv.Atoi(p)
				mstart, err2 := strconv.ParseUint(s, 10, 64)
				if !ok || err1 != nil || err2 != nil || mpid <= 1 {
					return "", nil, false
				}
				t.members = append(t.members, ident{pid: mpid, start: mstart})
			}
		}
	}
	return f[1], t, true
}
