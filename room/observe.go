package room

import (
	"context"
	"time"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/record"
)

// Observed is what Options.Observe is told: one event a room's log
// committed, or one step of a turn the log records no start of (Phase).
type Observed struct {
	// Event is the event as stored (Data is its JSON), with its Payload;
	// both zero for a Phase.
	Event   record.Event
	Payload event.Payload
	// TraceParent and TraceState, on a message.accepted event, are its
	// message's (Message.TraceParent and TraceState): held in memory only,
	// never in the log.
	TraceParent, TraceState string
	Phase                   *Phase
}

// Phase is a step of a room's work that no event starts: the workspace
// snapshots before and after a turn, the agent's start. Err says why it
// failed ("" when it did not).
type Phase struct {
	Room string
	// TurnID is the turn the step belongs to ("" when the room does not
	// know it there: an agent's start is its room's running turn's).
	TurnID     string
	Name       string // PhaseSnapshotBefore, PhaseSnapshotAfter or PhaseAgentStart
	Start, End time.Time
	Err        string
}

// Phase names.
const (
	PhaseSnapshotBefore = "snapshot.before"
	PhaseSnapshotAfter  = "snapshot.after"
	PhaseAgentStart     = "agent.start"
)

// Limits of a message's trace context (Message.TraceParent, TraceState):
// W3C's traceparent is 55 bytes, its tracestate at most 32 entries.
const (
	MaxTraceParentBytes = 64
	MaxTraceStateBytes  = 1024
)

// obsTx notes the events a write appends, for Options.Observe once the
// write has committed.
type obsTx struct {
	Tx
	evs []Observed
}

func (o *obsTx) Append(room, typ string, data any) (record.Event, error) {
	ev, err := o.Tx.Append(room, typ, data)
	if err == nil {
		p, _ := data.(event.Payload)
		o.evs = append(o.evs, Observed{Event: ev, Payload: p})
	}
	return ev, err
}

// traceMessage gives the message.accepted event just appended in tx the
// message's trace context.
func traceMessage(tx Tx, msg Message) {
	for {
		switch t := tx.(type) {
		case *obsTx:
			if n := len(t.evs); n > 0 {
				t.evs[n-1].TraceParent, t.evs[n-1].TraceState = msg.TraceParent, msg.TraceState
			}
			return
		case *offsetTx:
			tx = t.Tx
		default:
			return
		}
	}
}

// stWrite is the store's Write, telling Options.Observe the events it
// committed (no lock of the room's is held while it runs).
func (m *Manager) stWrite(ctx context.Context, fn func(tx Tx) error) error {
	if m.opts.Observe == nil {
		return m.st.Write(ctx, fn)
	}
	var rec *obsTx
	err := m.st.Write(ctx, func(tx Tx) error {
		rec = &obsTx{Tx: tx}
		return fn(rec)
	})
	if err == nil && rec != nil && len(rec.evs) > 0 {
		m.opts.Observe(rec.evs)
	}
	return err
}

// phase tells Options.Observe a step that began at start and ends now.
func (m *Manager) phase(room, turnID, name string, start time.Time, err string) {
	if m.opts.Observe == nil {
		return
	}
	m.opts.Observe([]Observed{{Phase: &Phase{Room: room, TurnID: turnID, Name: name, Start: start, End: time.Now(), Err: err}}})
}

// errText is err's text ("" for nil).
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
