//go:build linux

package custody

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ownGroup is a shell prelude: G is the shell's cgroup directory.
const ownGroup = `G="$CG2$(sed -n 's/^0:://p' /proc/self/cgroup)"; `

// needCgroup skips where the host may make no cgroup v2 group (the
// portable path has no cgroup to nest in) and returns the cgroup2 mount.
func needCgroup(t *testing.T) string {
	t.Helper()
	if root, _ := probeCgroup(); root == "" {
		t.Skip("no cgroup v2 group can be made here: nothing to nest in")
	}
	return cgroup2Mount()
}

// waitInGroup waits until pid is in a cgroup whose path ends with suffix.
func waitInGroup(t *testing.T, pid int, suffix string) {
	t.Helper()
	waitUntil(t, 20*time.Second, "the process to join its cgroup", func() bool {
		return strings.HasSuffix(cgroupOfPid(pid), suffix)
	})
}

// Issue 23 item 2: a group below the scope's (a tool that makes one, a
// nested agenthost) made every Close fail ("the cgroup is not empty") and
// left the directories behind. Close judges emptiness from cgroup.events,
// ends what is below, and removes the groups depth first.
func TestScope_ChildCgroup(t *testing.T) {
	mount := needCgroup(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := newCustodian(t, Options{Grace: 100 * time.Millisecond, TermGrace: 300 * time.Millisecond})
	for _, tc := range []struct {
		name, script string
		in           string // the cgroup the printed pid joins, below the scope's
	}{
		{"an empty group below", ownGroup + `mkdir "$G/sub" && echo 0; exec cat`, ""},
		{"a process in a group below", ownGroup + `mkdir "$G/sub"; /bin/sh -c 'echo $$ > "$1/sub/cgroup.procs"; exec /bin/sleep 3070' sh "$G" & echo $!; exec cat`, "/sub"},
		{"a process two groups below", ownGroup + `mkdir -p "$G/a/b"; /bin/sh -c 'echo $$ > "$1/a/b/cgroup.procs"; exec /bin/sleep 3071' sh "$G" & echo $!; exec cat`, "/a/b"},
		// The nested host ignores SIGTERM: it is killed, and leaves its
		// scope's group (with its child) below ours.
		{"a nested custodian", helperEnv + `=host "$0" & exec cat`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("/bin/sh", "-c", tc.script, exe)
			cmd.Env = append(os.Environ(), "CG2="+mount)
			s, err := c.Start(ctxFor(t, 10*time.Second), cmd)
			if err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(s.Stdout()).ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			pid, err := strconv.Atoi(strings.Fields(line + " x")[0])
			if err != nil {
				t.Fatalf("script said %q", line)
			}
			if pid != 0 {
				defer killIfAlive(pid)
			}
			if tc.in != "" {
				waitInGroup(t, pid, tc.in)
			}
			dir := s.cg.dir
			r, err := s.Close(ctxFor(t, 20*time.Second))
			if err != nil {
				t.Fatalf("close: %v", err)
			}
			if pid != 0 {
				checkGone(t, r, pid)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("the scope's cgroup directory is left (%v)", err)
			}
		})
	}
}

// Issue 23 item 2, after a host's kill -9: reap looks into the groups
// below a dead host's scope (a process there has no marker here), ends
// what is there and removes them all, depth first; a group below that is
// empty does not keep the scope's directory either.
func TestReap_ChildCgroupOfDeadHost(t *testing.T) {
	mount := needCgroup(t)
	root, _ := probeCgroup()
	for _, tc := range []struct{ name, script string }{
		{"a markerless process in a group below", ownGroup + `mkdir "$G/sub"; env -i /usr/bin/setsid /bin/sh -c 'echo $$ > "$1/sub/cgroup.procs"; exec /bin/sleep 3072' sh "$G" & echo $!; exec cat`},
		{"an empty group below", ownGroup + `mkdir "$G/sub" && echo 0; exec cat`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host, pid, marker := startHost(t, "CG2="+mount, "AGENTHOST_CUSTODY_SCRIPT="+tc.script)
			scopeID := marker[strings.LastIndexByte(marker, '.')+1:]
			dirs := func() []string {
				m, _ := filepath.Glob(filepath.Join(root, cgroupPrefix+"*"+scopeID))
				return m
			}
			if len(dirs()) != 1 {
				t.Fatalf("the scope's cgroup directory: %v", dirs())
			}
			if pid != 0 {
				defer killIfAlive(pid)
				waitInGroup(t, pid, "/sub")
			}
			host.Process.Kill()
			host.Wait()
			if pid != 0 {
				reapOrphan(t, pid, "a process in a group below the dead host's scope")
			} else {
				// The leader (cat) ends on its stdin's EOF; then the
				// scope holds nothing but the empty group below.
				if !cgroupAt(dirs()[0]).waitEmpty(ctxFor(t, 20*time.Second), 20*time.Second) {
					t.Fatal("the dead host's leader did not end")
				}
				if left, err := KillOrphans(ctxFor(t, 20*time.Second), nil, time.Second); err != nil || len(left) != 0 {
					t.Fatalf("kill: %v left %v", err, left)
				}
			}
			if d := dirs(); len(d) != 0 {
				t.Fatalf("the dead host's cgroup directories are left: %v", d)
			}
		})
	}
}
