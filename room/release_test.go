package room

import (
	"context"
	"testing"
	"time"

	"github.com/agenthost/agenthost/event"
)

// A release sent as soon as a turn's end is read (its turn.ended and
// message.ended written, the room not yet idle) releases the agent once
// the end is recorded: it found the room busy and did nothing, though it
// answered nil (TestRealPiRoomResumesAcrossRelease failed on it under load).
func TestReleaseRightAfterATurnEndedReleases(t *testing.T) {
	h := newHarness(t, Options{})
	written := make(chan struct{}, 1)
	proceed := make(chan struct{})
	waits := make(chan struct{}, 1)
	h.m.onTurnEndWritten = func(string) {
		select {
		case written <- struct{}{}:
			<-proceed // the room stays ending until the release waits
		default:
		}
	}
	h.m.onReleaseWaits = func(string) { waits <- struct{}{} }
	acc := h.submit("r", "hello")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	select {
	case <-written:
	case <-ctx.Done():
		t.Fatal("the turn's end was never written")
	}
	h.turnEnded("r", acc) // readable now, as a client reads it
	released := make(chan error, 1)
	go func() { released <- h.m.Release(ctx, "r") }()
	select {
	case <-waits:
	case err := <-released:
		t.Fatalf("Release returned %v while the turn's end was being recorded, without waiting for it", err)
	case <-ctx.Done():
		t.Fatal("Release neither waited nor returned")
	}
	close(proceed)
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	h.waitEvent("r", acc.Seq, event.TypeAgentReleased, nil)
}
