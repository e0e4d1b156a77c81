package room

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// startedRooms lists the rooms the fake transport started agents for, in
// order.
func (f *fakeTransport) startedRooms() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, s := range f.starts {
		out = append(out, s.Room)
	}
	return out
}

// TestSlotWaitWakesWhenARoomGoesIdle: with one slot held by a room whose
// turn waits on a person, turns of two other rooms wait for it in line
// (turn.waiting), longer than the liveness limit, which that wait does
// not count against; as soon as the holding room's turn ends they get the
// slot in the order they came, each evicting the room before it.
func TestSlotWaitWakesWhenARoomGoesIdle(t *testing.T) {
	const live = 200 * time.Millisecond
	h := newHarness(t, Options{MaxResident: 1, Config: Config{Liveness: live}})
	hold := h.submit("a", "approve:bash")
	req := h.waitEvent("a", hold.Seq, "approval.requested", nil)
	b := h.submit("b", "hi b")
	wb := h.waitEvent("b", b.Seq, "turn.waiting", nil)
	var d map[string]any
	_ = json.Unmarshal(wb.Data, &d)
	if d["message_id"] != b.ID || d["turn_id"] == "" || d["slots"] != float64(1) || d["resident"] != float64(1) {
		t.Fatalf("turn.waiting %v", d)
	}
	c := h.submit("c", "hi c")
	h.waitEvent("c", c.Seq, "turn.waiting", nil)
	// Longer than the liveness limit: the point of the test is that
	// waiting for a slot is not the agent's silence.
	time.Sleep(3 * live)
	if err := h.m.Approve(t.Context(), "a", field(req, "approval_id"), true); err != nil {
		t.Fatal(err)
	}
	if d := h.turnEnded("a", hold); d["outcome"] != OutcomeSettled {
		t.Fatalf("room a: %v", d)
	}
	for _, acc := range []struct {
		room string
		acc  Accepted
	}{{"b", b}, {"c", c}} {
		if d := h.turnEnded(acc.room, acc.acc); d["outcome"] != OutcomeSettled {
			t.Fatalf("room %s: %v", acc.room, d)
		}
	}
	if got := strings.Join(h.f.startedRooms(), " "); got != "a b c" {
		t.Fatalf("agents started for rooms %q, want a b c (in line)", got)
	}
	for _, rm := range []string{"a", "b"} {
		rel := h.waitEvent(rm, 0, "agent.released", nil)
		if !strings.Contains(field(rel, "reason"), "evicted") {
			t.Fatalf("room %s released: %s", rm, rel.Data)
		}
	}
	if n := h.f.resident(); n != 1 {
		t.Fatalf("%d agents resident, want 1", n)
	}
}

// TestBusyRoomKeepsItsAgentBetweenTurns: a room with a message queued is
// not idle between its turns: a turn waiting for its slot gets it only
// once the queue is done, and the busy room's agent runs both turns.
func TestBusyRoomKeepsItsAgentBetweenTurns(t *testing.T) {
	h := newHarness(t, Options{MaxResident: 1})
	first := h.submit("a", "approve:bash")
	req := h.waitEvent("a", first.Seq, "approval.requested", nil)
	second := h.submit("a", "second")
	b := h.submit("b", "hi")
	h.waitEvent("b", b.Seq, "turn.waiting", nil)
	if err := h.m.Approve(t.Context(), "a", field(req, "approval_id"), true); err != nil {
		t.Fatal(err)
	}
	h.turnEnded("a", second)
	if d := h.turnEnded("b", b); d["outcome"] != OutcomeSettled {
		t.Fatalf("room b: %v", d)
	}
	if got := strings.Join(h.f.startedRooms(), " "); got != "a b" {
		t.Fatalf("agents started for rooms %q, want a b", got)
	}
	// a's one agent ran both turns, then was evicted.
	end := h.waitEvent("a", 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == second.ID })
	l := h.log("a")
	released := 0
	for i, ev := range l.evs {
		if ev.Type == "agent.released" {
			released++
			if !strings.Contains(l.data[i]["reason"].(string), "evicted") || ev.Seq < end.Seq {
				t.Fatalf("room a's agent released at seq %d (its second turn ended at %d): %v", ev.Seq, end.Seq, l.data[i])
			}
		}
	}
	if released != 1 {
		t.Fatalf("room a's agent released %d times", released)
	}
}

// TestSlotWaitHasItsOwnBound: a turn that gets no slot within its turn
// timeout ends timed_out, saying why.
func TestSlotWaitHasItsOwnBound(t *testing.T) {
	h := newHarness(t, Options{MaxResident: 1, RoomConfig: func(room string) Config {
		if room == "b" {
			return Config{TurnTimeout: 300 * time.Millisecond}
		}
		return Config{}
	}})
	hold := h.submit("a", "approve:bash")
	h.waitEvent("a", hold.Seq, "approval.requested", nil)
	b := h.submit("b", "hi")
	d := h.turnEnded("b", b)
	if d["outcome"] != OutcomeTimedOut || !strings.Contains(d["reason"].(string), "no agent slot came free") {
		t.Fatalf("room b: %v", d)
	}
	checkMessageEnds(t, h.log("b"))
	_ = h.m.Cancel(t.Context(), "a")
	h.turnEnded("a", hold)
}
