//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/procd"
	"github.com/creack/pty"
)

// TestProc_Commands drives agenthost proc run|list|get|wait|signal|kill|
// shutdown against a daemon the commands start (the test binary running
// agenthost procd).
func TestProc_Commands(t *testing.T) {
	procDaemonEnv = append(os.Environ(), serveHelperEnv+"=1")
	defer func() { procDaemonEnv = nil }()
	data := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	defer func() { _ = run(ctx, []string{"proc", "shutdown", "--data", data}, &bytes.Buffer{}, &bytes.Buffer{}) }()
	cli := func(args ...string) (string, error) {
		var out, errb bytes.Buffer
		err := run(ctx, append([]string{"proc"}, args...), &out, &errb)
		return out.String(), err
	}
	out := filepath.Join(t.TempDir(), "out.txt")
	id, err := cli("run", "--data", data, "--output", out, "--meta", `{"a":1}`, "--", "/bin/sh", "-c", "echo hi; exit 3")
	if err != nil {
		t.Fatal(err)
	}
	id = strings.TrimSpace(id)
	got, err := cli("wait", "--data", data, id)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 3 {
		t.Fatalf("wait: %v, want exit code 3", err)
	}
	var exit procd.Exit
	if err := json.Unmarshal([]byte(got), &exit); err != nil || exit.Code != 3 || exit.OutputLines != 1 {
		t.Fatalf("wait printed %q (%v)", got, err)
	}
	if b, _ := os.ReadFile(out); string(b) != "hi\n" {
		t.Fatalf("output file %q", b)
	}
	got, err = cli("get", "--data", data, id)
	var info procd.ProcessInfo
	if err != nil || json.Unmarshal([]byte(got), &info) != nil || info.ID != id || string(info.Metadata) != `{"a":1}` {
		t.Fatalf("get: %q %v", got, err)
	}
	got, err = cli("list", "--data", data, "--mode", "pipe")
	if err != nil || strings.Count(got, "\n") != 1 {
		t.Fatalf("list: %q %v", got, err)
	}
	if _, err := cli("list", "--data", data, "--mode", "tty"); !errors.As(err, &ee) || ee.code != 2 {
		t.Fatalf("list --mode tty: %v", err)
	}
	id2, err := cli("run", "--data", data, "--", "sleep", "300")
	if err != nil {
		t.Fatal(err)
	}
	id2 = strings.TrimSpace(id2)
	if _, err := cli("signal", "--data", data, id2, "TERM"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli("wait", "--data", data, id2); !errors.As(err, &ee) || ee.code != 143 {
		t.Fatalf("wait after TERM: %v", err)
	}
	id3, err := cli("run", "--data", data, "--pty", "--", "sleep", "300")
	if err != nil {
		t.Fatal(err)
	}
	got, err = cli("kill", "--data", data, strings.TrimSpace(id3))
	if err != nil || !strings.Contains(got, `"processes"`) {
		t.Fatalf("kill: %q %v", got, err)
	}
	// Not found is the operation failing (1), not a usage error.
	if _, err := cli("get", "--data", data, strings.TrimSpace(id3)); !errors.Is(err, procd.ErrNotFound) || exitCode(err) != exitFailed {
		t.Fatalf("get after kill: %v", err)
	}
	got, err = cli("shutdown", "--data", data)
	if err != nil || strings.Count(got, "\n") != 2 {
		t.Fatalf("shutdown: %q %v", got, err)
	}
	// Shutdown never starts a daemon.
	if _, err := cli("shutdown", "--data", data); err != nil {
		t.Fatal(err)
	}
}

// TestProc_Attach relays a pty: the replay first, then input and output,
// and the process's exit code.
func TestProc_Attach(t *testing.T) {
	procDaemonEnv = append(os.Environ(), serveHelperEnv+"=1")
	defer func() { procDaemonEnv = nil }()
	data := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	defer func() { _ = run(ctx, []string{"proc", "shutdown", "--data", data}, &bytes.Buffer{}, &bytes.Buffer{}) }()
	var out bytes.Buffer
	if err := run(ctx, []string{"proc", "run", "--data", data, "--pty", "--", "/bin/sh", "-c", "echo ready; read x; echo got-$x; exit 4"}, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out.String())
	c, err := procd.Connect(ctx, data, &procd.ClientOptions{DaemonEnv: procDaemonEnv})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The output before anyone attached is in the replay.
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := c.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if info.PTY.Offset >= int64(len("ready\r\n")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no output from the pty")
		}
		time.Sleep(10 * time.Millisecond) // polling: no event for output nobody subscribed to
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if _, err := w.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	var term bytes.Buffer
	err = attach(ctx, c, id, r, &term, io.Discard)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 4 {
		t.Fatalf("attach: %v, want exit code 4", err)
	}
	if got := term.String(); !strings.Contains(got, "ready") || !strings.Contains(got, "got-hello") {
		t.Fatalf("terminal saw %q", got)
	}
}

// TestProcd_ForegroundHangup: agenthost procd in the foreground says at
// start that it exits when idle, and ends every process and exits 0 on
// SIGHUP (its terminal closing), as on SIGTERM.
func TestProcd_ForegroundHangup(t *testing.T) {
	data := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.Command(os.Args[0], "procd", "--data", data)
	cmd.Env = append(os.Environ(), serveHelperEnv+"=1")
	cmd.WaitDelay = 10 * time.Second
	var stderr syncBuf
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	defer func() {
		if !waited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	var c *procd.Client
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		if c, err = procd.Dial(ctx, data); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon never answered: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // polling: the foreground daemon announces nothing to this process
	}
	defer c.Close()
	info, err := c.CreatePipe(ctx, procd.PipeSpec{Argv: []string{"sleep", "300"}, Cwd: data, Env: []string{"PATH=/usr/bin:/bin"},
		OutputPath: filepath.Join(data, "out")})
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	waited = true
	if err != nil {
		t.Fatalf("procd after SIGHUP: %v", err)
	}
	// In the foreground it says at start that it exits when idle.
	if !strings.Contains(stderr.String(), `msg="procd: exits when idle: no owner, process or client" after=5s`) {
		t.Errorf("procd's stderr does not say it exits when idle:\n%s", stderr.String())
	}
	if err := syscall.Kill(info.PID, 0); err == nil {
		t.Fatalf("process %d outlived the daemon", info.PID)
	}
}

// procClient runs the test binary as the daemon of a fresh data dir and
// returns a client; the daemon is shut down with the test.
func procClient(t *testing.T, ctx context.Context) (string, *procd.Client) {
	t.Helper()
	procDaemonEnv = append(os.Environ(), serveHelperEnv+"=1")
	t.Cleanup(func() { procDaemonEnv = nil })
	data := t.TempDir()
	c, err := procd.Connect(ctx, data, &procd.ClientOptions{DaemonEnv: procDaemonEnv})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Close()
		_ = run(context.Background(), []string{"proc", "shutdown", "--data", data}, &bytes.Buffer{}, &bytes.Buffer{})
	})
	return data, c
}

// proc attach to a pty that has already exited prints the replay and
// exits with the process's status at once (it hung).
func TestProc_AttachExited(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	_, c := procClient(t, ctx)
	info, err := c.CreatePTY(ctx, procd.PTYSpec{Argv: []string{"/bin/sh", "-c", "echo hello-from-pty; exit 3"}, Cwd: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	actx, acancel := context.WithTimeout(ctx, 20*time.Second)
	defer acancel()
	var term bytes.Buffer
	err = attach(actx, c, info.ID, r, &term, io.Discard)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 3 {
		t.Fatalf("attach: %v, want exit code 3 at once", err)
	}
	if !strings.Contains(term.String(), "hello-from-pty") {
		t.Fatalf("terminal saw %q", term.String())
	}
}

// proc attach from a terminal that reports 0x0 (a fresh pty) keeps the
// process's size and goes on (the refused resize ended the attach at once).
func TestProc_AttachZeroSizeTerminal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	_, c := procClient(t, ctx)
	info, err := c.CreatePTY(ctx, procd.PTYSpec{Argv: []string{"/bin/sh", "-c", "read x; echo got-$x; exit 4"}, Cwd: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	defer tty.Close()
	if cols, rows, ok := termSize(int(tty.Fd())); !ok || cols != 0 || rows != 0 {
		t.Fatalf("a fresh pty reports %dx%d (%v); the test needs 0x0", cols, rows, ok)
	}
	// Typed on the terminal: read by attach once the tty is raw.
	if _, err := ptmx.Write([]byte("hello\r")); err != nil {
		t.Fatal(err)
	}
	var term, errOut bytes.Buffer
	err = attach(ctx, c, info.ID, tty, &term, &errOut)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 4 {
		t.Fatalf("attach: %v (stderr %q), want exit code 4", err, errOut.String())
	}
	if !strings.Contains(term.String(), "got-hello") {
		t.Fatalf("terminal saw %q", term.String())
	}
}
