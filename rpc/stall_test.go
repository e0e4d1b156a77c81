package rpc

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"testing"
	"time"
)

// stuckWriter is an agent stdin that takes nothing: every Write blocks
// until Close, like a full pipe the agent never drains.
type stuckWriter struct {
	entered chan struct{}
	closed  chan struct{}
	once    sync.Once
}

func newStuckWriter() *stuckWriter {
	return &stuckWriter{entered: make(chan struct{}, 1), closed: make(chan struct{})}
}

func (w *stuckWriter) Write(p []byte) (int, error) {
	select {
	case w.entered <- struct{}{}:
	default:
	}
	<-w.closed
	return 0, os.ErrClosed
}

func (w *stuckWriter) Close() error {
	w.once.Do(func() { close(w.closed) })
	return nil
}

// A call waiting for the write lock (another frame is stuck on a full
// pipe) gives up when its context ends.
func TestClient_WriteLockHonoursContext(t *testing.T) {
	w := newStuckWriter()
	outR, outW := io.Pipe()
	c := New(outR, w, Options{NoHandshake: true})
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		outW.Close()
	})
	holder := make(chan error, 1)
	go func() { // takes the write lock and blocks in Write
		_, err := c.GetState(ctxT(t, 60*time.Second))
		holder <- err
	}()
	select {
	case <-w.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first call never wrote")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := c.GetState(ctx)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want context.DeadlineExceeded", err)
		}
		t.Logf("returned %v after the call began", time.Since(start))
	case <-time.After(10 * time.Second):
		t.Fatal("a call waiting for the write lock ignored its context")
	}
	select {
	case <-c.Done():
		t.Fatal("a call that wrote nothing retired the transport")
	default:
	}
	c.Close()
	if err := <-holder; err == nil {
		t.Fatal("the stuck write succeeded")
	}
}
