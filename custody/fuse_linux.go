//go:build linux

package custody

import (
	"os"
	"path/filepath"
)

// cgroupFreeze freezes (or thaws) a scope's cgroup v2 group, if it has one.
func cgroupFreeze(cg *cgroup, on bool) {
	if cg == nil {
		return
	}
	v := "0"
	if on {
		v = "1"
	}
	_ = os.WriteFile(filepath.Join(cg.dir, "cgroup.freeze"), []byte(v), 0)
}

func cgroupDir(cg *cgroup) string {
	if cg == nil {
		return ""
	}
	return cg.dir
}

// procStart is pid's start time, and whether it runs (a zombie does not).
func procStart(pid int) (uint64, bool) {
	pi, ok := readStat(pid)
	return pi.start, ok && pi.state != 'Z'
}
