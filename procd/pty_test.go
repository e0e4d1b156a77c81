//go:build linux

package procd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// readUntil reads subscription events until the output seen contains want.
func readUntil(t *testing.T, ctx context.Context, s *Subscription, seen *bytes.Buffer, want string) {
	t.Helper()
	for !strings.Contains(seen.String(), want) {
		ev, err := s.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for %q (seen %q): %v", want, seen.String(), err)
		}
		if ev.Type == TypeOutput {
			seen.Write(ev.Data)
		}
	}
}

func TestPTY_AttachInputResizeReplay(t *testing.T) {
	t.Parallel()
	_, c := startDaemon(t)
	ctx := testCtx(t)
	d := t.TempDir()
	info, err := c.CreatePTY(ctx, PTYSpec{Argv: []string{"/bin/sh"}, Cwd: d, Env: []string{"PATH=/usr/bin:/bin", "PS1=$ "}, Cols: 100, Rows: 30})
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode != ModePTY || info.PTY == nil || info.PTY.Cols != 100 || info.PTY.Rows != 30 {
		t.Fatalf("created: %+v", info)
	}
	s, err := c.Subscribe(ctx, info.ID, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Attached.Controller || s.Attached.Truncated {
		t.Fatalf("attached: %+v", s.Attached)
	}
	var seen bytes.Buffer
	seen.Write(s.Attached.Data)
	if err := s.Input([]byte("echo hel''lo; stty size\n")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, ctx, s, &seen, "30 100")
	if !strings.Contains(seen.String(), "hello") {
		t.Fatalf("output: %q", seen.String())
	}
	// A plain write is refused while a controller is attached.
	if err := c.Write(ctx, info.ID, []byte("x")); !errors.Is(err, ErrForbidden) {
		t.Fatalf("write beside the controller: %v", err)
	}
	if err := s.Resize(120, 40); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := s.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == TypeResized {
			if ev.Cols != 120 || ev.Rows != 40 {
				t.Fatalf("resized: %+v", ev)
			}
			break
		}
	}
	// A late observer gets the replay from its offset and then live output
	// exactly where the replay ends.
	got, _ := c.Get(ctx, info.ID)
	obs, err := c.Subscribe(ctx, info.ID, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	if obs.Attached.Offset != 0 || int64(len(obs.Attached.Data)) < got.PTY.Offset || obs.Attached.Controller {
		t.Fatalf("observer attached at %d with %d bytes (end was %d)", obs.Attached.Offset, len(obs.Attached.Data), got.PTY.Offset)
	}
	next := obs.Attached.Offset + int64(len(obs.Attached.Data))
	// A second controller takes over; the first is told.
	ctl2, err := c.Subscribe(ctx, info.ID, next, true)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl2.Close()
	for {
		ev, err := s.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == TypeControllerChanged {
			break
		}
	}
	if err := s.Input([]byte("echo no\n")); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := s.Next(ctx)
		if errors.Is(err, ErrForbidden) {
			break
		}
		if err != nil {
			t.Fatalf("input from a former controller: %v", err)
		}
	}
	if err := ctl2.Input([]byte("exit 9\n")); err != nil {
		t.Fatal(err)
	}
	exit, err := c.Wait(ctx, info.ID)
	if err != nil || exit.Code != 9 {
		t.Fatalf("exit: %+v %v", exit, err)
	}
	// The observer's stream is contiguous from the replay's end to the exit.
	for {
		ev, err := obs.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == TypeOutput {
			if ev.Offset != next {
				t.Fatalf("output at %d, want %d (no gap, no overlap)", ev.Offset, next)
			}
			next += int64(len(ev.Data))
		}
		if ev.Type == TypeExited {
			if ev.Exit.FinalOffset != next {
				t.Fatalf("exited at %d, stream ended at %d", ev.Exit.FinalOffset, next)
			}
			break
		}
	}
	ptys, err := c.List(ctx, ModePTY)
	if err != nil || len(ptys) != 1 {
		t.Fatalf("list: %+v %v", ptys, err)
	}
	if _, err := c.Terminate(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
}

func TestPTY_ReplayTruncatedAndSlowObserverDropped(t *testing.T) {
	t.Parallel()
	_, c := startDaemon(t)
	ctx := testCtx(t)
	d := t.TempDir()
	info, err := c.CreatePTY(ctx, PTYSpec{Argv: []string{"/bin/sh", "-c", "read go; head -c 5000000 /dev/zero | tr '\\0' a; echo; echo END; read x"}, Cwd: d, Env: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	// A subscriber that never reads.
	slow, err := c.Subscribe(ctx, info.ID, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	if err := c.Write(ctx, info.ID, []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "all output", func() bool {
		g, err := c.Get(ctx, info.ID)
		return err == nil && g.PTY.Offset > 5000000
	})
	late, err := c.Subscribe(ctx, info.ID, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if !late.Attached.Truncated || len(late.Attached.Data) != ReplayLimit || late.Attached.Offset == 0 {
		t.Fatalf("late attach: truncated %v, %d bytes from %d", late.Attached.Truncated, len(late.Attached.Data), late.Attached.Offset)
	}
	// The slow one was dropped: its stream ends before the exit.
	for {
		ev, err := slow.Next(ctx)
		if err != nil {
			break
		}
		if ev.Type == TypeExited {
			t.Fatal("a subscriber that never read was not dropped")
		}
	}
	if _, err := c.Terminate(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
}

func TestRequests_ModeErrors(t *testing.T) {
	t.Parallel()
	dir, c := startDaemon(t)
	ctx := testCtx(t)
	pipe, err := c.CreatePipe(ctx, pipeSpec(t, `exit 0`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, pipe.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, pipe.ID, []byte("late\n")); !errors.Is(err, ErrFailed) {
		t.Errorf("write to an exited pipe process: %v", err)
	}
	big, _ := json.Marshal(map[string]any{"op": "write", "id": pipe.ID, "data": make([]byte, maxWrite+1)})
	if r := rawRequest(t, dir, svcToken(t, dir), string(big)); r.Code != codeInvalid || !strings.HasPrefix(r.Message, "invalid write request: data is") {
		t.Errorf("oversized write: %+v", r)
	}
	if err := c.Resize(ctx, pipe.ID, 80, 24); !errors.Is(err, ErrInvalid) {
		t.Errorf("resize of a pipe process: %v", err)
	}
	if _, err := c.Subscribe(ctx, pipe.ID, 0, false); !errors.Is(err, ErrInvalid) {
		t.Errorf("subscribe to a pipe process: %v", err)
	}
	tty, err := c.CreatePTY(ctx, PTYSpec{Argv: []string{"/bin/sh", "-c", "read x"}, Cwd: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreatePTY(ctx, PTYSpec{Argv: []string{"sh"}, Cwd: "relative"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("create_pty with a relative cwd: %v", err)
	}
	if err := c.CloseStdin(ctx, tty.ID); !errors.Is(err, ErrInvalid) {
		t.Errorf("eof to a pty: %v", err)
	}
	if err := c.Resize(ctx, tty.ID, 0, 10); !errors.Is(err, ErrInvalid) {
		t.Errorf("resize to zero: %v", err)
	}
	if _, err := c.Subscribe(ctx, tty.ID, -1, false); !errors.Is(err, ErrInvalid) {
		t.Errorf("negative offset: %v", err)
	}
	if err := c.Resize(ctx, tty.ID, 132, 43); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, tty.ID); err != nil || got.PTY.Cols != 132 || got.PTY.Rows != 43 {
		t.Fatalf("after resize: %+v %v", got.PTY, err)
	}
	if err := c.Write(ctx, tty.ID, []byte("x\n")); err != nil {
		t.Fatal(err)
	}
	if e, err := c.Wait(ctx, tty.ID); err != nil || e.Code != 0 {
		t.Fatalf("pty exit: %+v %v", e, err)
	}
}

// Attaching to a pty that has already exited gives the replay, then the
// exit at once. (The exit had been sent before the subscriber joined, and
// the attach waited for ever, keeping the record attended.)
func TestPTY_SubscribeAfterExit(t *testing.T) {
	t.Parallel()
	_, c := startDaemon(t)
	ctx := testCtx(t)
	info, err := c.CreatePTY(ctx, PTYSpec{Argv: []string{"/bin/sh", "-c", "echo hello-from-pty; exit 3"}, Cwd: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	if exit, err := c.Wait(ctx, info.ID); err != nil || exit.Code != 3 {
		t.Fatalf("wait: %+v %v", exit, err)
	}
	s, err := c.Subscribe(ctx, info.ID, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !strings.Contains(string(s.Attached.Data), "hello-from-pty") {
		t.Fatalf("replay %q", s.Attached.Data)
	}
	nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ev, err := s.Next(nctx)
	if err != nil || ev.Type != TypeExited || ev.Exit.Code != 3 {
		t.Fatalf("after the replay: %+v %v; want the exit", ev, err)
	}
}

// A refused request on a subscription (a resize to 0x0) is an error frame
// for the subscriber; the subscription goes on.
func TestPTY_RefusedResizeKeepsTheSubscription(t *testing.T) {
	t.Parallel()
	_, c := startDaemon(t)
	ctx := testCtx(t)
	info, err := c.CreatePTY(ctx, PTYSpec{Argv: []string{"/bin/sh", "-c", "read x; echo got-$x"}, Cwd: t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Subscribe(ctx, info.ID, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Resize(0, 0); err != nil {
		t.Fatal(err)
	}
	var re *ReplyError
	if _, err := s.Next(ctx); !errors.As(err, &re) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("after a 0x0 resize: %v, want the refusal", err)
	}
	if err := s.Input([]byte("x\n")); err != nil {
		t.Fatal(err)
	}
	var seen bytes.Buffer
	readUntil(t, ctx, s, &seen, "got-x")
}
