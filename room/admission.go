package room

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/record"
)

// Message is what Submit takes.
type Message struct {
	Text   string
	Sender string
	// Delivery is DeliverQueue (default), DeliverSteer or DeliverFollowUp.
	Delivery string
	// Key, if set, is the message's idempotency key (1 to MaxKeyBytes
	// printable ASCII characters): the room's incarnation accepts one
	// message per key, and Submit answers a second one with the same key
	// with the first one's acceptance, or ErrKeyReused when it is not the
	// same message (see idempotent.go).
	Key string
	// TraceParent and TraceState are the sender's W3C trace context, if
	// any (at most MaxTraceParentBytes and MaxTraceStateBytes): Options.
	// Observe is given them with the message's message.accepted. They are
	// kept in memory only: a message run after a restart has none.
	TraceParent, TraceState string
	// Token, if set, is the room token that sent it through the API: its
	// message.accepted names it (Submit takes it from ctx when unset, see
	// WithToken).
	Token *event.TokenRef
}

// Accepted is a durably accepted message.
type Accepted struct {
	ID string `json:"id"`
	// Seq is the sequence number of its message.accepted event.
	Seq int64 `json:"seq"`
	// Incarnation is the incarnation of the room the message is in (see
	// State.Incarnation; "" when the store does not say, or in a cluster
	// when the room's holder has not accepted the message yet).
	Incarnation string `json:"incarnation,omitempty"`
}

// Submit accepts a message into the room and returns once it is durably
// stored. A question pending in the room takes the message as its answer;
// otherwise it is queued (or, for steer and follow_up while a turn runs,
// delivered into that turn).
func (m *Manager) Submit(ctx context.Context, room string, msg Message) (Accepted, error) {
	id := newID("m")
	if msg.Key != "" {
		if err := checkKey(msg.Key); err != nil {
			return Accepted{}, err
		}
		id = keyID(room, msg.Key)
	}
	if msg.Token == nil {
		msg.Token = tokenOf(ctx)
	}
	return m.submit(ctx, room, id, msg, m.opts.Cluster != nil)
}

// submit accepts msg under id; forward hands it to the cluster's inbox
// (the holder accepts it from there).
func (m *Manager) submit(ctx context.Context, room, id string, msg Message, forward bool) (Accepted, error) {
	switch {
	case msg.Delivery == "":
		msg.Delivery = DeliverQueue
	case msg.Delivery != DeliverQueue && msg.Delivery != DeliverSteer && msg.Delivery != DeliverFollowUp:
		return Accepted{}, fmt.Errorf("%w: delivery %q", ErrBadMessage, msg.Delivery)
	}
	if msg.Text == "" || len(msg.Text) > MaxMessageBytes {
		return Accepted{}, fmt.Errorf("%w: text must be 1 to %d bytes", ErrBadMessage, MaxMessageBytes)
	}
	if len(msg.TraceParent) > MaxTraceParentBytes || len(msg.TraceState) > MaxTraceStateBytes {
		return Accepted{}, fmt.Errorf("%w: trace context over %d/%d bytes", ErrBadMessage, MaxTraceParentBytes, MaxTraceStateBytes)
	}
	if forward {
		if err := ValidateID(room); err != nil {
			return Accepted{}, err
		}
		if msg.Key != "" {
			// Sent again (a lost answer): the message is in the shared
			// store once its holder accepted it.
			if acc, ok, err := m.accepted(ctx, room, id, msg); ok || err != nil {
				return m.withIncarnation(ctx, room, nil, acc), err
			}
		}
		// The front end refuses a room it knows is over its budget (the
		// holder refuses it anyway); one it cannot read it forwards.
		if s, _, err := m.loadSettings(ctx, room); err == nil {
			if limit, err := m.exhausted(ctx, room, s); err == nil && limit != "" {
				return Accepted{}, budgetErr(limit)
			}
		}
		if qc, ok := m.opts.Cluster.(QueueCounter); ok {
			// Counted before the message goes in, so two front ends may
			// overfill by what they accept at the same moment; one that
			// cannot count forwards (the holder still takes no more than
			// the limit into the room's queue).
			n, running, asking, err := qc.Waiting(ctx, room)
			takesPlace := !asking && (msg.Delivery == DeliverQueue || !running)
			if err == nil && takesPlace && n >= m.opts.QueueLimit {
				return Accepted{}, fmt.Errorf("%w: room %q has %d waiting messages", ErrQueueFull, room, m.opts.QueueLimit)
			}
		}
		acc, err := m.opts.Cluster.Forward(ctx, room, id, msg)
		if err != nil || acc.Seq == 0 {
			return acc, err
		}
		return m.withIncarnation(ctx, room, nil, acc), nil
	}
	r, leave, err := m.enter(ctx, room, false)
	if err != nil {
		return Accepted{}, err
	}
	defer leave()
	if msg.Key != "" {
		unlock, err := r.lockKey(ctx, msg.Key)
		if err != nil {
			return Accepted{}, err
		}
		defer unlock()
		if acc, ok, err := m.accepted(ctx, room, id, msg); ok || err != nil {
			return m.withIncarnation(ctx, room, r, acc), err
		}
	}
	acc, err := m.admit(ctx, r, id, msg)
	if err != nil {
		return Accepted{}, err
	}
	return m.withIncarnation(ctx, room, r, acc), nil
}

// admit accepts msg under id into r, whose door the caller passed.
func (m *Manager) admit(ctx context.Context, r *roomState, id string, msg Message) (Accepted, error) {
	room := r.id
	if err := m.refreshSettings(ctx, r); err != nil {
		return Accepted{}, err
	}
	r.mu.Lock()
	settings := r.settings
	r.mu.Unlock()
	if limit, err := m.exhausted(ctx, room, settings); err != nil {
		return Accepted{}, err
	} else if limit != "" {
		return Accepted{}, budgetErr(limit)
	}
	var question string
	r.qmu.Lock()
	if len(r.questionQ) > 0 {
		question = r.questionQ[0]
	}
	r.qmu.Unlock()
	r.mu.Lock()
	if _, err := m.configLocked(r); err != nil {
		r.mu.Unlock()
		return Accepted{}, err
	}
	into := r.turn
	r.mu.Unlock()
	// Answers and deliveries into a turn take no queue place.
	direct := question != "" || msg.Delivery != DeliverQueue && into != nil

	now := time.Now()
	var acc Accepted
	status := record.MessageQueued
	if direct {
		status = record.MessageAccepted
	}
	// A room with a budget checks it again before each turn (turnBudget):
	// its messages never start a turn in the write that accepts them.
	atOnce := !direct && m.budget(settings).IsZero()
	var begun *begunTurn
	err := m.stWrite(ctx, func(tx Tx) error {
		ev, err := appendEvent(tx, room, event.MessageAccepted{
			MessageID: id, Text: msg.Text, Sender: msg.Sender, Delivery: msg.Delivery, Token: msg.Token,
		})
		if err != nil {
			return err
		}
		traceMessage(tx, msg)
		acc = Accepted{ID: id, Seq: ev.Seq}
		if err := tx.PutMessage(record.Message{ID: id, Room: room, Seq: ev.Seq, Sender: msg.Sender, Text: msg.Text,
			Delivery: msg.Delivery, Status: status, Accepted: now}); err != nil {
			return err
		}
		if status == record.MessageQueued {
			if _, err := appendEvent(tx, room, event.MessageQueued{MessageID: id}); err != nil {
				return err
			}
		}
		// The limit is checked and the message's place in the queue taken
		// in the write that records it (undone with it when refused),
		// in the order of the log: concurrent submits neither overfill
		// the queue nor line up out of the order of their sequence
		// numbers. r.mu is taken last and never held while waiting for
		// the store.
		r.mu.Lock()
		defer r.mu.Unlock()
		if !direct && r.placesLocked() >= m.opts.QueueLimit {
			return fmt.Errorf("%w: room %q has %d waiting messages", ErrQueueFull, room, m.opts.QueueLimit)
		}
		r.insertLocked(queued{id: id, text: msg.Text, seq: ev.Seq, pending: true, place: !direct})
		if atOnce {
			if begun = m.beginLocked(r); begun != nil {
				return recordStart(tx, r.id, begun.t, now)
			}
		}
		return nil
	})
	if err != nil {
		if begun != nil {
			m.unbegin(r, begun)
		}
		m.settle(r, id, false) // its place, if the write failed after taking it
		return Accepted{}, err
	}
	if begun != nil {
		// Its turn is recorded as started: the reserved worker runs it.
		r.mu.Lock()
		begun.t.accepting = false
		r.mu.Unlock()
		go m.work(r, begun)
		return acc, nil
	}
	switch {
	case question != "":
		if err := m.answerByMessage(ctx, room, question, id, msg.Text); err == nil {
			m.settle(r, id, false)
			return acc, nil
		}
		// The question was answered meanwhile: the message runs as a turn.
	case direct:
		if m.deliver(ctx, r, into, id, msg) {
			m.settle(r, id, false)
			return acc, nil
		}
	default:
		m.settle(r, id, true)
		return acc, nil
	}
	// Fall back to the queue, in the place it took when accepted.
	err = m.stWrite(ctx, func(tx Tx) error {
		if err := tx.UpdateMessage(id, record.MessageQueued, "", "", ""); err != nil {
			return err
		}
		_, err := appendEvent(tx, room, event.MessageQueued{MessageID: id})
		return err
	})
	if err != nil {
		// It is accepted all the same: its turn records its start.
		m.log.Warn("room: recording that a message falls back to the queue failed", "room", room, "err", err)
	}
	m.settle(r, id, true)
	return acc, nil
}

// deliverTimeout bounds a delivery's call to the agent: finishTurn and
// Detach wait for deliveries in flight.
const deliverTimeout = 30 * time.Second

// deliver steers or follows up message id into turn t; false when it is
// to wait in the queue instead: t is over or ending, the host stops, the
// agent is gone, or it refused the message. A message delivered (or
// joined to the prompt) ends with t, whatever is recorded of the delivery:
// finishTurn waits for deliveries in flight, so a message is never both
// ended with the turn and queued.
func (m *Manager) deliver(ctx context.Context, r *roomState, t *turnRun, id string, msg Message) bool {
	r.mu.Lock()
	a := r.agent
	// A turn begun by a write not committed yet may never be: what is
	// delivered into it would have no turn to end with. A prompted turn
	// without an agent lost it (Detach let go of it).
	live := r.turn == t && !t.accepting && !t.closed && !m.stopping.Load() && (a != nil || !t.prompted)
	early := !t.prompted
	if live {
		t.joined = append(t.joined, id)
		t.delivering++
		if early {
			// The agent has not had the turn's prompt yet: the text
			// goes with it.
			t.early = append(t.early, msg.Text)
		}
	}
	r.mu.Unlock()
	if !live {
		return false
	}
	defer m.deliveryDone(r, t)
	var err error
	if !early {
		dctx, cancel := context.WithTimeout(ctx, deliverTimeout)
		if msg.Delivery == DeliverSteer {
			err = a.Steer(dctx, msg.Text)
		} else {
			err = a.FollowUp(dctx, msg.Text)
		}
		cancel()
	}
	if err != nil {
		m.log.Warn("room: delivery into the running turn failed; queued instead", "room", r.id, "err", err)
		r.mu.Lock()
		t.joined = slices.DeleteFunc(t.joined, func(j string) bool { return j == id })
		r.mu.Unlock()
		return false
	}
	d := event.MessageDelivered{MessageID: id, TurnID: t.id, Delivery: msg.Delivery}
	if early {
		d.With = "prompt"
	}
	// On the manager's bounded context: the agent has the text, so the
	// message ends with the turn even when its caller is gone.
	werr := m.write(func(tx Tx) error {
		if err := tx.UpdateMessage(id, record.MessageStarted, t.id, "", ""); err != nil {
			return err
		}
		_, err := appendEvent(tx, r.id, d)
		return err
	})
	if werr != nil {
		m.log.Error("room: recording a delivery failed; the message ends with its turn", "room", r.id, "err", werr)
	}
	return true
}

// deliveryDone ends a delivery into t counted by deliver.
func (m *Manager) deliveryDone(r *roomState, t *turnRun) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t.delivering--
	if t.delivering == 0 && t.delivered != nil {
		close(t.delivered)
		t.delivered = nil
	}
}

// endMessages ends messages ids in tx: their records and, in the same
// order, their message.ended events. turnID names the turn that consumed
// them ("" for none); reason goes with an outcome other than settled and
// answered.
func endMessages(tx Tx, room string, ids []string, turnID, outcome, reason string) error {
	for _, id := range ids {
		if err := tx.UpdateMessage(id, record.MessageEnded, turnID, outcome, reason); err != nil {
			return err
		}
	}
	for _, id := range ids {
		d := event.MessageEnded{MessageID: id, Outcome: outcome, TurnID: turnID}
		if outcome != OutcomeSettled && outcome != OutcomeAnswered {
			d.Reason = reason
		}
		if _, err := appendEvent(tx, room, d); err != nil {
			return err
		}
	}
	return nil
}
