//go:build linux

package snapshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A cancelled call kills git with everything it started, returns the
// context's error, and leaves the repository usable; Close interrupts a
// call in flight; a lock file a killed git left behind is no obstacle.
func TestRepo_Cancel(t *testing.T) {
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	write(t, ws, "a.txt", "a\n")
	realGit, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	// A git that hangs in write-tree, with a child of its own: the fault
	// the real git shows only on a stuck disk.
	pids := filepath.Join(base, "pids")
	write(t, base, "git", fmt.Sprintf(`#!/bin/sh
for a; do
	if [ "$a" = write-tree ]; then
		sleep 600 &
		echo "$$ $!" > %s.tmp && mv %s.tmp %s
		wait
		exit 1
	fi
done
exec %s "$@"
`, pids, pids, pids, realGit))
	hanging := filepath.Join(base, "git")
	if err := os.Chmod(hanging, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "snapshots")
	r := openRepoAt(t, dir, ws)
	snap(t, r)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	for _, how := range []string{"cancel", "close"} {
		t.Run(how, func(t *testing.T) {
			_ = os.Remove(pids)
			write(t, ws, how+".txt", how)
			r, err := Open(testCtx(t), dir, ws, Options{Git: hanging})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(testCtx(t))
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, _, err := r.Snapshot(ctx)
				done <- err
			}()
			procs := waitFile(t, pids)
			want := context.Canceled
			if how == "cancel" {
				cancel()
			} else {
				want = ErrClosed
				go func() { _ = r.Close() }()
			}
			select {
			case err := <-done:
				if !errors.Is(err, want) {
					t.Errorf("Snapshot: %v, want %v", err, want)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Snapshot did not return after its context ended")
			}
			for _, pid := range strings.Fields(procs) {
				waitGone(t, pid)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}

	// A lock file left behind, then the real git: the files whose
	// snapshots were interrupted (after the index was updated) are in.
	write(t, dir, "index.lock", "")
	r = openRepoAt(t, dir, ws)
	write(t, dir, "index.lock", "")
	id, _ := snap(t, r)
	if rec := treeOf(t, r, id); len(rec) != 3 || rec["cancel.txt"] == "" || rec["close.txt"] == "" {
		t.Errorf("the snapshot after the interruptions recorded %v, want a.txt, cancel.txt, close.txt", rec)
	}
}

// waitFile waits for path to appear and returns its content.
func waitFile(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil {
			return string(b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s never appeared", path)
	return ""
}

// waitGone waits for the process to be gone (or a zombie awaiting its
// parent's reaping).
func waitGone(t *testing.T, pid string) {
	t.Helper()
	n, err := strconv.Atoi(pid)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n))
		if err != nil || syscall.Kill(n, 0) != nil {
			return
		}
		if _, rest, ok := strings.Cut(string(stat), ") "); ok && strings.HasPrefix(rest, "Z") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("process %d outlived the cancelled call", n)
}

// A recorded file replaced by a FIFO is left out and reported, and the
// snapshot does not block on it.
func TestRepo_SpecialFile(t *testing.T) {
	ws := t.TempDir()
	write(t, ws, "pipe", "a file at first\n")
	r := openRepo(t, ws, Options{})
	snap(t, r)
	remove(t, ws, "pipe")
	if err := syscall.Mkfifo(filepath.Join(ws, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	id, rep := snap(t, r)
	if len(rep.Skipped) != 1 || rep.Skipped[0] != (Skipped{Path: "pipe", Reason: ReasonSpecial}) {
		t.Errorf("skipped %v, want the FIFO", rep.Skipped)
	}
	if rec := treeOf(t, r, id); len(rec) != 0 {
		t.Errorf("recorded %v, want nothing", rec)
	}
}
