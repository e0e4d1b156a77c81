package client_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/client"
	"github.com/agenthost/agenthost/internal/roomsnap"
	"github.com/agenthost/agenthost/room"
)

// A turn's changes in turn.ended, its diff, and its revert, typed.
func TestTurnDiffAndRevert(t *testing.T) {
	snaps := roomsnap.New(roomsnap.Options{})
	t.Cleanup(func() { _ = snaps.Close() }) // after the server stops
	a := newAPI(t, room.Options{Snapshots: snaps})
	c := newClient(t, a.URL(), client.Options{})
	ctx := t.Context()
	acc, err := c.Send(ctx, "r", client.NewMessage{Text: "write:new.txt"})
	if err != nil {
		t.Fatal(err)
	}
	evs := untilTurnEnded(t, ctx, c, "r", acc.Seq)
	var ended client.TurnEnded
	if err := evs[len(evs)-1].Decode(&ended); err != nil || ended.Changes == nil ||
		*ended.Changes != (client.Changes{Files: 1, Insertions: 1}) {
		t.Fatalf("turn.ended %s: %v", evs[len(evs)-1].Data, err)
	}
	d, err := c.TurnDiff(ctx, "r", ended.TurnID)
	if err != nil || len(d.Files) != 1 || d.Files[0].Path != "new.txt" || d.Files[0].Status != client.FileAdded ||
		!strings.Contains(d.Patch, "+hello") || d.Truncated {
		t.Fatalf("diff %+v: %v", d, err)
	}
	if _, err := c.TurnDiff(ctx, "r", "t_nope"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("diff of an unknown turn: %v", err)
	}
	if _, err := c.Revert(ctx, "r", "../x"); !errors.Is(err, client.ErrBadRequest) {
		t.Fatalf("revert of a bad turn id: %v", err)
	}
	rv, err := c.Revert(ctx, "r", ended.TurnID)
	if err != nil || !rv.Reverted || rv.TurnID != ended.TurnID || len(rv.Files) != 1 || rv.Files[0] != "new.txt" {
		t.Fatalf("revert %+v: %v", rv, err)
	}
	for ev, err := range c.Follow(ctx, "r", evs[len(evs)-1].Seq) {
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type != client.TypeWorkspaceReverted {
			continue
		}
		var w client.WorkspaceReverted
		if err := ev.Decode(&w); err != nil || w.TurnID != ended.TurnID || w.Count != 1 || w.Files[0] != "new.txt" {
			t.Fatalf("workspace.reverted %s: %v", ev.Data, err)
		}
		break
	}
}
