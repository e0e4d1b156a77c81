package confine

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Policy's paths are canonical (a data dir reached through a link still
// works: the launcher opens no link), the room's own folders are never
// resolved (a link there is refused), and the TMPDIR beside the home is
// made afresh without following a link, the agent's own.
func TestPolicy_CanonicalPathsAndTmp(t *testing.T) {
	c, err := New(Options{Mode: ModeLandlock, KernelABI: abi(7), Exe: "/bin/launcher"})
	if err != nil {
		t.Fatal(err)
	}
	real := t.TempDir()
	data := filepath.Join(t.TempDir(), "data")
	if err := os.Symlink(real, data); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"ws", "rooms/r/home"} {
		if err := os.MkdirAll(filepath.Join(real, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	p, err := c.Policy(AgentRoom(filepath.Join(data, "ws"), filepath.Join(data, "rooms/r/home"), nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(real, "rooms/r/tmp")
	own := map[string]bool{}
	for _, r := range p.Rules {
		if r.Own {
			own[r.Path] = true
		}
	}
	if len(own) != 3 || !own[filepath.Join(real, "ws")] || !own[filepath.Join(real, "rooms/r/home")] || !own[tmp] || p.Tmp != tmp {
		t.Fatalf("own folders %v, tmp %s", own, p.Tmp)
	}

	// The TMPDIR made a link to another folder: emptied means the link
	// goes (never what it leads to), and a folder takes its place.
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "keep"), []byte("other's"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, tmp); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Policy(AgentRoom(filepath.Join(real, "ws"), filepath.Join(real, "rooms/r/home"), nil, nil)); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(tmp); err != nil || !fi.IsDir() {
		t.Fatalf("the TMPDIR: %v %v", fi, err)
	}
	if b, err := os.ReadFile(filepath.Join(other, "keep")); err != nil || string(b) != "other's" {
		t.Fatalf("the link's target was touched: %q %v", b, err)
	}
	// Not fresh (an attached agent's policy): a link is refused.
	if err := os.Remove(tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, tmp); err != nil {
		t.Fatal(err)
	}
	kept := AgentRoom(filepath.Join(real, "ws"), filepath.Join(real, "rooms/r/home"), nil, nil)
	kept.FreshTmp = false
	if _, err := c.Policy(kept); err == nil || !strings.Contains(err.Error(), "not a folder") {
		t.Fatalf("a TMPDIR link kept: %v", err)
	}
	os.Remove(tmp)

	// The home (the room's own) made a link: refused, not resolved.
	home := filepath.Join(real, "rooms/r/home")
	if err := os.Rename(home, home+".real"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(home+".real", home); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Policy(AgentRoom(filepath.Join(real, "ws"), home, nil, nil)); err == nil || !strings.Contains(err.Error(), "not a folder") {
		t.Fatalf("a home that is a link: %v", err)
	}
}

// With a user of its own, the TMPDIR is that user's, whether made afresh
// or kept.
func TestPolicy_TmpOfTheAgentsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving a folder to another uid needs root")
	}
	c, err := New(Options{Mode: ModeLandlock, KernelABI: abi(7), Exe: "/bin/launcher"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ws, home := filepath.Join(dir, "ws"), filepath.Join(dir, "room", "home")
	for _, d := range []string{ws, home} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	u := &User{UID: 3999002, GID: 3999003}
	for _, fresh := range []bool{true, false} {
		if err := os.Chown(agentTmp(home), 0, 0); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		r := AgentRoom(ws, home, nil, nil)
		r.User, r.FreshTmp = u, fresh
		p, err := c.Policy(r)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(p.Tmp)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != u.UID || int(st.Gid) != u.GID || fi.Mode().Perm() != 0o700 {
			t.Fatalf("fresh %v: the TMPDIR is %d:%d %v", fresh, st.Uid, st.Gid, fi.Mode())
		}
		if p.User == nil || *p.User != *u {
			t.Fatalf("the policy's user: %+v", p.User)
		}
	}
}
