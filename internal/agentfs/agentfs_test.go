//go:build unix

package agentfs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a room folder and, beside it, an outside folder the server
// may write and the agent may not: every attack aims a link at it.
type fixture struct {
	room, outside string
	d             *Dir
	before        map[string]string // the outside folder's state
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	base := t.TempDir()
	f := &fixture{room: filepath.Join(base, "room"), outside: filepath.Join(base, "outside")}
	for _, d := range []string{f.room, filepath.Join(f.outside, "sub")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range map[string]string{"secret": "the server's secret\nnot json", "sub/secret": "another secret"} {
		if err := os.WriteFile(filepath.Join(f.outside, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f.before = snapshot(t, f.outside)
	d, err := Open(f.room, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	f.d = d
	return f
}

// snapshot is every entry beneath dir: its type, mode, owner and content.
func snapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		v := fmt.Sprintf("%v %d:%d", fi.Mode(), st.Uid, st.Gid)
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + string(b)
		}
		out[p] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// untouched fails unless the outside folder is as it was.
func (f *fixture) untouched(t testing.TB) {
	t.Helper()
	after := snapshot(t, f.outside)
	for p, v := range f.before {
		if after[p] != v {
			t.Errorf("outside %s: %q, was %q", p, after[p], v)
		}
	}
	for p := range after {
		if _, ok := f.before[p]; !ok {
			t.Errorf("outside %s: new", p)
		}
	}
}

// plant makes room/name a link to target.
func (f *fixture) plant(t testing.TB, name, target string) {
	t.Helper()
	p := filepath.Join(f.room, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) write(t testing.TB, name, data string) {
	t.Helper()
	p := filepath.Join(f.room, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) fifo(t testing.TB, name string) {
	t.Helper()
	p := filepath.Join(f.room, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
}

// isRegular fails unless room/name is a regular file holding data.
func (f *fixture) isRegular(t testing.TB, name, data string) {
	t.Helper()
	p := filepath.Join(f.room, name)
	fi, err := os.Lstat(p)
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("%s: %v, %v: want a regular file", name, fi, err)
	}
	if b, _ := os.ReadFile(p); string(b) != data {
		t.Fatalf("%s: %q, want %q", name, b, data)
	}
}

// withDeadline fails the test if fn does not return within a minute (a
// read that blocked on a FIFO).
func withDeadline(t *testing.T, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the operation blocked")
	}
}

func TestReadRefusesLinksAndSpecialFiles(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, f *fixture)
		read  string
		want  error
	}{
		{"a link out", func(t *testing.T, f *fixture) { f.plant(t, "s.jsonl", filepath.Join(f.outside, "secret")) }, "s.jsonl", ErrLink},
		{"a relative link out", func(t *testing.T, f *fixture) { f.plant(t, "s.jsonl", "../outside/secret") }, "s.jsonl", ErrLink},
		{"a link inside", func(t *testing.T, f *fixture) {
			f.write(t, "real", "x")
			f.plant(t, "s.jsonl", "real")
		}, "s.jsonl", ErrLink},
		{"a parent link out", func(t *testing.T, f *fixture) { f.plant(t, "sessions", filepath.Join(f.outside, "sub")) }, "sessions/secret", ErrLink},
		{"a parent link inside", func(t *testing.T, f *fixture) {
			f.write(t, "real/secret", "x")
			f.plant(t, "sessions", "real")
		}, "sessions/secret", ErrLink},
		{"a FIFO", func(t *testing.T, f *fixture) { f.fifo(t, "s.jsonl") }, "s.jsonl", ErrNotRegular},
		{"a folder", func(t *testing.T, f *fixture) {
			if err := os.Mkdir(filepath.Join(f.room, "s.jsonl"), 0o700); err != nil {
				t.Fatal(err)
			}
		}, "s.jsonl", ErrNotRegular},
		{"too large", func(t *testing.T, f *fixture) { f.write(t, "s.jsonl", strings.Repeat("x", 101)) }, "s.jsonl", ErrTooLarge},
		{"missing", func(t *testing.T, f *fixture) {}, "s.jsonl", fs.ErrNotExist},
		{"dotdot", func(t *testing.T, f *fixture) {}, "../outside/secret", ErrName},
		{"absolute", func(t *testing.T, f *fixture) {}, "/etc/passwd", ErrName},
		{"unclean", func(t *testing.T, f *fixture) {}, "a//b", ErrName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tc.setup(t, f)
			withDeadline(t, func() {
				b, err := f.d.ReadFile(tc.read, 100)
				if !errors.Is(err, tc.want) || b != nil {
					t.Errorf("ReadFile: %q, %v; want %v", b, err, tc.want)
				}
			})
			withDeadline(t, func() {
				if fh, err := f.d.OpenFile(tc.read, os.O_WRONLY|os.O_APPEND); !errors.Is(err, tc.want) && !(tc.want == ErrTooLarge && err == nil) {
					t.Errorf("OpenFile: %v; want %v", err, tc.want)
				} else if err == nil {
					fh.Close()
				}
			})
			f.untouched(t)
		})
	}
	f := newFixture(t)
	f.write(t, "sessions/a.jsonl", "ok\n")
	if b, err := f.d.ReadFile("sessions/a.jsonl", 3); err != nil || string(b) != "ok\n" {
		t.Fatalf("a regular file: %q, %v", b, err)
	}
}

func TestWriteReplacesLinks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, f *fixture)
		write string
	}{
		{"a link out", func(t *testing.T, f *fixture) {
			f.plant(t, "agenthost-overlay.yml", filepath.Join(f.outside, "secret"))
		}, "agenthost-overlay.yml"},
		{"a dangling link out", func(t *testing.T, f *fixture) { f.plant(t, "x.yml", filepath.Join(f.outside, "new")) }, "x.yml"},
		{"a link inside", func(t *testing.T, f *fixture) {
			f.write(t, "mine", "the agent's own")
			f.plant(t, "x.yml", "mine")
		}, "x.yml"},
		{"a parent link out", func(t *testing.T, f *fixture) { f.plant(t, ".omp", filepath.Join(f.outside, "sub")) }, ".omp/agent/models.yml"},
		{"a deeper parent link out", func(t *testing.T, f *fixture) { f.plant(t, ".omp/agent", filepath.Join(f.outside, "sub")) }, ".omp/agent/models.yml"},
		{"a parent link by dotdot", func(t *testing.T, f *fixture) { f.plant(t, ".pi", "../outside") }, ".pi/secret"},
		{"a FIFO", func(t *testing.T, f *fixture) { f.fifo(t, "room.json") }, "room.json"},
		{"a file", func(t *testing.T, f *fixture) { f.write(t, "room.json", "old and longer") }, "room.json"},
		{"nothing", func(t *testing.T, f *fixture) {}, "a/b/c.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tc.setup(t, f)
			withDeadline(t, func() {
				if err := f.d.WriteFile(tc.write, []byte("the server's"), 0o640); err != nil {
					t.Fatal(err)
				}
			})
			f.isRegular(t, tc.write, "the server's")
			if fi, _ := os.Lstat(filepath.Join(f.room, tc.write)); fi.Mode().Perm() != 0o640 {
				t.Errorf("mode %v", fi.Mode())
			}
			for d := filepath.Dir(tc.write); d != "."; d = filepath.Dir(d) {
				if fi, err := os.Lstat(filepath.Join(f.room, d)); err != nil || !fi.IsDir() {
					t.Errorf("parent %s: %v, %v", d, fi, err)
				}
			}
			f.untouched(t)
			if b, _ := os.ReadFile(filepath.Join(f.room, "mine")); tc.name == "a link inside" && string(b) != "the agent's own" {
				t.Errorf("the link's target inside: %q", b)
			}
		})
	}
	f := newFixture(t)
	if err := os.Mkdir(filepath.Join(f.room, "dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := f.d.WriteFile("dir", []byte("x"), 0o600); err == nil {
		t.Fatal("a write over a folder succeeded")
	}
	if ents, _ := os.ReadDir(f.room); len(ents) != 1 {
		t.Fatalf("left behind: %v", ents)
	}
}

func TestMkdirSymlinkRemoveGlob(t *testing.T) {
	f := newFixture(t)
	f.plant(t, "a", filepath.Join(f.outside, "sub"))
	if err := f.d.MkdirAll("a/b", 0o700); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(f.room, "a", "b")); err != nil || !fi.IsDir() {
		t.Fatalf("a/b: %v", err)
	}
	if err := f.d.Symlink("/usr/lib/something", "a/b/pkg"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.Readlink(filepath.Join(f.room, "a/b/pkg")); got != "/usr/lib/something" {
		t.Fatalf("symlink: %q", got)
	}

	// Removal never follows a parent link, nor removes a link's target.
	f.plant(t, "l", filepath.Join(f.outside, "sub"))
	f.plant(t, "c/link", filepath.Join(f.outside, "secret"))
	f.plant(t, "c/d/link", filepath.Join(f.outside, "sub"))
	for _, tc := range []struct {
		name string
		op   func() error
		want error
	}{
		{"Remove through a link", func() error { return f.d.Remove("l/secret") }, ErrLink},
		{"RemoveAll through a link", func() error { return f.d.RemoveAll("l/secret") }, ErrLink},
		{"Remove a link", func() error { return f.d.Remove("l") }, nil},
		{"RemoveAll a tree of links", func() error { return f.d.RemoveAll("c") }, nil},
		{"RemoveAll nothing", func() error { return f.d.RemoveAll("nothing/at/all") }, nil},
		{"Remove nothing", func() error { return f.d.Remove("nothing") }, fs.ErrNotExist},
	} {
		if err := tc.op(); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	for _, n := range []string{"l", "c"} {
		if _, err := os.Lstat(filepath.Join(f.room, n)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s not removed: %v", n, err)
		}
	}

	// Glob: only regular files; a linked folder is refused.
	f.write(t, "sessions/1_id.jsonl", "a")
	f.write(t, "sessions/2_id.jsonl", "b")
	f.plant(t, "sessions/zzzz_id.jsonl", filepath.Join(f.outside, "secret"))
	f.plant(t, "sessions/zzzy_id.jsonl", "1_id.jsonl")
	f.fifo(t, "sessions/3_id.jsonl")
	if err := os.Mkdir(filepath.Join(f.room, "sessions", "4_id.jsonl"), 0o700); err != nil {
		t.Fatal(err)
	}
	got, err := f.d.Glob("sessions/*_id.jsonl")
	if want := []string{"sessions/1_id.jsonl", "sessions/2_id.jsonl"}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("Glob: %v, %v; want %v", got, err, want)
	}
	if got, err := f.d.Glob("nowhere/*"); err != nil || got != nil {
		t.Fatalf("Glob of a missing folder: %v, %v", got, err)
	}
	f.plant(t, "linked", filepath.Join(f.outside, "sub"))
	if got, err := f.d.Glob("linked/*"); !errors.Is(err, ErrLink) {
		t.Fatalf("Glob through a link: %v, %v", got, err)
	}
	if _, err := f.d.Glob("sessions/["); !errors.Is(err, filepath.ErrBadPattern) {
		t.Fatalf("bad pattern: %v", err)
	}
	f.untouched(t)
}

func TestGlobBounded(t *testing.T) {
	f := newFixture(t)
	for i := range MaxGlob + 1 {
		f.write(t, fmt.Sprintf("s/%d_x.jsonl", i), "")
	}
	if _, err := f.d.Glob("s/*_x.jsonl"); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Glob: %v", err)
	}
}

// A process of the room swaps a folder for a link out, and back, as fast
// as it can while the server's operations run: none ever touches the
// outside folder, whatever the interleaving.
func TestConcurrentSwapNeverReachesOutside(t *testing.T) {
	f := newFixture(t)
	root := os.Geteuid() == 0
	f.write(t, "a/f", "inside")
	stop := make(chan struct{})
	swapped := make(chan int)
	go func() {
		n := 0
		defer func() { swapped <- n }()
		a, real := filepath.Join(f.room, "a"), filepath.Join(f.room, "a.real")
		for {
			select {
			case <-stop:
				return
			default:
			}
			if os.Rename(a, real) == nil {
				_ = os.Symlink(f.outside, a)
				_ = os.Remove(a)
				_ = os.Rename(real, a)
				n++
			}
			// The server's writes replace the link with a folder now and
			// then: it is put back as a link the next time round.
			_ = os.RemoveAll(real)
		}
	}()
	ops := []func() error{
		func() error { return f.d.WriteFile("a/f", []byte("server"), 0o600) },
		func() error { _, err := f.d.ReadFile("a/secret", 1<<10); return err },
		func() error { _, err := f.d.ReadFile("a/f", 1<<10); return err },
		func() error { return f.d.MkdirAll("a/sub/x", 0o700) },
		func() error { return f.d.Remove("a/secret") },
		func() error { return f.d.RemoveAll("a/sub") },
		func() error { _, err := f.d.Glob("a/*"); return err },
		func() error { return f.d.Symlink("x", "a/l") },
		func() error { _, err := f.d.Lstat("a/secret"); return err },
	}
	if root {
		ops = append(ops, func() error { _, err := OwnTree(f.room, Owner{UID: 4242, GID: 4242}); return err })
	}
	for i := range 3000 {
		_ = ops[i%len(ops)]()
	}
	close(stop)
	if n := <-swapped; n == 0 {
		t.Fatal("the swapper never swapped")
	}
	f.untouched(t)
}

func TestOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving files to another user needs root")
	}
	f := newFixture(t)
	o := Owner{UID: 4243, GID: 4244}
	d, err := Create(filepath.Join(f.room, "home"), 0o700, &o)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	f.plant(t, "home/.omp", filepath.Join(f.outside, "sub"))
	if err := d.WriteFile(".omp/agent/models.yml", []byte("m"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.Symlink("target", ".omp/l"); err != nil {
		t.Fatal(err)
	}
	if err := d.MkdirAll("sessions", 0o700); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{".", ".omp", ".omp/agent", ".omp/agent/models.yml", ".omp/l", "sessions"} {
		fi, err := os.Lstat(filepath.Join(f.room, "home", n))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 4243 || st.Gid != 4244 {
			t.Errorf("%s: owned by %d:%d", n, st.Uid, st.Gid)
		}
	}
	f.untouched(t)
}

func TestOwnTree(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving files to another user needs root")
	}
	f := newFixture(t)
	f.write(t, "ws/a/b/file", "x")
	f.write(t, "ws/linked", "two names")
	if err := os.Link(filepath.Join(f.room, "ws/linked"), filepath.Join(f.room, "ws/a/linked2")); err != nil {
		t.Fatal(err)
	}
	f.plant(t, "ws/out", filepath.Join(f.outside, "secret"))
	f.plant(t, "ws/outdir", filepath.Join(f.outside, "sub"))
	f.fifo(t, "ws/fifo")
	dev := filepath.Join(f.room, "ws", "null")
	if err := syscall.Mknod(dev, syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Fatal(err)
	}
	o := Owner{UID: 4245, GID: 4246}
	res, err := OwnTree(filepath.Join(f.room, "ws"), o)
	if err != nil {
		t.Fatal(err)
	}
	// ws, a, b, file, out, outdir, fifo.
	if res.Entries != 7 || res.Linked != 2 || res.Devices != 1 || res.Skipped != 0 {
		t.Fatalf("%+v", res)
	}
	for _, n := range []string{"", "a", "a/b", "a/b/file", "out", "outdir", "fifo"} {
		fi, _ := os.Lstat(filepath.Join(f.room, "ws", n))
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != o.UID || int(st.Gid) != o.GID {
			t.Errorf("%q: owned by %d:%d", n, st.Uid, st.Gid)
		}
	}
	fi, _ := os.Lstat(filepath.Join(f.room, "ws/linked"))
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 {
		t.Errorf("a file with two names was given away: %d", st.Uid)
	}
	if _, err := os.Lstat(dev); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the device stays: %v", err)
	}
	if err := OwnFolder(filepath.Join(f.room, "ws"), Owner{UID: 4247, GID: 4247}); err != nil {
		t.Fatal(err)
	}
	if err := OwnFolder(filepath.Join(f.room, "ws", "outdir"), o); !errors.Is(err, ErrLink) {
		t.Fatalf("OwnFolder of a link: %v", err)
	}
	if _, err := OwnTree(filepath.Join(f.room, "ws", "outdir"), o); !errors.Is(err, ErrLink) {
		t.Fatalf("OwnTree of a link: %v", err)
	}
	f.untouched(t)
}

// FuzzOperations lays out a room from the input (folders, files, links
// out and in, FIFOs, at a few names) and runs every operation on every
// name: none reaches the outside folder, none blocks, and every read
// returns only what a regular file in the room holds.
func FuzzOperations(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5})
	f.Add([]byte{2, 0, 3, 9, 4, 10, 1, 12})
	f.Add([]byte{16, 33, 50, 67, 84, 101, 118})
	names := []string{"a", "b", "a/b", "a/c", "b/c", "a/b/c", ".omp", ".omp/agent"}
	f.Fuzz(func(t *testing.T, layout []byte) {
		fx := newFixture(t)
		for _, c := range layout[:min(len(layout), 16)] {
			rel := names[int(c>>3)%len(names)]
			if !realParents(fx.room, rel) {
				continue // the layout itself must not write through its links
			}
			name := filepath.Join(fx.room, rel)
			switch c % 6 {
			case 0:
				_ = os.Mkdir(name, 0o700)
			case 1:
				if fh, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err == nil {
					_, _ = fh.WriteString("inside")
					fh.Close()
				}
			case 2:
				_ = os.Symlink(filepath.Join(fx.outside, "secret"), name)
			case 3:
				_ = os.Symlink(filepath.Join(fx.outside, "sub"), name)
			case 4:
				_ = os.Symlink("../..", name)
			case 5:
				_ = syscall.Mkfifo(name, 0o600)
			}
		}
		withDeadline(t, func() {
			for _, n := range names {
				if b, err := fx.d.ReadFile(n, 1<<10); err == nil && !bytes.Equal(b, []byte("inside")) {
					t.Errorf("read %s: %q", n, b)
				}
				_, _ = fx.d.Glob(filepath.Join(n, "*"))
				_, _ = fx.d.Lstat(n)
			}
			for _, n := range names {
				_ = fx.d.WriteFile(n, []byte("server"), 0o600)
				_ = fx.d.MkdirAll(filepath.Join(n, "x"), 0o700)
				_ = fx.d.Remove(filepath.Join(n, "secret"))
				_ = fx.d.RemoveAll(n)
			}
		})
		fx.untouched(t)
	})
}

// realParents makes the folders of rel in room, and reports false when one
// is something else (a link).
func realParents(room, rel string) bool {
	d := room
	for _, e := range strings.Split(filepath.Dir(rel), "/") {
		if e == "." {
			break
		}
		d = filepath.Join(d, e)
		_ = os.Mkdir(d, 0o700)
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
			return false
		}
	}
	return true
}
