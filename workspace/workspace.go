// Package workspace gives rooms what `agenthost serve` gives their
// workspaces, for a program that hosts rooms in its own process:
// per-turn snapshots, so that Manager.TurnDiff tells what a turn changed
// and Manager.Revert undoes it (room.Options.Snapshots), and workspaces
// checked out from git repositories that rooms' settings name
// (room.Options.Sources).
//
// Snapshots are kept in a shadow git repository per room, in the room's
// own folder (beside its agent home, outside its workspace: the agent
// cannot rewrite them), with a journal of each turn's snapshots, so a
// diff and a revert survive a restart. Git workspaces share one mirror
// per repository and give each room a worktree of its own.
//
// Both need the git program (2.29 or later) on PATH. Platforms: Linux,
// macOS and the BSDs; Windows is untested.
package workspace

import (
	"errors"
	"log/slog"

	"github.com/agenthost/agenthost/internal/gitws"
	"github.com/agenthost/agenthost/internal/roomgit"
	"github.com/agenthost/agenthost/internal/roomsnap"
	"github.com/agenthost/agenthost/internal/snapshot"
	"github.com/agenthost/agenthost/room"
)

// SnapshotOptions configure NewSnapshots. The zero value is ready to use.
type SnapshotOptions struct {
	// MaxFileSize is the largest file, in bytes, a snapshot records (0:
	// 10 MiB); bigger ones are left out, and the turn's changes say so.
	MaxFileSize int64
	// MaxPatchBytes bounds a turn's diff (0: 1 MiB; a longer one is cut
	// at a line's end and marked truncated).
	MaxPatchBytes int
}

// Snapshots are rooms' per-turn snapshots. Create them with
// NewSnapshots; Close them after the room.Manager (Close, then Wait).
type Snapshots struct {
	snapshots
	s *roomsnap.Snapshots
}

// snapshots is what Snapshots offer rooms: embedded, so that a method
// room.Snapshots gains comes with it.
type snapshots interface {
	room.Snapshots
	room.SnapshotForgetter
}

var (
	_ room.Snapshots         = (*Snapshots)(nil)
	_ room.SnapshotForgetter = (*Snapshots)(nil)
)

// NewSnapshots returns rooms' snapshots, for room.Options.Snapshots.
func NewSnapshots(opts SnapshotOptions) *Snapshots {
	s := roomsnap.New(roomsnap.Options{Repo: snapshot.Options{MaxFileSize: opts.MaxFileSize},
		Limits: snapshot.Limits{MaxPatchBytes: opts.MaxPatchBytes}})
	return &Snapshots{snapshots: s, s: s}
}

// Close closes every room's shadow repository; later calls fail.
func (s *Snapshots) Close() error { return s.s.Close() }

// GitOptions configure NewGit. Root is required.
type GitOptions struct {
	// Root is the folder of the mirrors and the rooms' worktrees records
	// (created if need be).
	Root string
	// FileRoots are the only folders a file:// URL may name a repository
	// in; none refuses file:// URLs (an agent's room must not check out
	// the host's own repositories).
	FileRoots []string
	// Denied are folders no file:// URL may reach whatever FileRoots
	// says: give the rooms' folder (room.Options.Root, and Workspaces),
	// which holds other rooms' files and snapshots.
	Denied []string
	// Logger gets one debug line per git command (never a URL's
	// credentials). nil: discard.
	Logger *slog.Logger
}

// NewGit returns the source of rooms' workspaces from git, for
// room.Options.Sources: a room whose settings name a repository
// (room.Settings.Workspace) gets a worktree of it before its first turn.
func NewGit(opts GitOptions) (room.WorkspaceSource, error) {
	if opts.Root == "" {
		return nil, errors.New("workspace: GitOptions.Root is required")
	}
	e, err := gitws.New(gitws.Options{Root: opts.Root, FileRoots: opts.FileRoots, Denied: opts.Denied, Logger: opts.Logger})
	if err != nil {
		return nil, err
	}
	return roomgit.New(e), nil
}
