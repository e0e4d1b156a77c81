package room

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/record"
)

// ErrNotHeld is returned (wrapped) by a store or a Cluster when this host
// does not hold the room's lease: another host runs it, or none does.
var ErrNotHeld = errors.New("room: room held by no host here")

// ErrUnavailable is returned (wrapped, with the reason) by a store or a
// Cluster that cannot serve a request for now, through no fault of the
// request (a cluster out of storage, or electing a leader): the same
// request may succeed later; the reason says whether a write may have
// been stored.
var ErrUnavailable = errors.New("room: the store cannot serve this now")

// Cluster places rooms on several hosts. With Options.Cluster nil (the
// default) a Manager runs every room in its store, as on one machine.
//
// With a Cluster, a Manager runs turns only for the rooms it has adopted
// (its host holds their leases): Submit hands every message to the
// cluster's durable per-room inbox, and the holder's Manager accepts it
// (Accept); Cancel, Release, Approve and Answer run on the holder.
type Cluster interface {
	// Owns reports whether this host holds the room's lease now.
	Owns(room string) bool
	// Holder names the host that holds the room's lease ("" for none).
	Holder(ctx context.Context, room string) string
	// Forward makes msg, with its id, durable in the room's inbox and
	// returns once it is (Seq is its message.accepted event's sequence
	// when the holder accepted it in time, else 0).
	Forward(ctx context.Context, room, id string, msg Message) (Accepted, error)
	// Control runs op on the room's holder: ErrNotHeld when none holds it.
	Control(ctx context.Context, room string, op ControlOp) error
}

// Hosted is the Manager as a Cluster sees it: what the cluster calls on
// the host that holds a room. A Cluster implementation is given one at its
// start and needs nothing else of the Manager; these methods are for it
// alone (a program hosting rooms calls Submit, Cancel, Release and the
// rest).
type Hosted interface {
	// Adopt makes this host the room's runner after its lease was taken:
	// a turn the last holder left running ends failed (reason), and
	// queued messages run again in order.
	Adopt(ctx context.Context, room, reason string) error
	// Drop forgets a room whose lease this host lost: its turn ends, its
	// agent is released (reason).
	Drop(room, reason string)
	// HoldUntil holds the room's agent to its lease's local deadline.
	HoldUntil(room string, deadline time.Time)
	// Accept logs a message taken from the room's inbox (once per id).
	Accept(ctx context.Context, room, id string, msg Message) (Accepted, error)
	// Refuse logs a message taken from the inbox as ended failed, reason
	// said, for a sender already answered 202.
	Refuse(ctx context.Context, room, id string, msg Message, reason string) (Accepted, error)
	// Apply runs a ControlOp another host sent to this holder.
	Apply(ctx context.Context, room string, op ControlOp) error
}

var _ Hosted = (*Manager)(nil)

// ControlOp is Cancel, Release, Approve or Answer, sent to the room's
// holder.
type ControlOp struct {
	Kind  string `json:"kind"` // "cancel", "release", "approve" or "answer"
	ID    string `json:"id,omitempty"`
	Allow bool   `json:"allow,omitempty"`
	Text  string `json:"text,omitempty"`
	// Token is the room token that asked for op (see WithToken).
	Token *event.TokenRef `json:"token,omitempty"`
}

// Kinds of ControlOp.
const (
	ControlCancel  = "cancel"
	ControlRelease = "release"
	ControlApprove = "approve"
	ControlAnswer  = "answer"
)

// QueueCounter is implemented by a Cluster that can count, from any host,
// what a room's queue holds: a front end then refuses a message that would
// overfill it (ErrQueueFull), as the holder does, instead of accepting it
// into an inbox the holder takes nothing more from.
type QueueCounter interface {
	// Waiting is how many of the room's messages wait for a turn (queued
	// in its log, or forwarded and not taken yet), whether a turn runs and
	// whether a question waits for an answer (a message then may take no
	// queue place).
	Waiting(ctx context.Context, room string) (waiting int, running, asking bool, err error)
}

// LeaseBound is implemented by an Agent whose processes can be held to a
// deadline by something that outlives a paused host (custody's fuse): in a
// cluster, a room's agent acts only while its host holds the room's lease,
// also when the host itself is paused (SIGSTOP, swap) past the lease and
// cannot act, since another host then runs the room in the same
// workspace.
type LeaseBound interface {
	// HoldUntil makes the agent's processes stop (frozen) at deadline,
	// unless called again with a later one before.
	HoldUntil(deadline time.Time) error
	// Kill ends the agent's processes at once, without the grace a Close
	// gives (the host lost the room: another may run it already).
	Kill() error
}

// HoldUntil holds the room's agent, and any agent it starts later, to
// deadline: the Cluster calls it as the room's lease is taken and renewed.
func (m *Manager) HoldUntil(room string, deadline time.Time) {
	m.mu.Lock()
	r := m.rooms[room]
	m.mu.Unlock()
	if r == nil {
		return
	}
	r.mu.Lock()
	r.holdUntil = deadline
	a := r.agent
	r.mu.Unlock()
	m.holdAgent(r, a, deadline)
}

// holdAgent holds a to deadline (a zero deadline: the room is not held to
// a lease).
func (m *Manager) holdAgent(r *roomState, a Agent, deadline time.Time) {
	lb, ok := a.(LeaseBound)
	if !ok || deadline.IsZero() {
		return
	}
	if err := lb.HoldUntil(deadline); err != nil {
		m.log.Error("room: holding the agent to the room's lease failed", "room", r.id, "err", err)
	}
}

// StatusStore is implemented by a store that can tell a room's turn and
// queue from its log alone, for rooms another host runs.
type StatusStore interface {
	Status(ctx context.Context, room string) (turn *TurnRef, queued int, resident bool, err error)
}

// Apply runs op on this host's room (the holder's side of
// Cluster.Control).
func (m *Manager) Apply(ctx context.Context, room string, op ControlOp) error {
	if op.Token != nil {
		ctx = WithToken(ctx, *op.Token)
	}
	switch op.Kind {
	case ControlCancel:
		return m.cancelLocal(ctx, room)
	case ControlRelease:
		return m.releaseLocal(ctx, room)
	case ControlApprove:
		return m.approveLocal(ctx, room, op.ID, op.Allow)
	case ControlAnswer:
		return m.answerLocal(ctx, room, op.ID, op.Text)
	}
	return fmt.Errorf("%w: control %q", ErrBadMessage, op.Kind)
}

// remote reports whether op must run on another host, and runs it there.
func (m *Manager) remote(ctx context.Context, room string, op ControlOp) (bool, error) {
	c := m.opts.Cluster
	if c == nil || c.Owns(room) {
		return false, nil
	}
	op.Token = tokenOf(ctx)
	return true, c.Control(ctx, room, op)
}

// Accept is the holder's side of Cluster.Forward: it accepts a message
// taken from the room's inbox under the id the front end gave it. A
// message already accepted (an inbox entry read twice across a takeover)
// returns its first acceptance.
func (m *Manager) Accept(ctx context.Context, room, id string, msg Message) (Accepted, error) {
	x, err := m.message(ctx, room, id)
	switch {
	case err == nil:
		return Accepted{ID: id, Seq: x.Seq}, nil
	case !errors.Is(err, ErrNotFound):
		return Accepted{}, err
	}
	return m.submit(ctx, room, id, msg, false)
}

// messageFinder is a store that finds a message by id without a scan.
type messageFinder interface {
	Message(ctx context.Context, room, id string) (record.Message, error)
}

// message finds one of the room's messages by id (ErrNotFound if none).
func (m *Manager) message(ctx context.Context, room, id string) (record.Message, error) {
	if mf, ok := m.st.(messageFinder); ok {
		return mf.Message(ctx, room, id)
	}
	var after int64
	for {
		msgs, err := m.st.Messages(ctx, room, after, record.MaxPage)
		if err != nil {
			return record.Message{}, err
		}
		for _, x := range msgs {
			if x.ID == id {
				return x, nil
			}
			after = x.Seq
		}
		if len(msgs) < record.MaxPage {
			return record.Message{}, fmt.Errorf("store: message %q: %w", id, record.ErrNotFound)
		}
	}
}

// Refuse is the holder's side of Cluster.Forward for a message it cannot
// take (its queue is full): the front end answered it 202, so it is
// recorded as accepted and ended at once, failed with reason, in one
// write, so that its sender sees an outcome.
func (m *Manager) Refuse(ctx context.Context, room, id string, msg Message, reason string) (Accepted, error) {
	if x, err := m.message(ctx, room, id); err == nil {
		return Accepted{ID: id, Seq: x.Seq}, nil
	} else if !errors.Is(err, ErrNotFound) {
		return Accepted{}, err
	}
	if err := ValidateID(room); err != nil {
		return Accepted{}, err
	}
	var acc Accepted
	now := time.Now()
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
			Delivery: msg.Delivery, Status: record.MessageAccepted, Accepted: now}); err != nil {
			return err
		}
		return endMessages(tx, room, []string{id}, "", OutcomeFailed, reason)
	})
	if err != nil {
		return Accepted{}, err
	}
	return acc, nil
}

// Adopt starts running a room whose lease this host just acquired: like
// Start's recovery, restricted to the room, it ends the turn the previous
// holder was running as failed (reason), denies its pending approvals and
// cancels its questions (by: "takeover"), and queues its waiting messages
// again in order.
func (m *Manager) Adopt(ctx context.Context, room, reason string) error {
	if _, err := m.room(room); err != nil {
		return err
	}
	return m.recoverRooms(ctx, room, reason, "takeover")
}

// Drop stops running the room at once: this host lost (or gave up) its
// lease. The agent's processes end at once when it is LeaseBound, the
// running turn is cancelled (reason), the queue is forgotten (it stays in
// the log for the next holder), and the agent is released now: the log
// refuses this host's writes, so only the agent's custody receipt is kept
// (in the host's log). Drop returns once the room's worker stopped, or
// after ShutdownBudget.
func (m *Manager) Drop(room, reason string) {
	m.mu.Lock()
	r := m.rooms[room]
	delete(m.rooms, room)
	m.mu.Unlock()
	if r == nil {
		return
	}
	cause := errors.New(reason)
	r.mu.Lock()
	r.dropped = true
	r.queue = nil
	if r.turn != nil {
		r.turn.cancel(fmt.Errorf("%w: %w", errDropped, cause))
	}
	a := r.agent
	r.mu.Unlock()
	if lb, ok := a.(LeaseBound); ok {
		// No grace: another host may run the room already.
		if err := lb.Kill(); err != nil {
			m.log.Error("room: ending a dropped room's agent", "room", room, "err", err)
		}
	}
	done := make(chan struct{})
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		r.worker.Wait()
		close(done)
	}()
	select {
	case <-done:
		m.release(r, reason)
		m.forgetSnapshots(r)
	case <-time.After(m.opts.ShutdownBudget):
		m.log.Error("room: dropped room's turn still running after the shutdown budget", "room", room)
		m.release(r, reason)
		// Once the turn's last snapshot is done.
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			select {
			case <-done:
				m.forgetSnapshots(r)
			case <-m.ctx.Done():
			}
		}()
	}
}

// forgetSnapshots lets go of a dropped room's shadow repository: the
// room's next holder (another node on the shared data dir) opens it, and
// an open one here would keep it locked for as long as this host runs.
func (m *Manager) forgetSnapshots(r *roomState) {
	f, ok := m.opts.Snapshots.(SnapshotForgetter)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(m.ctx, m.opts.ShutdownBudget)
	defer cancel()
	if err := f.Forget(ctx, r.snapshotPlace()); err != nil {
		m.log.Warn("room: letting go of a dropped room's snapshots", "room", r.id, "err", err)
	}
}

// errDropped ends a turn whose room this host no longer holds.
var errDropped = errors.New("room lease lost")

// clusterState fills st's live fields for a room another host runs.
func (m *Manager) clusterState(ctx context.Context, room string, st *State) {
	c := m.opts.Cluster
	if c == nil {
		return
	}
	st.Node = c.Holder(ctx, room)
	if c.Owns(room) {
		return
	}
	if ss, ok := m.st.(StatusStore); ok {
		if turn, queued, resident, err := ss.Status(ctx, room); err == nil {
			st.Turn, st.Queued, st.Resident = turn, queued, resident
		}
	}
}

// openTurnsOf filters turns to room ("" for all).
func openTurnsOf(ts []record.Turn, room string) []record.Turn {
	if room == "" {
		return ts
	}
	out := ts[:0:0]
	for _, t := range ts {
		if t.Room == room {
			out = append(out, t)
		}
	}
	return out
}
