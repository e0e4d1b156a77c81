//go:build unix && !linux

package procd

import (
	"errors"
	"os"
)

// punch: releasing a file's start keeping its offsets needs Linux's
// fallocate; elsewhere output files are trimmed only when removed.
func punch(f *os.File, done *int64, upto int64) error {
	upto -= upto % trimAlign
	if f == nil || upto <= *done {
		return nil
	}
	return errors.ErrUnsupported
}
