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
	cgRoot    string // our cgroup v2 directory, "" without cgroup support

	mu      sync.Mutex
	markers map[ident]string // environ lookups, pruned to live processes
}

func newPlatform(opts Options) (platform, error) {
	p := &linuxPlatform{self: os.Getpid(), markers: map[ident]string{}}
	p.selfStart = p.startTime(p.self)
	if !opts.NoSubreaper {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return nil, fmt.Errorf("custody: becoming a child subreaper: %w", err)
		}
	}
	if !opts.NoCgroup {
		p.cgRoot = probeCgroup()
	}
	return p, nil
}

func (p *linuxPlatform) ownerID() string { return fmt.Sprintf("%d.%d", p.self, p.selfStart) }
func (p *linuxPlatform) selfPid() int    { return p.self }

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
	var path [32]byte
	p := append(append(append(path[:0], "/proc/"...), strconv.Itoa(pid)...), "/stat"...)
	fd, err := unix.Open(string(p), unix.O_RDONLY|unix.O_CLOEXEC, 0)
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
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	t := &procTable{plat: p, byStart: make([]procInfo, 0, len(names))}
	live := make(map[ident]struct{}, len(names))
	var buf [512]byte
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		if pi, ok := readStatBuf(pid, buf[:]); ok {
			t.byStart = append(t.byStart, pi)
			live[ident{pi.pid, pi.start}] = struct{}{}
		}
	}
	sort.Slice(t.byStart, func(i, j int) bool { return t.byStart[i].start < t.byStart[j].start })
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

// reap collects one zombie child by pid, never with -1, so exec.Cmd.Wait
// keeps the statuses of the processes it started.
func (p *linuxPlatform) reap(pid int) bool {
	var ws unix.WaitStatus
	wpid, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	return wpid == pid || errors.Is(err, unix.ECHILD)
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
	dir string
	fd  int
}

// probeCgroup finds this process's cgroup v2 directory and checks, with a
// real child, that processes can be started into a new group under it.
// "" means no cgroup containment.
func probeCgroup() string {
	root := ownCgroupDir()
	if root == "" {
		return ""
	}
	cg := makeCgroup(root, "probe-"+strconv.Itoa(os.Getpid()))
	if cg == nil {
		return ""
	}
	defer cg.remove()
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cg.fd}
	err := cmd.Run()
	cg.started()
	if err != nil {
		return ""
	}
	if _, err := os.Stat(filepath.Join(cg.dir, "cgroup.kill")); err != nil {
		return "" // kernels before 5.14 have no cgroup.kill
	}
	return root
}

// ownCgroupDir is the cgroup2 directory this process is in, from
// /proc/self/cgroup ("0::/path") and the cgroup2 mount in mountinfo.
func ownCgroupDir() string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	var rel string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "0::") {
			rel = strings.TrimPrefix(l, "0::")
		}
	}
	if rel == "" {
		return ""
	}
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
				return filepath.Join(fields[4], rel)
			}
		}
	}
	return ""
}

func makeCgroup(root, name string) *cgroup {
	dir := filepath.Join(root, "agenthost-"+name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		os.Remove(dir)
		return nil
	}
	return &cgroup{dir: dir, fd: fd}
}

func (p *linuxPlatform) newCgroup(id string, cmd *exec.Cmd) *cgroup {
	if p.cgRoot == "" {
		return nil
	}
	cg := makeCgroup(p.cgRoot, id)
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

func (cg *cgroup) remove() {
	if cg != nil {
		cg.started()
		_ = os.Remove(cg.dir)
	}
}
