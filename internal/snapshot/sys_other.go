//go:build !unix

package snapshot

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"time"
)

// lockGrace is unused where there is no flock.
const lockGrace = 0

// lockFile opens the lock file without locking it: on platforms without
// flock a second Repo on the same directory is not detected.
func lockFile(_ context.Context, path string, _ time.Duration) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("snapshot: lock: %w", err)
	}
	return f, nil
}

// killGroup leaves cmd's default cancellation: git alone is killed.
func killGroup(*exec.Cmd) {}

// readable says whether the host may read the file at path.
func readable(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	_ = f.Close()
	return true
}

// folderOwner is nil: files keep the host's user.
func folderOwner(*os.Root) *[2]int { return nil }
