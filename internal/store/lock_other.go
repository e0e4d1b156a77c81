//go:build !unix

package store

import (
	"context"
	"fmt"
	"os"
	"time"
)

// lockGrace is unused where there is no flock.
const lockGrace = 0

// lockFile opens the lock file without locking it: on platforms without
// flock a second process on the same store is not detected.
func lockFile(_ context.Context, path string, _ time.Duration) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: lock: %w", err)
	}
	return f, nil
}
