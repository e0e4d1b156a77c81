package room

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Purger is a Store that deletes a room for good: its records, its event
// log and its settings, so that its id starts a new room.
type Purger interface {
	PurgeRoom(ctx context.Context, room string) error
}

// SnapshotForgetter is Snapshots that let go of a room's shadow
// repository (its files are deleted next).
type SnapshotForgetter interface {
	Forget(ctx context.Context, p SnapshotPlace) error
}

// Errors of Purge.
var (
	// ErrPurgeUnsupported: the store cannot delete rooms, or rooms are
	// spread over a cluster (not supported yet).
	ErrPurgeUnsupported = errors.New("room: deleting a room for good is not supported here")
	// ErrPurging was returned for a message sent while its room was being
	// deleted.
	//
	// Deprecated: no longer returned: an operation that comes during a
	// purge waits for it at the room's door, then acts on the id's new
	// room (see the package doc).
	ErrPurging = errors.New("room: the room is being deleted")
)

// Purge deletes the room for good: it releases its agent (the receipt is
// returned, and nowhere recorded: the log goes too), and deletes its
// session files and agent home, its snapshots, its workspace (a git
// worktree included) and its records, event log and settings. The id may
// then be used again, as a new room (a new incarnation). It passes the
// room's door alone (see the package doc): operations that came before it
// end first, those that come after it act on the new room. ErrBusy while a
// turn runs or messages wait (cancel the turn; a waiting message must end
// first), and ErrNotFound for a room the store does not know (a purge that
// waited for another purge of the room finds it gone).
func (m *Manager) Purge(ctx context.Context, room string) (json.RawMessage, error) {
	if err := ValidateID(room); err != nil {
		return nil, err
	}
	p, ok := m.st.(Purger)
	if !ok || m.opts.Cluster != nil {
		return nil, ErrPurgeUnsupported
	}
	r, leave, err := m.enter(ctx, room, true)
	if err != nil {
		return nil, err
	}
	defer leave()
	if _, err := m.st.Room(ctx, room); err != nil {
		if _, raw, serr := m.loadSettings(ctx, room); serr != nil || raw == nil {
			return nil, err
		}
	}
	if err := m.purgeable(ctx, r); err != nil {
		return nil, err
	}
	defer func() {
		// The room's state goes (also after a failure half-way, when what
		// is left is read again from the store): its id is a new room
		// from here on, and operations that waited at the door enter the
		// new one.
		m.mu.Lock()
		r.mu.Lock()
		r.retired = true
		r.mu.Unlock()
		if m.rooms[room] == r {
			delete(m.rooms, room)
		}
		m.mu.Unlock()
	}()
	var receipt json.RawMessage
	if a := r.takeAgent(nil); a != nil {
		cctx, cancel := context.WithTimeout(context.Background(), m.opts.ShutdownBudget)
		receipt, err = a.Close(cctx)
		cancel()
		m.freeSlot()
		if err != nil {
			return receipt, fmt.Errorf("room: releasing the agent: %w", err)
		}
	}
	// What the agent said before it was gone is written before the room
	// is deleted, not after (it would start the new room's log).
	r.events.flush()
	if f, ok := m.opts.Snapshots.(SnapshotForgetter); ok {
		if err := f.Forget(ctx, r.snapshotPlace()); err != nil {
			return receipt, fmt.Errorf("room: its snapshots: %w", err)
		}
	}
	if m.opts.Sources != nil {
		if err := m.opts.Sources.Remove(ctx, room); err != nil {
			return receipt, fmt.Errorf("room: its workspace: %w", err)
		}
	}
	for _, d := range []string{r.workspace, r.dir} {
		if err := os.RemoveAll(d); err != nil {
			return receipt, fmt.Errorf("room: deleting %s: %w", filepath.Base(d), err)
		}
	}
	if err := p.PurgeRoom(ctx, room); err != nil {
		return receipt, err
	}
	return receipt, nil
}

// purgeable waits for the room's worker to wind down (a client that saw
// the last turn end is not told the room is busy) and says, as ErrBusy,
// what keeps the room from being deleted. The caller holds the door
// alone: no message, revert or purge comes meanwhile.
func (m *Manager) purgeable(ctx context.Context, r *roomState) error {
	for {
		r.mu.Lock()
		var wait <-chan struct{}
		switch {
		case r.turn != nil || r.cont != nil:
			r.mu.Unlock()
			return busy("a turn is running: cancel it, and let waiting messages end, before deleting the room")
		case len(r.queue) > 0:
			n := len(r.queue)
			r.mu.Unlock()
			return busy(fmt.Sprintf("%d messages wait for a turn: let them end (or cancel their turns) before deleting the room", n))
		case r.ending:
			// The last turn's end is being written.
			wait = r.endDone
		case r.working:
			// The worker records its last turn's budget note and winds
			// down; it may find a message meanwhile (the loop looks
			// again).
			wait = r.workerDone
		}
		r.mu.Unlock()
		if wait == nil {
			return nil
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
