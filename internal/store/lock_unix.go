//go:build unix

package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// lockGrace is how long Open waits for a lock held by a process it did
// not start on purpose: a child this process is starting holds a copy of
// every open file (the store's lock too, though close-on-exec) from its
// fork until its exec, a moment on an idle machine, longer on a busy one.
// A store closed and opened again in one process while other goroutines
// start processes (a host restarting its rooms) met that copy and failed
// with ErrLocked. Another process that holds the store holds it for good:
// it fails after lockGrace.
const lockGrace = 2 * time.Second

// lockFile takes an exclusive flock on path, trying again for grace (or
// until ctx ends) while it is held. The kernel drops it when the process
// dies, so a killed host never leaves the store locked.
func lockFile(ctx context.Context, path string, grace time.Duration) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: lock: %w", err)
	}
	deadline := time.Now().Add(grace)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("store: lock: %w", err)
		}
		if !time.Now().Before(deadline) || ctx.Err() != nil {
			_ = f.Close()
			return nil, fmt.Errorf("%w: %s", ErrLocked, path)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}
