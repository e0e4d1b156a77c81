package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/room"
)

// TestStreamSurvivesABurstAfterAnIdleGap: a stream idle for longer than
// the write timeout (and shorter than the heartbeat) takes a frame larger
// than its buffer: each write to the connection has its own deadline, so
// the stream goes on.
func TestStreamSurvivesABurstAfterAnIdleGap(t *testing.T) {
	h := newHarness(t, room.Options{}, Options{WriteTimeout: 300 * time.Millisecond, Heartbeat: time.Hour})
	h.ended("g", h.post("g", "first"))
	st, err := h.m.State(t.Context(), "g")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s, err := h.open(ctx, "g", "", st.LastSeq)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	// The point: idle past the write timeout of the last flush.
	time.Sleep(time.Second)
	big := h.post("g", strings.Repeat("x", 40<<10)) // a message.accepted frame over the 32 KiB buffer
	for {
		ev, err := s.next()
		if err != nil {
			t.Fatalf("the stream ended after the idle gap: %v", err)
		}
		checkEvent(t, "g", ev, st.LastSeq+1)
		st.LastSeq = ev.id
		if ev.typ == "turn.ended" && ev.data["message_id"] == big.ID {
			return
		}
	}
}
