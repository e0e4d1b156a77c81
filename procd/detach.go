//go:build unix

package procd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// maxLog is the daemon log's size past which a new daemon starts a new one.
const maxLog = 16 << 20

// Detach starts the daemon for dataDir in the background and returns once
// it answers: argv (with "--data DIR" appended) runs in a session of its
// own with its output appended to DIR/procd/daemon.log. A daemon that
// already answers is success. ctx bounds the wait. The caller should exit
// soon after: the daemon is its child until then, and is reparented after.
func Detach(ctx context.Context, dataDir string, argv, env []string) error {
	if len(argv) == 0 {
		return errors.New("procd: Detach needs a command")
	}
	if answering(ctx, dataDir) {
		return nil
	}
	if err := os.MkdirAll(procdDir(dataDir), 0o700); err != nil {
		return err
	}
	logPath := filepath.Join(procdDir(dataDir), logFile)
	if fi, err := os.Lstat(logPath); err == nil && fi.Size() > maxLog {
		// One old generation is kept; the log never grows past twice this.
		_ = os.Rename(logPath, logPath+".1")
	}
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("procd: daemon log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], append(argv[1:len(argv):len(argv)], "--data", dataDir)...)
	cmd.Env = withoutMarker(env)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("procd: starting the daemon: %w", err)
	}
	pid := cmd.Process.Pid
	_ = cmd.Process.Release()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	exited := false
	for {
		if answering(ctx, dataDir) {
			return nil
		}
		if !exited {
			// Polled, not waited for: the daemon outlives this call.
			var ws syscall.WaitStatus
			if wpid, _ := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); wpid == pid {
				exited = true
			}
		}
		if exited {
			// It failed, or lost the race to another daemon that holds
			// the lock and is still starting: that one is waited for.
			if free, _ := lockFree(dataDir); free {
				if answering(ctx, dataDir) {
					return nil
				}
				return fmt.Errorf("procd: the daemon exited; see %s", filepath.Join(procdDir(dataDir), logFile))
			}
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("procd: the daemon did not answer: %w", ctx.Err())
		}
	}
}

// answering reports whether the daemon of dataDir answers, in a protocol
// of this build or another's (its clients learn which from the
// VersionError).
func answering(ctx context.Context, dataDir string) bool {
	c, err := Dial(ctx, dataDir)
	if err == nil {
		_ = c.Close()
		return true
	}
	var verr *VersionError
	return errors.As(err, &verr)
}

// pidAlive reports whether pid runs (and is not a zombie).
func pidAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return syscall.Kill(pid, 0) == nil
	}
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == ')' && i+2 < len(b) {
			return b[i+2] != 'Z' && b[i+2] != 'X'
		}
	}
	return true
}
