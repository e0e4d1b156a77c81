//go:build linux

package custody

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// spawnerScript is a spawner (its pid on its first line) that starts, on
// SIGUSR1, a child in a session of its own running $LATE, and prints the
// child's pid. With IGNTERM set it ignores SIGTERM, and so do its children.
const spawnerScript = `[ -n "$IGNTERM" ] && trap '' TERM
trap 'setsid /bin/sh -c "$LATE" </dev/null >/dev/null 2>&1 & echo $!' USR1
echo $$
while :; do /bin/sleep 0.05; done
`

// Issue 23 item 3: a process born after one of Close's signal rounds (a
// child of a spawner, in a session of its own) was adopted by Close's later
// looks but never signalled by that Close: a TERM-able one was left to the
// KILL round, and one born right before the KILL round ran until Close
// gave up on it (no receipt). Each is signalled as soon as it is found,
// with the signal of the phase Close is in.
func TestScope_LateChildrenSignalledAtOnce(t *testing.T) {
	script := filepath.Join(t.TempDir(), "spawner.sh")
	if err := os.WriteFile(script, []byte(spawnerScript), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		phase   int    // the phase whose signal round the child misses
		ignTerm bool   // the spawner (and what it starts) ignores SIGTERM
		late    string // the child's command
		ended   Ended
	}{
		{"born before the TERM round", 2, false, "exec /bin/sleep 3073", EndedTerm},
		// The spawner outlives the TERM round: the child is found while
		// Close waits out TermGrace.
		{"born before the TERM round, found during TermGrace", 2, true, "exec env --default-signal=TERM /bin/sleep 3074", EndedTerm},
		{"born before the KILL round, ignoring SIGTERM", 3, true, "exec /bin/sleep 3075", EndedKill},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bothPaths(t, func(t *testing.T, opts Options) {
				opts.Confirm = 2 * time.Second
				c := newCustodian(t, opts)
				cmd := exec.Command("/bin/sh", "-c", `/bin/sh "$0" & exec cat`, script)
				cmd.Env = append(os.Environ(), "LATE="+tc.late)
				if tc.ignTerm {
					cmd.Env = append(cmd.Env, "IGNTERM=1")
				}
				s, err := c.Start(ctxFor(t, 10*time.Second), cmd)
				if err != nil {
					t.Fatal(err)
				}
				out := bufio.NewReader(s.Stdout())
				spawner := readPid(t, out)
				late := 0
				defer func() {
					if late != 0 {
						killIfAlive(late)
					}
				}()
				testHookBeforeSignal = func(hs *Scope, phase int) {
					if hs != s || phase != tc.phase {
						return
					}
					// Born now: after the phase's look, before its signals.
					if err := syscall.Kill(spawner, syscall.SIGUSR1); err != nil {
						t.Error(err)
						return
					}
					late = readPid(t, out)
					// Its pid is said before it runs its command: until
					// env has put TERM back to default, the TERM it is
					// sent is ignored (as the spawner's) and the child is
					// left to the KILL round. Wait for the exec (no event
					// tells of another process's exec: /proc is polled).
					for deadline := time.Now().Add(10 * time.Second); ; {
						cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", late))
						if strings.HasPrefix(string(cmdline), "/bin/sleep\x00") || time.Now().After(deadline) {
							break
						}
						time.Sleep(5 * time.Millisecond)
					}
				}
				defer func() { testHookBeforeSignal = nil }()
				r, err := s.Close(ctxFor(t, 20*time.Second))
				if err != nil {
					t.Fatalf("close: %v", err)
				}
				if late == 0 {
					t.Fatal("no late child was born")
				}
				if tc.phase == 3 && !opts.NoCgroup {
					// cgroup.kill ends it before any look sees it, and its
					// parent may reap it first (a KILL round is not atomic):
					// it need not be on the receipt, only gone.
					checkGone(t, r, spawner)
					if alive(late) {
						t.Fatalf("the late child %d survived Close", late)
					}
				} else {
					checkGone(t, r, spawner, late)
				}
				for _, e := range r.Processes {
					if e.PID == late && e.Ended != tc.ended {
						t.Errorf("the late child ended %q, want %q:\n%s", e.Ended, tc.ended, r)
					}
				}
			})
		})
	}
}

// readPid reads a line holding a pid.
func readPid(t *testing.T, r *bufio.Reader) int {
	t.Helper()
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("reading a pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("not a pid: %q", line)
	}
	return pid
}

// Issue 23 item 3: in serve nothing closes a scope again after its Close
// gave up. The discovery loop now ends what remains (killing it again)
// and completes the scope once it is empty: nothing keeps running until
// the host stops, and the receipt is there for a later Close.
func TestCustodian_FinishesScopeWhoseCloseFailed(t *testing.T) {
	c := newCustodian(t, Options{NoCgroup: true, Grace: 50 * time.Millisecond, TermGrace: 100 * time.Millisecond,
		Confirm: 300 * time.Millisecond, ScanInterval: 20 * time.Millisecond})
	stub := &stubbornPlatform{platform: c.plat, spare: map[int]bool{}}
	c.plat = stub
	s, pids, _ := startSh(t, c, `setsid /bin/sleep 3076 & echo $!; exec cat`)
	defer killIfAlive(pids[0])
	// Its pid is printed when it is forked: until it has left the
	// leader's process group, a group signal would end it (not spared).
	waitUntil(t, 10*time.Second, "the sleep in its own session", func() bool {
		pi, ok := readStat(pids[0])
		return ok && pi.sid == pids[0]
	})
	stub.mu.Lock()
	stub.spare[pids[0]] = true // as if it could not be ended (uninterruptible sleep)
	stub.mu.Unlock()
	if _, err := s.Close(ctxFor(t, 10*time.Second)); !errors.Is(err, ErrNotConfirmed) {
		t.Fatalf("close: %v, want ErrNotConfirmed", err)
	}
	stub.mu.Lock()
	stub.spare = map[int]bool{}
	stub.mu.Unlock()
	waitUntil(t, 20*time.Second, "the discovery loop to complete the scope", func() bool { return s.Receipt() != nil })
	r := s.Receipt()
	checkGone(t, r, pids...)
	if r2, err := s.Close(ctxFor(t, time.Second)); err != nil || r2 != r {
		t.Fatalf("close again: %v (the same receipt: %v)", err, r2 == r)
	}
	c.mu.Lock()
	open := len(c.scopes)
	c.mu.Unlock()
	if open != 0 {
		t.Fatalf("%d scope(s) still open", open)
	}
}

// Issue 23 item 5: a child that exited on its own long before Close, whose
// parent never reaped it, is first seen as a zombie once its parent is
// ended and it is reparented to the host. The receipt said "term" or
// "kill" (the phase it was found in); its exit status says it exited.
func TestScope_LateZombieEndedOnItsOwn(t *testing.T) {
	bothPaths(t, func(t *testing.T, opts Options) {
		opts.ScanInterval = time.Hour // no look but the test's and Close's
		c := newCustodian(t, opts)
		s, err := c.Start(ctxFor(t, 10*time.Second), exec.Command("/bin/sh", "-c",
			// The parent (an exec'd sleep) never reaps the child.
			`read go; (/bin/sh -c 'exit 3' & exec /bin/sleep 3077) & echo $!; exec cat`))
		if err != nil {
			t.Fatal(err)
		}
		// Start's own look ran before the child is born: no look sees it
		// alive.
		waitUntil(t, 10*time.Second, "Start's look", func() bool { return s.lookedAt.Load() != 0 })
		if _, err := s.Stdin().Write([]byte("go\n")); err != nil {
			t.Fatal(err)
		}
		parent := readPid(t, bufio.NewReader(s.Stdout()))
		var child int
		waitUntil(t, 10*time.Second, "the child to exit", func() bool {
			b, _ := os.ReadFile("/proc/" + strconv.Itoa(parent) + "/task/" + strconv.Itoa(parent) + "/children")
			f := strings.Fields(string(b))
			if len(f) != 1 {
				return false
			}
			child, _ = strconv.Atoi(f[0])
			pi, ok := readStat(child)
			return ok && pi.dead()
		})
		r, err := s.Close(ctxFor(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		checkGone(t, r, parent, child)
		for _, e := range r.Processes {
			if e.PID != child {
				continue
			}
			if e.Ended != EndedSelf {
				t.Errorf("the child that exited on its own ended %q, want exited:\n%s", e.Ended, r)
			}
			if e.ExitCode == nil || *e.ExitCode != 3 {
				t.Errorf("the child's exit code: %v, want 3", e.ExitCode)
			}
		}
	})
}

// Issue 23 item 3, portable containment: while Close waits for a killed
// process that is slow to go (exiting, or in uninterruptible sleep), a look
// finds a child born right before the KILL round, which ignores SIGTERM. It
// was adopted and never signalled: Close waited out Confirm and gave up on
// it, with no receipt. It is killed as soon as it is found.
func TestScope_LateChildKilledWhileCloseWaits(t *testing.T) {
	script := filepath.Join(t.TempDir(), "spawner.sh")
	if err := os.WriteFile(script, []byte(spawnerScript), 0o644); err != nil {
		t.Fatal(err)
	}
	c := newCustodian(t, Options{NoCgroup: true, Grace: 100 * time.Millisecond, TermGrace: 300 * time.Millisecond, Confirm: 3 * time.Second})
	stub := &stubbornPlatform{platform: c.plat, spare: map[int]bool{}}
	c.plat = stub
	cmd := exec.Command("/bin/sh", "-c", `setsid /bin/sleep 3089 & echo $!; /bin/sh "$0" & exec cat`, script)
	cmd.Env = append(os.Environ(), "LATE=exec /bin/sleep 3075", "IGNTERM=1")
	s, err := c.Start(ctxFor(t, 10*time.Second), cmd)
	if err != nil {
		t.Fatal(err)
	}
	out := bufio.NewReader(s.Stdout())
	slow := readPid(t, out)
	defer killIfAlive(slow)
	stub.mu.Lock()
	stub.spare[slow] = true // its signals do not end it (the test does, below)
	stub.mu.Unlock()
	spawner := readPid(t, out)
	late := 0
	defer func() {
		if late != 0 {
			killIfAlive(late)
		}
	}()
	done := make(chan struct{})
	defer func() { <-done }()
	testHookBeforeSignal = func(hs *Scope, phase int) {
		if hs != s || phase != 3 {
			return
		}
		if err := syscall.Kill(spawner, syscall.SIGUSR1); err != nil {
			t.Error(err)
		}
		late = readPid(t, out)
		// The slow one goes once a look has found the late child.
		go func() {
			defer close(done)
			for deadline := time.Now().Add(20 * time.Second); !ownsPid(s, late) && alive(late) && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond) // polling the scope: nothing to wait on
			}
			syscall.Kill(slow, syscall.SIGKILL)
		}()
	}
	defer func() { testHookBeforeSignal = nil }()
	r, err := s.Close(ctxFor(t, 20*time.Second))
	if late == 0 {
		close(done)
		t.Fatal("no late child was born")
	}
	if err != nil {
		t.Fatalf("close: %v", err)
	}
	checkGone(t, r, spawner, late, slow)
	for _, e := range r.Processes {
		if e.PID == late && e.Ended != EndedKill {
			t.Errorf("the late child ended %q, want kill:\n%s", e.Ended, r)
		}
	}
}

// Issue 21 item 9 / issue 23: agents end some of their children
// themselves on stdin EOF, and callers (rpc, acp) close stdin before they
// Close the scope. A child alive when stdin closed, which the agent then
// ended and reaped, was on the receipt only if a periodic look had seen
// it. Closing stdin looks first.
func TestScope_ChildEndedOnStdinEOFOnReceipt(t *testing.T) {
	c := newCustodian(t, Options{NoCgroup: true, ScanInterval: time.Hour}) // no look but the test's and Close's
	s, err := c.Start(ctxFor(t, 10*time.Second), exec.Command("/bin/sh", "-c",
		`read go; /bin/sleep 3121 & echo $!; read eof; kill $!; wait; exit 0`))
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "Start's look", func() bool { return s.lookedAt.Load() != 0 })
	if _, err := s.Stdin().Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	child := readPid(t, bufio.NewReader(s.Stdout()))
	defer killIfAlive(child)
	if err := s.Stdin().Close(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the agent to end its child", func() bool {
		_, ok := readStat(child)
		return !ok
	})
	r, err := s.Close(ctxFor(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	checkGone(t, r, child)
}
