//go:build unix

package confine

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// lockWait bounds waiting for another process's allocation (a few file
// writes) to let go of the lock.
const lockWait = 30 * time.Second

// lockFile takes an exclusive lock on path (created 0600), held until
// unlock; after lockWait it gives up.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(lockWait)
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			break
		}
		if time.Now().After(deadline) {
			err = fmt.Errorf("another process held %s for %s", path, lockWait)
			break
		}
		time.Sleep(wait)
	}
	f.Close()
	return nil, err
}
