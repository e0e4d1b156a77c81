package room

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/store"
)

// TestFullDiskEndsEveryAcceptedMessage runs a room on the real store in a
// small tmpfs, fills the disk while messages are posted, then frees it:
// whatever write the full disk refused (an acceptance, a turn's start, a
// turn's end), every message answered as accepted ends exactly once, and
// turns keep the order of acceptance. It needs root to mount the tmpfs;
// TestStoreRefusingATurnStartEndsItsMessageInOrder covers the same paths
// everywhere with a store that refuses on demand.
func TestFullDiskEndsEveryAcceptedMessage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root; TestStoreRefusingATurnStartEndsItsMessageInOrder covers these paths")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=4m,mode=0700"); err != nil {
		t.Skipf("mounting a tmpfs was refused (%v); TestStoreRefusingATurnStartEndsItsMessageInOrder covers these paths", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmounting the tmpfs: %v", err)
		}
	})
	db, err := store.Open(t.Context(), filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, db: db, f: newFakeTransport(), root: filepath.Join(dir, "rooms")}
	logs := &refusals{Handler: slog.DiscardHandler, refused: make(chan struct{}, 1)}
	h.m, err = New(Options{Store: SQLite(db), Transport: h.f, Root: h.root, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = shut(h.m)
		_ = db.Close()
	})
	h.turnEnded("d", h.submit("d", "warm up"))
	// Hold the room busy on a person while the disk fills, so the
	// messages accepted meanwhile queue behind it.
	hold := h.submit("d", "approve:bash")
	req := h.waitEvent("d", hold.Seq, "approval.requested", nil)
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	var total int
	for {
		n, err := f.Write(chunk)
		total += n
		if err != nil {
			break
		}
	}
	f.Close()
	// Free just enough for some acceptances, not for all.
	if err := os.Truncate(filler, int64(total-400<<10)); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 100<<10)
	var accepted []Accepted
	for i := 0; ; i++ {
		acc, err := h.m.Submit(t.Context(), "d", Message{Text: big})
		if err != nil {
			if errors.Is(err, ErrQueueFull) || i > 60 {
				t.Fatalf("submit %d: %v", i, err)
			}
			break // refused: the disk is full
		}
		accepted = append(accepted, acc)
	}
	if len(accepted) == 0 {
		t.Fatal("the disk was full before any message was accepted")
	}
	// Room for small writes, not for a big one: the turn holding the
	// room ends, the next starts, and the end of that one (its answer
	// echoes the 100 KB message) is refused until the disk is freed.
	st, err := os.Stat(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filler, st.Size()-48<<10); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Approve(t.Context(), "d", field(req, "approval_id"), true); err != nil {
		t.Fatalf("approving with 48 KiB free: %v", err)
	}
	select {
	case <-logs.refused:
	case <-time.After(30 * time.Second):
		t.Fatal("the store never refused a turn's end")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	last := h.submit("d", "after")
	h.turnEnded("d", last)
	l := h.log("d")
	turnOrder(t, l)
	ends := checkMessageEnds(t, l)
	for _, acc := range append(accepted, hold) {
		if ends[acc.ID] == nil {
			t.Fatalf("message %s never ended", acc.ID)
		}
	}
}

// refusals is a log handler that signals the room's report of a refused
// write ending a turn.
type refusals struct {
	slog.Handler
	refused chan struct{}
}

func (r *refusals) Enabled(context.Context, slog.Level) bool { return true }

func (r *refusals) Handle(_ context.Context, rec slog.Record) error {
	if strings.Contains(rec.Message, "refused the end of a turn") {
		select {
		case r.refused <- struct{}{}:
		default:
		}
	}
	return nil
}

func (r *refusals) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *refusals) WithGroup(string) slog.Handler      { return r }
