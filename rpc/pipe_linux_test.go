//go:build linux

package rpc

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

func pipeSize(t *testing.T, f *os.File) int {
	t.Helper()
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	n := -1
	if err := rc.Control(func(fd uintptr) { n, err = fcntl(fd, fGetPipeSize, 0) }); err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPipeResizer: a pipe is raised to the flood size and set back to its
// own; anything that is not a pipe gets no resizer.
func TestPipeResizer(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	base := pipeSize(t, r)
	resize := pipeResizer(r)
	if resize == nil {
		t.Fatal("no resizer for a pipe")
	}
	resize(true)
	if got := pipeSize(t, r); got != floodBuf {
		t.Fatalf("flooding: pipe of %d bytes, want %d", got, floodBuf)
	}
	resize(false)
	if got := pipeSize(t, r); got != base {
		t.Fatalf("after the flood: pipe of %d bytes, want %d", got, base)
	}
	f, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if pipeResizer(f) != nil || pipeResizer(strings.NewReader("")) != nil {
		t.Fatal("a resizer for something that is not a pipe")
	}
}

// TestClient_FloodRaisesThePipeUntilTheRunEnds: a client reading an agent
// that is ahead of it (a full pipe) raises the pipe for the flood, and its
// agent_end sets the pipe back, so an idle agent holds a default pipe.
func TestClient_FloodRaisesThePipeUntilTheRunEnds(t *testing.T) {
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outW.Close()
	base := pipeSize(t, outR)
	c := New(outR, nopWriter{}, Options{NoHandshake: true})
	if base >= floodBuf {
		// Pages of 64 KiB: a default pipe is already larger than a flood's.
		if c.resizePipe != nil {
			t.Fatalf("a resizer for a pipe of %d bytes", base)
		}
		return
	}
	var mu sync.Mutex
	var sizes []int
	resize := c.resizePipe
	c.resizePipe = func(flooding bool) {
		resize(flooding)
		mu.Lock()
		sizes = append(sizes, pipeSize(t, outR))
		mu.Unlock()
	}
	frame := `{"type":"message_update","pad":"` + strings.Repeat("p", 95) + `"}` + "\n" // 128 bytes
	updates := make(chan struct{}, 1)
	last := make(chan struct{})
	n := 0
	const total = 20_000
	c.On(EventMessageUpdate, func(Event) {
		if n++; n == total {
			close(updates)
		}
	})
	c.On("note", func(Event) { close(last) })
	// A full pipe before the first read: the agent is ahead.
	if _, err := outW.WriteString(strings.Repeat(frame, stableBuf/len(frame))); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer closeAndWait(t, c)
	wrote := make(chan error, 1)
	go func() {
		_, err := outW.WriteString(strings.Repeat(frame, total-stableBuf/len(frame)) + `{"type":"agent_end","messages":[]}` + "\n")
		wrote <- err
	}()
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			t.Fatalf("no %s", what)
		}
	}
	wait(updates, "flood delivered")
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	// A frame after agent_end: once it is delivered, the reader has
	// handled agent_end.
	if _, err := outW.WriteString(`{"type":"note"}` + "\n"); err != nil {
		t.Fatal(err)
	}
	wait(last, "frame after agent_end")
	mu.Lock()
	defer mu.Unlock()
	if len(sizes) < 2 || sizes[0] != floodBuf || sizes[len(sizes)-1] != base {
		t.Fatalf("pipe sizes as the flood began and ended: %v; want %d first and %d last", sizes, floodBuf, base)
	}
	if got := pipeSize(t, outR); got != base {
		t.Fatalf("idle after the run: pipe of %d bytes, want %d", got, base)
	}
}
