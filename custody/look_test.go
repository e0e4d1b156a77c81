//go:build linux

package custody

import (
	"bufio"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// readCountingPlatform counts the process reads: whole tables and single
// processes.
type readCountingPlatform struct {
	platform
	mu     sync.Mutex
	tables int
	stats  int
}

func (p *readCountingPlatform) table() *procTable {
	p.mu.Lock()
	p.tables++
	p.mu.Unlock()
	return p.platform.table()
}

func (p *readCountingPlatform) stat(pid int) (procInfo, bool) {
	p.mu.Lock()
	p.stats++
	p.mu.Unlock()
	return p.platform.stat(pid)
}

func (p *readCountingPlatform) counts() (tables, stats int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tables, p.stats
}

// bystanders starts n sleeping processes outside custody (children of one
// shell that waits for them, so none is the host's) and ends them when the
// test ends.
func bystanders(t testing.TB, n int) {
	t.Helper()
	if n == 0 {
		return
	}
	cmd := exec.Command("/bin/sh", "-c", fmt.Sprintf(`p=""; i=0; while [ $i -lt %d ]; do /bin/sleep 3085 & p="$p $!"; i=$((i+1)); done; echo $p; wait`, n))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, f := range strings.Fields(line) {
			if pid, err := strconv.Atoi(f); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		cmd.Wait() // the shell reaps them, then exits
	})
}

// Issue 23 item 4 (and issue 25's custody part): every scan read all of
// /proc (a stat per process on the machine, four times a second, while any
// scope was open). A look now reads what the scopes own and lead to: its
// cost does not grow with the machine's other processes. (The CPU figures
// are BenchmarkScanCPU's.)
func TestScan_ReadsOnlyWhatScopesOwn(t *testing.T) {
	const others = 300
	bystanders(t, others)
	bothPaths(t, func(t *testing.T, opts Options) {
		opts.ScanInterval = time.Hour // the scans are the test's
		c := newCustodian(t, opts)
		stub := &readCountingPlatform{platform: c.plat}
		c.plat = stub
		s, pids, _ := startSh(t, c, `/bin/sleep 3086 & setsid /bin/sleep 3087 & echo $!; exec cat`)
		if err := scanUntilOwned(c, s, pids[0]); err != nil {
			t.Fatal(err)
		}
		tables0, stats0 := stub.counts()
		const scans = 10
		for i := 0; i < scans; i++ {
			c.scan()
		}
		tables, stats := stub.counts()
		tables -= tables0
		stats -= stats0
		if tables != 0 {
			t.Errorf("%d scans read the whole process table %d times", scans, tables)
		}
		// The scope owns 3 processes; the host has a few children of its
		// own (the bystanders' shell among them).
		if perScan := stats / scans; perScan > 20 {
			t.Errorf("a scan read %d processes, with %d others on the machine", perScan, others)
		}
		t.Logf("per scan: %d process reads, %d table reads", stats/scans, tables)
		if _, err := s.Close(ctxFor(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	})
}
