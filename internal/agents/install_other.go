//go:build !unix

package agents

import (
	"context"
	"io"
	"os/exec"
	"time"
)

// prepareInstall: npm alone is killed when the context ends (no process
// groups here).
func prepareInstall(cmd *exec.Cmd) { cmd.WaitDelay = 5 * time.Second }

// lockDir takes no lock on this platform: two installs at once may race.
func lockDir(context.Context, string, io.Writer) (func(), error) { return func() {}, nil }
