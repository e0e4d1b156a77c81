package confine

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

// usersConfiner is an enforcing Confiner (whatever the kernel) with the
// range rng, as if the server ran as root.
func usersConfiner(t *testing.T, rng UIDRange) *Confiner {
	t.Helper()
	c, err := New(Options{Mode: ModeLandlock, KernelABI: abi(MaxABI), Exe: "/bin/true", AgentUIDs: rng})
	if err != nil {
		t.Fatal(err)
	}
	c.euid = 0
	return c
}

// roomDir makes rooms/name (as the room manager does) and returns it.
func roomDir(t *testing.T, rooms, name string) string {
	t.Helper()
	d := filepath.Join(rooms, name)
	if err := os.MkdirAll(filepath.Join(d, "home"), 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestParseUIDs(t *testing.T) {
	for in, want := range map[string]UIDRange{
		"off": {}, "2000000000-2000999999": DefaultAgentUIDs, " 65536 - 65536 ": {65536, 65536}, "100000-2147483647": {100000, 1<<31 - 1},
	} {
		if got, err := ParseUIDs(in); err != nil || got != want {
			t.Errorf("ParseUIDs(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "1000-2000", "0-70000", "70000-60000", "70000", "70000-2147483648", "a-b", "-5-70000"} {
		if _, err := ParseUIDs(bad); err == nil {
			t.Errorf("ParseUIDs(%q) accepted", bad)
		}
	}
	if DefaultAgentUIDs.String() != "2000000000-2000999999" || (UIDRange{}).String() != "off" {
		t.Fatalf("String: %s, %s", DefaultAgentUIDs, UIDRange{})
	}
	if _, err := New(Options{AgentUIDs: UIDRange{First: 1, Last: 5}}); err == nil {
		t.Fatal("New took a range over the system's own ids")
	}
}

// Agents run as the server's user unless the server is root, the range
// is set and agents are confined.
func TestRoomUserOnlyWhenRootRangeAndEnforced(t *testing.T) {
	rooms := t.TempDir()
	dir := roomDir(t, rooms, "r")
	for name, c := range map[string]*Confiner{
		"nil":      nil,
		"no range": usersConfiner(t, UIDRange{}),
		"not enforced": func() *Confiner {
			c := usersConfiner(t, DefaultAgentUIDs)
			c.abi = 0
			return c
		}(),
		"not root": func() *Confiner {
			c := usersConfiner(t, DefaultAgentUIDs)
			c.euid = 1000
			return c
		}(),
	} {
		if u, err := c.RoomUser(dir); u != nil || err != nil {
			t.Errorf("%s: %+v, %v", name, u, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, uidFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a uid was recorded: %v", err)
	}
}

// Rooms started at once get distinct uids, kept in their folders (0600)
// for the next Confiner (a restart), also when two processes allocate on
// the same rooms' folder at once (two Confiners: only the lock file
// serialises them).
func TestRoomUserDistinctAndPersistent(t *testing.T) {
	rooms := t.TempDir()
	rng := UIDRange{First: 3_000_000, Last: 3_000_099}
	a, b := usersConfiner(t, rng), usersConfiner(t, rng)
	const n = 40
	got := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		dir := roomDir(t, rooms, fmt.Sprintf("room-%d", i))
		c := a
		if i%2 == 1 {
			c = b
		}
		wg.Go(func() {
			u, err := c.RoomUser(dir)
			if err != nil || u == nil || u.GID != u.UID {
				t.Errorf("room %d: %+v, %v", i, u, err)
				return
			}
			got[i] = u.UID
		})
	}
	wg.Wait()
	seen := map[int]int{}
	for i, uid := range got {
		if uid < rng.First || uid > rng.Last {
			t.Fatalf("room %d: uid %d outside %v", i, uid, rng)
		}
		if j, dup := seen[uid]; dup {
			t.Fatalf("rooms %d and %d both got uid %d", j, i, uid)
		}
		seen[uid] = i
	}
	// A restart: a new Confiner reads what each room holds.
	c := usersConfiner(t, rng)
	for i := range n {
		dir := filepath.Join(rooms, fmt.Sprintf("room-%d", i))
		u, err := c.RoomUser(dir)
		if err != nil || u.UID != got[i] {
			t.Fatalf("room %d after a restart: %+v, %v; want %d", i, u, err, got[i])
		}
		fi, err := os.Lstat(filepath.Join(dir, uidFile))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("room %d's agent-uid: %v, %v", i, fi, err)
		}
	}
	// And the next new room gets none of theirs.
	u, err := c.RoomUser(roomDir(t, rooms, "new"))
	if _, dup := seen[u.UID]; err != nil || dup {
		t.Fatalf("a new room: %+v, %v", u, err)
	}
}

// A full range refuses the next room; a purged room's uid goes to the
// next room that needs one, in this process and after a restart; a room
// whose folder was copied from another's, or whose uid is outside the
// range, gets a uid of its own.
func TestRoomUserExhaustionReclaimAndCopies(t *testing.T) {
	rooms := t.TempDir()
	rng := UIDRange{First: 4_000_000, Last: 4_000_001}
	c := usersConfiner(t, rng)
	r1, r2, r3 := roomDir(t, rooms, "r1"), roomDir(t, rooms, "r2"), roomDir(t, rooms, "r3")
	u1, err1 := c.RoomUser(r1)
	u2, err2 := c.RoomUser(r2)
	if err1 != nil || err2 != nil || u1.UID == u2.UID {
		t.Fatalf("%+v %v, %+v %v", u1, err1, u2, err2)
	}
	if u, err := c.RoomUser(r3); !errors.Is(err, ErrNoAgentUID) || u != nil {
		t.Fatalf("a third room in a range of two: %+v, %v", u, err)
	}
	if _, err := os.Lstat(filepath.Join(r3, uidFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused room has a uid file: %v", err)
	}
	// r1 is purged: its uid is r3's.
	if err := os.RemoveAll(r1); err != nil {
		t.Fatal(err)
	}
	if u, err := c.RoomUser(r3); err != nil || u.UID != u1.UID {
		t.Fatalf("after r1's purge: %+v, %v; want %d", u, err, u1.UID)
	}
	// After a restart too: r2 purged, r1 back (a new room of that id).
	if err := os.RemoveAll(r2); err != nil {
		t.Fatal(err)
	}
	c = usersConfiner(t, rng)
	r1 = roomDir(t, rooms, "r1")
	if u, err := c.RoomUser(r1); err != nil || u.UID != u2.UID {
		t.Fatalf("after r2's purge and a restart: %+v, %v; want %d", u, err, u2.UID)
	}

	// A copy of r3's folder holds r3's uid: it gets another.
	rooms = t.TempDir()
	c = usersConfiner(t, UIDRange{First: 4_100_000, Last: 4_100_009})
	orig := roomDir(t, rooms, "orig")
	uo, err := c.RoomUser(orig)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(orig, uidFile))
	if err != nil {
		t.Fatal(err)
	}
	cp := roomDir(t, rooms, "copy")
	if err := os.WriteFile(filepath.Join(cp, uidFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*Confiner{c, usersConfiner(t, UIDRange{First: 4_100_000, Last: 4_100_009})} {
		uc, err := c.RoomUser(cp)
		if err != nil || uc.UID == uo.UID {
			t.Fatalf("a copied folder: %+v, %v (the original has %d)", uc, err, uo.UID)
		}
		if again, err := c.RoomUser(orig); err != nil || again.UID != uo.UID {
			t.Fatalf("the original after the copy: %+v, %v", again, err)
		}
	}
	// The range moved: the room gets a uid of the new one.
	c = usersConfiner(t, UIDRange{First: 5_000_000, Last: 5_000_000})
	if u, err := c.RoomUser(orig); err != nil || u.UID != 5_000_000 || u.owned {
		t.Fatalf("a uid outside the range: %+v, %v", u, err)
	}
}

// ownerOf is path's uid (not following a link).
func ownerOf(t *testing.T, path string) int {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return int(fi.Sys().(*syscall.Stat_t).Uid)
}

// The first Policy of a room with a new uid gives its workspace, home
// and TMPDIR to it whole, never following a link out (another room's
// files and the data dir keep their owner), while a process of the room
// swaps a folder for such a link as fast as it can; later Policies give
// the folders themselves only. The policy carries the user.
func TestPolicyGivesTheRoomsFoldersToItsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving files to another user needs root")
	}
	base := t.TempDir()
	rooms := filepath.Join(base, "rooms")
	dir := roomDir(t, rooms, "r")
	ws, home := filepath.Join(base, "ws"), filepath.Join(dir, "home")
	other := filepath.Join(base, "other-room")
	for _, p := range []string{filepath.Join(ws, "src", "deep"), filepath.Join(home, "sessions"), other} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{filepath.Join(ws, "src", "deep", "a.go"), filepath.Join(home, "sessions", "s.jsonl"), filepath.Join(other, "secret")} {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{filepath.Join(ws, "out"): other, filepath.Join(home, "token"): filepath.Join(base, "token-file")} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(base, "token-file"), []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The swapper has swapped once before Policy starts, and goes on
	// until it ends.
	stop, done, swapping := make(chan struct{}), make(chan int), make(chan struct{})
	go func() {
		n := 0
		defer func() { done <- n }()
		src, real := filepath.Join(ws, "src"), filepath.Join(ws, "src.real")
		for {
			select {
			case <-stop:
				return
			default:
			}
			if os.Rename(src, real) == nil {
				_ = os.Symlink(other, src)
				_ = os.Remove(src)
				_ = os.Rename(real, src)
				if n++; n == 1 {
					close(swapping)
				}
			}
		}
	}()
	<-swapping
	c := usersConfiner(t, DefaultAgentUIDs)
	u, err := c.RoomUser(dir)
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.Policy(Room{Workspace: ws, Home: home, Tmp: filepath.Join(home, "tmp"), FreshTmp: true, User: u})
	close(stop)
	if n := <-done; err != nil || n == 0 {
		t.Fatalf("policy: %v (swaps %d)", err, n)
	}
	if p.User == nil || p.User.UID != u.UID || p.User.GID != u.GID {
		t.Fatalf("the policy's user: %+v", p.User)
	}
	var pj struct {
		User *User `json:"user"`
	}
	b, _ := json.Marshal(p)
	if err := json.Unmarshal(b, &pj); err != nil || pj.User == nil || *pj.User != (User{UID: u.UID, GID: u.GID}) {
		t.Fatalf("the policy's JSON: %s", b)
	}
	// src itself, swapped while the walk ran, may have been skipped (the
	// swapper only keeps the room from its own files): what must hold is
	// that nothing outside was given away (below).
	for _, path := range []string{ws, filepath.Join(ws, "out"),
		home, filepath.Join(home, "sessions", "s.jsonl"), filepath.Join(home, "token"), filepath.Join(home, "tmp")} {
		if got := ownerOf(t, path); got != u.UID {
			t.Errorf("%s: owned by %d, want %d", path, got, u.UID)
		}
	}
	for _, path := range []string{other, filepath.Join(other, "secret"), filepath.Join(base, "token-file"), dir, filepath.Join(dir, uidFile)} {
		if got := ownerOf(t, path); got != 0 {
			t.Errorf("%s (outside the room's folders): owned by %d", path, got)
		}
	}
	if rec, err := readUID(filepath.Join(dir, uidFile)); err != nil || !rec.Owned {
		t.Fatalf("the room's record: %+v, %v", rec, err)
	}
	// The next start (a new process: the record says it was done) gives
	// the folders themselves only.
	late := filepath.Join(ws, "late")
	if err := os.WriteFile(late, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(ws, 0, 0); err != nil {
		t.Fatal(err)
	}
	c = usersConfiner(t, DefaultAgentUIDs)
	if u, err = c.RoomUser(dir); err != nil || !u.owned {
		t.Fatalf("again: %+v, %v", u, err)
	}
	if _, err := c.Policy(Room{Workspace: ws, Home: home, Tmp: filepath.Join(home, "tmp"), User: u}); err != nil {
		t.Fatal(err)
	}
	if ownerOf(t, ws) != u.UID || ownerOf(t, late) != 0 {
		t.Fatalf("the second start: workspace %d, a file in it %d", ownerOf(t, ws), ownerOf(t, late))
	}
}

// A room's first start among 1,000 rooms that hold uids (the allocation
// scans their folders under the lock), and a later start (its record).
func BenchmarkRoomUser(b *testing.B) {
	rooms := b.TempDir()
	c, err := New(Options{Mode: ModeLandlock, KernelABI: abi(MaxABI), Exe: "/bin/true", AgentUIDs: DefaultAgentUIDs})
	if err != nil {
		b.Fatal(err)
	}
	c.euid = 0
	for i := range 1000 {
		d := filepath.Join(rooms, fmt.Sprintf("r%d", i))
		if err := os.Mkdir(d, 0o700); err != nil {
			b.Fatal(err)
		}
		if _, err := c.RoomUser(d); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("allocate", func(b *testing.B) {
		i := 0
		for b.Loop() {
			d := filepath.Join(rooms, fmt.Sprintf("new%d", i))
			i++
			if err := os.Mkdir(d, 0o700); err != nil {
				b.Fatal(err)
			}
			if _, err := c.RoomUser(d); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			_ = os.RemoveAll(d)
			b.StartTimer()
		}
	})
	b.Run("again", func(b *testing.B) {
		d := filepath.Join(rooms, "r500")
		for b.Loop() {
			if _, err := c.RoomUser(d); err != nil {
				b.Fatal(err)
			}
		}
	})
}
