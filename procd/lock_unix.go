//go:build unix

package procd

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
)

// lockService takes the exclusive lock a daemon holds for its whole life;
// ok is false when another daemon holds it.
func lockService(dataDir string) (f *os.File, ok bool, err error) {
	if err := os.MkdirAll(procdDir(dataDir), 0o700); err != nil {
		return nil, false, err
	}
	f, err = os.OpenFile(filepath.Join(procdDir(dataDir), lockFile), os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, false, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, err
	}
	return f, true, nil
}

// lockFree reports whether no daemon holds dataDir's lock.
func lockFree(dataDir string) (bool, error) {
	f, ok, err := lockService(dataDir)
	if ok {
		f.Close()
	}
	return ok, err
}
