//go:build linux

package custody

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// FindOrphans lists processes of this user whose host is proven gone: those
// that carry a MarkerEnv whose host no longer runs, and those left in the
// cgroup directory of a scope whose host no longer runs (even without a
// marker). A host is compared in its own pid namespace (named in the
// marker); a marker whose host cannot be checked from here (a pid namespace
// this process cannot see) is not an orphan. A process without a marker
// outside such a cgroup, or whose host is alive, is never listed, nor, for
// a caller that is not root, one of another user (root's hosts run their
// agents on uids of their own, so root lists them whatever their uid).
func FindOrphans() ([]Orphan, error) {
	p := newLinuxPlatform()
	t := p.table()
	if t == nil {
		return nil, fmt.Errorf("custody: reading /proc failed")
	}
	v := &hostCheck{p: p, t: t}
	uid := os.Getuid()
	inDir := map[int]string{} // pid -> the dead host's cgroup it is in (or below)
	for _, dir := range v.deadCgroups(uid) {
		for pid := range cgroupAt(dir).members() {
			inDir[pid] = dir
		}
	}
	var out []Orphan
	for _, pi := range t.byStart {
		// A process whose main thread exited while others run shows as a
		// zombie, but runs: it is listed.
		if pi.pid == p.self || pi.dead() {
			continue
		}
		dir := inDir[pi.pid]
		m := p.marker(pi)
		// Root's hosts start their agents on uids of their own (a room's
		// agent uid), so root's orphans are any user's; a host that is not
		// root lists only its own user's.
		if (m == "" && dir == "") || (uid != 0 && !ownedByUID(pi.pid, uid)) {
			continue
		}
		hm, ok := parseMarker(m)
		switch {
		case ok && v.dead(hm, pi.pid):
		case ok:
			continue // its own marker's host runs, or cannot be checked
		case dir != "": // no marker, in a dead host's cgroup
			m = strings.TrimPrefix(filepath.Base(dir), cgroupPrefix)
			hm, _ = parseMarker(m)
		default:
			continue
		}
		cmdline, _ := boundCmdline(t.cmdline(pi))
		out = append(out, Orphan{PID: pi.pid, Cmdline: cmdline, Marker: m, Host: hm.pid, Cgroup: dir, start: pi.start})
	}
	return out, nil
}

// hostMarker is a marker's host: ns is the inode of its pid namespace, 0
// in the format of earlier versions ("<pid>.<start>.<scope>"), which did
// not say.
type hostMarker struct {
	ns    uint64
	pid   int
	start uint64
}

// parseMarker reads "<pid ns>.<host pid>.<host start>.<scope>", or the
// earlier "<host pid>.<host start>.<scope>".
func parseMarker(m string) (hostMarker, bool) {
	parts := strings.Split(m, ".")
	var h hostMarker
	var errNS error
	switch len(parts) {
	case 4:
		h.ns, errNS = strconv.ParseUint(parts[0], 10, 64)
		parts = parts[1:]
	case 3:
	default:
		return h, false
	}
	pid, err1 := strconv.Atoi(parts[0])
	start, err2 := strconv.ParseUint(parts[1], 10, 64)
	h.pid, h.start = pid, start
	return h, errNS == nil && err1 == nil && err2 == nil && pid > 0 && parts[2] != ""
}

// hostCheck decides whether a marker's host is proven gone.
type hostCheck struct {
	p  *linuxPlatform
	t  *procTable
	ns map[uint64]map[int]bool // pid namespace -> the pids in it, counted there; built on first need
}

// dead says whether the host of m is proven not to run. carrier is the pid
// of the process carrying m (0 for a cgroup directory's name).
func (v *hostCheck) dead(m hostMarker, carrier int) bool {
	switch {
	case m.ns == 0:
		// The earlier format: its pid counts in the host's namespace, which
		// is known to be ours only if the carrier is in ours.
		if carrier == 0 || v.p.pidNS == 0 || pidNamespace(strconv.Itoa(carrier)) != v.p.pidNS {
			return false
		}
		return !v.runs(m)
	case m.ns == v.p.pidNS:
		return !v.runs(m)
	default:
		// Another namespace: checkable only if it is visible from here
		// (ours or below ours, so all of its processes are visible); then
		// any process there on the host's pid counts as the host (start
		// times may be shifted by a time namespace).
		pids, visible := v.namespace(m.ns)
		return visible && !pids[m.pid]
	}
}

// runs says whether the host (pid counted in our namespace) is alive.
func (v *hostCheck) runs(m hostMarker) bool {
	hs, ok := readStat(m.pid)
	return ok && hs.start == m.start && !hs.dead()
}

// namespace lists the pids (as counted inside it) of the processes in pid
// namespace ns; false if no process here is in it.
func (v *hostCheck) namespace(ns uint64) (map[int]bool, bool) {
	if v.ns == nil {
		v.ns = map[uint64]map[int]bool{}
		for _, pi := range v.t.byStart {
			n := pidNamespace(strconv.Itoa(pi.pid))
			inner := innermostPid(pi.pid)
			if n == 0 || inner == 0 {
				continue
			}
			if v.ns[n] == nil {
				v.ns[n] = map[int]bool{}
			}
			v.ns[n][inner] = true
		}
	}
	pids, ok := v.ns[ns]
	return pids, ok
}

// innermostPid is a process's pid in its own pid namespace (the last NSpid
// field of its status), 0 if unreadable.
func innermostPid(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				return 0
			}
			n, _ := strconv.Atoi(f[len(f)-1])
			return n
		}
	}
	return 0
}

// deadCgroups lists the scope cgroup directories, owned by uid, whose
// host is proven gone.
func (v *hostCheck) deadCgroups(uid int) []string {
	root := cgroup2Mount()
	if root == "" {
		return nil
	}
	var out []string
	n := 0
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if n++; n > maxCgroupDirs {
			return filepath.SkipAll
		}
		name, ok := strings.CutPrefix(d.Name(), cgroupPrefix)
		if !ok {
			return nil
		}
		// A scope's directory is named after its marker (the probe's and
		// those of earlier versions are not, and are left alone). What is
		// below it (groups its processes made, a nested agenthost's) is
		// its own: its members and removal cover them.
		if hm, ok := parseMarker(name); ok && hm.ns != 0 && dirOwnedBy(path, uid) && v.dead(hm, 0) {
			out = append(out, path)
		}
		return filepath.SkipDir
	})
	return out
}

func dirOwnedBy(path string, uid int) bool {
	fi, err := os.Stat(path)
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == uid
}

// ownedByUID says whether pid runs as uid (its real uid, from status: the
// owner of /proc/PID is root for a non-dumpable process).
func ownedByUID(pid, uid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Uid:"); ok {
			f := strings.Fields(rest)
			return len(f) > 0 && f[0] == strconv.Itoa(uid)
		}
	}
	return false
}

// KillOrphans ends the listed orphans: SIGTERM, up to grace for them to
// exit, then SIGKILL, each signal after re-checking the process's identity
// (and through a pidfd, so it reaches a thread group whose main thread
// exited). Then the cgroup directories of dead hosts are removed, with the
// groups below them (killing what is left in those the orphans were found
// in). It returns the pids not confirmed gone within ctx.
func KillOrphans(ctx context.Context, orphans []Orphan, grace time.Duration) ([]int, error) {
	p := newLinuxPlatform()
	alive := func() []Orphan {
		var left []Orphan
		for _, o := range orphans {
			a, z, ppid := p.state(ident{o.PID, o.start})
			if a {
				left = append(left, o)
			} else if z && ppid == p.self {
				if gone, _ := p.reap(ident{o.PID, o.start}); !gone {
					left = append(left, o)
				}
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
	if err := removeDeadCgroups(ctx, p, orphans, grace); err != nil {
		return nil, err
	}
	return nil, nil
}

// cgroupAt is the cgroup at dir (a directory of the cgroup2 mount).
func cgroupAt(dir string) *cgroup {
	rel := "/"
	if m := cgroup2Mount(); m != "" {
		if r, err := filepath.Rel(m, dir); err == nil && r != "." {
			rel = "/" + r
		}
	}
	return &cgroup{dir: dir, rel: rel, fd: -1, dirfd: -1, procfd: -1}
}

// removeDeadCgroups removes the cgroup directories of dead hosts, each
// with the groups below it: those the orphans were found in are emptied
// first (cgroup.kill and a SIGKILL to each member by pid: a dead host's
// group holds only its orphans); the others are removed if empty.
func removeDeadCgroups(ctx context.Context, p *linuxPlatform, orphans []Orphan, grace time.Duration) error {
	t := p.table()
	if t == nil {
		return nil
	}
	kill := map[string]bool{}
	for _, o := range orphans {
		if o.Cgroup != "" {
			kill[o.Cgroup] = true
		}
	}
	v := &hostCheck{p: p, t: t}
	var errs []error
	for _, dir := range v.deadCgroups(os.Getuid()) {
		cg := cgroupAt(dir)
		if !kill[dir] {
			if !cg.populated() {
				_ = cg.remove() // an empty leftover; a busy one is not ours to end
			}
			continue
		}
		cg.kill()
		// The group empties once its members have exited (zombies do not
		// count); those a subreaper host inherited are reaped here.
		reapZombieMembers(p, cg)
		if !cg.waitEmpty(ctx, grace) {
			errs = append(errs, fmt.Errorf("custody: %s still holds %s", dir, cg.memberList()))
			continue
		}
		reapZombieMembers(p, cg)
		if err := cg.remove(); err != nil {
			errs = append(errs, fmt.Errorf("custody: removing %s: %w", dir, err))
		}
	}
	// Their groups in the cgroup v1 hierarchies (limits), empty by now.
	removeDeadV1Groups(v, os.Getuid())
	if len(errs) > 0 {
		return fmt.Errorf("%w: %v", ErrNotConfirmed, errs)
	}
	return nil
}

func pids(os []Orphan) []int {
	out := make([]int, len(os))
	for i, o := range os {
		out[i] = o.PID
	}
	return out
}

// reapZombieMembers collects the group's zombies that are this process's
// children (a host that is a subreaper inherits a dead host's orphans, and
// an unreaped zombie keeps the group from being removed). None of them is
// an exec.Cmd child of ours: they belong to the dead host's group.
func reapZombieMembers(p *linuxPlatform, cg *cgroup) {
	for pid := range cg.members() {
		if pi, ok := readStat(pid); ok && pi.dead() && pi.ppid == p.self {
			p.reap(ident{pid, pi.start})
		}
	}
}
