package room

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeSnapshots records which turns were snapshotted. failBefore and
// hangAfter make Before fail and After wait for its context.
type fakeSnapshots struct {
	mu         sync.Mutex
	before     map[string]SnapshotPlace
	after      map[string]bool
	reverted   []string
	failBefore bool
	hangAfter  bool
}

func newFakeSnapshots() *fakeSnapshots {
	return &fakeSnapshots{before: map[string]SnapshotPlace{}, after: map[string]bool{}}
}

func (f *fakeSnapshots) Before(ctx context.Context, p SnapshotPlace, turn string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failBefore {
		return errors.New("git exploded")
	}
	// A record on disk, in the room's snapshot folder, as the real
	// snapshots keep: a purge deletes the folder, and with it the record.
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(p.Dir, turn), nil, 0o600); err != nil {
		return err
	}
	f.before[turn] = p
	return nil
}

func (f *fakeSnapshots) After(ctx context.Context, p SnapshotPlace, turn string) (Changes, error) {
	f.mu.Lock()
	hang := f.hangAfter
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return Changes{}, ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.before[turn]; !ok {
		return Changes{}, fmt.Errorf("%w: turn %s", ErrNotFound, turn)
	}
	f.after[turn] = true
	return Changes{Files: 1, Insertions: 2, Deletions: 1}, nil
}

func (f *fakeSnapshots) known(p SnapshotPlace, turn string) bool {
	b, ok := f.before[turn]
	if !ok || b != p || !f.after[turn] {
		return false
	}
	_, err := os.Stat(filepath.Join(p.Dir, turn))
	return err == nil
}

func (f *fakeSnapshots) Diff(ctx context.Context, p SnapshotPlace, turn string) (TurnDiff, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.known(p, turn) {
		return TurnDiff{}, fmt.Errorf("%w: turn %s", ErrNotFound, turn)
	}
	return TurnDiff{Files: []ChangedFile{{Path: "a.txt", Status: "modified", Insertions: 2, Deletions: 1}},
		Changes: Changes{Files: 1, Insertions: 2, Deletions: 1}, Patch: "--- a/a.txt\n"}, nil
}

func (f *fakeSnapshots) Revert(ctx context.Context, p SnapshotPlace, turn string) (Reverted, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.known(p, turn) {
		return Reverted{}, fmt.Errorf("%w: turn %s", ErrNotFound, turn)
	}
	f.reverted = append(f.reverted, turn)
	return Reverted{Files: []string{"a.txt"}}, nil
}

func TestTurnEndedCountsTheTurnsChanges(t *testing.T) {
	snaps := newFakeSnapshots()
	h := newHarness(t, Options{Snapshots: snaps})
	d := h.turnEnded("r", h.submit("r", "write"))
	c, ok := d["changes"].(map[string]any)
	if d["outcome"] != OutcomeSettled || !ok || c["files"] != 1.0 || c["insertions"] != 2.0 || c["deletions"] != 1.0 {
		t.Fatalf("turn.ended %v", d)
	}
	if _, ok := d["changes_error"]; ok {
		t.Fatalf("turn.ended %v", d)
	}
	snaps.mu.Lock()
	p := snaps.before[d["turn_id"].(string)]
	snaps.mu.Unlock()
	if p.Room != "r" || p.Workspace == "" || p.Dir == "" || strings.HasPrefix(p.Dir, p.Workspace) {
		t.Fatalf("snapshot place %+v", p)
	}
}

func TestTurnEndedWithoutSnapshotsHasNoChanges(t *testing.T) {
	h := newHarness(t, Options{})
	d := h.turnEnded("r", h.submit("r", "write"))
	if _, ok := d["changes"]; ok {
		t.Fatalf("turn.ended %v", d)
	}
	if _, err := h.m.TurnDiff(t.Context(), "r", d["turn_id"].(string)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("diff with snapshots off: %v", err)
	}
}

func TestSnapshotFailureNeverFailsTheTurn(t *testing.T) {
	t.Run("before fails", func(t *testing.T) {
		snaps := newFakeSnapshots()
		snaps.failBefore = true
		h := newHarness(t, Options{Snapshots: snaps})
		d := h.turnEnded("r", h.submit("r", "write"))
		if d["outcome"] != OutcomeSettled || d["text"] != "ok: write" {
			t.Fatalf("turn.ended %v", d)
		}
		if v, ok := d["changes"]; !ok || v != nil || !strings.Contains(d["changes_error"].(string), "git exploded") {
			t.Fatalf("turn.ended %v", d)
		}
	})
	t.Run("after hangs", func(t *testing.T) {
		snaps := newFakeSnapshots()
		snaps.hangAfter = true
		// The bound, not a wait: the turn ends when it passes.
		h := newHarness(t, Options{Snapshots: snaps, SnapshotTimeout: 100 * time.Millisecond})
		d := h.turnEnded("r", h.submit("r", "write"))
		if d["outcome"] != OutcomeSettled || d["changes"] != nil || !strings.Contains(d["changes_error"].(string), "deadline") {
			t.Fatalf("turn.ended %v", d)
		}
		// The room goes on.
		snaps.mu.Lock()
		snaps.hangAfter = false
		snaps.mu.Unlock()
		if d := h.turnEnded("r", h.submit("r", "again")); d["outcome"] != OutcomeSettled || d["changes"] == nil {
			t.Fatalf("next turn.ended %v", d)
		}
	})
}

func TestRevertRestoresRecordsAndTellsTheNextPrompt(t *testing.T) {
	snaps := newFakeSnapshots()
	h := newHarness(t, Options{Snapshots: snaps})
	d := h.turnEnded("r", h.submit("r", "write"))
	turn := d["turn_id"].(string)

	diff, err := h.m.TurnDiff(t.Context(), "r", turn)
	if err != nil || len(diff.Files) != 1 || diff.Files[0].Path != "a.txt" {
		t.Fatalf("diff %+v %v", diff, err)
	}
	for _, bad := range []struct{ room, turn string }{{"r", "t_nope"}, {"other", turn}} {
		if _, err := h.m.TurnDiff(t.Context(), bad.room, bad.turn); !errors.Is(err, ErrNotFound) {
			t.Fatalf("diff %v: %v", bad, err)
		}
		if _, err := h.m.Revert(t.Context(), bad.room, bad.turn); !errors.Is(err, ErrNotFound) {
			t.Fatalf("revert %v: %v", bad, err)
		}
	}

	// Busy while a turn runs.
	hang := h.submit("r", "hang")
	started := h.waitEvent("r", hang.Seq, "turn.started", nil)
	var st struct {
		TurnID string `json:"turn_id"`
	}
	if err := json.Unmarshal(started.Data, &st); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Revert(t.Context(), "r", turn); !errors.Is(err, ErrBusy) {
		t.Fatalf("revert while a turn runs: %v", err)
	}
	// A turn the room never ran is not found, busy or not (a purged
	// room's turn, asked of the new room under its id); the running turn
	// itself is busy.
	if _, err := h.m.Revert(t.Context(), "r", "t_nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revert of an unknown turn while a turn runs: %v", err)
	}
	if _, err := h.m.Revert(t.Context(), "r", st.TurnID); !errors.Is(err, ErrBusy) {
		t.Fatalf("revert of the running turn: %v", err)
	}
	if err := h.m.Cancel(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	h.turnEnded("r", hang)

	res, err := h.m.Revert(t.Context(), "r", turn)
	if err != nil || len(res.Files) != 1 || res.Files[0] != "a.txt" {
		t.Fatalf("revert %+v %v", res, err)
	}
	ev := h.waitEvent("r", hang.Seq, "workspace.reverted", nil)
	var rv map[string]any
	_ = json.Unmarshal(ev.Data, &rv)
	if rv["turn_id"] != turn || fmt.Sprint(rv["files"]) != "[a.txt]" || rv["count"] != 1.0 {
		t.Fatalf("workspace.reverted %v", rv)
	}
	// The next prompt says so, in one line, once.
	h.turnEnded("r", h.submit("r", "next"))
	want := revertNote(turn) + "next"
	if p := h.f.lastPrompt(); p != want || strings.Count(revertNote(turn), "\n") != 1 {
		t.Fatalf("prompt %q, want %q", p, want)
	}
	h.turnEnded("r", h.submit("r", "after"))
	if p := h.f.lastPrompt(); p != "after" {
		t.Fatalf("prompt %q", p)
	}
}

func TestMessagesQueuedDuringARevertRunAfterIt(t *testing.T) {
	snaps := newFakeSnapshots()
	h := newHarness(t, Options{Snapshots: snaps})
	turn := h.turnEnded("r", h.submit("r", "write"))["turn_id"].(string)
	// Hold the revert inside the implementation while a message comes.
	snaps.mu.Lock()
	done := make(chan error, 1)
	go func() {
		_, err := h.m.Revert(t.Context(), "r", turn)
		done <- err
	}()
	// Wait until Revert holds the room (its flag), without sleeping.
	for {
		r, _ := h.m.room("r")
		r.mu.Lock()
		rev := r.reverting
		r.mu.Unlock()
		if rev {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("revert returned early: %v", err)
		default:
		}
		time.Sleep(time.Millisecond) // polling a flag set by another goroutine
	}
	acc := h.submit("r", "queued")
	snaps.mu.Unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d := h.turnEnded("r", acc); d["outcome"] != OutcomeSettled {
		t.Fatalf("turn.ended %v", d)
	}
	// The revert's event comes before the queued turn's start.
	rev := h.waitEvent("r", 0, "workspace.reverted", nil)
	st := h.waitEvent("r", acc.Seq, "turn.started", nil)
	if rev.Seq > st.Seq {
		t.Fatalf("workspace.reverted at %d after the next turn's start at %d", rev.Seq, st.Seq)
	}
}
