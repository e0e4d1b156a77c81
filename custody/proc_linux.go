//go:build linux

package custody

import (
	"bufio"
	"bytes"
	"context"
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
	"unsafe"

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
	threads              int      // num_threads: live threads of its thread group
	comm                 [16]byte // its command name: a change means it exec'd
}

// dead says whether the process has exited: a zombie whose threads are all
// gone. A thread group whose leader (main thread) exited while others run
// also shows state Z, but runs: it counts as alive, is signalled (by pid,
// group-directed) and is watched until its pidfd says the group is gone.
func (p procInfo) dead() bool {
	return (p.state == 'Z' || p.state == 'X') && p.threads <= 1
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
	// members are the pids listed in the scopes' cgroups (and the groups
	// below them) when the table was read, with their scope.
	members map[int]*Scope
	// full: every process of the machine (a read of all of /proc), not
	// only those a look reached from what the scopes own.
	full bool
	// stat reads one process for add (the platform's, through the
	// platform interface, so a test's platform sees every read).
	stat func(pid int) (procInfo, bool)
}

// newTable starts a table read now; add fills it.
func (p *linuxPlatform) newTable() *procTable {
	at, tick := time.Now(), bootTicks()
	return &procTable{plat: p, byPid: map[int]int{}, tick: tick, at: at, stat: readStat}
}

// add reads pid into the table unless it is there; false if it is gone.
func (t *procTable) add(pid int) (procInfo, bool) {
	if i, ok := t.byPid[pid]; ok {
		return t.byStart[i], true
	}
	pi, ok := t.stat(pid)
	if !ok {
		return procInfo{}, false
	}
	t.byPid[pid] = len(t.byStart)
	t.byStart = append(t.byStart, pi)
	t.groups = nil
	return pi, true
}

// sortByStart orders the table oldest first (children may share their
// parent's start tick: assign does not rely on the order).
func (t *procTable) sortByStart() {
	sort.Slice(t.byStart, func(i, j int) bool {
		a, b := t.byStart[i], t.byStart[j]
		return a.start < b.start || a.start == b.start && a.pid < b.pid
	})
	for i, pi := range t.byStart {
		t.byPid[pi.pid] = i
	}
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

func (t *procTable) cmdline(p procInfo) string { return readCmdline(p) }

// readCmdline is the process's command line, NULs as spaces, "?" if
// unreadable; at most maxCmdline bytes of it are kept (see boundCmdline).
func readCmdline(p procInfo) string {
	b := procFile(p, "cmdline")
	if len(b) == 0 {
		return "?"
	}
	if len(b) > 4*maxCmdline {
		b = b[:4*maxCmdline] // bounded later; no need to copy the rest
	}
	return strings.TrimSpace(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
}

// procFile reads /proc/PID/name. A thread group whose leader exited while
// other threads run reads empty there (the leader's memory is gone), so
// for such a process (state Z) the first other thread's copy is read.
func procFile(p procInfo, name string) []byte {
	base := "/proc/" + strconv.Itoa(p.pid)
	b, err := os.ReadFile(base + "/" + name)
	if (err == nil && len(b) > 0) || p.state != 'Z' {
		return b
	}
	for _, tid := range taskIDs(p.pid) {
		if tid == p.pid {
			continue
		}
		if b, err := os.ReadFile(base + "/task/" + strconv.Itoa(tid) + "/" + name); err == nil && len(b) > 0 {
			return b
		}
	}
	return nil
}

// taskIDs lists the thread ids of pid (nil if it is gone).
func taskIDs(pid int) []int {
	return listPids("/proc/" + strconv.Itoa(pid) + "/task")
}

// listPids reads the numeric names in dir.
func listPids(dir string) []int {
	d, err := os.Open(dir)
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	out := make([]int, 0, len(names))
	for _, n := range names {
		if id, err := strconv.Atoi(n); err == nil {
			out = append(out, id)
		}
	}
	return out
}

// children lists the children of every thread of p: a child's parent is
// the thread that forked it (or the one an orphan was reparented to), and
// each thread's children file lists its own. A single thread's is read
// without listing the threads. It appends to out.
func (p *linuxPlatform) children(pi procInfo, out []int) []int {
	dir := "/proc/" + strconv.Itoa(pi.pid) + "/task/"
	var buf [512]byte
	if pi.threads == 1 {
		return appendPids(out, readSmall(dir+strconv.Itoa(pi.pid)+"/children", buf[:0]))
	}
	for _, tid := range taskIDs(pi.pid) {
		out = appendPids(out, readSmall(dir+strconv.Itoa(tid)+"/children", buf[:0]))
	}
	return out
}

// hostChildren lists the orphans the host inherited, and the children its
// main thread started. An orphan is reparented to the subreaper's first
// live thread, its main thread (which a Go program keeps), so that one
// thread's children file lists them all, whatever the number of threads
// (a host has one blocked in wait4 for every leader).
func (p *linuxPlatform) hostChildren(out []int) []int {
	var buf [4096]byte
	b := readSmall("/proc/"+strconv.Itoa(p.self)+"/task/"+strconv.Itoa(p.self)+"/children", buf[:0])
	if b == nil {
		return p.children(procInfo{pid: p.self}, out) // no main thread: every thread's
	}
	return appendPids(out, b)
}

// appendPids appends the numbers in b (separated by spaces or newlines).
func appendPids(out []int, b []byte) []int {
	n, in := 0, false
	for _, c := range b {
		if c >= '0' && c <= '9' {
			n, in = n*10+int(c-'0'), true
			continue
		}
		if in {
			out = append(out, n)
		}
		n, in = 0, false
	}
	if in {
		out = append(out, n)
	}
	return out
}

// readSmall reads a whole (small, generated) file into buf, growing it
// as needed; nil if unreadable.
func readSmall(path string, buf []byte) []byte {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			return buf
		}
		if n <= 0 {
			return buf
		}
		buf = buf[:len(buf)+n]
	}
}

type linuxPlatform struct {
	self      int
	selfStart uint64
	selfSid   int
	pidNS     uint64 // inode of our pid namespace, 0 if unknown
	cgRoot    string // our cgroup v2 directory, "" without cgroup support
	cgRel     string // the same, as /proc/PID/cgroup names it
	// v2 are the controllers enabled for the scopes' groups, why2 why
	// none is (Options.Resources).
	v2   map[string]bool
	why2 string

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
	switch {
	case opts.NoCgroup:
	case opts.Resources:
		// The scopes' groups go where the controllers can be enabled.
		if dir, rel := ownCgroupDir(); dir != "" {
			dir, rel, p.v2, p.why2 = prepareV2(dir, rel)
			p.cgRoot, p.cgRel = probeCgroupAt(dir, rel)
			if p.cgRoot == "" && p.why2 == "" {
				// Say why no group could be made (a read-only mount, as
				// a container's; a group not this user's).
				if err := unix.Access(dir, unix.W_OK); err != nil {
					p.why2 = fmt.Sprintf("%s is not writable: %v", rel, err)
				}
			}
		}
	default:
		p.cgRoot, p.cgRel = probeCgroup()
	}
	return p, nil
}

func (p *linuxPlatform) resources() *resources {
	v2 := p.v2
	if p.cgRoot == "" {
		v2 = nil
	}
	return newResources(p.cgRoot, v2, p.why2)
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

func (p *linuxPlatform) stat(pid int) (procInfo, bool) { return readStat(pid) }

// cgroupOf reads the cgroup v2 path of pid; a zombie still names the
// cgroup it died in.
func (p *linuxPlatform) cgroupOf(pid int) string { return cgroupOfPid(pid) }

func cgroupOfPid(pid int) string {
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

// parseStat reads fields 2 (comm), 3 (state), 4 (ppid), 5 (pgrp), 6
// (session), 20 (num_threads) and 22 (start time) of a stat line. The command name (field 2) may hold
// spaces and parentheses, so fields are counted from the last ')'.
func parseStat(pid int, b []byte) (procInfo, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return procInfo{}, false
	}
	var comm [16]byte
	if j := bytes.IndexByte(b, '('); j >= 0 && j < i {
		copy(comm[:], b[j+1:i])
	}
	b = b[i+2:]
	pi := procInfo{pid: pid, state: b[0], comm: comm}
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
		case 20:
			pi.threads = int(num)
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

// table reads every process of the machine: the cost grows with the
// machine, so only reap and a host without the subreaper flag use it (see
// look).
func (p *linuxPlatform) table() *procTable {
	t := p.newTable()
	t.full = true
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	dirfd := int(d.Fd())
	t.byStart = make([]procInfo, 0, len(names))
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
	t.sortByStart()
	p.mu.Lock()
	for id := range p.markers {
		if _, ok := live[id]; !ok {
			delete(p.markers, id)
		}
	}
	p.mu.Unlock()
	return t
}

// maxMarkers bounds the marker cache between two full tables (which prune
// it to the processes alive); past it, the cache starts over.
const maxMarkers = 1 << 14

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
	m = markerIn(procFile(pi, "environ"))
	p.mu.Lock()
	if len(p.markers) >= maxMarkers {
		clear(p.markers)
	}
	p.markers[id] = m
	p.mu.Unlock()
	return m
}

func readMarker(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return ""
	}
	return markerIn(b)
}

// markerIn finds MarkerEnv's value in an environ block.
func markerIn(b []byte) string {
	prefix := []byte(MarkerEnv + "=")
	for _, kv := range bytes.Split(b, []byte{0}) {
		if bytes.HasPrefix(kv, prefix) {
			return string(kv[len(prefix):])
		}
	}
	return ""
}

// state reads a process's liveness by identity. A zombie is not alive; a
// thread group whose leader exited while other threads run is.
func (p *linuxPlatform) state(id ident) (alive, zombie bool, ppid int) {
	pi, ok := readStat(id.pid)
	if !ok || pi.start != id.start {
		return false, false, 0
	}
	if pi.dead() {
		return false, true, pi.ppid
	}
	return true, false, pi.ppid
}

// Codes of a SIGCHLD siginfo (si_code).
const (
	cldExited = 1
	cldKilled = 2
	cldDumped = 3
)

// reap collects one zombie child by identity, never with -1: through a
// pidfd opened before its start time is checked, so neither a child that
// exec.Cmd waits for nor a process that took the pid loses its exit
// status. It reports whether the process is gone (collected, or already),
// and, when collected here, how it ended.
func (p *linuxPlatform) reap(id ident) (bool, exitStatus) {
	fd, err := unix.PidfdOpen(id.pid, 0)
	if err != nil {
		return true, exitStatus{} // no such process
	}
	defer unix.Close(fd)
	if pi, ok := readStat(id.pid); !ok || pi.start != id.start {
		return true, exitStatus{} // the pid names another process now
	}
	var info unix.Siginfo
	err = unix.Waitid(unix.P_PIDFD, fd, &info, unix.WEXITED|unix.WNOHANG, nil)
	if errors.Is(err, unix.ECHILD) {
		return true, exitStatus{} // collected by another waiter
	}
	// With WNOHANG and nothing to collect, Linux returns a zeroed siginfo.
	if err != nil || info.Signo != int32(unix.SIGCHLD) {
		return false, exitStatus{}
	}
	return true, childStatus(&info)
}

// childStatus reads si_status of a SIGCHLD siginfo. x/sys leaves the union
// opaque: it starts after three int32s, aligned to a pointer, and its
// SIGCHLD member is {si_pid int32, si_uid uint32, si_status int32, ...}.
func childStatus(info *unix.Siginfo) exitStatus {
	off := uintptr(12)
	if unsafe.Sizeof(uintptr(0)) == 8 {
		off = 16
	}
	status := *(*int32)(unsafe.Add(unsafe.Pointer(info), off+8))
	switch info.Code {
	case cldExited:
		return exitStatus{known: true, code: int(status)}
	case cldKilled, cldDumped:
		return exitStatus{known: true, signal: sysSignal(status)}
	}
	return exitStatus{}
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

// threadCPU is the CPU time the calling thread has used.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// signalName is "TERM" for SIGTERM.
func signalName(sig sysSignal) string {
	if n := unix.SignalName(sig); n != "" {
		return strings.TrimPrefix(n, "SIG")
	}
	return strconv.Itoa(int(sig))
}

// leaderStatus is how the leader ended, from its exec.Cmd's state.
func leaderStatus(ps *os.ProcessState) exitStatus {
	if ps == nil {
		return exitStatus{}
	}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	switch {
	case !ok:
		return exitStatus{}
	case ws.Signaled():
		return exitStatus{known: true, signal: ws.Signal()}
	case ws.Exited():
		return exitStatus{known: true, code: ws.ExitStatus()}
	}
	return exitStatus{}
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
	fd  int    // its directory, for starting the leader in it (-1: none)

	// Kept open while the group lives, so a look costs two system calls
	// (a directory fstat: are there groups below? and a pread of
	// cgroup.procs), not a walk by path. mu guards their lifetime.
	mu     sync.RWMutex
	dirfd  int // -1: read by path
	procfd int
}

// probeCgroup finds this process's cgroup v2 directory (and its path as
// /proc/PID/cgroup names it) and checks, with a real child, that processes
// can be started into a new group under it. "" means no cgroup containment.
func probeCgroup() (dir, rel string) {
	return probeCgroupAt(ownCgroupDir())
}

// probeCgroupAt is probeCgroup for a group of this process's choosing
// (root, as /proc/PID/cgroup names it: rel).
func probeCgroupAt(root, rel string) (string, string) {
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
	cg := &cgroup{dir: dir, rel: filepath.Join(rel, cgroupPrefix+name), fd: fd, dirfd: -1, procfd: -1}
	if dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		if pfd, err := unix.Open(filepath.Join(dir, "cgroup.procs"), unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			cg.dirfd, cg.procfd = dfd, pfd
		} else {
			unix.Close(dfd) // out of descriptors: read by path
		}
	}
	return cg
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

// maxCgroupDirs bounds every walk of a cgroup hierarchy.
const maxCgroupDirs = 100000

// walk calls f for every cgroup directory in the group's subtree, children
// before their parent (the order they can be removed in). A directory's
// link count is 2 plus its subdirectories (kernfs), so a group without
// children costs one stat, not a directory read.
func (cg *cgroup) walk(f func(dir string)) {
	n := 0
	var rec func(dir string)
	rec = func(dir string) {
		if n++; n > maxCgroupDirs {
			return
		}
		var st unix.Stat_t
		if err := unix.Stat(dir, &st); err != nil {
			return
		}
		if st.Nlink > 2 {
			if ents, err := os.ReadDir(dir); err == nil {
				for _, e := range ents {
					if e.IsDir() {
						rec(filepath.Join(dir, e.Name()))
					}
				}
			}
		}
		f(dir)
	}
	rec(cg.dir)
}

// members lists the pids in the group and in every group below it (nil
// without one). A thread group whose leader exited while other threads run
// is listed under the leader's pid.
func (cg *cgroup) members() map[int]bool {
	if cg == nil {
		return nil
	}
	m := map[int]bool{}
	var buf [512]byte
	var pids []int
	if cg.membersFast(m, buf[:0]) {
		return m
	}
	cg.walk(func(dir string) {
		pids = appendPids(pids[:0], readSmall(filepath.Join(dir, "cgroup.procs"), buf[:0]))
		for _, pid := range pids {
			m[pid] = true
		}
	})
	return m
}

// membersFast reads the members through the kept descriptors when no group
// is below (false: read by path).
func (cg *cgroup) membersFast(m map[int]bool, buf []byte) bool {
	cg.mu.RLock()
	defer cg.mu.RUnlock()
	if cg.dirfd < 0 {
		return false
	}
	var st unix.Stat_t
	if err := unix.Fstat(cg.dirfd, &st); err != nil || st.Nlink > 2 {
		return false
	}
	// A pread from 0 regenerates the list (seq_file); a short read is
	// all of it.
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := unix.Pread(cg.procfd, buf[len(buf):cap(buf)], int64(len(buf)))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false
		}
		buf = buf[:len(buf)+n]
		if n == 0 || len(buf) < cap(buf) {
			break
		}
	}
	for _, pid := range appendPids(nil, buf) {
		m[pid] = true
	}
	return true
}

// closeFDs closes the kept descriptors.
func (cg *cgroup) closeFDs() {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	if cg.dirfd >= 0 {
		unix.Close(cg.dirfd)
		unix.Close(cg.procfd)
		cg.dirfd, cg.procfd = -1, -1
	}
}

// memberList names the group's members, for an error.
func (cg *cgroup) memberList() string {
	var parts []string
	for pid := range cg.members() {
		parts = append(parts, fmt.Sprintf("pid %d (%s)", pid, trimCmd(readCmdline(procInfo{pid: pid}))))
	}
	if len(parts) == 0 {
		return "processes that are not listed (on their way out)"
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// populated says whether any process is in the group or below it, from
// cgroup.events (recursive, unlike cgroup.procs). A group that is gone is
// not populated.
func (cg *cgroup) populated() bool {
	if cg == nil {
		return false
	}
	var buf [256]byte
	return eventsPopulated(readSmall(filepath.Join(cg.dir, "cgroup.events"), buf[:0]))
}

func eventsPopulated(b []byte) bool {
	for _, l := range bytes.Split(b, []byte{'\n'}) {
		if v, ok := bytes.CutPrefix(l, []byte("populated ")); ok {
			return string(v) != "0"
		}
	}
	return false
}

// waitEmpty waits up to d for the group to hold no process, woken by
// cgroup.events (a change raises POLLPRI on it), and reports whether it is
// empty.
func (cg *cgroup) waitEmpty(ctx context.Context, d time.Duration) bool {
	if cg == nil {
		return true
	}
	fd, err := unix.Open(filepath.Join(cg.dir, "cgroup.events"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return true // the group is gone
	}
	defer unix.Close(fd)
	deadline := time.Now().Add(d)
	var buf [256]byte
	for {
		n, err := unix.Pread(fd, buf[:], 0) // a read also rearms the poll
		if err != nil || n <= 0 || !eventsPopulated(buf[:n]) {
			return true // empty, or removed (its files then fail)
		}
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return false
		}
		// Woken at least every 50 ms for ctx.
		wait := min(left, 50*time.Millisecond)
		_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLPRI}}, max(int(wait/time.Millisecond), 1))
	}
}

// kill ends every process in the group and below it: cgroup.kill, and a
// group-directed SIGKILL to each member by pid, because cgroup.kill sends
// its SIGKILL to the leader thread only, which a thread group whose leader
// already exited never takes. A pid is signalled through a pidfd opened
// before it is checked to be in the subtree still, so a reused pid is
// never hit.
func (cg *cgroup) kill() {
	if cg == nil {
		return
	}
	_ = os.WriteFile(filepath.Join(cg.dir, "cgroup.kill"), []byte("1"), 0)
	for pid := range cg.members() {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue
		}
		if cg.holds(pid) {
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		}
		unix.Close(fd)
	}
}

// holds says whether pid is in the group or below it.
func (cg *cgroup) holds(pid int) bool {
	rel := cgroupOfPid(pid)
	return cg.rel != "" && (rel == cg.rel || strings.HasPrefix(rel, cg.rel+"/"))
}

// remove removes the group's directory, and every group below it first,
// which only an empty group allows.
func (cg *cgroup) remove() error {
	if cg == nil {
		return nil
	}
	cg.started()
	var err error
	cg.walk(func(dir string) {
		if e := os.Remove(dir); e != nil && !errors.Is(e, os.ErrNotExist) && err == nil {
			err = e
		}
	})
	if err == nil {
		cg.closeFDs()
	}
	return err
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
