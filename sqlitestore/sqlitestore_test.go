package sqlitestore_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/record"
	"github.com/agenthost/agenthost/room"
	"github.com/agenthost/agenthost/sqlitestore"
	"github.com/agenthost/agenthost/transport"
)

// TestManagerFindsWhatServeDoes: through a Store, a Manager has rooms'
// own settings (kept across a reopen), room pages with a total, purge and
// the event tap: the optional interfaces the package doc promises reach
// the Manager (no agent starts: no message is sent).
func TestManagerFindsWhatServeDoes(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	path := filepath.Join(dir, "agenthost.db")
	cust, err := custody.New(custody.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cust.Close()
	tr, err := transport.NewRPC(transport.Options{Custodian: cust})
	if err != nil {
		t.Fatal(err)
	}
	open := func() (*sqlitestore.Store, *room.Manager) {
		st, err := sqlitestore.Open(ctx, path, sqlitestore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		m, err := room.New(room.Options{Store: st, Transport: tr, Root: filepath.Join(dir, "rooms")})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return st, m
	}
	shut := func(st *sqlitestore.Store, m *room.Manager) {
		if err := errors.Join(m.Close(), m.Wait(context.Background()), st.Close()); err != nil {
			t.Fatal(err)
		}
	}

	st, m := open()
	stop, tapped := m.TapEvents(func([]record.Event) {})
	stop()
	if !tapped {
		t.Error("TapEvents: the store offers no tap")
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, err := m.SetSettings(ctx, id, room.Settings{Instructions: "be brief in " + id}); err != nil {
			t.Fatalf("SetSettings %s: %v", id, err)
		}
	}
	shut(st, m)

	st, m = open()
	defer shut(st, m)
	s, err := m.Settings(ctx, "b")
	if err != nil || s.Instructions != "be brief in b" {
		t.Fatalf("settings after a reopen: %+v, %v", s, err)
	}
	page, err := m.RoomPage(ctx, "", 2)
	if err != nil || page.Total != 3 || len(page.Rooms) != 2 || !page.More {
		t.Fatalf("RoomPage: %+v, %v; want 2 of 3 rooms, more", page, err)
	}
	if _, err := m.Purge(ctx, "a"); err != nil {
		t.Fatalf("Purge: %v", err)
	}
	ids, err := m.Rooms(ctx)
	if err != nil || len(ids) != 2 {
		t.Fatalf("rooms after a purge: %v, %v", ids, err)
	}
}

// TestRacingOpens: of two Opens of one file at once, one wins and the
// other gets ErrLocked; after Close, writes and a second Close get
// ErrClosed and reads fail.
func TestRacingOpens(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "agenthost.db")
	var wg sync.WaitGroup
	stores := make([]*sqlitestore.Store, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { stores[i], errs[i] = sqlitestore.Open(ctx, path, sqlitestore.Options{}) })
	}
	wg.Wait()
	won := 0
	for i := range 2 {
		switch {
		case errs[i] == nil:
			won++
			if err := stores[i].Close(); err != nil {
				t.Fatal(err)
			}
			if err := stores[i].Write(ctx, func(room.Tx) error { return nil }); !errors.Is(err, sqlitestore.ErrClosed) {
				t.Errorf("a write after Close: %v, want ErrClosed", err)
			}
			if _, err := stores[i].Room(ctx, "r"); err == nil {
				t.Error("a read after Close: no error")
			}
			if err := stores[i].Close(); !errors.Is(err, sqlitestore.ErrClosed) {
				t.Errorf("a second Close: %v, want ErrClosed", err)
			}
		case !errors.Is(errs[i], sqlitestore.ErrLocked):
			t.Errorf("the other Open: %v, want ErrLocked", errs[i])
		}
	}
	if won != 1 {
		t.Fatalf("%d Opens won, want 1 (%v)", won, errs)
	}
}
