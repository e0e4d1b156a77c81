package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

// sqliteEvents reads the room's events from SQLite itself, past the
// recent events.
func sqliteEvents(t *testing.T, db *DB, room string, after int64, limit int) []Event {
	t.Helper()
	rows, err := db.rdb.QueryContext(t.Context(),
		"SELECT seq, type, time_ns, data FROM events WHERE room = ? AND seq > ? ORDER BY seq LIMIT ?", room, after, limit)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		ev := Event{Room: room}
		var ns int64
		if err := rows.Scan(&ev.Seq, &ev.Type, &ns, &ev.Data); err != nil {
			t.Fatal(err)
		}
		ev.Time = fromNS(ns)
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func sameEvents(a, b []Event) bool {
	return slices.EqualFunc(a, b, func(x, y Event) bool {
		return x.Room == y.Room && x.Seq == y.Seq && x.Type == y.Type && x.Time.Equal(y.Time) && string(x.Data) == string(y.Data)
	})
}

// checkReads compares Events with SQLite for every starting point of the
// room, in pages of several sizes, and reports how many the recent
// events answered.
func checkReads(t *testing.T, db *DB, room string) (answered int) {
	t.Helper()
	last := int64(len(sqliteEvents(t, db, room, 0, MaxEventsPage)))
	for after := int64(0); after <= last+1; after++ {
		for _, limit := range []int{1, 3, MaxEventsPage} {
			if _, ok := db.recent.events(room, after, limit); ok {
				answered++
			}
			got, err := db.Events(t.Context(), room, after, limit)
			if err != nil {
				t.Fatal(err)
			}
			if want := sqliteEvents(t, db, room, after, limit); !sameEvents(got, want) {
				t.Fatalf("room %s after %d limit %d: Events gives %d events, SQLite %d", room, after, limit, len(got), len(want))
			}
		}
	}
	return answered
}

// TestRecentEventsAreWhatSQLiteHolds: the events a live stream reads from
// memory are exactly those a read of SQLite gives, through long rooms,
// events too large to keep, a write that failed, and a room deleted and
// begun again.
func TestRecentEventsAreWhatSQLiteHolds(t *testing.T) {
	db := openTest(t, Options{})
	ctx := t.Context()
	// Kept for watched rooms only.
	for _, room := range []string{"a", "b"} {
		_, stop := db.Watch(room)
		defer stop()
	}
	for i := range 100 {
		for _, room := range []string{"a", "b"} {
			if _, err := appendOne(ctx, db, room, "tick", map[string]int{"i": i}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := checkReads(t, db, "a"); n == 0 {
		t.Fatal("no read was answered from memory")
	}
	if _, err := appendOne(ctx, db, "c", "tick", map[string]int{"i": 0}); err != nil {
		t.Fatal(err)
	}
	if n := checkReads(t, db, "c"); n != 0 {
		t.Fatalf("%d reads of a room nobody watches answered from memory", n)
	}
	// An event over the bound is not kept; the ones after it are.
	if _, err := appendOne(ctx, db, "a", "big", map[string]string{"text": strings.Repeat("x", recentMaxEvent)}); err != nil {
		t.Fatal(err)
	}
	checkReads(t, db, "a")
	if _, err := appendOne(ctx, db, "a", "tick", map[string]int{"i": 101}); err != nil {
		t.Fatal(err)
	}
	checkReads(t, db, "a")
	// A failed write's events are undone, in SQLite and here.
	boom := errors.New("boom")
	err := db.Write(ctx, func(w *Writer) error {
		if _, err := w.Append("a", "tick", map[string]int{"i": -1}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("write: %v", err)
	}
	checkReads(t, db, "a")
	// Deleted, then begun again in the same write and in the next.
	err = db.Write(ctx, func(w *Writer) error {
		if _, err := w.Append("b", "tick", map[string]int{"i": 1000}); err != nil {
			return err
		}
		return w.DeleteRoom("b")
	})
	if err != nil {
		t.Fatal(err)
	}
	checkReads(t, db, "b")
	for i := range 3 {
		if _, err := appendOne(ctx, db, "b", "tick", map[string]int{"again": i}); err != nil {
			t.Fatal(err)
		}
	}
	checkReads(t, db, "b")
	checkReads(t, db, "a")
}

// TestRecentNeverBehindSQLite: a reader that saw a room's last sequence
// number in SQLite finds that event in Events at once, while commits go
// on (a stream joins at the last sequence number SQLite gives and reads
// Events from there; one behind would lose the event).
func TestRecentNeverBehindSQLite(t *testing.T) {
	db := openTest(t, Options{})
	_, stop := db.Watch("r")
	defer stop()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const n = 1500
	var wg sync.WaitGroup
	defer wg.Wait()
	errs := make(chan error, 4)
	for w := range 3 {
		wg.Go(func() {
			for i := range n / 3 {
				if _, err := appendOne(ctx, db, "r", "tick", map[string]int{"w": w, "i": i}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Go(func() {
		defer cancel()
		for {
			last, err := db.LastSeq(ctx, "r")
			if err != nil {
				errs <- err
				return
			}
			if last > 0 {
				evs, err := db.Events(ctx, "r", last-1, 1)
				if err != nil {
					errs <- err
					return
				}
				if len(evs) != 1 || evs[0].Seq != last {
					errs <- fmt.Errorf("SQLite's last is %d; Events after %d gives %d events", last, last-1, len(evs))
					return
				}
			}
			if last == n {
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestRecentIsBounded: each room keeps its last recentPerRoom events, and
// all rooms together about recentMaxBytes.
func TestRecentIsBounded(t *testing.T) {
	rc := newRecent()
	for r := range 40 {
		rc.watch(fmt.Sprint("room-", r))
	}
	data := []byte(`{"text":"` + strings.Repeat("x", 8<<10) + `"}`)
	for seq := int64(1); seq <= 3*recentPerRoom; seq++ {
		var batch []Event
		for r := range 40 {
			batch = append(batch, Event{Room: fmt.Sprint("room-", r), Seq: seq, Type: "tick", Data: data})
		}
		rc.add(batch)
		if rc.bytes > recentMaxBytes {
			t.Fatalf("%d bytes held, bound %d", rc.bytes, recentMaxBytes)
		}
	}
	held := 0
	for _, tl := range rc.rooms {
		if len(tl.evs) > recentPerRoom {
			t.Fatalf("%d events of one room held", len(tl.evs))
		}
		held += len(tl.evs)
	}
	if held == 0 {
		t.Fatal("nothing held")
	}
	// A room nobody watches any more holds nothing.
	for r := range 40 {
		rc.unwatch(fmt.Sprint("room-", r))
	}
	if len(rc.rooms) != 0 || rc.bytes != 0 {
		t.Fatalf("%d rooms, %d bytes held after the last watch ended", len(rc.rooms), rc.bytes)
	}
}
