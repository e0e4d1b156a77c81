//go:build !unix

package procd

import (
	"context"
	"os"
)

// Run needs Unix.
func Run(ctx context.Context, opts Options) error { return ErrUnsupportedPlatform }

// Detach needs Unix.
func Detach(ctx context.Context, dataDir string, argv, env []string) error {
	return ErrUnsupportedPlatform
}

func lockService(dataDir string) (*os.File, bool, error) { return nil, false, ErrUnsupportedPlatform }
func lockFree(dataDir string) (bool, error)              { return false, ErrUnsupportedPlatform }
