//go:build linux

package custody

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

type sysSignal = unix.Signal

const (
	sigTerm = unix.SIGTERM
	sigKill = unix.SIGKILL
)

type procInfo struct {
	pid, ppid, pgid, sid int
	start                uint64
	state                byte
}

// procTable is one read of /proc, oldest process first.
type procTable struct {
	byStart []procInfo
	byPid   map[int]int // pid -> index in byStart
	plat    *linuxPlatform
	// tick is the boot-time clock, in the ticks of a stat start time, read
	// before the table: every process in it was alive at tick or later.
	tick   uint64
	at     time.Time        // when the read began
	groups map[int]struct{} // every pgid and sid in the table, built on demand
}

// groupInUse says whether some process in the table has pgid or sid gid
// (so the pid gid cannot have been reused).
func (t *procTable) groupInUse(gid int) bool {
	if t.groups == nil {
		t.groups = make(map[int]struct{}, len(t.byStart))
		for _, p := range t.byStart {
			t.groups[p.pgid] = struct{}{}
			t.groups[p.sid] = struct{}{}
		}
	}
	_, ok := t.groups[gid]
	return ok
}

// clockTicks is USER_HZ, the unit of a stat start time: 100 on every Linux
// architecture Go supports.
const clockTicks = 100

// bootTicks reads the boot-time clock in stat start-time ticks, rounded
// down (as start times are).
func bootTicks() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0 // no process is born before tick 0: nothing relies on it
	}
	return uint64(ts.Nano()) / (1e9 / clockTicks)
}

// lookup finds a process by identity in the table.
func (t *procTable) lookup(id ident) (procInfo, bool) {
	i, ok := t.byPid[id.pid]
	if !ok || t.byStart[i].start != id.start {
		return procInfo{}, false
	}
	return t.byStart[i], true
}

func (t *procTable) marker(p procInfo) string { return t.plat.marker(p) }

func (t *procTable) cmdline(p procInfo) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.pid))
	if err != nil || len(b) == 0 {
		return "?"
	}
	return strings.TrimSpace(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
}

type linuxPlatform struct {
	self      int
	selfStart uint64
	selfSid   int
	pidNS     uint64 // inode of our pid namespace, 0 if unknown
	cgRoot    string // our cgroup v2 directory, "" without cgroup support
	cgRel     string // the same, as /proc/PID/cgroup names it

	mu      sync.Mutex
	markers map[ident]string // environ lookups, pruned to live processes
}

func newPlatform(opts Options) (platform, error) {
	p := newLinuxPlatform()
	if !opts.NoSubreaper {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return nil, fmt.Errorf("custody: becoming a child subreaper: %w", err)
		}
	}
	if !opts.NoCgroup {
		p.cgRoot, p.cgRel = probeCgroup()
	}
	return p, nil
}

func newLinuxPlatform() *linuxPlatform {
	p := &linuxPlatform{self: os.Getpid(), markers: map[ident]string{}}
	if pi, ok := readStat(p.self); ok {
		p.selfStart, p.selfSid = pi.start, pi.sid
	}
	p.pidNS = pidNamespace("self")
	return p
}

// pidNamespace is the inode of the pid namespace of /proc/<pid> (pid may
// be "self"), 0 if unreadable.
func pidNamespace(pid string) uint64 {
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+pid+"/ns/pid", &st); err != nil {
		return 0
	}
	return st.Ino
}

func (p *linuxPlatform) ownerID() string {
	return fmt.Sprintf("%d.%d.%d", p.pidNS, p.self, p.selfStart)
}
func (p *linuxPlatform) selfPid() int     { return p.self }
func (p *linuxPlatform) hostSession() int { return p.selfSid }
func (p *linuxPlatform) ticks() uint64    { return bootTicks() }

func (p *linuxPlatform) lookup(id ident) (procInfo, bool) {
	pi, ok := readStat(id.pid)
	return pi, ok && pi.start == id.start
}

// cgroupOf reads the cgroup v2 path of pid; a zombie still names the
// cgroup it died in.
func (p *linuxPlatform) cgroupOf(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rel, ok := strings.CutPrefix(l, "0::"); ok {
			return rel
		}
	}
	return ""
}

func (p *linuxPlatform) containment(cg bool) Containment {
	if cg {
		return ContainCgroup
	}
	return ContainPortable
}

func (p *linuxPlatform) prepare(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// Its own session: pgid = sid = its pid, and no controlling terminal.
	cmd.SysProcAttr.Setsid = true
}

// readStat parses /proc/PID/stat.
func readStat(pid int) (procInfo, bool) {
	var buf [512]byte
	return readStatBuf(pid, buf[:])
}

// readStatBuf reads /proc/PID/stat into buf (no allocation when the path
// and line fit) and parses it.
func readStatBuf(pid int, buf []byte) (procInfo, bool) {
	return readStatAt(unix.AT_FDCWD, "/proc/", pid, buf)
}

// readStatAt reads dir/PID/stat, dir relative to dirfd (a table opens
// /proc once and reads every process relative to it).
func readStatAt(dirfd int, dir string, pid int, buf []byte) (procInfo, bool) {
	var path [40]byte
	p := append(append(append(path[:0], dir...), strconv.Itoa(pid)...), "/stat"...)
	fd, err := unix.Openat(dirfd, string(p), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return procInfo{}, false
	}
	n, err := unix.Read(fd, buf)
	unix.Close(fd)
	if err != nil || n <= 0 {
		return procInfo{}, false
	}
	return parseStat(pid, buf[:n])
}

// parseStat reads fields 3 (state), 4 (ppid), 5 (pgrp), 6 (session) and
// 22 (start time) of a stat line. The command name (field 2) may hold
// spaces and parentheses, so fields are counted from the last ')'.
func parseStat(pid int, b []byte) (procInfo, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return procInfo{}, false
	}
	b = b[i+2:]
	pi := procInfo{pid: pid, state: b[0]}
	field := 3
	var num uint64
	inNum := false
	for j := 0; j <= len(b) && field <= 22; j++ {
		if j < len(b) && b[j] != ' ' && b[j] != '\n' {
			if c := b[j]; c >= '0' && c <= '9' {
				num = num*10 + uint64(c-'0')
			}
			inNum = true
			continue
		}
		if !inNum {
			continue
		}
		switch field {
		case 4:
			pi.ppid = int(num)
		case 5:
			pi.pgid = int(num)
		case 6:
			pi.sid = int(num)
		case 22:
			pi.start = num
			return pi, true
		}
		field++
		num, inNum = 0, false
	}
	return procInfo{}, false
}

func (p *linuxPlatform) startTime(pid int) uint64 {
	pi, _ := readStat(pid)
	return pi.start
}

func (p *linuxPlatform) table() *procTable {
	at, tick := time.Now(), bootTicks()
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	dirfd := int(d.Fd())
	t := &procTable{plat: p, byStart: make([]procInfo, 0, len(names)), tick: tick, at: at}
	live := make(map[ident]struct{}, len(names))
	var buf [512]byte
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		if pi, ok := readStatAt(dirfd, "", pid, buf[:]); ok {
			t.byStart = append(t.byStart, pi)
			live[ident{pi.pid, pi.start}] = struct{}{}
		}
	}
	sort.Slice(t.byStart, func(i, j int) bool {
		a, b := t.byStart[i], t.byStart[j]
		return a.start < b.start || a.start == b.start && a.pid < b.pid
	})
	t.byPid = make(map[int]int, len(t.byStart))
	for i, pi := range t.byStart {
		t.byPid[pi.pid] = i
	}
	p.mu.Lock()
	for id := range p.markers {
		if _, ok := live[id]; !ok {
			delete(p.markers, id)
		}
	}
	p.mu.Unlock()
	return t
}

// marker returns the process's MarkerEnv value ("" if none or unreadable),
// reading each process's environment once.
func (p *linuxPlatform) marker(pi procInfo) string {
	id := ident{pi.pid, pi.start}
	p.mu.Lock()
	m, ok := p.markers[id]
	p.mu.Unlock()
	if ok {
		return m
	}
	m = readMarker(pi.pid)
	p.mu.Lock()
	p.markers[id] = m
	p.mu.Unlock()
	return m
}

func readMarker(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return ""
	}
	prefix := []byte(MarkerEnv + "=")
	for _, kv := range bytes.Split(b, []byte{0}) {
		if bytes.HasPrefix(kv, prefix) {
			return string(kv[len(prefix):])
		}
	}
	return ""
}

// state reads a process's liveness by identity. A zombie is not alive.
func (p *linuxPlatform) state(id ident) (alive, zombie bool, ppid int) {
	pi, ok := readStat(id.pid)
	if !ok || pi.start != id.start {
		return false, false, 0
	}
	if pi.state == 'Z' {
		return false, true, pi.ppid
	}
	return true, false, pi.ppid
}

// reap collects one zombie child by identity, never with -1: through a
// pidfd opened before its start time is checked, so neither a child that
// exec.Cmd waits for nor a process that took the pid loses its exit
// status. It reports whether the process is gone (collected, or already).
func (p *linuxPlatform) reap(id ident) bool {
	fd, err := unix.PidfdOpen(id.pid, 0)
	if err != nil {
		return true // no such process
	}
	defer unix.Close(fd)
	if pi, ok := readStat(id.pid); !ok || pi.start != id.start {
		return true // the pid names another process now
	}
	var info unix.Siginfo
	err = unix.Waitid(unix.P_PIDFD, fd, &info, unix.WEXITED|unix.WNOHANG, nil)
	if errors.Is(err, unix.ECHILD) {
		return true // collected by another waiter
	}
	// With WNOHANG and nothing to collect, Linux returns a zeroed siginfo.
	return err == nil && info.Signo == int32(unix.SIGCHLD)
}

// signal sends sig to id through a pidfd opened before the identity check,
// so a reused pid is never hit. It reports whether the pid was reused.
func (p *linuxPlatform) signal(id ident, sig unix.Signal) (reused bool) {
	fd, err := unix.PidfdOpen(id.pid, 0)
	if err != nil {
		return false // gone already
	}
	defer unix.Close(fd)
	pi, ok := readStat(id.pid)
	if !ok {
		return false
	}
	if pi.start != id.start {
		return true
	}
	_ = unix.PidfdSendSignal(fd, sig, nil, 0)
	return false
}

func (p *linuxPlatform) signalGroup(leader ident, sig unix.Signal) {
	// Only while the leader is unreaped: then its pid, and so the group id,
	// cannot have been reused.
	if pi, ok := readStat(leader.pid); ok && pi.start == leader.start {
		_ = unix.Kill(-leader.pid, sig)
	}
}

// cgroup is a scope's cgroup v2 group. Its methods accept a nil receiver
// (no cgroup containment).
type cgroup struct {
	dir string // its directory
	rel string // its path as /proc/PID/cgroup names it
	fd  int
}

// probeCgroup finds this process's cgroup v2 directory (and its path as
// /proc/PID/cgroup names it) and checks, with a real child, that processes
// can be started into a new group under it. "" means no cgroup containment.
func probeCgroup() (dir, rel string) {
	root, rel := ownCgroupDir()
	if root == "" {
		return "", ""
	}
	cg := makeCgroup(root, rel, "probe-"+strconv.Itoa(os.Getpid()))
	if cg == nil {
		return "", ""
	}
	defer cg.remove()
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cg.fd}
	err := cmd.Run()
	cg.started()
	if err != nil {
		return "", ""
	}
	if _, err := os.Stat(filepath.Join(cg.dir, "cgroup.kill")); err != nil {
		return "", "" // kernels before 5.14 have no cgroup.kill
	}
	return root, rel
}

// ownCgroupDir is the cgroup2 directory this process is in, from
// /proc/self/cgroup ("0::/path") and the cgroup2 mount in mountinfo.
func ownCgroupDir() (dir, rel string) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "0::") {
			rel = strings.TrimPrefix(l, "0::")
		}
	}
	if rel == "" {
		return "", ""
	}
	if m := cgroup2Mount(); m != "" {
		return filepath.Join(m, rel), rel
	}
	return "", ""
}

// cgroup2Mount is where the cgroup v2 hierarchy is mounted, from mountinfo.
func cgroup2Mount() string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, fl := range fields {
			if fl == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" && len(fields) > 4 {
				return fields[4]
			}
		}
	}
	return ""
}

// cgroupPrefix starts the name of every cgroup directory custody makes;
// a scope's is followed by its marker, so reap can tell whose it was.
const cgroupPrefix = "agenthost-"

func makeCgroup(root, rel, name string) *cgroup {
	dir := filepath.Join(root, cgroupPrefix+name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		os.Remove(dir)
		return nil
	}
	return &cgroup{dir: dir, rel: filepath.Join(rel, cgroupPrefix+name), fd: fd}
}

func (p *linuxPlatform) newCgroup(marker string, cmd *exec.Cmd) *cgroup {
	if p.cgRoot == "" {
		return nil
	}
	cg := makeCgroup(p.cgRoot, p.cgRel, marker)
	if cg == nil {
		return nil
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = cg.fd
	return cg
}

// started closes the directory fd once the child was placed.
func (cg *cgroup) started() {
	if cg != nil && cg.fd >= 0 {
		unix.Close(cg.fd)
		cg.fd = -1
	}
}

// members lists the pids in the group (nil without one).
func (cg *cgroup) members() map[int]bool {
	if cg == nil {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(cg.dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	m := map[int]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if pid, err := strconv.Atoi(l); err == nil {
			m[pid] = true
		}
	}
	return m
}

func (cg *cgroup) kill() {
	if cg != nil {
		_ = os.WriteFile(filepath.Join(cg.dir, "cgroup.kill"), []byte("1"), 0)
	}
}

// remove removes the group's directory, which only an empty group allows.
func (cg *cgroup) remove() error {
	if cg == nil {
		return nil
	}
	cg.started()
	if err := os.Remove(cg.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (p *linuxPlatform) exitWaiter() exitWaiter {
	return &pidfdWaiter{fds: map[ident]int{}, done: map[ident]bool{}}
}

// pidfdWaiter polls pidfds, which become readable when their process
// exits. Each is opened once, before its identity is checked, and closed
// when its process leaves the set or the waiter closes.
type pidfdWaiter struct {
	fds  map[ident]int
	done map[ident]bool // seen exiting: not polled again
}

func (w *pidfdWaiter) wait(ids []ident, d time.Duration) (exited, pending bool) {
	want := make(map[ident]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	for id, fd := range w.fds {
		if !want[id] {
			unix.Close(fd)
			delete(w.fds, id)
		}
	}
	pfds := make([]unix.PollFd, 0, len(ids))
	order := make([]ident, 0, len(ids))
	for _, id := range ids {
		if w.done[id] {
			pending = true // exited, not yet seen gone (reaped)
			continue
		}
		fd, ok := w.fds[id]
		if !ok {
			var err error
			fd, err = unix.PidfdOpen(id.pid, 0)
			if err == nil {
				if pi, ok := readStat(id.pid); !ok || pi.start != id.start {
					unix.Close(fd)
					err = unix.ESRCH
				}
			}
			if err != nil {
				w.done[id], exited = true, true // gone already
				continue
			}
			w.fds[id] = fd
		}
		pfds = append(pfds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		order = append(order, id)
	}
	if exited {
		return true, pending
	}
	if len(pfds) == 0 {
		time.Sleep(d)
		return false, pending
	}
	n, err := unix.Poll(pfds, max(int(d/time.Millisecond), 1))
	if err != nil || n <= 0 {
		return false, pending
	}
	for i, pf := range pfds {
		if pf.Revents != 0 {
			w.done[order[i]] = true
		}
	}
	return true, pending
}

func (w *pidfdWaiter) close() {
	for id, fd := range w.fds {
		unix.Close(fd)
		delete(w.fds, id)
	}
}

// setCtty makes the child's fd 0 its controlling terminal (its own
// session is set by prepare).
func setCtty(cmd *exec.Cmd) { cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, 0 }
