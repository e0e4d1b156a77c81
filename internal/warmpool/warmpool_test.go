//go:build unix

package warmpool

import (
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tree is every entry under dir: a file's content, "dir/" for a folder,
// "-> target" for a link.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case rel == ".":
		case d.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out[rel] = "-> " + target
		case d.IsDir():
			out[rel] = "dir/"
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = string(b)
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return out
}

func write(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for rel, body := range files {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// fixture is a room with a workspace and home, and a slot whose agent
// planted links in its folders (into a secret folder outside both, and
// where the room has a file and a folder of the same name).
type fixture struct {
	plan             Plan
	journal, secret  string
	roomWS, roomHome map[string]string
}

func newFixture(t *testing.T) fixture {
	dir := t.TempDir()
	f := fixture{journal: filepath.Join(dir, "slots", "s1", Journal), secret: filepath.Join(dir, "secret")}
	f.plan = Plan{
		Workspace: Pair{Slot: filepath.Join(dir, "workspaces", ".pool", "s1"), Room: filepath.Join(dir, "workspaces", "room")},
		Home:      Pair{Slot: filepath.Join(dir, "slots", "s1", "home"), Room: filepath.Join(dir, "rooms", "room", "home")},
		Tmp:       Pair{Slot: filepath.Join(dir, "slots", "s1", "tmp"), Room: filepath.Join(dir, "rooms", "room", "tmp")},
	}
	write(t, f.plan.Workspace.Room, map[string]string{"main.go": "package main", "src/a.txt": "a", "src/deep/b.txt": "b", "notes": "n"})
	write(t, f.plan.Home.Room, map[string]string{"sessions/1_abc.jsonl": "{}\n", ".omp/agent/memories/m": "memory", ".omp/agent/history.db": "room's history"})
	write(t, f.plan.Tmp.Room, map[string]string{"old": "tmp of the last run"})
	write(t, f.secret, map[string]string{"key": "the server's secret"})
	write(t, f.plan.Home.Slot, map[string]string{".omp/agent/history.db": "slot's history", ".omp/agent/agent.db": "slot's db"})
	write(t, f.plan.Tmp.Slot, map[string]string{"x": "slot tmp"})
	if err := os.MkdirAll(f.plan.Workspace.Slot, 0o700); err != nil {
		t.Fatal(err)
	}
	// The slot's agent plants links: where the room has a folder (src),
	// a file (notes), and where the home's sessions are.
	for _, l := range [][2]string{
		{f.secret, filepath.Join(f.plan.Workspace.Slot, "src")},
		{filepath.Join(f.secret, "key"), filepath.Join(f.plan.Workspace.Slot, "notes")},
		{f.secret, filepath.Join(f.plan.Home.Slot, "sessions")},
		{f.secret, filepath.Join(f.plan.Home.Slot, ".omp", "agent", "memories")},
	} {
		if err := os.Symlink(l[0], l[1]); err != nil {
			t.Fatal(err)
		}
	}
	f.roomWS, f.roomHome = tree(t, f.plan.Workspace.Room), tree(t, f.plan.Home.Room)
	return f
}

// checkRoomWhole: every entry the room had is where it was, with its
// content, and the secret folder is untouched.
func (f fixture) checkRoomWhole(t *testing.T) {
	t.Helper()
	for _, c := range []struct {
		dir  string
		want map[string]string
	}{{f.plan.Workspace.Room, f.roomWS}, {f.plan.Home.Room, f.roomHome}} {
		got := tree(t, c.dir)
		for rel, body := range c.want {
			if got[rel] != body {
				t.Errorf("%s: %q, want %q", filepath.Join(c.dir, rel), got[rel], body)
			}
		}
	}
	if got := tree(t, f.secret); !maps.Equal(got, map[string]string{"key": "the server's secret"}) {
		t.Errorf("the secret folder was reached: %v", got)
	}
}

// A bind makes the slot's folders the room's: every file of the room is
// there, the slot's links where the room has entries are gone (never
// followed: the secret folder is untouched), the slot's own files the room
// lacks stay, and the slot's folders and the journal are gone. The
// workspace and home are the slot's inodes (what the agent is confined
// to).
func TestBindMovesTheRoomIntoTheSlot(t *testing.T) {
	f := newFixture(t)
	var wsIno, homeIno uint64
	for p, ino := range map[string]*uint64{f.plan.Workspace.Slot: &wsIno, f.plan.Home.Slot: &homeIno} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		*ino = inode(fi)
	}
	if err := Bind(f.journal, f.plan, nil); err != nil {
		t.Fatal(err)
	}
	f.checkRoomWhole(t)
	home := tree(t, f.plan.Home.Room)
	if home[".omp/agent/agent.db"] != "slot's db" || home[".omp/agent/history.db"] != "room's history" {
		t.Errorf("home after the bind: %v", home)
	}
	if ws := tree(t, f.plan.Workspace.Room); len(ws) != len(f.roomWS) {
		t.Errorf("workspace after the bind: %v, want %v", ws, f.roomWS)
	}
	if tmp := tree(t, f.plan.Tmp.Room); !maps.Equal(tmp, map[string]string{"x": "slot tmp"}) {
		t.Errorf("tmp after the bind: %v", tmp)
	}
	for p, ino := range map[string]uint64{f.plan.Workspace.Room: wsIno, f.plan.Home.Room: homeIno} {
		fi, err := os.Stat(p)
		if err != nil || inode(fi) != ino {
			t.Errorf("%s is not the slot's folder: %v", p, err)
		}
	}
	for _, p := range []string{f.plan.Workspace.Slot, f.plan.Home.Slot, f.plan.Tmp.Slot, f.journal} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is left: %v", p, err)
		}
	}
}

// A bind stopped at each step (as a crash there would leave it) loses no
// file of the room: Recover puts every entry back and removes the slot.
func TestBindStoppedAtEachStepIsRecovered(t *testing.T) {
	for _, stop := range Steps {
		t.Run(stop, func(t *testing.T) {
			f := newFixture(t)
			err := Bind(f.journal, f.plan, func(step string) error {
				if step == stop {
					return errors.New("crash")
				}
				return nil
			})
			if !errors.Is(err, ErrFault) {
				t.Fatalf("Bind: %v, want the fault", err)
			}
			if err := Recover(f.journal); err != nil {
				t.Fatal(err)
			}
			f.checkRoomWhole(t)
			if _, err := os.Lstat(f.journal); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the journal is left: %v", err)
			}
			for _, p := range []string{f.plan.Workspace.Slot, f.plan.Home.Slot} {
				// Stopped before its journal, the bind touched nothing: the
				// slot is as it was (the pool removes leftover slots).
				if _, err := os.Lstat(p); stop != StepJournal && !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s is left: %v", p, err)
				}
			}
			if err := Recover(f.journal); err != nil {
				t.Fatalf("a second Recover: %v", err)
			}
		})
	}
}

// A crash after some of the room's entries moved (mid-merge) is recovered
// too: the journal names each before it moves.
func TestRecoverMidMerge(t *testing.T) {
	f := newFixture(t)
	j, err := createJournal(f.journal, f.plan)
	if err != nil {
		t.Fatal(err)
	}
	// Move the workspace as a bind would, then stop half way through the
	// home: only the entries recorded so far moved.
	if err := merge(j, "ws", f.plan.Workspace); err != nil {
		t.Fatal(err)
	}
	if err := record(j, "home", "sessions"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(f.plan.Home.Slot, "sessions")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(f.plan.Home.Room, "sessions"), filepath.Join(f.plan.Home.Slot, "sessions")); err != nil {
		t.Fatal(err)
	}
	j.Write([]byte(`home "torn`)) // a torn last line
	j.Close()
	if got := tree(t, f.plan.Workspace.Room); len(got) != 0 {
		t.Fatalf("the merge left %v in the room's workspace", slices.Sorted(maps.Keys(got)))
	}
	if err := Recover(f.journal); err != nil {
		t.Fatal(err)
	}
	f.checkRoomWhole(t)
}

func inode(fi fs.FileInfo) uint64 { return fi.Sys().(*syscall.Stat_t).Ino }
