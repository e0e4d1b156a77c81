//go:build !linux

package custody

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"
)

// Other platforms: no subreaper, no /proc, no marker scan, no cgroup. The
// leader is started in its own process group (Unix) and Close signals that
// group; descendants that leave it are not found.

type procInfo struct {
	pid, ppid, pgid, sid int
	start                uint64
	state                byte
	comm                 [16]byte
}

func (procInfo) dead() bool { return false }

type procTable struct {
	byStart []procInfo
	byPid   map[int]int
	tick    uint64
	at      time.Time
	members map[int]*Scope
	full    bool
	stat    func(int) (procInfo, bool)
}

func (t *procTable) add(int) (procInfo, bool) { return procInfo{}, false }
func (t *procTable) sortByStart()             {}

func (t *procTable) lookup(ident) (procInfo, bool) { return procInfo{}, false }
func (t *procTable) groupInUse(int) bool           { return true }

func (t *procTable) marker(procInfo) string  { return "" }
func (t *procTable) cmdline(procInfo) string { return "?" }

type cgroup struct{ rel string }

func (*cgroup) members() map[int]bool                         { return nil }
func (*cgroup) kill()                                         {}
func (*cgroup) remove() error                                 { return nil }
func (*cgroup) started()                                      {}
func (*cgroup) populated() bool                               { return false }
func (*cgroup) waitEmpty(context.Context, time.Duration) bool { return true }
func (*cgroup) memberList() string                            { return "" }

type otherPlatform struct{ self int }

func newPlatform(Options) (platform, error) { return &otherPlatform{self: os.Getpid()}, nil }

func (p *otherPlatform) ownerID() string                      { return fmt.Sprintf("0.%d.0", p.self) }
func (p *otherPlatform) selfPid() int                         { return p.self }
func (p *otherPlatform) containment(bool) Containment         { return ContainGroupOnly }
func (p *otherPlatform) prepare(cmd *exec.Cmd)                { prepareGroup(cmd) }
func (p *otherPlatform) startTime(int) uint64                 { return 0 }
func (p *otherPlatform) table() *procTable                    { return nil }
func (p *otherPlatform) newTable() *procTable                 { return nil }
func (p *otherPlatform) stat(int) (procInfo, bool)            { return procInfo{}, false }
func (p *otherPlatform) children(_ procInfo, out []int) []int { return out }
func (p *otherPlatform) hostChildren(out []int) []int         { return out }
func (p *otherPlatform) hostSession() int                     { return 0 }
func (p *otherPlatform) ticks() uint64                        { return 0 }
func (p *otherPlatform) lookup(ident) (procInfo, bool)        { return procInfo{}, false }
func (p *otherPlatform) cgroupOf(int) string                  { return "" }
func (p *otherPlatform) exitWaiter() exitWaiter               { return sleepWaiter{} }
func (p *otherPlatform) reap(ident) (bool, exitStatus)        { return false, exitStatus{} }
func (p *otherPlatform) newCgroup(string, *exec.Cmd) *cgroup  { return nil }
func (p *otherPlatform) resources() *resources                { return newResources() }

func (p *otherPlatform) signal(id ident, sig sysSignal) bool {
	if pr, err := os.FindProcess(id.pid); err == nil {
		_ = signalProcess(pr, sig)
	}
	return false
}

func (p *otherPlatform) signalGroup(leader ident, sig sysSignal) { signalGroupOther(leader.pid, sig) }

// sleepWaiter is the exitWaiter of platforms without pidfds: it sleeps,
// and cannot tell.
type sleepWaiter struct{}

func (sleepWaiter) wait(_ []ident, d time.Duration) (exited, pending bool) {
	time.Sleep(d)
	return false, true
}
func (sleepWaiter) close() {}

// signalName names a signal by its number here.
func signalName(sig sysSignal) string { return strconv.Itoa(int(sig)) }

// leaderStatus is how the leader ended: its exit code (a signal is not
// told apart here).
func leaderStatus(ps *os.ProcessState) exitStatus {
	if ps == nil || ps.ExitCode() < 0 {
		return exitStatus{}
	}
	return exitStatus{known: true, code: ps.ExitCode()}
}

// threadCPU is not measured here (no look has a cost worth bounding).
func threadCPU() time.Duration { return 0 }

func readCmdline(procInfo) string { return "?" }
