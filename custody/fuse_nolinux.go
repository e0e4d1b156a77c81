//go:build !linux

package custody

// Other platforms have no cgroup, and no start time to check a pid by.

func cgroupFreeze(*cgroup, bool)       {}
func cgroupDir(*cgroup) string         { return "" }
func procStart(pid int) (uint64, bool) { return 0, procAlive(pid) }

// scopeProcs are the processes its host listed as t's scope (no /proc to
// look in here).
func scopeProcs(t *fuseTarget) []ident {
	var out []ident
	for _, m := range t.members {
		if procAlive(m.pid) {
			out = append(out, m)
		}
	}
	return out
}
