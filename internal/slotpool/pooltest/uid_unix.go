//go:build unix

package pooltest

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/agenthost/agenthost/internal/slotpool"
)

// UIDOf is the uid an agent-uid record in dir names (0: none), and
// whether the record owns it; it fails the test on a record that names
// another folder.
func UIDOf(t testing.TB, dir string) (uid int, owned bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "agent-uid"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, false
	}
	var rec struct {
		UID   int    `json:"uid"`
		Room  string `json:"room"`
		Owned bool   `json:"owned"`
	}
	if err != nil || json.Unmarshal(b, &rec) != nil {
		t.Fatalf("%s's agent-uid: %q, %v", dir, b, err)
	}
	if rec.Room != filepath.Base(dir) {
		t.Fatalf("%s's agent-uid names %q", dir, rec.Room)
	}
	return rec.UID, rec.Owned
}

// Holders are the room and slot folders under rooms whose records name
// uid.
func Holders(t testing.TB, rooms string, uid int) []string {
	t.Helper()
	var out []string
	dirs, _ := filepath.Glob(filepath.Join(rooms, "*"))
	slots, _ := filepath.Glob(filepath.Join(rooms, slotpool.Dir, "*"))
	for _, d := range append(dirs, slots...) {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() || filepath.Base(d) == slotpool.Dir {
			continue
		}
		if u, _ := UIDOf(t, d); u == uid {
			out = append(out, d)
		}
	}
	return out
}

// FileUID is the owner of path (not followed).
func FileUID(t testing.TB, path string) int {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return int(fi.Sys().(*syscall.Stat_t).Uid)
}

// TreeOwnedBy fails the test unless every entry of the folders is uid's.
func TreeOwnedBy(t testing.TB, uid int, folders ...string) {
	t.Helper()
	for _, f := range folders {
		_ = filepath.Walk(f, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				return nil
			}
			st := fi.Sys().(*syscall.Stat_t)
			// A file of several names is left as it is (agentfs.OwnTree).
			if got := int(st.Uid); got != uid && (fi.IsDir() || st.Nlink < 2) {
				t.Errorf("%s is uid %d's, not %d's", p, got, uid)
			}
			return nil
		})
	}
}
