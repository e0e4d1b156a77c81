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
	// ErrPurging: the room is being deleted; a message to it is refused.
	ErrPurging = errors.New("room: the room is being deleted")
)

// Purge deletes the room for good: it releases its agent (the receipt is
// returned, and nowhere recorded: the log goes too), and deletes its
// session files and agent home, its snapshots, its workspace (a git
// worktree included) and its records, event log and settings. The id may
// then be used again, as a new room. ErrBusy while a turn runs or
// messages wait (cancel the turn; a waiting message must end first), and
// ErrNotFound for a room the store does not know.
func (m *Manager) Purge(ctx context.Context, room string) (json.RawMessage, error) {
	if err := ValidateID(room); err != nil {
		return nil, err
	}
	p, ok := m.st.(Purger)
	if !ok || m.opts.Cluster != nil {
		return nil, ErrPurgeUnsupported
	}
	if _, err := m.st.Room(ctx, room); err != nil {
		if _, raw, serr := m.loadSettings(ctx, room); serr != nil || raw == nil {
			return nil, err
		}
	}
	r, err := m.room(room)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	for r.working && r.turn == nil && r.cont == nil && len(r.queue) == 0 {
		// The worker records its last turn's end and winds down (the
		// budget's note after message.ended): a client that saw the
		// turn end is not told the room is busy. The loop looks again
		// after it: a message may have come meanwhile.
		done := r.workerDone
		r.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		r.mu.Lock()
	}
	if r.turn != nil || r.ending || r.working || len(r.queue) > 0 || r.reverting || r.purging {
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: cancel the running turn, and let waiting messages end, before deleting the room", ErrBusy)
	}
	r.purging = true
	r.mu.Unlock()
	defer func() {
		// The room's state goes: its id is a new room from here on. It
		// stays purging: a request that took it before refuses itself,
		// and never reaches the new room's state.
		m.mu.Lock()
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
