package natsroom

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/internal/store"
)

// batch is one message of a room's log: the events and record changes of
// one store write, published with one fenced append, so that a write is
// atomic.
type batch struct {
	// V is the format (format.go); 0, in entries written before it was
	// recorded, is format 1.
	V      int     `json:"v,omitempty"`
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
	K        string       `json:"k"`
	Message  *msgRec      `json:"message,omitempty"`
	Turn     *turnRec     `json:"turn,omitempty"`
	Approval *approvalRec `json:"approval,omitempty"`
	Question *questionRec `json:"question,omitempty"`
	ID       string       `json:"id,omitempty"`
	Status   string       `json:"status,omitempty"`
	TurnID   string       `json:"turn_id,omitempty"`
	Outcome  string       `json:"outcome,omitempty"`
	Reason   string       `json:"reason,omitempty"`
	Text     string       `json:"text,omitempty"`
	By       string       `json:"by,omitempty"`
	Agent    string       `json:"agent,omitempty"`
	Inbox    uint64       `json:"inbox,omitempty"`
	Time     int64        `json:"time,omitempty"`
	// Usage is what an ended turn cost (end_turn). Added without a new
	// format: older readers ignore it.
	Usage *usageRec `json:"usage,omitempty"`
	// Compute is what a turn's processes used (compute), counted in the
	// room's totals; older readers ignore the op.
	Compute *store.Compute `json:"compute,omitempty"`
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
	opCompute  = "compute"
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

	// Kept as records change, so that a question asked per message (is
	// the queue full? is the room idle?) costs the same in a room of ten
	// messages as in one of a million.
	nQueued  int          // messages queued for a turn
	nOpen    int          // messages not ended
	openTurn map[int]bool // indexes of the turns not ended

	// undo, during a write, keeps what rollback needs to put the fold
	// back as it was (a write changes the fold in place: a copy of it
	// per write cost as much as the room's history).
	undo *foldMark
}

// foldMark is a fold's state at the start of a write: its scalars, the
// lengths of its lists, and the old values of the entries changed since.
type foldMark struct {
	room                           store.Room
	exists, resident               bool
	receipts, nQueued, nOpen       int
	inbox                          uint64
	msgs, turns, approvals, quests int
	oldMsgs                        map[int]store.Message
	oldTurns                       map[int]store.Turn
	oldAppr                        map[int]store.Approval
	oldQ                           map[int]store.Question
}

// begin starts a write: changes from here on can be rolled back.
func (f *fold) begin() {
	f.undo = &foldMark{room: f.room, exists: f.exists, resident: f.resident, receipts: f.receipts, nQueued: f.nQueued,
		nOpen: f.nOpen, inbox: f.inbox, msgs: len(f.msgs), turns: len(f.turns), approvals: len(f.approvals), quests: len(f.questions),
		oldMsgs: map[int]store.Message{}, oldTurns: map[int]store.Turn{}, oldAppr: map[int]store.Approval{}, oldQ: map[int]store.Question{}}
}

// commit keeps the write's changes.
func (f *fold) commit() { f.undo = nil }

// rollback puts the fold back as it was at begin.
func (f *fold) rollback() {
	u := f.undo
	if u == nil {
		return
	}
	f.undo = nil
	for i, m := range u.oldMsgs {
		if i < u.msgs {
			f.msgs[i] = m
		}
	}
	for _, m := range f.msgs[u.msgs:] {
		delete(f.msgIdx, m.ID)
	}
	f.msgs = f.msgs[:u.msgs]
	for i, t := range u.oldTurns {
		if i < u.turns {
			f.turns[i] = t
			if t.Ended.IsZero() {
				f.openTurn[i] = true
			}
		}
	}
	for i, t := range f.turns[u.turns:] {
		delete(f.turnIdx, t.ID)
		delete(f.openTurn, u.turns+i)
	}
	f.turns = f.turns[:u.turns]
	for i, a := range u.oldAppr {
		if i < u.approvals {
			f.approvals[i] = a
		}
	}
	f.approvals = f.approvals[:u.approvals]
	for i, q := range u.oldQ {
		if i < u.quests {
			f.questions[i] = q
		}
	}
	f.questions = f.questions[:u.quests]
	f.room, f.exists, f.resident, f.receipts = u.room, u.exists, u.resident, u.receipts
	f.nQueued, f.nOpen, f.inbox = u.nQueued, u.nOpen, u.inbox
}

// keep records an entry's old value before a write changes it in place.
func keep[V any](old map[int]V, i int, v V) {
	if _, ok := old[i]; !ok {
		old[i] = v
	}
}

func newFold(room string) *fold {
	return &fold{room: store.Room{ID: room}, msgIdx: map[string]int{}, turnIdx: map[string]int{}, openTurn: map[int]bool{}}
}

// running is the turn not ended yet (the latest, if several; nil: none).
func (f *fold) running() *store.Turn {
	last := -1
	for i := range f.openTurn {
		last = max(last, i)
	}
	if last < 0 {
		return nil
	}
	return &f.turns[last]
}

// queued is how many messages wait for a turn.
func (f *fold) queued() int { return f.nQueued }

// idle: no turn runs and every message ended.
func (f *fold) idle() bool { return f.nOpen == 0 && len(f.openTurn) == 0 }

// spent counts an ended turn, whose first message was msgID, and what it
// cost in the room's totals. The split by sender is copied, never changed
// in place: readers hold the old one, and rollback puts it back.
func (f *fold) spent(msgID string, u store.Usage) {
	sender := ""
	if i, ok := f.msgIdx[msgID]; ok {
		sender = f.msgs[i].Sender
	}
	by := make(map[string]store.SenderUsage, len(f.room.UsageBySender)+1)
	for k, v := range f.room.UsageBySender {
		by[k] = v
	}
	s := by[sender]
	s.Turns++
	s.Usage = s.Usage.Add(u)
	by[sender] = s
	f.room.Turns++
	f.room.Usage = f.room.Usage.Add(u)
	f.room.UsageBySender = by
}

// count adds d to the counters of a message in status.
func (f *fold) count(status string, d int) {
	if status == store.MessageQueued {
		f.nQueued += d
	}
	if status != store.MessageEnded {
		f.nOpen += d
	}
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
	case event.TypeAgentStarted:
		f.resident = true
	case event.TypeAgentReleased, evTakeover:
		// A new holder runs no agent yet; the old holder's is gone
		// (released, or ended with the lease).
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
		f.msgs = append(f.msgs, o.Message.record())
		f.count(o.Message.Status, 1)
	case opMsg:
		i, ok := f.msgIdx[o.ID]
		if !ok {
			return fmt.Errorf("store: update message: %w", store.ErrNotFound)
		}
		m := &f.msgs[i]
		if f.undo != nil {
			keep(f.undo.oldMsgs, i, *m)
		}
		f.count(m.Status, -1)
		f.count(o.Status, 1)
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
		if o.Turn.Ended.IsZero() {
			f.openTurn[len(f.turns)] = true
		}
		f.turns = append(f.turns, o.Turn.record())
	case opEndTurn:
		i, ok := f.turnIdx[o.ID]
		if !ok {
			return fmt.Errorf("store: end turn: %w", store.ErrNotFound)
		}
		tr := &f.turns[i]
		if !tr.Ended.IsZero() {
			return fmt.Errorf("store: end turn: %w", store.ErrConflict)
		}
		if f.undo != nil {
			keep(f.undo.oldTurns, i, *tr)
		}
		tr.Outcome, tr.Reason, tr.Text, tr.Ended, tr.Usage = o.Outcome, o.Reason, o.Text, t, o.Usage.record()
		delete(f.openTurn, i)
		f.spent(tr.MessageID, tr.Usage)
	case opPutAppr:
		f.approvals = append(f.approvals, o.Approval.record())
	case opResolve:
		for i := range f.approvals {
			a := &f.approvals[i]
			if a.ID == o.ID {
				if a.Decision != "" {
					return fmt.Errorf("store: resolve approval: %w", store.ErrConflict)
				}
				if f.undo != nil {
					keep(f.undo.oldAppr, i, *a)
				}
				a.Decision, a.By, a.Resolved = o.Status, o.By, t
				return nil
			}
		}
		return fmt.Errorf("store: resolve approval: %w", store.ErrNotFound)
	case opPutQ:
		f.questions = append(f.questions, o.Question.record())
	case opAnswer:
		for i := range f.questions {
			q := &f.questions[i]
			if q.ID == o.ID {
				if q.By != "" {
					return fmt.Errorf("store: answer question: %w", store.ErrConflict)
				}
				if f.undo != nil {
					keep(f.undo.oldQ, i, *q)
				}
				q.Answer, q.By, q.Answered = o.Text, o.By, t
				return nil
			}
		}
		return fmt.Errorf("store: answer question: %w", store.ErrNotFound)
	case opReceipt:
		f.receipts++
	case opCompute:
		if o.Compute != nil {
			f.room.Compute = f.room.Compute.Add(*o.Compute)
		}
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
