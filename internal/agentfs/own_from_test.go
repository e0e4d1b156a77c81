//go:build unix

package agentfs

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// OwnTreeFrom gives files of several names too when they are the uid
// from's (a room's earlier agent uid, freed), and leaves those of anyone
// else (the server's) as OwnTree does.
func TestOwnTreeFrom(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving files to another user needs root")
	}
	f := newFixture(t)
	f.write(t, "ws/theirs", "two names, the earlier uid's")
	f.write(t, "ws/servers", "two names, the server's")
	for _, n := range []string{"theirs", "servers"} {
		if err := os.Link(filepath.Join(f.room, "ws", n), filepath.Join(f.room, "ws", n+"2")); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Lchown(filepath.Join(f.room, "ws", "theirs"), 4250, 4250); err != nil {
		t.Fatal(err)
	}
	o := Owner{UID: 4251, GID: 4251}
	res, err := OwnTreeFrom(filepath.Join(f.room, "ws"), o, 4250)
	if err != nil {
		t.Fatal(err)
	}
	// ws, theirs, theirs2 (the same file, met twice).
	if res.Entries != 3 || res.Linked != 2 {
		t.Fatalf("%+v: want the server's two names left", res)
	}
	for n, want := range map[string]uint32{"theirs": 4251, "theirs2": 4251, "servers": 0, "servers2": 0} {
		fi, _ := os.Lstat(filepath.Join(f.room, "ws", n))
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != want {
			t.Errorf("%s: uid %d, want %d", n, st.Uid, want)
		}
	}
	f.untouched(t)
}
