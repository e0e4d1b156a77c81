package rpcagent

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/roomsqlite"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// slowStore makes every write 10 ms slower, as on a slow disk.
type slowStore struct{ room.Store }

func (s slowStore) Write(ctx context.Context, fn func(tx room.Tx) error) error {
	time.Sleep(10 * time.Millisecond) // the point of the test: a slow disk
	return s.Store.Write(ctx, fn)
}

// A turn streaming faster than the disk writes, end to end over a real
// client: it settles with its text recorded (room's
// TestAgentEventsDoNotWaitForTheStore pins that events never wait on the
// store).
func TestStreamingTurnSurvivesASlowStore(t *testing.T) {
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(t.Context(), filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	cust, err := custody.New(custody.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cust.Close()
	tr, err := New(Options{Custodian: cust})
	if err != nil {
		t.Fatal(err)
	}
	m, err := room.New(room.Options{Store: slowStore{roomsqlite.New(db)}, Transport: tr, Root: filepath.Join(dir, "rooms"),
		Config: room.Config{Command: []string{exe, "-test.run=^$"}, Env: []string{benchAgentEnv + "=1", "GORACE=atexit_sleep_ms=0"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = m.Close()
		wctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_ = m.Wait(wctx)
		cancel()
	}()
	h := &benchHost{db: db, cust: cust, m: m}
	if err := h.turn("r", "stream:600"); err != nil {
		t.Fatal(err)
	}
	evs, err := db.Events(t.Context(), "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	deltas := 0
	for _, ev := range evs {
		if ev.Type == room.KindText {
			deltas++
		}
	}
	if deltas == 0 {
		t.Fatal("no text delta recorded")
	}
}
