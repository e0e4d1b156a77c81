package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
)

// TestRoomPageAndCount: pages of rooms in order of id after a cursor,
// each with its last sequence number, and the count.
func TestRoomPageAndCount(t *testing.T) {
	db := openTest(t, Options{})
	ctx := t.Context()
	for i := range 7 {
		for range i + 1 {
			if _, err := appendOne(ctx, db, fmt.Sprintf("r%d", 6-i), "x", nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n, err := db.RoomCount(ctx); err != nil || n != 7 {
		t.Fatalf("count %d, %v; want 7", n, err)
	}
	var got []string
	for after := ""; ; {
		page, err := db.RoomPage(ctx, after, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) > 3 {
			t.Fatalf("page of %d, limit 3", len(page))
		}
		for _, r := range page {
			got = append(got, r.ID)
			var i int
			fmt.Sscanf(r.ID, "r%d", &i)
			if r.LastSeq != int64(7-i) {
				t.Errorf("%s: last seq %d, want %d", r.ID, r.LastSeq, 7-i)
			}
		}
		if len(page) < 3 {
			break
		}
		after = page[len(page)-1].ID
	}
	if want := []string{"r0", "r1", "r2", "r3", "r4", "r5", "r6"}; !slices.Equal(got, want) {
		t.Fatalf("rooms %v, want %v", got, want)
	}
	if page, err := db.RoomPage(ctx, "r2x", 0); err != nil || len(page) != 4 || page[0].ID != "r3" {
		t.Fatalf("after r2x: %v, %v", page, err)
	}
}

// TestTapSeesCommittedEventsOnly: a tap gets every committed event, in
// order, before its Write returns, and none of a write that failed.
func TestTapSeesCommittedEventsOnly(t *testing.T) {
	db := openTest(t, Options{})
	ctx := t.Context()
	var mu sync.Mutex
	var seen []string
	stop := db.Tap(func(evs []Event) {
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range evs {
			seen = append(seen, fmt.Sprintf("%s/%d/%s", ev.Room, ev.Seq, ev.Type))
		}
	})
	if _, err := appendOne(ctx, db, "a", "one", nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(seen) != 1 {
		t.Fatalf("after the Write returned the tap saw %v", seen)
	}
	mu.Unlock()
	boom := errors.New("boom")
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := db.Write(context.Background(), func(w *Writer) error {
				if _, err := w.Append("b", "two", nil); err != nil {
					return err
				}
				if i%2 == 1 {
					return boom
				}
				return nil
			})
			if i%2 == 1 && !errors.Is(err, boom) || i%2 == 0 && err != nil {
				t.Errorf("write %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	stop()
	if _, err := appendOne(ctx, db, "a", "three", nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"a/1/one"}
	for i := 1; i <= 10; i++ {
		want = append(want, fmt.Sprintf("b/%d/two", i))
	}
	if !slices.Equal(seen, want) {
		t.Fatalf("tap saw %v, want %v", seen, want)
	}
}
