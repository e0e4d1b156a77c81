//go:build linux

package procd

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCtx is the bound of one test's waits: generous, for a loaded box.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// startDaemon starts a daemon (the test binary) for a fresh data dir and
// returns a plain client; cleanup shuts it down and waits for it to go.
func startDaemon(t *testing.T, flags ...string) (string, *Client) {
	t.Helper()
	dir := t.TempDir()
	ctx := testCtx(t)
	c, err := Connect(ctx, dir, testOpts(flags...))
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { stopDaemon(t, dir) })
	return dir, c
}

// stopDaemon shuts down whatever daemon serves dir and waits for it.
func stopDaemon(t *testing.T, dir string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if c, err := Dial(ctx, dir); err == nil {
		if _, err := c.Shutdown(ctx); err != nil && !errors.Is(err, ErrNoDaemon) && !errors.Is(err, ErrShuttingDown) {
			t.Errorf("Shutdown: %v", err)
		}
	}
	if err := waitGone(ctx, dir); err != nil {
		t.Errorf("daemon not gone: %v", err)
	}
}

// pipeSpec runs a shell script with output to a file in dir.
func pipeSpec(t *testing.T, script string) PipeSpec {
	t.Helper()
	d := t.TempDir()
	return PipeSpec{Argv: []string{"/bin/sh", "-c", script}, Cwd: d, Env: []string{"PATH=/usr/bin:/bin", "LC_ALL=C"},
		OutputPath: filepath.Join(d, "out")}
}

// rawRequest sends one envelope on its own connection and returns the reply.
func rawRequest(t *testing.T, dir string, token string, req string) Reply {
	t.Helper()
	svc, err := readService(dir)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("unix", svc.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	env := map[string]any{"request": json.RawMessage(req)}
	if token != "" {
		env["token"] = token
	}
	b, _ := json.Marshal(env)
	if err := writeFrame(conn, json.RawMessage(b)); err != nil {
		t.Fatal(err)
	}
	fb, err := readFrame(conn)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	var r Reply
	if err := json.Unmarshal(fb, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition with no event to wait on
	}
}

// outputLines waits for n lines in the process's output file and returns them.
func outputLines(t *testing.T, c *Client, id string, n int) []string {
	t.Helper()
	ctx := testCtx(t)
	var info ProcessInfo
	waitFor(t, "output lines", func() bool {
		var err error
		info, err = c.Get(ctx, id)
		return err == nil && info.Pipe.OutputLines >= int64(n)
	})
	b, err := os.ReadFile(info.Pipe.OutputPath)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// watchers waits until n waits or subscriptions are open on id.
func watchers(t *testing.T, c *Client, id string, n int) {
	t.Helper()
	ctx := testCtx(t)
	waitFor(t, "watchers", func() bool {
		pi, err := c.Get(ctx, id)
		return err == nil && pi.Watchers == n
	})
}

func svcToken(t *testing.T, dir string) string {
	t.Helper()
	svc, err := readService(dir)
	if err != nil {
		t.Fatal(err)
	}
	return svc.Token
}
