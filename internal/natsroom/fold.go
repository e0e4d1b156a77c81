package natsroom

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/agenthost/agenthost/internal/store"
)

// batch is one message of a room's log: the events and record changes of
// one store write, published with one fenced append, so that a write is
// atomic.
type batch struct {
	Epoch  uint64  `json:"epoch"`
	Node   string  `json:"node"`
	Events []evRec `json:"events,omitempty"`
	Ops    []op    `json:"ops,omitempty"`
}

type evRec struct {
	Seq  int64           `json:"seq"`
	Type string          `json:"type"`
	Time int64           `json:"time"`
	Data json.RawMessage `json:"data"`
}

// op is one record change; K says which.
type op struct {
	K        string          `json:"k"`
	Message  *store.Message  `json:"message,omitempty"`
	Turn     *store.Turn     `json:"turn,omitempty"`
	Approval *store.Approval `json:"approval,omitempty"`
	Question *store.Question `json:"question,omitempty"`
	ID       string          `json:"id,omitempty"`
	Status   string          `json:"status,omitempty"`
	TurnID   string          `json:"turn_id,omitempty"`
	Outcome  string          `json:"outcome,omitempty"`
	Reason   string          `json:"reason,omitempty"`
	Text     string          `json:"text,omitempty"`
	By       string          `json:"by,omitempty"`
	Agent    string          `json:"agent,omitempty"`
	Inbox    uint64          `json:"inbox,omitempty"`
	Time     int64           `json:"time,omitempty"`
}

// Kinds of op.
const (
	opSession  = "session"
	opPutMsg   = "put_message"
	opMsg      = "message"
	opPutTurn  = "put_turn"
	opEndTurn  = "end_turn"
	opPutAppr  = "put_approval"
	opResolve  = "resolve_approval"
	opPutQ     = "put_question"
	opAnswer   = "answer_question"
	opReceipt  = "receipt"
	opInboxCur = "inbox"
)

// fold is a room's records, folded from its log.
type fold struct {
	room      store.Room
	exists    bool
	msgs      []store.Message // in order of acceptance
	msgIdx    map[string]int
	turns     []store.Turn
	turnIdx   map[string]int
	approvals []store.Approval
	questions []store.Question
	receipts  int
	resident  bool
	inbox     uint64 // the last inbox sequence taken into the log
}

func newFold(room string) *fold {
	return &fold{room: store.Room{ID: room}, msgIdx: map[string]int{}, turnIdx: map[string]int{}}
}

// running is the turn not ended yet (nil: none).
func (f *fold) running() *store.Turn {
	var open *store.Turn
	for i := range f.turns {
		if f.turns[i].Ended.IsZero() {
			open = &f.turns[i]
		}
	}
	return open
}

// queued is how many messages wait for a turn.
func (f *fold) queued() int {
	n := 0
	for _, m := range f.msgs {
		if m.Status == store.MessageQueued {
			n++
		}
	}
	return n
}

func (f *fold) clone() *fold {
	c := *f
	c.msgs = append([]store.Message(nil), f.msgs...)
	c.turns = append([]store.Turn(nil), f.turns...)
	c.approvals = append([]store.Approval(nil), f.approvals...)
	c.questions = append([]store.Question(nil), f.questions...)
	c.msgIdx = make(map[string]int, len(f.msgIdx))
	for k, v := range f.msgIdx {
		c.msgIdx[k] = v
	}
	c.turnIdx = make(map[string]int, len(f.turnIdx))
	for k, v := range f.turnIdx {
		c.turnIdx[k] = v
	}
	return &c
}

// event applies an event to the fold (its sequence and the residency it
// shows).
func (f *fold) event(e evRec) {
	if !f.exists {
		f.exists = true
		f.room.Created = time.Unix(0, e.Time)
	}
	f.room.LastSeq = e.Seq
	switch e.Type {
	case "agent.started":
		f.resident = true
	case "agent.released":
		f.resident = false
	}
}

// apply applies a record change, with the SQLite store's errors.
func (f *fold) apply(o op) error {
	t := time.Unix(0, o.Time)
	switch o.K {
	case opSession:
		f.exists = true
		f.room.Agent, f.room.SessionID = o.Agent, o.ID
	case opPutMsg:
		if _, ok := f.msgIdx[o.Message.ID]; ok {
			return fmt.Errorf("store: put message: %w", store.ErrConflict)
		}
		f.exists = true
		f.msgIdx[o.Message.ID] = len(f.msgs)
		f.msgs = append(f.msgs, *o.Message)
	case opMsg:
		i, ok := f.msgIdx[o.ID]
		if !ok {
			return fmt.Errorf("store: update message: %w", store.ErrNotFound)
		}
		m := &f.msgs[i]
		m.Status = o.Status
		switch o.Status {
		case store.MessageStarted:
			m.TurnID, m.Started = o.TurnID, t
		case store.MessageEnded:
			if o.TurnID != "" {
				m.TurnID = o.TurnID
			}
			m.Outcome, m.Reason, m.Ended = o.Outcome, o.Reason, t
		}
	case opPutTurn:
		f.turnIdx[o.Turn.ID] = len(f.turns)
		f.turns = append(f.turns, *o.Turn)
	case opEndTurn:
		i, ok := f.turnIdx[o.ID]
		if !ok {
			return fmt.Errorf("store: end turn: %w", store.ErrNotFound)
		}
		tr := &f.turns[i]
		if !tr.Ended.IsZero() {
			return fmt.Errorf("store: end turn: %w", store.ErrConflict)
		}
		tr.Outcome, tr.Reason, tr.Text, tr.Ended = o.Outcome, o.Reason, o.Text, t
	case opPutAppr:
		f.approvals = append(f.approvals, *o.Approval)
	case opResolve:
		for i := range f.approvals {
			a := &f.approvals[i]
			if a.ID == o.ID {
				if a.Decision != "" {
					return fmt.Errorf("store: resolve approval: %w", store.ErrConflict)
				}
				a.Decision, a.By, a.Resolved = o.Status, o.By, t
				return nil
			}
		}
		return fmt.Errorf("store: resolve approval: %w", store.ErrNotFound)
	case opPutQ:
		f.questions = append(f.questions, *o.Question)
	case opAnswer:
		for i := range f.questions {
			q := &f.questions[i]
			if q.ID == o.ID {
				if q.By != "" {
					return fmt.Errorf("store: answer question: %w", store.ErrConflict)
				}
				q.Answer, q.By, q.Answered = o.Text, o.By, t
				return nil
			}
		}
		return fmt.Errorf("store: answer question: %w", store.ErrNotFound)
	case opReceipt:
		f.receipts++
	case opInboxCur:
		if o.Inbox > f.inbox {
			f.inbox = o.Inbox
		}
	}
	return nil
}

// add folds a whole batch (replay: record errors cannot happen twice,
// they were refused before the append).
func (f *fold) add(b *batch) {
	for _, e := range b.Events {
		f.event(e)
	}
	for _, o := range b.Ops {
		_ = f.apply(o)
	}
}
