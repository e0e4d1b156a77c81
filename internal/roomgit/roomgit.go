// Package roomgit gives rooms their workspaces from git: it adapts
// internal/gitws's engine (shared mirrors, a worktree per room) to
// room.WorkspaceSource. It is its own package so that room imports no git
// engine and gitws no room.
package roomgit

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/agenthost/agenthost/internal/gitws"
	"github.com/agenthost/agenthost/room"
)

// Source is a room.WorkspaceSource over a gitws engine.
type Source struct{ e *gitws.Engine }

var _ room.WorkspaceSource = (*Source)(nil)

// New returns a Source preparing workspaces with e.
func New(e *gitws.Engine) *Source { return &Source{e: e} }

// Check implements room.WorkspaceSource: a room keeps the repository and
// ref of its first checkout (another would need its files deleted: the
// error says what it holds); a room without one takes a repository that
// answers and has the branch or tag (a commit id is checked at the
// checkout), into a workspace that holds no files yet.
func (s *Source) Check(ctx context.Context, rm, dir string, w room.Workspace) error {
	err := s.e.Admit(ctx, rm, dir, gitws.Spec{Git: w.Git, Ref: w.Ref})
	switch {
	case errors.Is(err, gitws.ErrSpecChanged):
		if held, ok, herr := s.e.Held(rm); herr == nil && ok {
			return fmt.Errorf("the room's workspace holds %s at %q (a room keeps the repository and ref of its first checkout): "+
				"delete the room (DELETE /v1/rooms/{room}?purge=true, which deletes its files) to give it another", gitws.Redact(held.Git), held.Ref)
		}
		return errors.New("the room's workspace already holds another repository or ref: delete the room (DELETE /v1/rooms/{room}?purge=true) to change it")
	case errors.Is(err, gitws.ErrNotEmpty):
		return errNotEmpty
	}
	return plain(err)
}

// errNotEmpty says why a room with files takes no checkout, and what to do.
var errNotEmpty = errors.New("git: the room's workspace already holds files: a git workspace is checked out into an empty one " +
	"(delete the room with DELETE /v1/rooms/{room}?purge=true, which deletes its files, first)")

// Held implements room.WorkspaceSource.
func (s *Source) Held(rm string) (*room.Workspace, error) {
	spec, ok, err := s.e.Held(rm)
	if err != nil || !ok {
		return nil, plain(err)
	}
	return &room.Workspace{Git: spec.Git, Ref: spec.Ref}, nil
}

// Prepare implements room.WorkspaceSource.
func (s *Source) Prepare(ctx context.Context, rm, dir string, w room.Workspace) (room.WorkspaceReady, error) {
	r, err := s.e.PrepareAt(ctx, rm, dir, gitws.Spec{Git: w.Git, Ref: w.Ref})
	if err != nil {
		if errors.Is(err, gitws.ErrNotEmpty) {
			return room.WorkspaceReady{}, errNotEmpty
		}
		return room.WorkspaceReady{}, plain(err)
	}
	return room.WorkspaceReady{URL: r.URL, Ref: r.Ref, Kind: r.Kind, Commit: r.Commit, Shared: []string{r.Mirror}}, nil
}

// Remove implements room.WorkspaceSource.
func (s *Source) Remove(ctx context.Context, rm string) error { return plain(s.e.Remove(ctx, rm)) }

// plain is err's text for people, naming git (the engine's messages name
// its package); a context's error stays itself.
func plain(err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return gitErr{msg: "git: " + strings.ReplaceAll(err.Error(), "gitws: ", ""), err: err}
}

type gitErr struct {
	msg string
	err error
}

func (e gitErr) Error() string { return e.msg }
func (e gitErr) Unwrap() error { return e.err }
