package room

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/agenthost/agenthost/event"
)

// DefaultSnapshotTimeout bounds one snapshot of a room's workspace (see
// Options.SnapshotTimeout).
const DefaultSnapshotTimeout = 60 * time.Second

// maxRevertedListed bounds the paths a workspace.reverted event lists;
// the rest are only counted.
const maxRevertedListed = 1000

// ErrBusy is returned by Revert and TurnDiff while a turn runs in the
// room (or its end is being recorded), and by Purge while a turn runs or
// messages wait; the error's text says which.
var ErrBusy = errors.New("room: a turn is running")

// busyError is ErrBusy with its own reason.
type busyError struct{ reason string }

func busy(reason string) error { return busyError{reason} }

func (e busyError) Error() string        { return "room: " + e.reason }
func (e busyError) Is(target error) bool { return target == ErrBusy }

// Snapshots records a room's workspace before and after each turn, so
// that what a turn changed can be told and taken back. The room calls it;
// the implementation (the workspace snapshot engine, wired in by the
// command) keeps, per room, which records belong to which turn. Errors
// for an unknown turn wrap ErrNotFound.
type Snapshots interface {
	// Before records the workspace as turn starts.
	Before(ctx context.Context, p SnapshotPlace, turn string) error
	// After records it as turn ends and counts what changed since
	// Before.
	After(ctx context.Context, p SnapshotPlace, turn string) (Changes, error)
	// Diff tells what turn changed.
	Diff(ctx context.Context, p SnapshotPlace, turn string) (TurnDiff, error)
	// Revert restores the workspace to its record before turn.
	Revert(ctx context.Context, p SnapshotPlace, turn string) (Reverted, error)
}

// SnapshotPlace is where a room's snapshots live.
type SnapshotPlace struct {
	Room string
	// Dir is the room's own folder for its snapshots, beside its agent
	// home: outside the workspace and the agent's reach.
	Dir       string
	Workspace string
}

// Changes count what a turn changed in the workspace (turn.ended carries
// them).
type Changes = event.Changes

// SkippedPath is one path a snapshot left out, and why: "ignored" (a
// wholly ignored folder is listed once, with a trailing slash),
// "too_large" (with its size), "repository", "unreadable" or "special".
type SkippedPath struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
	Size   int64  `json:"size,omitempty"`
}

// ChangedFile is one file a turn changed.
type ChangedFile struct {
	// Path is relative to the workspace; a name that is not UTF-8, or
	// starts with a double quote, is Go-quoted ("\xff.txt" for the
	// bytes ff 2e 74 78 74: strconv.Unquote reverses it), as in Reverted
	// and SkippedPath.
	Path string `json:"path"`
	// Status is "added", "modified" or "deleted".
	Status     string `json:"status"`
	Insertions int    `json:"insertions"`
	Deletions  int    `json:"deletions"`
	// Binary: named, not inlined in the patch, lines not counted.
	Binary bool `json:"binary,omitempty"`
}

// TurnDiff is what a turn changed: its files and a unified patch, both
// bounded.
type TurnDiff struct {
	Files []ChangedFile `json:"files"`
	// FilesOmitted counts the changed files beyond those listed.
	FilesOmitted int     `json:"files_omitted,omitempty"`
	Changes      Changes `json:"changes"`
	Patch        string  `json:"patch"`
	// Truncated is set when Patch was cut at its bound.
	Truncated bool `json:"truncated"`
	// Skipped lists what the turn's closing snapshot left out (at most
	// 1000; SkippedOmitted counts the rest): not in the diff, and left
	// alone by a revert.
	Skipped        []SkippedPath `json:"skipped,omitempty"`
	SkippedOmitted int           `json:"skipped_omitted,omitempty"`
}

// Reverted is what a Revert restored.
type Reverted struct {
	// Files are the paths removed or written back, sorted.
	Files []string `json:"files"`
	// Kept are paths left alone because something snapshots never touch
	// (a file over the size bound, a nested repository, a folder that is
	// not empty) occupies them; an ignored file or link there is replaced.
	Kept []string `json:"kept,omitempty"`
}

// snapshotPlace is where the room's snapshots live.
func (r *roomState) snapshotPlace() SnapshotPlace {
	return SnapshotPlace{Room: r.id, Dir: filepath.Join(r.dir, "snapshots"), Workspace: r.workspace}
}

// snapshotBefore records the workspace as t starts; it returns why it
// could not ("" when it did). A failure never fails the turn: the turn
// runs, and its end says its changes are unknown.
func (m *Manager) snapshotBefore(r *roomState, t *turnRun) string {
	s := m.opts.Snapshots
	if s == nil {
		return ""
	}
	if err := mkdirNoLink(r.workspace); err != nil {
		return err.Error()
	}
	ctx, cancel := context.WithTimeout(t.ctx, m.opts.SnapshotTimeout)
	defer cancel()
	start := time.Now()
	err := s.Before(ctx, r.snapshotPlace(), t.id)
	m.phase(r.id, t.id, PhaseSnapshotBefore, start, errText(err))
	if err != nil {
		m.log.Warn("room: snapshot before the turn failed; its changes will be unknown", "room", r.id, "turn", t.id, "err", err)
		return "no snapshot before the turn: " + err.Error()
	}
	return ""
}

// snapshotAfter adds to a turn.ended event what the turn changed:
// Changes, or, when that is unknown (a snapshot failed or timed out),
// ChangesError saying why. Nothing is added with snapshots off.
func (m *Manager) snapshotAfter(r *roomState, t *turnRun, d *event.TurnEnded) {
	s := m.opts.Snapshots
	if s == nil {
		return
	}
	if t.snapErr != "" {
		d.ChangesError = t.snapErr
		return
	}
	// The manager's context, not the turn's: a cancelled turn's changes
	// still count; a closing host gives up on them.
	ctx, cancel := context.WithTimeout(m.ctx, m.opts.SnapshotTimeout)
	defer cancel()
	start := time.Now()
	c, err := s.After(ctx, r.snapshotPlace(), t.id)
	m.phase(r.id, t.id, PhaseSnapshotAfter, start, errText(err))
	if err != nil {
		m.log.Warn("room: snapshot after the turn failed; its changes are unknown", "room", r.id, "turn", t.id, "err", err)
		d.ChangesError = "no snapshot after the turn: " + err.Error()
		return
	}
	d.Changes = &c
}

// TurnDiff tells what turn changed in the room's workspace. ErrNotFound
// for a turn with no snapshots recorded (unknown, from another room, or
// run with snapshots off) and for a room the store does not know (a
// purged one); ErrBusy while that turn runs.
func (m *Manager) TurnDiff(ctx context.Context, room, turn string) (TurnDiff, error) {
	if err := m.snapshotArgs(room, turn); err != nil {
		return TurnDiff{}, err
	}
	r, leave, err := m.enter(ctx, room, false)
	if err != nil {
		return TurnDiff{}, err
	}
	defer leave()
	if err := m.knownRoom(ctx, room); err != nil {
		return TurnDiff{}, err
	}
	// A turn's diff is there once its end is: from before turn.ended is
	// written (the room is still "ending" then).
	r.mu.Lock()
	running := r.turn != nil && r.turn.id == turn
	r.mu.Unlock()
	if running {
		return TurnDiff{}, fmt.Errorf("%w: turn %s has not ended", ErrBusy, turn)
	}
	return m.opts.Snapshots.Diff(ctx, r.snapshotPlace(), turn)
}

// Revert restores the room's workspace to its state before turn (later
// turns' changes go too), records workspace.reverted, and tells the
// agent's next prompt. A second revert waits for the first, then runs
// (see the package doc). ErrBusy while a turn runs (no turn starts while
// it works); ErrNotFound as TurnDiff.
func (m *Manager) Revert(ctx context.Context, room, turn string) (Reverted, error) {
	if err := m.snapshotArgs(room, turn); err != nil {
		return Reverted{}, err
	}
	r, leave, err := m.enter(ctx, room, false)
	if err != nil {
		return Reverted{}, err
	}
	defer leave()
	if err := r.revertLock.enter(ctx, true); err != nil {
		return Reverted{}, fmt.Errorf("room %q: waiting for its other revert: %w", room, err)
	}
	defer r.revertLock.leave(true)
	if err := m.knownRoom(ctx, room); err != nil {
		return Reverted{}, err
	}
	for {
		r.mu.Lock()
		if r.turn != nil || r.cont != nil {
			running := r.turn != nil && r.turn.id == turn || r.cont != nil && r.cont.rec.ID == turn
			place := r.snapshotPlace()
			r.mu.Unlock()
			// A turn this room has no record of is not found, busy or not
			// (the room may be a new one under a purged room's id).
			if !running {
				if _, err := m.opts.Snapshots.Diff(ctx, place, turn); errors.Is(err, ErrNotFound) {
					return Reverted{}, err
				}
			}
			return Reverted{}, busy("a turn is running: revert when the room is idle")
		}
		if r.ending {
			// The last turn's end is being written (turn.ended may be out
			// already): wait for it, so the revert comes after it.
			done := r.endDone
			r.mu.Unlock()
			select {
			case <-done:
				continue
			case <-ctx.Done():
				return Reverted{}, ctx.Err()
			}
		}
		r.reverting = true // the worker starts no turn until it is done
		r.mu.Unlock()
		break
	}
	defer func() {
		r.mu.Lock()
		r.reverting = false
		if len(r.queue) > 0 && !r.queue[0].pending {
			m.ensureWorkerLocked(r)
		}
		r.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(ctx, m.opts.SnapshotTimeout)
	defer cancel()
	res, err := m.opts.Snapshots.Revert(ctx, r.snapshotPlace(), turn)
	if err != nil {
		return Reverted{}, err
	}
	listed := res.Files
	if len(listed) > maxRevertedListed {
		listed = listed[:maxRevertedListed]
	}
	d := event.WorkspaceReverted{TurnID: turn, Files: nonNilStrings(listed), Count: len(res.Files),
		FilesOmitted: len(res.Files) - len(listed), Token: tokenOf(ctx)}
	if len(res.Kept) > 0 {
		d.Kept = res.Kept[:min(len(res.Kept), maxRevertedListed)]
	}
	// The workspace is reverted: the agent hears of it even if the event
	// cannot be written.
	r.mu.Lock()
	r.revertedTo = turn
	r.mu.Unlock()
	if err := m.write(func(tx Tx) error {
		_, err := appendEvent(tx, r.id, d)
		return err
	}); err != nil {
		return res, err
	}
	return res, nil
}

// snapshotArgs checks a diff's or revert's arguments.
func (m *Manager) snapshotArgs(room, turn string) error {
	if err := ValidateID(room); err != nil {
		return err
	}
	if turn == "" || len(turn) > 128 {
		return fmt.Errorf("%w: turn %q", ErrNotFound, turn)
	}
	if m.opts.Snapshots == nil {
		return fmt.Errorf("%w: snapshots are off on this host", ErrNotFound)
	}
	if c := m.opts.Cluster; c != nil && !c.Owns(room) {
		// The shadow repository is the holder's to use.
		return fmt.Errorf("%w: the room is held by another node", ErrUnavailable)
	}
	return nil
}

// knownRoom is ErrNotFound for a room the store does not know: inside
// the door, what a purge deleted is not made again (a snapshot's folder)
// by what waited for it.
func (m *Manager) knownRoom(ctx context.Context, room string) error {
	if _, err := m.st.Room(ctx, room); err != nil {
		if errors.Is(err, ErrNotFound) {
			return fmt.Errorf("%w: no room %q", ErrNotFound, room)
		}
		return err
	}
	return nil
}

// revertNote is the line the agent's next prompt starts with after a
// revert.
func revertNote(turn string) string {
	return "[The workspace was reverted to its state before turn " + turn + "; changes made since are gone.]\n"
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
