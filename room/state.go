package room

import (
	"context"

	"github.com/agenthost/agenthost/internal/store"
)

// State is a room's state: resident or not, its session, the running
// turn, the queue, and what waits on people.
type State struct {
	ID        string           `json:"id"`
	Resident  bool             `json:"resident"`
	SessionID string           `json:"session_id"`
	Turn      *TurnRef         `json:"turn,omitempty"`
	Queued    int              `json:"queued"`
	LastSeq   int64            `json:"last_seq"`
	Approvals []store.Approval `json:"approvals"`
	Questions []store.Question `json:"questions"`
	// Node is the host that holds the room's lease, with a Cluster ("":
	// none, or one machine).
	Node string `json:"node"`
}

// TurnRef names a running turn.
type TurnRef struct {
	ID        string `json:"id"`
	MessageID string `json:"message_id"`
}

// State returns the room's state; ErrNotFound for a room never used.
func (m *Manager) State(ctx context.Context, room string) (State, error) {
	if err := ValidateID(room); err != nil {
		return State{}, err
	}
	rec, err := m.st.Room(ctx, room)
	if err != nil {
		return State{}, err
	}
	st := State{ID: room, SessionID: rec.SessionID, LastSeq: rec.LastSeq}
	m.mu.Lock()
	r := m.rooms[room]
	m.mu.Unlock()
	if r != nil {
		r.mu.Lock()
		st.Resident = r.agent != nil
		if r.session != "" {
			st.SessionID = r.session
		}
		if r.turn != nil {
			st.Turn = &TurnRef{ID: r.turn.id, MessageID: r.turn.messageID}
		}
		st.Queued = r.queuedLocked()
		r.mu.Unlock()
	}
	m.clusterState(ctx, room, &st)
	if st.Approvals, err = m.st.Approvals(ctx, room, true); err != nil {
		return State{}, err
	}
	if st.Questions, err = m.st.Questions(ctx, room, true); err != nil {
		return State{}, err
	}
	return st, nil
}

// Rooms lists the ids of every room the store knows.
func (m *Manager) Rooms(ctx context.Context) ([]string, error) { return m.st.RoomIDs(ctx) }

// Events returns the room's events after seq after (see store.DB.Events).
func (m *Manager) Events(ctx context.Context, room string, after int64, limit int) ([]store.Event, error) {
	if err := ValidateID(room); err != nil {
		return nil, err
	}
	return m.st.Events(ctx, room, after, limit)
}

// Watch signals new events in the room (see store.DB.Watch).
func (m *Manager) Watch(room string) (<-chan struct{}, func()) { return m.st.Watch(room) }

// Messages returns the room's messages with their status and outcome.
func (m *Manager) Messages(ctx context.Context, room string, after int64, limit int) ([]store.Message, error) {
	if err := ValidateID(room); err != nil {
		return nil, err
	}
	return m.st.Messages(ctx, room, after, limit)
}
