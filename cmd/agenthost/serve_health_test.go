package main

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
)

// TestServeHealth_ChecksAreAskedAtEachCall: a part's check (the embedded
// NATS node's JetStream) is asked at each /healthz, beside the problems
// set, and its answer changes the report as it changes.
func TestServeHealth_ChecksAreAskedAtEachCall(t *testing.T) {
	var down atomic.Bool
	h := &serveHealth{}
	h.check(healthNATS, func() error {
		if down.Load() {
			return errors.New("JetStream is disabled on node n1")
		}
		return nil
	})
	if err := h.err(); err != nil {
		t.Fatalf("healthy: %v", err)
	}
	down.Store(true)
	h.set(healthDaemon, errors.New("restarting"))
	err := h.err()
	if err == nil || !strings.Contains(err.Error(), "nats: JetStream is disabled on node n1") || !strings.Contains(err.Error(), "process daemon: restarting") {
		t.Fatalf("with the node down and the daemon restarting: %v", err)
	}
	down.Store(false)
	h.clear(healthDaemon)
	if err := h.err(); err != nil {
		t.Fatalf("healthy again: %v", err)
	}
}
