//go:build !linux

package custody

import (
	"context"
	"errors"
	"time"
)

// ErrUnsupported: finding orphans needs /proc (Linux).
var ErrUnsupported = errors.New("custody: finding orphans is supported on Linux only")

// FindOrphans is Linux only.
func FindOrphans() ([]Orphan, error) { return nil, ErrUnsupported }

// KillOrphans is Linux only.
func KillOrphans(context.Context, []Orphan, time.Duration) ([]int, error) {
	return nil, ErrUnsupported
}
