//go:build !unix

package store

import (
	"fmt"
	"os"
)

// lockFile opens the lock file without locking it: on platforms without
// flock a second process on the same store is not detected.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: lock: %w", err)
	}
	return f, nil
}
