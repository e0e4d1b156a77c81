package workspace_test

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/room"
	"github.com/agenthost/agenthost/sqlitestore"
	"github.com/agenthost/agenthost/transport"
	"github.com/agenthost/agenthost/workspace"
)

// TestGitFileRoots: a room's settings (a hostile API caller's) may name a
// file:// repository only under GitOptions.FileRoots, never in the rooms'
// folder (Denied) even when it lies under a root, and with no roots none
// at all; the refusal comes when the settings are set, before any agent.
func TestGitFileRoots(t *testing.T) {
	if _, err := workspace.NewGit(workspace.GitOptions{}); err == nil {
		t.Error("NewGit without a Root: no error")
	}
	ctx := t.Context()
	dir := t.TempDir()
	repos := filepath.Join(dir, "repos")
	rooms := filepath.Join(dir, "repos", "rooms") // under the root, and denied
	ok := gitRepo(filepath.Join(repos, "ok"), "README", "x\n")
	inRooms := gitRepo(filepath.Join(rooms, "other-room", "workspace"), "secret", "x\n")
	outside := gitRepo(filepath.Join(dir, "elsewhere"), "README", "x\n")

	st, err := sqlitestore.Open(ctx, filepath.Join(dir, "agenthost.db"), sqlitestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cust, err := custody.New(custody.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := transport.NewRPC(transport.Options{Custodian: cust})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		roots []string
		url   string
		ok    bool
	}{
		{[]string{repos}, "file://" + ok, true},
		{[]string{repos}, "file://" + inRooms, false},
		{[]string{repos}, "file://" + outside, false},
		{[]string{repos}, "file://" + filepath.Join(repos, "ok", "..", "..", "elsewhere"), false},
		{nil, "file://" + ok, false},
	} {
		id := "r" + strconv.Itoa(i)
		git, err := workspace.NewGit(workspace.GitOptions{Root: filepath.Join(t.TempDir(), "git"), FileRoots: c.roots, Denied: []string{rooms}})
		if err != nil {
			t.Fatal(err)
		}
		m, err := room.New(room.Options{Store: st, Transport: tr, Root: rooms, Sources: git})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(ctx); err != nil {
			t.Fatal(err)
		}
		_, err = m.SetSettings(ctx, id, room.Settings{Workspace: &room.Workspace{Git: c.url, Ref: "main"}})
		if (err == nil) != c.ok {
			t.Errorf("roots %v, workspace %s: %v, want accepted %v", c.roots, c.url, err, c.ok)
		}
		if err := errors.Join(m.Close(), m.Wait(context.Background())); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(cust.Close(), st.Close()); err != nil {
		t.Fatal(err)
	}
}
