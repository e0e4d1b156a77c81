package acp

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The callback and shutdown contract (README, "Callbacks and shutdown"):
// Close is safe from any callback and never waits on user code, Wait
// joins the callbacks, and every Close returns the first one's result.

// TestClient_CloseFromEvents: Close called from the Events callback (run
// by the reader) returns. It used to wait for the reader to end, that is
// for its own caller: a deadlock.
func TestClient_CloseFromEvents(t *testing.T) {
	var cp atomic.Pointer[Client]
	closed := make(chan error, 1)
	var once sync.Once
	c, _ := startFake(t, Options{CloseGrace: 100 * time.Millisecond, Events: func(ev Event) {
		if ev.Type != "agent_message_chunk" {
			return
		}
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := cp.Load().Close(ctx)
			closed <- err
		})
	}})
	cp.Store(c)
	s := newSession(t, c)
	go func() { _, _ = c.Prompt(t.Context(), s, "hello") }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close from Events: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Close from Events did not return: it waited for its own caller")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := c.Wait(ctx); err != nil {
		t.Fatalf("Wait after Close: %v", err)
	}
}

// TestClient_CloseDoesNotWaitForCallbacksWaitDoes: a Permission callback
// that ignores its context holds neither its own Close nor one from
// outside; Wait returns only once the callback has, and ctx bounds it. A
// second Close returns the first one's receipt.
func TestClient_CloseDoesNotWaitForCallbacksWaitDoes(t *testing.T) {
	var cp atomic.Pointer[Client]
	release := make(chan struct{})
	fromCallback := make(chan error, 1)
	c, _ := startFake(t, Options{Permission: func(context.Context, PermissionRequest) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := cp.Load().Close(ctx)
		fromCallback <- err
		<-release // ignores its ctx: user code Close must not wait for
		return false
	}})
	cp.Store(c)
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	s := newSession(t, c)
	go func() { _, _ = c.Prompt(t.Context(), s, "permission") }()
	select {
	case err := <-fromCallback:
		if err != nil {
			t.Fatalf("Close from Permission: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Close from Permission did not return while the callback ran")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	r1, err := c.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r2, err := c.Close(ctx); err != nil || r2 != r1 {
		t.Fatalf("a second Close = %p, %v; want the first one's receipt %p", r2, err, r1)
	}
	short, stop := context.WithCancel(ctx)
	stop()
	if err := c.Wait(short); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with the callback still running = %v, want the context's error", err)
	}
	close(release)
	if err := c.Wait(ctx); err != nil {
		t.Fatalf("Wait after the callback returned: %v", err)
	}
}
