package room

import (
	"context"
	"encoding/json"

	"github.com/agenthost/agenthost/record"
)

// Store is what a room needs from its durable store. The embedded SQLite
// store is the first implementation and NATS JetStream the second; the
// records are plain data (package record) so that another engine, in
// another module too, can serve them.
type Store interface {
	// Write runs fn atomically and returns once its changes are durable.
	Write(ctx context.Context, fn func(tx Tx) error) error
	Events(ctx context.Context, room string, after int64, limit int) ([]record.Event, error)
	Watch(room string) (<-chan struct{}, func())
	Room(ctx context.Context, room string) (record.Room, error)
	RoomIDs(ctx context.Context) ([]string, error)
	// AgentRooms lists the rooms with a recorded agent handle.
	AgentRooms(ctx context.Context) ([]record.Room, error)
	Messages(ctx context.Context, room string, after int64, limit int) ([]record.Message, error)
	Exchanges(ctx context.Context, room string, before int64, limit int) ([]record.Exchange, error)
	OpenMessages(ctx context.Context) ([]record.Message, error)
	OpenTurns(ctx context.Context) ([]record.Turn, error)
	// Turns lists the room's turns in order of the message each consumed
	// first, for the messages accepted after seq after.
	Turns(ctx context.Context, room string, after int64, limit int) ([]record.Turn, error)
	Approvals(ctx context.Context, room string, pending bool) ([]record.Approval, error)
	Questions(ctx context.Context, room string, pending bool) ([]record.Question, error)
}

// Tx is one atomic write.
type Tx interface {
	Append(room, typ string, data any) (record.Event, error)
	SetSession(room, agent, sessionID string) error
	SetAgentProc(room, handle string) error
	SetAgentOffset(room string, offset, seen int64) error
	PutMessage(m record.Message) error
	UpdateMessage(id, status, turnID, outcome, reason string) error
	PutTurn(t record.Turn) error
	// EndTurn records a turn's end and what it cost; the room's totals
	// (record.Room's Turns, Usage, UsageBySender) count it.
	EndTurn(id, outcome, reason, text string, usage record.Usage) error
	PutApproval(a record.Approval) error
	ResolveApproval(room, id, decision, by string) error
	PutQuestion(q record.Question) error
	AnswerQuestion(room, id, answer, by string) error
	PutReceipt(room string, receipt json.RawMessage) (int64, error)
}
