package room

import (
	"context"
	"encoding/json"

	"github.com/agenthost/agenthost/internal/store"
)

// Store is what a room needs from its durable store. SQLite (SQLite,
// below) is the first implementation; the records are plain data so that
// another engine can serve them.
type Store interface {
	// Write runs fn atomically and returns once its changes are durable.
	Write(ctx context.Context, fn func(tx Tx) error) error
	Events(ctx context.Context, room string, after int64, limit int) ([]store.Event, error)
	Watch(room string) (<-chan struct{}, func())
	Room(ctx context.Context, room string) (store.Room, error)
	RoomIDs(ctx context.Context) ([]string, error)
	// AgentRooms lists the rooms with a recorded agent handle.
	AgentRooms(ctx context.Context) ([]store.Room, error)
	Messages(ctx context.Context, room string, after int64, limit int) ([]store.Message, error)
	Exchanges(ctx context.Context, room string, before int64, limit int) ([]store.Exchange, error)
	OpenMessages(ctx context.Context) ([]store.Message, error)
	OpenTurns(ctx context.Context) ([]store.Turn, error)
	Approvals(ctx context.Context, room string, pending bool) ([]store.Approval, error)
	Questions(ctx context.Context, room string, pending bool) ([]store.Question, error)
}

// Tx is one atomic write.
type Tx interface {
	Append(room, typ string, data any) (store.Event, error)
	SetSession(room, agent, sessionID string) error
	SetAgentProc(room, handle string) error
	SetAgentOffset(room string, offset, seen int64) error
	PutMessage(m store.Message) error
	UpdateMessage(id, status, turnID, outcome, reason string) error
	PutTurn(t store.Turn) error
	EndTurn(id, outcome, reason, text string) error
	PutApproval(a store.Approval) error
	ResolveApproval(room, id, decision, by string) error
	PutQuestion(q store.Question) error
	AnswerQuestion(room, id, answer, by string) error
	PutReceipt(room string, receipt json.RawMessage) (int64, error)
}

// SQLite adapts the embedded store to Store.
func SQLite(db *store.DB) Store { return sqliteStore{db} }

type sqliteStore struct{ *store.DB }

func (s sqliteStore) Write(ctx context.Context, fn func(tx Tx) error) error {
	return s.DB.Write(ctx, func(w *store.Writer) error { return fn(w) })
}
