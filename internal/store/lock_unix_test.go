//go:build unix

package store

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// A child this process starts holds a copy of the store's lock from its
// fork until its exec. A store closed and opened again meanwhile waits
// for the copy to go (it failed with ErrLocked); a lock held for good
// still fails after the grace.
func TestOpenWaitsOutALockCopyInAChild(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agenthost.db")
	db, err := Open(t.Context(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The child: holds the lock's open file (as a forked child does)
	// until its stdin closes.
	child := exec.Command("/bin/sh", "-c", "read x")
	child.ExtraFiles = []*os.File{db.lock}
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stdin.Close(); _ = child.Wait() }()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	// Held: without a grace, the lock is refused.
	if f, err := lockFile(t.Context(), path+".lock", 0); !errors.Is(err, ErrLocked) {
		if f != nil {
			f.Close()
		}
		t.Fatalf("the lock while the child holds its copy: %v; want ErrLocked", err)
	}
	opened := make(chan error, 1)
	go func() {
		db, err := Open(t.Context(), path, Options{})
		if err == nil {
			err = db.Close()
		}
		opened <- err
	}()
	_ = stdin.Close() // the child ends: its copy goes
	if err := <-opened; err != nil {
		t.Fatalf("open after the child let go: %v", err)
	}
	// Held for good (by another open file of this process): ErrLocked,
	// once the grace is over.
	f, err := lockFile(t.Context(), path+".lock", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := lockFile(t.Context(), path+".lock", 50*time.Millisecond); !errors.Is(err, ErrLocked) {
		t.Fatalf("a lock held for good: %v; want ErrLocked", err)
	}
}
