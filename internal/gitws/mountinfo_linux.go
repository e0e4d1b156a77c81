package gitws

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// sameFSWithin reports whether p is, in its filesystem, at or below where d is in the same
// filesystem: a bind mount of a folder inside d (mount --bind d/x elsewhere) is inside d. Both
// are resolved paths. It reads /proc/self/mountinfo; without it, it says false.
func sameFSWithin(p, d string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	mounts := parseMountinfo(string(b))
	pd, pp, ok1 := fsPlace(mounts, p)
	dd, dp, ok2 := fsPlace(mounts, d)
	return ok1 && ok2 && pd == dd && within(pp, dp)
}

// mount is one line of mountinfo: the filesystem's device, the folder of that filesystem
// mounted, and where.
type mount struct{ dev, root, point string }

func parseMountinfo(s string) []mount {
	var ms []mount
	for line := range strings.SplitSeq(s, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		ms = append(ms, mount{dev: f[2], root: unescapeMount(f[3]), point: unescapeMount(f[4])})
	}
	return ms
}

// fsPlace returns the device of the filesystem p is on and p's path from that filesystem's
// root: the mount with the longest mount point holding p (the last listed of equal ones, which
// is on top) decides.
func fsPlace(ms []mount, p string) (dev, fsPath string, ok bool) {
	best := -1
	for i, m := range ms {
		if !within(p, m.point) && m.point != "/" {
			continue
		}
		if best < 0 || len(m.point) >= len(ms[best].point) {
			best = i
		}
	}
	if best < 0 {
		return "", "", false
	}
	m := ms[best]
	rel, err := filepath.Rel(m.point, p)
	if err != nil {
		return "", "", false
	}
	return m.dev, filepath.Join(m.root, rel), true
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
