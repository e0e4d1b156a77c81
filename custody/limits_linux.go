//go:build linux

package custody

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// How limits and meters are found (Options.Resources):
//
//   - cgroup v2 with the memory, pids and cpu controllers (a pure v2 host):
//     the scopes' own groups (their containment) take the limits. The
//     controllers must be enabled in the parent's cgroup.subtree_control,
//     which the kernel allows only in a group that holds no process: a
//     host in a group of its own (systemd's Delegate=yes) moves itself
//     into a leaf below it (leafName) first, and its scopes' groups are
//     made beside that leaf.
//   - cgroup v1 hierarchies (a hybrid host, whose v2 hierarchy has none of
//     those controllers): a group per scope in each of the memory, pids,
//     cpu and cpuacct hierarchies, below the host's own group there. A
//     v1 group has no "start into it" (v2's CLONE_INTO_CGROUP), so the
//     leader is forked from a host thread moved into those groups for the
//     fork (v1 membership is per thread) and moved back: the leader is
//     born in them, with nothing it runs ever outside.
//   - neither (a host that may write no cgroup, such as a non-root one
//     without delegation): each process of a scope gets RLIMIT_AS (memory,
//     at least MinAddressSpace) and RLIMIT_NPROC (processes); CPU is not
//     limited and nothing is metered but Processes.

// leafName is the group a host moves itself into below the group it owns,
// so that the controllers can be enabled there for its scopes (a group
// with processes of its own cannot enable them). It does not start with
// cgroupPrefix: it is no scope's, and reap leaves it alone.
const leafName = "agenthost.host"

// v1Controllers are the cgroup v1 hierarchies custody uses.
var v1Controllers = []string{"memory", "pids", "cpu", "cpuacct"}

// v2Controllers are the cgroup v2 controllers custody enables for its
// scopes.
var v2Controllers = []string{"memory", "pids", "cpu"}

// Defaults of what a limited scope's groups are given.
const (
	// cpuPeriod is the period of a CPU quota, in microseconds (the
	// kernel's default).
	cpuPeriod = 100000
	// cpuWeight and cpuShares are every scope's CPU share (the kernel's
	// defaults, written so that every scope has the same whatever its
	// parent's children have).
	cpuWeight = 100
	cpuShares = 1024
)

// resources is a Custodian's means to limit and measure its scopes.
type resources struct {
	support Support
	// v2 are the controllers enabled for the scopes' cgroup v2 groups.
	v2 map[string]bool
	// v1 maps a controller to the directory its scopes' groups are made
	// in (the host's own group in that hierarchy); cpu and cpuacct may
	// share one (mounted together).
	v1 map[string]string
	// root: the host runs as root (RLIMIT_NPROC then counts per room
	// user, or not at all for root).
	root bool
}

// newResources finds what limits the host can apply; cgDir is the parent
// of the scopes' v2 groups ("" when there are none), v2 the controllers
// enabled there and why2 why none is when none is.
func newResources(cgDir string, v2 map[string]bool, why2 string) *resources {
	r := &resources{v2: v2, v1: map[string]string{}, root: os.Geteuid() == 0}
	var why []string
	if cgDir != "" && len(v2) == 0 && why2 != "" {
		why = append(why, why2)
	}
	if cgDir == "" {
		w := "no cgroup v2 group can be made for a scope here"
		if why2 != "" {
			w += ": " + why2
		}
		why = append(why, w)
	}
	need := []string{}
	for _, c := range v1Controllers {
		if !r.v2[c] && !(c == "cpuacct" && cgDir != "") { // v2 groups meter CPU without a controller
			need = append(need, c)
		}
	}
	if len(need) > 0 {
		found, whyV1 := probeV1(need)
		r.v1 = found
		if whyV1 != "" {
			why = append(why, whyV1)
		}
	}
	by := func(c string) Mechanism {
		switch {
		case cgDir != "" && r.v2[c]:
			return ByCgroupV2
		case r.v1[c] != "":
			return ByCgroupV1
		}
		return ByNothing
	}
	s := Support{Memory: by("memory"), Pids: by("pids"), CPU: by("cpu")}
	var fallback []string
	if s.Memory == ByNothing {
		s.Memory = ByRlimit
		fallback = append(fallback, fmt.Sprintf("memory is RLIMIT_AS on each process (at least %d GiB), not on the room as a whole", MinAddressSpace>>30))
	}
	if s.Pids == ByNothing {
		s.Pids = ByRlimit
		if r.root {
			fallback = append(fallback, "processes are RLIMIT_NPROC, counted per room user (root's own are not limited)")
		} else {
			fallback = append(fallback, "processes are RLIMIT_NPROC, counted over every process of the server's user")
		}
	}
	if s.CPU == ByNothing {
		fallback = append(fallback, "CPU is neither limited nor shared fairly")
	}
	s.Metered = s.Memory != ByRlimit && (cgDir != "" || r.v1["cpuacct"] != "")
	if len(fallback) > 0 {
		if !s.Metered {
			fallback = append(fallback, "no CPU time or peak memory is measured")
		}
		why = append(why, strings.Join(fallback, "; "))
	}
	if len(fallback) > 0 || !s.Enforced() {
		s.Why = strings.Join(why, "; ")
	}
	r.support = s
	return r
}

// prepareV2 makes the host's cgroup v2 group (dir, rel as /proc/PID/cgroup
// names it) one whose children can take the memory, pids and cpu
// controllers, moving the host into a leaf below it where needed. It
// returns the parent for the scopes' groups (dir itself, or its parent
// when the host is already in the leaf), the controllers enabled there,
// and why none is when none is.
func prepareV2(dir, rel string) (pdir, prel string, enabled map[string]bool, why string) {
	pdir, prel = dir, rel
	if filepath.Base(rel) == leafName {
		// This host, or the one that started it (a process daemon), moved
		// into the leaf before.
		pdir, prel = filepath.Dir(dir), filepath.Dir(rel)
	}
	enabled = map[string]bool{}
	avail := fieldsOf(filepath.Join(pdir, "cgroup.controllers"))
	var want []string
	for _, c := range v2Controllers {
		if slices.Contains(avail, c) {
			want = append(want, c)
		}
	}
	if len(want) == 0 {
		return pdir, prel, enabled, "the cgroup v2 hierarchy offers none of the memory, pids and cpu controllers here (they are in cgroup v1 hierarchies, or not delegated)"
	}
	on := fieldsOf(filepath.Join(pdir, "cgroup.subtree_control"))
	var need []string
	for _, c := range want {
		if slices.Contains(on, c) {
			enabled[c] = true
		} else {
			need = append(need, c)
		}
	}
	if len(need) == 0 {
		return pdir, prel, enabled, ""
	}
	if prel != "/" {
		// The group must hold no process of its own: this host (and the
		// children it started before custody, a fuse) move to the leaf.
		if err := moveToLeaf(pdir); err != nil {
			return pdir, prel, enabled, fmt.Sprintf("the cgroup v2 controllers cannot be enabled under %s: %v", prel, err)
		}
	}
	var b strings.Builder
	for _, c := range need {
		b.WriteString("+" + c + " ")
	}
	if err := os.WriteFile(filepath.Join(pdir, "cgroup.subtree_control"), []byte(strings.TrimSpace(b.String())), 0); err != nil {
		return pdir, prel, enabled, fmt.Sprintf("the cgroup v2 controllers cannot be enabled under %s: %v", prel, err)
	}
	for _, c := range need {
		enabled[c] = true
	}
	return pdir, prel, enabled, ""
}

// moveToLeaf moves this process, and its children in the same group, into
// dir's leaf group; it refuses when dir holds another's processes (a
// shell's, a sibling service's), which are not custody's to move.
func moveToLeaf(dir string) error {
	self := os.Getpid()
	var move []int
	for _, pid := range appendPids(nil, readSmall(filepath.Join(dir, "cgroup.procs"), nil)) {
		if pid == self {
			move = append(move, pid)
			continue
		}
		if pi, ok := readStat(pid); ok && pi.ppid == self {
			move = append(move, pid)
			continue
		}
		return fmt.Errorf("it holds other processes (pid %d) than this server's; run the server alone in a group of its own (a systemd service with Delegate=yes)", pid)
	}
	leaf := filepath.Join(dir, leafName)
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	for _, pid := range move {
		if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("moving pid %d into %s: %w", pid, leafName, err)
		}
	}
	return nil
}

// fieldsOf reads a file of space-separated words.
func fieldsOf(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	return strings.Fields(string(b))
}

// v1Mount is a cgroup v1 hierarchy's mount, from mountinfo.
type v1Mount struct {
	dir  string // where it is mounted
	root string // the mount's root within the hierarchy
}

// v1Mounts reads where the cgroup v1 hierarchy of each controller is
// mounted.
func v1Mounts() map[string]v1Mount {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	out := map[string]v1Mount{}
	for _, l := range strings.Split(string(b), "\n") {
		fields := strings.Fields(l)
		i := slices.Index(fields, "-")
		if i < 0 || i+3 >= len(fields) || fields[i+1] != "cgroup" || len(fields) < 5 {
			continue
		}
		for _, opt := range strings.Split(fields[i+3], ",") {
			out[opt] = v1Mount{dir: fields[4], root: fields[3]}
		}
	}
	return out
}

// v1Groups reads a cgroup file (/proc/self/cgroup, or a thread's) for the
// directory of its group in the v1 hierarchy of each controller in want.
func v1Groups(file string, mounts map[string]v1Mount, want []string) map[string]string {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			m, ok := mounts[c]
			if !ok || !slices.Contains(want, c) {
				continue
			}
			path := parts[2]
			if m.root != "/" {
				if rest, ok := strings.CutPrefix(path, m.root); ok {
					path = rest
				}
			}
			out[c] = filepath.Join(m.dir, path)
		}
	}
	return out
}

// probeV1 finds the cgroup v1 hierarchies of want in which this host may
// make a group and fork a process into it, and says why others are not
// usable.
func probeV1(want []string) (map[string]string, string) {
	own := v1Groups("/proc/self/cgroup", v1Mounts(), want)
	found := map[string]string{}
	var missing, denied []string
	var deniedErr error          // the first mkdir refused
	probe := map[string]string{} // controller -> the probe group
	made := map[string]string{}  // directory -> its probe group (cpu and cpuacct may share one)
	for _, c := range want {
		dir := own[c]
		if dir == "" {
			missing = append(missing, c)
			continue
		}
		if p, ok := made[dir]; ok {
			probe[c] = p
			continue
		}
		p := filepath.Join(dir, cgroupPrefix+"probe-"+strconv.Itoa(os.Getpid()))
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			denied = append(denied, c)
			if deniedErr == nil {
				deniedErr = err
			}
			continue
		}
		made[dir], probe[c] = p, p
	}
	defer func() {
		for _, p := range made {
			_ = os.Remove(p)
		}
	}()
	if len(probe) > 0 {
		var into []v1Target
		for c, p := range probe {
			if !slices.ContainsFunc(into, func(t v1Target) bool { return t.dir == p }) {
				into = append(into, v1Target{c, p})
			}
		}
		err := forkIn(into, func() error { return exec.Command("/bin/true").Run() })
		if err != nil {
			return nil, fmt.Sprintf("cgroup v1 groups can be made but not started in: %v", err)
		}
		for c := range probe {
			found[c] = own[c]
		}
	}
	var why []string
	if len(missing) > 0 {
		why = append(why, "no cgroup v1 hierarchy for "+strings.Join(missing, ", "))
	}
	if len(denied) > 0 {
		// Not root and nothing delegated, or (root too) hierarchies
		// mounted read-only, as a container's often are.
		reason := "not root, nothing delegated"
		var errno unix.Errno
		if os.Geteuid() == 0 || errors.Is(deniedErr, unix.EROFS) {
			reason = "read-only, or not this server's to write"
			if errors.As(deniedErr, &errno) {
				reason += ": " + errno.Error()
			}
		}
		why = append(why, "no cgroup v1 group of "+strings.Join(denied, ", ")+" may be made by this server ("+reason+")")
	}
	return found, strings.Join(why, "; ")
}

// v1Target is a group in the cgroup v1 hierarchy of a controller.
type v1Target struct{ controller, dir string }

// forkIn runs start (which forks) on a host thread moved into the cgroup
// v1 groups into for the fork: a process forked there is born in them.
// The thread is moved back after; one that cannot be is never used again
// (its goroutine ends locked to it, which ends the thread). The main
// thread is never the one moved (in v1 the memory of the whole process
// follows its leader).
func forkIn(into []v1Target, start func() error) error {
	if len(into) == 0 {
		return start()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() != os.Getpid() {
			errc <- onThread(into, start)
			return
		}
		// On the main thread: another goroutine, which cannot be given
		// this (locked) thread, does it.
		inner := make(chan error, 1)
		go func() {
			runtime.LockOSThread()
			inner <- onThread(into, start)
		}()
		err := <-inner
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// onThread is forkIn's work on the locked thread; it unlocks the thread
// only when it is back in its groups.
func onThread(into []v1Target, start func() error) error {
	tid := strconv.Itoa(unix.Gettid())
	ctrls := make([]string, len(into))
	for i, t := range into {
		ctrls[i] = t.controller
	}
	back := v1Groups("/proc/self/task/"+tid+"/cgroup", v1Mounts(), ctrls)
	moved := 0
	var err error
	for _, t := range into {
		if back[t.controller] == "" {
			err = fmt.Errorf("the thread's %s group is not known", t.controller)
			break
		}
		if err = os.WriteFile(filepath.Join(t.dir, "tasks"), []byte(tid), 0); err != nil {
			err = fmt.Errorf("moving a thread into %s: %w", t.dir, err)
			break
		}
		moved++
	}
	if err == nil {
		err = start()
	}
	for _, t := range into[:moved] {
		if os.WriteFile(filepath.Join(back[t.controller], "tasks"), []byte(tid), 0) != nil {
			return err // the thread ends with its goroutine
		}
	}
	runtime.UnlockOSThread()
	return err
}

// scopeRes is a scope's limits and meters: its groups.
type scopeRes struct {
	r  *resources
	v2 string // the scope's v2 group (its containment group), "" without one
	// v1 maps a controller to the scope's group in its hierarchy.
	v1     map[string]string
	limits Limits
	// rlimits stand in for the limits no group holds.
	rlimits []rlimit

	mu     sync.Mutex
	peakFD int    // v2 memory.peak opened for a reset (-1: none)
	final  *Usage // read before the groups were removed
}

// prepare makes the scope's groups and writes its limits; cg is the
// scope's v2 group (nil without one). On an error nothing is left.
func (r *resources) prepare(name string, cg *cgroup, l Limits) (*scopeRes, error) {
	sr := &scopeRes{r: r, v1: map[string]string{}, limits: l, peakFD: -1}
	if cg != nil {
		sr.v2 = cg.dir
		if err := sr.limitV2(l); err != nil {
			return nil, err
		}
	}
	made := map[string]string{}
	for _, c := range v1Controllers {
		parent := r.v1[c]
		if parent == "" {
			continue
		}
		if d, ok := made[parent]; ok {
			sr.v1[c] = d
			continue
		}
		d := filepath.Join(parent, cgroupPrefix+name)
		if err := os.Mkdir(d, 0o755); err != nil {
			sr.removeV1()
			return nil, fmt.Errorf("custody: making the scope's %s group: %w", c, err)
		}
		made[parent], sr.v1[c] = d, d
	}
	if err := sr.limitV1(l); err != nil {
		sr.removeV1()
		return nil, err
	}
	sr.rlimits = r.rlimitsFor(l)
	return sr, nil
}

// limitV2 writes l into the scope's v2 group, for the controllers enabled.
func (sr *scopeRes) limitV2(l Limits) error {
	w := func(file, v string) error {
		if err := os.WriteFile(filepath.Join(sr.v2, file), []byte(v), 0); err != nil {
			return fmt.Errorf("custody: setting the scope's %s to %s: %w", file, v, err)
		}
		return nil
	}
	en := sr.r.v2
	if en["memory"] && l.Memory > 0 {
		if err := w("memory.max", strconv.FormatInt(l.Memory, 10)); err != nil {
			return err
		}
		// Reclaim and throttling start a little below the limit.
		if err := w("memory.high", strconv.FormatInt(l.Memory-l.Memory/10, 10)); err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(sr.v2, "memory.swap.max")); err == nil {
			if err := w("memory.swap.max", "0"); err != nil {
				return err
			}
		}
	}
	if en["pids"] && l.Pids > 0 {
		if err := w("pids.max", strconv.FormatInt(l.Pids, 10)); err != nil {
			return err
		}
	}
	if en["cpu"] {
		if err := w("cpu.weight", strconv.Itoa(cpuWeight)); err != nil {
			return err
		}
		if l.CPU > 0 {
			if err := w("cpu.max", fmt.Sprintf("%d %d", cpuQuota(l.CPU), cpuPeriod)); err != nil {
				return err
			}
		}
	}
	return nil
}

// cpuQuota is cores' quota per cpuPeriod, in microseconds (at least the
// kernel's least, 1 ms).
func cpuQuota(cores float64) int64 {
	return max(int64(math.Round(cores*cpuPeriod)), 1000)
}

// limitV1 writes l into the scope's v1 groups.
func (sr *scopeRes) limitV1(l Limits) error {
	w := func(c, file, v string) error {
		if err := os.WriteFile(filepath.Join(sr.v1[c], file), []byte(v), 0); err != nil {
			return fmt.Errorf("custody: setting the scope's %s to %s: %w", file, v, err)
		}
		return nil
	}
	if sr.v1["memory"] != "" && l.Memory > 0 {
		v := strconv.FormatInt(l.Memory, 10)
		if err := w("memory", "memory.limit_in_bytes", v); err != nil {
			return err
		}
		// Memory and swap together no more than memory alone: no swap
		// (where the kernel accounts swap).
		if _, err := os.Stat(filepath.Join(sr.v1["memory"], "memory.memsw.limit_in_bytes")); err == nil {
			if err := w("memory", "memory.memsw.limit_in_bytes", v); err != nil {
				return err
			}
		}
	}
	if sr.v1["pids"] != "" && l.Pids > 0 {
		if err := w("pids", "pids.max", strconv.FormatInt(l.Pids, 10)); err != nil {
			return err
		}
	}
	if sr.v1["cpu"] != "" {
		if err := w("cpu", "cpu.shares", strconv.Itoa(cpuShares)); err != nil {
			return err
		}
		if l.CPU > 0 {
			if err := w("cpu", "cpu.cfs_period_us", strconv.Itoa(cpuPeriod)); err != nil {
				return err
			}
			if err := w("cpu", "cpu.cfs_quota_us", strconv.FormatInt(cpuQuota(l.CPU), 10)); err != nil {
				return err
			}
		}
	}
	return nil
}

// v1Dirs are the scope's distinct v1 groups.
func (sr *scopeRes) v1Dirs() []string {
	var out []string
	for _, t := range sr.v1Targets() {
		out = append(out, t.dir)
	}
	return out
}

// v1Targets are the scope's distinct v1 groups, each with a controller
// of its hierarchy.
func (sr *scopeRes) v1Targets() []v1Target {
	if sr == nil {
		return nil
	}
	var out []v1Target
	for _, c := range v1Controllers {
		if d := sr.v1[c]; d != "" && !slices.ContainsFunc(out, func(t v1Target) bool { return t.dir == d }) {
			out = append(out, v1Target{c, d})
		}
	}
	return out
}

// start runs start (which forks the leader) so that the leader is born in
// the scope's v1 groups.
func (sr *scopeRes) start(start func() error) error {
	if sr == nil {
		return start()
	}
	return forkIn(sr.v1Targets(), start)
}

// started applies the rlimits of a scope no group limits to its leader,
// as it starts (it has run no more than its exec), and to each process
// custody finds in the scope after (what the leader forked before the
// first may have missed them).
func (sr *scopeRes) started(pid int) {
	if sr == nil {
		return
	}
	for _, rl := range sr.rlimits {
		_ = unix.Prlimit(pid, rl.resource, &unix.Rlimit{Cur: rl.v, Max: rl.v}, nil)
	}
}

// rlimitsFor are the rlimits standing in for the limits no group holds.
func (r *resources) rlimitsFor(l Limits) []rlimit {
	var out []rlimit
	s := r.support
	if s.Memory == ByRlimit && l.Memory > 0 {
		out = append(out, rlimit{unix.RLIMIT_AS, uint64(max(l.Memory, MinAddressSpace))})
	}
	if s.Pids == ByRlimit && l.Pids > 0 {
		v := uint64(l.Pids)
		if !r.root {
			// Counted over every task of the server's user: what runs
			// now, and the room's share on top.
			v += uint64(userTasks(os.Getuid()))
		}
		out = append(out, rlimit{unix.RLIMIT_NPROC, v})
	}
	return out
}

// rlimit is one resource limit.
type rlimit struct {
	resource int
	v        uint64
}

// userTasks counts the tasks (threads) whose real uid is uid, as
// RLIMIT_NPROC counts them.
func userTasks(uid int) int {
	n := 0
	want := strconv.Itoa(uid)
	var buf [2048]byte
	for _, pid := range listPids("/proc") {
		b := readSmall("/proc/"+strconv.Itoa(pid)+"/status", buf[:0])
		real, threads := "", 0
		for _, l := range bytes.Split(b, []byte{'\n'}) {
			if rest, ok := bytes.CutPrefix(l, []byte("Uid:")); ok {
				if f := bytes.Fields(rest); len(f) > 0 {
					real = string(f[0])
				}
			} else if rest, ok := bytes.CutPrefix(l, []byte("Threads:")); ok {
				threads, _ = strconv.Atoi(string(bytes.TrimSpace(rest)))
			}
		}
		if real == want {
			n += max(threads, 1)
		}
	}
	return n
}

// usage reads the scope's groups (after they were removed, what they had
// last).
func (sr *scopeRes) usage() Usage {
	if sr == nil {
		return Usage{}
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	if sr.final != nil {
		return *sr.final
	}
	return sr.readLocked()
}

func (sr *scopeRes) readLocked() Usage {
	var u Usage
	var buf [1024]byte
	cpuKnown := false
	if sr.v2 != "" {
		if v, ok := keyed(readSmall(filepath.Join(sr.v2, "cpu.stat"), buf[:0]), "usage_usec"); ok {
			u.CPU, cpuKnown = time.Duration(v)*time.Microsecond, true
		}
	}
	if d := sr.v1["cpuacct"]; !cpuKnown && d != "" {
		if v, err := strconv.ParseInt(string(bytes.TrimSpace(readSmall(filepath.Join(d, "cpuacct.usage"), buf[:0]))), 10, 64); err == nil {
			u.CPU, cpuKnown = time.Duration(v), true
		}
	}
	peakKnown := false
	switch {
	case sr.v2 != "" && sr.r.v2["memory"]:
		if sr.peakFD >= 0 {
			n, err := unix.Pread(sr.peakFD, buf[:], 0)
			if err == nil && n > 0 {
				u.PeakMemory, _ = strconv.ParseInt(string(bytes.TrimSpace(buf[:n])), 10, 64)
				peakKnown = true
			}
		}
		if !peakKnown {
			if v, err := strconv.ParseInt(string(bytes.TrimSpace(readSmall(filepath.Join(sr.v2, "memory.peak"), buf[:0]))), 10, 64); err == nil {
				u.PeakMemory, peakKnown = v, true
			}
		}
		u.OOMKills, _ = keyed(readSmall(filepath.Join(sr.v2, "memory.events"), buf[:0]), "oom_kill")
	case sr.v1["memory"] != "":
		d := sr.v1["memory"]
		if v, err := strconv.ParseInt(string(bytes.TrimSpace(readSmall(filepath.Join(d, "memory.max_usage_in_bytes"), buf[:0]))), 10, 64); err == nil {
			u.PeakMemory, peakKnown = v, true
		}
		u.OOMKills, _ = keyed(readSmall(filepath.Join(d, "memory.oom_control"), buf[:0]), "oom_kill")
	}
	switch {
	case sr.v2 != "" && sr.r.v2["pids"]:
		u.ForksRefused, _ = keyed(readSmall(filepath.Join(sr.v2, "pids.events"), buf[:0]), "max")
	case sr.v1["pids"] != "":
		u.ForksRefused, _ = keyed(readSmall(filepath.Join(sr.v1["pids"], "pids.events"), buf[:0]), "max")
	}
	u.Metered = cpuKnown && peakKnown
	return u
}

// keyed reads the value of key in a flat keyed file ("key value" lines).
func keyed(b []byte, key string) (int64, bool) {
	for _, l := range bytes.Split(b, []byte{'\n'}) {
		k, v, ok := bytes.Cut(l, []byte{' '})
		if ok && string(k) == key {
			n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// resetPeak starts a new peak window: memory.peak opened and written
// (its value then counts from the write, for reads through that
// descriptor: kernels since 6.12), or v1's max_usage_in_bytes set to 0.
func (sr *scopeRes) resetPeak() error {
	if sr == nil {
		return nil
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	if sr.final != nil {
		return nil
	}
	switch {
	case sr.v2 != "" && sr.r.v2["memory"]:
		if sr.peakFD < 0 {
			fd, err := unix.Open(filepath.Join(sr.v2, "memory.peak"), unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			sr.peakFD = fd
		}
		if _, err := unix.Pwrite(sr.peakFD, []byte("reset\n"), 0); err != nil {
			unix.Close(sr.peakFD)
			sr.peakFD = -1
			return err
		}
	case sr.v1["memory"] != "":
		return os.WriteFile(filepath.Join(sr.v1["memory"], "memory.max_usage_in_bytes"), []byte("0"), 0)
	}
	return nil
}

// keep reads the groups a last time, before they are removed: usage
// answers that from then on.
func (sr *scopeRes) keep() {
	if sr == nil {
		return
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	if sr.final == nil {
		u := sr.readLocked()
		sr.final = &u
	}
	if sr.peakFD >= 0 {
		unix.Close(sr.peakFD)
		sr.peakFD = -1
	}
}

// removeV1 removes the scope's v1 groups (and any below them), which only
// empty groups allow; what cannot be removed now, reap removes once its
// host is gone.
func (sr *scopeRes) removeV1() error {
	if sr == nil {
		return nil
	}
	var errs []error
	for _, d := range sr.v1Dirs() {
		if err := removeTree(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeTree removes dir and every directory below it, deepest first.
func removeTree(dir string) error {
	var err error
	(&cgroup{dir: dir}).walk(func(d string) {
		if e := os.Remove(d); e != nil && !errors.Is(e, fs.ErrNotExist) && err == nil {
			err = e
		}
	})
	return err
}

// removeDeadV1Groups removes the empty cgroup v1 groups of dead hosts'
// scopes (their processes, in the scope's v2 group too, were ended by
// then): those a host killed with -9 left.
func removeDeadV1Groups(v *hostCheck, uid int) {
	mounts := v1Mounts()
	seen := map[string]bool{}
	for _, c := range v1Controllers {
		mnt := mounts[c].dir
		if mnt == "" || seen[mnt] {
			continue
		}
		seen[mnt] = true
		n := 0
		_ = filepath.WalkDir(mnt, func(path string, d fs.DirEntry, err error) error {
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
			if hm, ok := parseMarker(name); ok && hm.ns != 0 && dirOwnedBy(path, uid) && v.dead(hm, 0) {
				if len(appendPids(nil, readSmall(filepath.Join(path, "cgroup.procs"), nil))) == 0 {
					_ = removeTree(path)
				}
			}
			return filepath.SkipDir
		})
	}
}
