//go:build unix

package agents

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// prepareInstall runs npm in its own process group, ended whole (npm's
// install scripts included) when the context ends.
func prepareInstall(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A script's child that keeps npm's output open does not hold Wait.
	cmd.WaitDelay = 5 * time.Second
}

// lockDir takes an exclusive lock on dir/.install.lock, waiting (while ctx
// lasts) for another process that holds it; unlock releases it.
func lockDir(ctx context.Context, dir string, progress io.Writer) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("agents: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, ".install.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("agents: %w", err)
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for said := false; ; said = true {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the lock
		}
		if err != syscall.EWOULDBLOCK {
			f.Close()
			return nil, fmt.Errorf("agents: locking %s: %w", f.Name(), err)
		}
		if !said {
			fmt.Fprintf(progress, "agenthost: waiting for another agenthost installing into %s\n", dir)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("%w: waiting for another install: %w", ErrInstall, ctx.Err())
		case <-tick.C:
		}
	}
}
