//go:build linux

package custody

import (
	"sync"
	"syscall"
	"testing"
	"time"
)

// countingPlatform counts the signals sent, by pid and to groups.
type countingPlatform struct {
	platform
	mu     sync.Mutex
	single map[int]int
	groups int
}

func (p *countingPlatform) signal(id ident, sig sysSignal) bool {
	p.mu.Lock()
	p.single[id.pid]++
	p.mu.Unlock()
	return p.platform.signal(id, sig)
}

func (p *countingPlatform) signalGroup(leader ident, sig sysSignal) {
	p.mu.Lock()
	p.groups++
	p.mu.Unlock()
	p.platform.signalGroup(leader, sig)
}

// TestScope_SignalEachProcessOnce: Signal reaches the leader's group with
// one kill and every owned process outside it once; a member of the group
// is not signalled twice (a second INT is "force quit" to many programs).
func TestScope_SignalEachProcessOnce(t *testing.T) {
	c := newCustodian(t, Options{NoCgroup: true, Grace: 50 * time.Millisecond, TermGrace: 100 * time.Millisecond})
	stub := &countingPlatform{platform: c.plat, single: map[int]int{}}
	c.plat = stub
	s, pids, _ := startSh(t, c, `/bin/sleep 3020 & a=$!; setsid /bin/sleep 3021 & echo $a $!; exec cat`)
	owned := func(pid int) bool {
		for _, id := range s.liveIdents() {
			if id.pid == pid {
				return true
			}
		}
		return false
	}
	// The second has its own session once setsid ran (it may be seen
	// before, still in the group).
	ownSession := func(pid int) bool {
		pi, ok := readStat(pid)
		return ok && pi.sid == pid
	}
	deadline := time.Now().Add(20 * time.Second)
	for !owned(pids[0]) || !owned(pids[1]) || !ownSession(pids[1]) {
		if time.Now().After(deadline) {
			t.Fatal("the children were never found")
		}
		c.scan()
	}
	if err := s.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stub.mu.Lock()
	defer stub.mu.Unlock()
	if stub.groups != 1 || stub.single[s.Pid()] != 0 || stub.single[pids[0]] != 0 || stub.single[pids[1]] != 1 {
		t.Fatalf("group kills %d, leader %d, group member %d, own session %d; want 1, 0, 0, 1",
			stub.groups, stub.single[s.Pid()], stub.single[pids[0]], stub.single[pids[1]])
	}
}
