package room

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agenthost/agenthost/internal/store"
)

// ErrNotHeld is returned (wrapped) by a store or a Cluster when this host
// does not hold the room's lease: another host runs it, or none does.
var ErrNotHeld = errors.New("room: room held by no host here")

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

// ControlOp is Cancel, Release, Approve or Answer, sent to the room's
// holder.
type ControlOp struct {
	Kind  string `json:"kind"` // "cancel", "release", "approve" or "answer"
	ID    string `json:"id,omitempty"`
	Allow bool   `json:"allow,omitempty"`
	Text  string `json:"text,omitempty"`
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

// StatusStore is implemented by a store that can tell a room's turn and
// queue from its log alone, for rooms another host runs.
type StatusStore interface {
	Status(ctx context.Context, room string) (turn *TurnRef, queued int, resident bool, err error)
}

// Apply runs op on this host's room (the holder's side of
// Cluster.Control).
func (m *Manager) Apply(ctx context.Context, room string, op ControlOp) error {
	switch op.Kind {
	case ControlCancel:
		return m.cancelLocal(room)
	case ControlRelease:
		return m.releaseLocal(room)
	case ControlApprove:
		return m.resolveApproval(ctx, room, op.ID, op.Allow, "person")
	case ControlAnswer:
		return m.answerQuestion(ctx, room, op.ID, op.Text, "person", true)
	}
	return fmt.Errorf("%w: control %q", ErrBadMessage, op.Kind)
}

// remote reports whether op must run on another host, and runs it there.
func (m *Manager) remote(ctx context.Context, room string, op ControlOp) (bool, error) {
	c := m.opts.Cluster
	if c == nil || c.Owns(room) {
		return false, nil
	}
	return true, c.Control(ctx, room, op)
}

// Accept is the holder's side of Cluster.Forward: it accepts a message
// taken from the room's inbox under the id the front end gave it. A
// message already accepted (an inbox entry read twice across a takeover)
// returns its first acceptance.
func (m *Manager) Accept(ctx context.Context, room, id string, msg Message) (Accepted, error) {
	msgs, err := m.st.Messages(ctx, room, 0, 0)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return Accepted{}, err
	}
	for _, x := range msgs {
		if x.ID == id {
			return Accepted{ID: id, Seq: x.Seq}, nil
		}
	}
	return m.submit(ctx, room, id, msg, false)
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
// lease. The running turn is cancelled (reason), the queue is forgotten
// (it stays in the log for the next holder), and the agent is released
// now: the log refuses this host's writes, so only the agent's custody
// receipt is kept (in the host's log). Drop returns once the room's
// worker stopped, or after ShutdownBudget.
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
	r.mu.Unlock()
	done := make(chan struct{})
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		r.worker.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(m.opts.ShutdownBudget):
		m.log.Error("room: dropped room's turn still running after the shutdown budget", "room", room)
	}
	m.release(r, reason)
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
func openTurnsOf(ts []store.Turn, room string) []store.Turn {
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
