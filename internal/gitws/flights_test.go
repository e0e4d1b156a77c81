package gitws

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// A fetch's waiters get its answer, unless the fetch was ended by its own caller's context:
// then a waiter whose context is alive runs the fetch itself; and a waiter leaves when its own
// context ends, the fetch going on.
func TestFlights(t *testing.T) {
	var f flights
	joined := make(chan string, 4)
	f.waiting = func(key string) { joined <- key }
	ctx := context.Background()

	// A waiter leaves at its own context's end; the fetch goes on and answers its caller.
	release := make(chan struct{})
	started := make(chan struct{})
	leaderDone := make(chan error, 1)
	go func() {
		leaderDone <- f.do(ctx, "k", func() error { close(started); <-release; return errors.New("unreachable") })
	}()
	<-started
	wctx, wcancel := context.WithCancel(ctx)
	waiterDone := make(chan error, 1)
	go func() {
		waiterDone <- f.do(wctx, "k", func() error { t.Error("the waiter ran its own fetch"); return nil })
	}()
	<-joined
	wcancel()
	if err := <-waiterDone; !errors.Is(err, context.Canceled) {
		t.Errorf("the waiter whose context ended = %v", err)
	}
	// Another waiter gets the fetch's own answer.
	go func() {
		waiterDone <- f.do(ctx, "k", func() error { t.Error("the waiter ran its own fetch"); return nil })
	}()
	<-joined
	close(release)
	if err := <-leaderDone; err == nil || err.Error() != "unreachable" {
		t.Errorf("the fetch's caller = %v", err)
	}
	if err := <-waiterDone; err == nil || err.Error() != "unreachable" {
		t.Errorf("its waiter = %v, want its answer", err)
	}

	// A fetch ended by its caller's context is no answer: the waiter runs it again.
	lctx, lcancel := context.WithCancel(ctx)
	started = make(chan struct{})
	go func() {
		leaderDone <- f.do(lctx, "k", func() error { close(started); <-lctx.Done(); return lctx.Err() })
	}()
	<-started
	ran := 0
	go func() { waiterDone <- f.do(ctx, "k", func() error { ran++; return nil }) }()
	<-joined
	lcancel()
	if err := <-leaderDone; !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled fetch's caller = %v", err)
	}
	if err := <-waiterDone; err != nil || ran != 1 {
		t.Errorf("the waiter of a cancelled fetch = %v, ran its own %d times, want once", err, ran)
	}
	if len(f.m) != 0 {
		t.Errorf("flights left: %v", f.m)
	}
}

// Every git, local steps and network ones (whose upload-pack inherits it), runs with lazy
// fetches from promisor remotes off.
func TestEnvNoLazyFetch(t *testing.T) {
	e, err := New(Options{Root: t.TempDir(), Env: []string{"PATH=/usr/bin", "GIT_NO_LAZY_FETCH=0"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, network := range []bool{false, true} {
		n := 0
		for _, kv := range e.env(network) {
			if strings.HasPrefix(kv, "GIT_NO_LAZY_FETCH=") {
				if kv != "GIT_NO_LAZY_FETCH=1" {
					t.Errorf("network %v: %s", network, kv)
				}
				n++
			}
		}
		if n != 1 {
			t.Errorf("network %v: GIT_NO_LAZY_FETCH set %d times", network, n)
		}
	}
}
