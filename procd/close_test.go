//go:build linux

package procd

import (
	"errors"
	"syscall"
	"testing"
	"time"
)

// TestClient_CloseContract: the callback and shutdown contract, for a
// client that runs no user code: Close from a goroutine that watched Done
// (as a host's watcher does) returns, ends a request waiting for a Reown
// with ErrClosed (it used to end with ErrNoDaemon, as if no client had
// asked it to stop), joins the client's goroutines, and every Close
// returns the first one's result.
func TestClient_CloseContract(t *testing.T) {
	t.Parallel()
	_, o := ownDaemon(t)
	ctx := testCtx(t)
	done := o.Done()
	if err := syscall.Kill(o.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	listed := make(chan error, 1)
	go func() {
		_, err := o.List(ctx, ModePipe) // waits for a Reown nobody makes
		listed <- err
	}()
	closed := make(chan error, 1)
	go func() {
		<-done
		closed <- o.Close()
	}()
	var first error
	select {
	case first = <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close from the Done watcher did not return")
	}
	select {
	case err := <-listed:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("a request waiting for a Reown after Close: %v, want ErrClosed", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close left a request waiting for a Reown")
	}
	for i := 0; i < 2; i++ {
		if err := o.Close(); err != first {
			t.Fatalf("Close #%d = %v, want the first one's %v", i+2, err, first)
		}
	}
	if err := o.Reown(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Reown after Close: %v", err)
	}
}
