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

// scopeProcs are the live processes of t's scope a group signal misses:
// its listed members (still the processes they were), every process
// carrying its marker, and every descendant of those or of its leader's
// group, from one reading of /proc.
func scopeProcs(t *fuseTarget) []ident {
	var all []procInfo
	byPid := map[int]procInfo{}
	for _, pid := range listPids("/proc") {
		if pi, ok := readStat(pid); ok && !pi.dead() {
			all = append(all, pi)
			byPid[pid] = pi
		}
	}
	in := map[int]bool{}
	for _, m := range t.members {
		if pi, ok := byPid[m.pid]; ok && (m.start == 0 || pi.start == m.start) {
			in[m.pid] = true
		}
	}
	for _, pi := range all {
		if pi.pgid == t.pid && t.alive() {
			in[pi.pid] = true
		}
		if t.marker != "" && readMarker(pi.pid) == t.marker {
			in[pi.pid] = true
		}
	}
	// Descendants: a process whose parent is in, until none is added.
	for added := true; added; {
		added = false
		for _, pi := range all {
			if !in[pi.pid] && in[pi.ppid] {
				in[pi.pid], added = true, true
			}
		}
	}
	out := make([]ident, 0, len(in))
	for pid := range in {
		out = append(out, ident{pid: pid, start: byPid[pid].start})
	}
	return out
}
