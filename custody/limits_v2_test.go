//go:build linux

package custody

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// This machine's cgroup v2 hierarchy has none of the memory, pids and cpu
// controllers (they are in v1 hierarchies), so the v2 path runs here on a
// tree of plain files laid out as the kernel's: what custody writes there
// and reads back. A real v2 kernel's enforcement is not tested here.

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, v := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// A host alone in a delegated group (systemd's Delegate=yes) moves itself
// into the leaf and enables the controllers for its scopes beside it; a
// host sharing its group with another's processes does not; a host whose
// group already has them enabled (its leaf's parent) uses them as they are.
func TestPrepareV2(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	t.Run("alone in a delegated group", func(t *testing.T) {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{"cgroup.controllers": "cpuset cpu io memory hugetlb pids", "cgroup.subtree_control": "", "cgroup.procs": self + "\n"})
		pdir, prel, en, why := prepareV2(dir, "/system.slice/agenthost.service")
		if pdir != dir || prel != "/system.slice/agenthost.service" || why != "" || !en["memory"] || !en["pids"] || !en["cpu"] || len(en) != 3 {
			t.Fatalf("%s %s %v %q", pdir, prel, en, why)
		}
		if got := readFile(t, filepath.Join(dir, leafName, "cgroup.procs")); got != self {
			t.Errorf("the leaf holds %q", got)
		}
		if got := readFile(t, filepath.Join(dir, "cgroup.subtree_control")); got != "+memory +pids +cpu" {
			t.Errorf("subtree_control written %q", got)
		}
	})
	t.Run("a group shared with another's processes", func(t *testing.T) {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{"cgroup.controllers": "cpu memory pids", "cgroup.subtree_control": "", "cgroup.procs": "1\n" + self + "\n"})
		_, _, en, why := prepareV2(dir, "/user.slice/session-1.scope")
		if len(en) != 0 || !strings.Contains(why, "other processes") {
			t.Fatalf("%v %q", en, why)
		}
		if _, err := os.Stat(filepath.Join(dir, leafName)); err == nil {
			t.Error("a leaf was made in a shared group")
		}
	})
	t.Run("in the leaf already", func(t *testing.T) {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{"cgroup.controllers": "cpu memory pids", "cgroup.subtree_control": "cpu memory pids", leafName + "/cgroup.procs": self})
		pdir, prel, en, why := prepareV2(filepath.Join(dir, leafName), "/system.slice/agenthost.service/"+leafName)
		if pdir != dir || prel != "/system.slice/agenthost.service" || why != "" || len(en) != 3 {
			t.Fatalf("%s %s %v %q", pdir, prel, en, why)
		}
	})
	t.Run("no controllers in v2 (a hybrid host)", func(t *testing.T) {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{"cgroup.controllers": "hugetlb", "cgroup.subtree_control": "", "cgroup.procs": self})
		_, _, en, why := prepareV2(dir, "/")
		if len(en) != 0 || !strings.Contains(why, "none of the memory, pids and cpu controllers") {
			t.Fatalf("%v %q", en, why)
		}
	})
}

// A scope's v2 group gets memory.max, memory.high a tenth below,
// memory.swap.max 0, pids.max, an equal cpu.weight and cpu.max; its usage
// is read from cpu.stat, memory.peak, memory.events and pids.events.
func TestScopeResV2(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"memory.max": "max", "memory.high": "max", "memory.swap.max": "max", "pids.max": "max", "cpu.weight": "100", "cpu.max": "max 100000",
		"cpu.stat":      "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
		"memory.peak":   "314572800\n",
		"memory.events": "low 0\nhigh 3\nmax 9\noom 2\noom_kill 2\noom_group_kill 0\n",
		"pids.events":   "max 5\n",
	})
	r := &resources{v2: map[string]bool{"memory": true, "pids": true, "cpu": true}, v1: map[string]string{}}
	r.support = Support{Memory: ByCgroupV2, Pids: ByCgroupV2, CPU: ByCgroupV2, Metered: true}
	sr, err := r.prepare("x", &cgroup{dir: dir}, Limits{Memory: 1 << 30, Pids: 512, CPU: 1.5})
	if err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		"memory.max": "1073741824", "memory.high": strconv.Itoa(1<<30 - (1<<30)/10), "memory.swap.max": "0",
		"pids.max": "512", "cpu.weight": "100", "cpu.max": "150000 100000",
	} {
		if got := readFile(t, filepath.Join(dir, file)); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	u := sr.usage()
	want := Usage{CPU: 2500 * time.Millisecond, PeakMemory: 314572800, OOMKills: 2, ForksRefused: 5, Metered: true}
	if u != want {
		t.Errorf("usage %+v, want %+v", u, want)
	}
	if len(sr.rlimits) != 0 || len(sr.v1Dirs()) != 0 {
		t.Errorf("a v2 scope has rlimits %v or v1 groups %v", sr.rlimits, sr.v1Dirs())
	}
}
