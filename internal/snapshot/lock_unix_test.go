//go:build unix

package snapshot

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// A child this process starts holds a copy of the repository's lock from
// its fork until its exec; the lock is taken once the copy goes (it failed
// with ErrLocked), and a lock held for good still fails after the grace.
func TestLockWaitsOutACopyInAChild(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agenthost.lock")
	held, err := lockFile(t.Context(), path, 0)
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command("/bin/sh", "-c", "read x")
	child.ExtraFiles = []*os.File{held}
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stdin.Close(); _ = child.Wait() }()
	held.Close() // the child's copy still holds it
	if f, err := lockFile(t.Context(), path, 0); !errors.Is(err, ErrLocked) {
		if f != nil {
			f.Close()
		}
		t.Fatalf("the lock while the child holds its copy: %v; want ErrLocked", err)
	}
	taken := make(chan error, 1)
	go func() {
		f, err := lockFile(t.Context(), path, lockGrace)
		if err == nil {
			f.Close()
		}
		taken <- err
	}()
	_ = stdin.Close()
	if err := <-taken; err != nil {
		t.Fatalf("the lock after the child let go: %v", err)
	}
	f, err := lockFile(t.Context(), path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := lockFile(t.Context(), path, 50*time.Millisecond); !errors.Is(err, ErrLocked) {
		t.Fatalf("a lock held for good: %v; want ErrLocked", err)
	}
}
