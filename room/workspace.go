package room

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/agenthost/agenthost/event"
)

// Workspace is where a room's workspace comes from: a git repository at a
// branch, tag or commit (Settings.Workspace). Credentials come from the
// host's own git configuration; none is stored.
type Workspace struct {
	Git string `json:"git"`
	Ref string `json:"ref"`
}

// WorkspaceReady is a room's workspace as its source prepared it.
type WorkspaceReady struct {
	// URL (without credentials), Ref as named, Kind ("branch", "tag" or
	// "commit") and the Commit checked out.
	URL, Ref, Kind, Commit string
	// Shared are folders the workspace borrows from (a repository's
	// shared objects): the room's agent may read them.
	Shared []string
}

// WorkspaceSource prepares rooms' workspaces from their Settings.Workspace
// (Options.Sources; internal/roomgit over git). Its methods are called
// with no Manager lock held; calls for one room do not overlap.
type WorkspaceSource interface {
	// Check says whether w can be the room's workspace (its folder dir),
	// as far as is cheap to know before its first turn: the URL and ref,
	// that the room holds no workspace of another repository or ref, and,
	// when it holds none yet, that dir holds no files and the repository
	// answers and has that branch or tag.
	Check(ctx context.Context, room, dir string, w Workspace) error
	// Held returns the workspace the room holds (checked out, or being
	// checked out now), nil when none. A room keeps it until it is
	// deleted, whatever its settings say later.
	Held(room string) (*Workspace, error)
	// Prepare fills the room's workspace folder (empty or missing the
	// first time) with w, or returns the one already prepared.
	Prepare(ctx context.Context, room, dir string, w Workspace) (WorkspaceReady, error)
	// Remove deletes what Prepare made for the room, its files included
	// (a purged room).
	Remove(ctx context.Context, room string) error
}

// checkTimeout bounds a workspace source's Check at SetSettings.
const checkTimeout = 30 * time.Second

// checkWorkspace refuses a workspace this Manager cannot give the room.
// Settings without one leave the room the workspace it holds.
func (m *Manager) checkWorkspace(ctx context.Context, room string, w *Workspace) error {
	if w == nil {
		return nil
	}
	if m.opts.Sources == nil {
		return fmt.Errorf("%w: this server has no workspaces from git", ErrBadSettings)
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	if err := m.opts.Sources.Check(ctx, room, m.workspaceDir(room), *w); err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			return fmt.Errorf("%w: workspace: git did not answer within %s", ErrBadSettings, checkTimeout)
		}
		return fmt.Errorf("%w: workspace: %s", ErrBadSettings, strings.TrimPrefix(err.Error(), "room: "))
	}
	return nil
}

// heldWorkspace is the workspace the room holds (see WorkspaceSource.Held),
// or else the one its settings name: what GET /config shows, so that it
// never says none while the room's workspace is a checkout.
func (m *Manager) heldWorkspace(room string, w *Workspace) *Workspace {
	if m.opts.Sources == nil {
		return w
	}
	if held, err := m.opts.Sources.Held(room); err == nil && held != nil {
		return held
	}
	return w
}

// prepareWorkspace gives the room its workspace from its settings before
// a turn (nothing when it has none), within the turn's timeout, and
// records workspace.ready the first time this host has it. The error
// names git.
func (m *Manager) prepareWorkspace(ctx context.Context, r *roomState, cfg Config) error {
	r.mu.Lock()
	w := r.settings.Workspace
	r.mu.Unlock()
	// Settings that name none leave the room the one it holds (whose
	// shared objects its agent must still read).
	if w = m.heldWorkspace(r.id, w); w == nil {
		return nil
	}
	if m.opts.Sources == nil {
		return errors.New("workspace: this server has no workspaces from git")
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.TurnTimeout)
	defer cancel()
	ready, err := m.opts.Sources.Prepare(ctx, r.id, r.workspace, *w)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			return fmt.Errorf("workspace: git did not finish within the turn's timeout (%s)", cfg.TurnTimeout)
		}
		return fmt.Errorf("workspace: %w", err)
	}
	key := ready.URL + "\x00" + ready.Ref + "\x00" + ready.Commit
	r.mu.Lock()
	fresh := r.wsReady != key
	r.wsReady, r.wsShared = key, ready.Shared
	r.mu.Unlock()
	if !fresh {
		return nil
	}
	return m.write(func(tx Tx) error {
		_, err := appendEvent(tx, r.id, event.WorkspaceReady{
			URL: ready.URL, Ref: ready.Ref, Kind: ready.Kind, Commit: ready.Commit,
		})
		return err
	})
}
