package room

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/event"
)

// recorder is an Options.Observe keeping what it is told.
type recorder struct {
	mu      sync.Mutex
	obs     []Observed
	changed chan struct{} // signalled after each call
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{}, 1)} }

func (r *recorder) observe(evs []Observed) {
	r.mu.Lock()
	r.obs = append(r.obs, evs...)
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) all() []Observed {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Observed(nil), r.obs...)
}

// waitSeq waits until the room's events 1 to seq were all told: Observe
// runs once a write has committed, after the log's readers may have seen
// it.
func (r *recorder) waitSeq(t *testing.T, room string, seq int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		seen := map[int64]bool{}
		for _, o := range r.all() {
			if o.Phase == nil && o.Event.Room == room && o.Event.Seq <= seq {
				seen[o.Event.Seq] = true
			}
		}
		if int64(len(seen)) == seq {
			return
		}
		select {
		case <-r.changed:
		case <-ctx.Done():
			t.Fatalf("observed %d events of the room's first %d", len(seen), seq)
		}
	}
}

// Observe is told every event the log holds, each once, with the payload the log's JSON says; a message's trace context
// rides with its message.accepted only, and reaches no event of the log;
// the agent's start is a Phase.
func TestObserveSeesTheLog(t *testing.T) {
	rec := newRecorder()
	h := newHarness(t, Options{Observe: rec.observe})
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	acc, err := h.m.Submit(t.Context(), "r", Message{Text: "approve:bash", TraceParent: tp, TraceState: "k=v"})
	if err != nil {
		t.Fatal(err)
	}
	req := h.waitEvent("r", acc.Seq, "approval.requested", nil)
	if err := h.m.Approve(t.Context(), "r", field(req, "approval_id"), true); err != nil {
		t.Fatal(err)
	}
	h.turnEnded("r", acc)
	last := h.waitEvent("r", acc.Seq, "message.ended", nil)
	rec.waitSeq(t, "r", last.Seq)

	logged, err := h.m.Events(t.Context(), "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var seen []Observed
	phases := map[string]int{}
	for _, o := range rec.all() {
		if o.Phase != nil {
			if o.Phase.Room != "r" || o.Phase.End.Before(o.Phase.Start) {
				t.Errorf("phase %+v", *o.Phase)
			}
			phases[o.Phase.Name]++
			continue
		}
		if o.Event.Room == "r" && o.Event.Seq <= last.Seq {
			seen = append(seen, o)
		}
	}
	// Writes that race (the API's and the agent's events) may be told in
	// either order: each once.
	slices.SortFunc(seen, func(a, b Observed) int { return int(a.Event.Seq - b.Event.Seq) })
	if len(seen) != int(last.Seq) {
		t.Fatalf("observed %d events of the room's first %d", len(seen), last.Seq)
	}
	for i, o := range seen {
		ev := logged[i]
		if o.Event.Seq != ev.Seq || o.Event.Type != ev.Type || o.Payload == nil || o.Payload.EventType() != ev.Type {
			t.Fatalf("observed #%d: %d %s, the log has %d %s", i, o.Event.Seq, o.Event.Type, ev.Seq, ev.Type)
		}
		if _, ok := o.Payload.(event.MessageAccepted); ok {
			if o.TraceParent != tp || o.TraceState != "k=v" {
				t.Errorf("message.accepted's trace context %q %q", o.TraceParent, o.TraceState)
			}
		} else if o.TraceParent != "" {
			t.Errorf("%s carries a trace context", ev.Type)
		}
		if strings.Contains(string(ev.Data), "4bf92f3577b34da6") {
			t.Errorf("the log holds the trace context: %s", ev.Data)
		}
	}
	if phases[PhaseAgentStart] != 1 {
		t.Errorf("phases %v: want the agent's start once", phases)
	}
}

// A trace context over its bound is refused like any bad message.
func TestTraceContextBounded(t *testing.T) {
	h := newHarness(t, Options{})
	_, err := h.m.Submit(t.Context(), "r", Message{Text: "hi", TraceParent: strings.Repeat("0", MaxTraceParentBytes+1)})
	if err == nil || !strings.Contains(err.Error(), "trace context") {
		t.Fatalf("err %v", err)
	}
	_, err = h.m.Submit(t.Context(), "r", Message{Text: "hi", TraceState: strings.Repeat("k", MaxTraceStateBytes+1)})
	if err == nil {
		t.Fatal("an oversized tracestate was taken")
	}
}
