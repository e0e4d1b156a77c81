package procd

import (
	"os"

	"golang.org/x/sys/unix"
)

// punch releases f's blocks from *done up to upto (page-aligned down),
// keeping its size and every offset: the range reads as zeros after.
func punch(f *os.File, done *int64, upto int64) error {
	upto -= upto % trimAlign
	if f == nil || upto <= *done {
		return nil
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		ferr = unix.Fallocate(int(fd), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, *done, upto-*done)
	}); err != nil {
		return err
	}
	if ferr != nil {
		return ferr
	}
	*done = upto
	return nil
}
