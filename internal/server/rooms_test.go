package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/roomsqlite"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// countingStore counts the reads a Manager makes of its store. plainStore
// hides the SQLite store's optional interfaces (a store that can neither
// page its rooms nor report its commits); pagingStore keeps them.
type countingStore struct {
	room.Store
	reads atomic.Int64
}

func (c *countingStore) Events(ctx context.Context, rm string, after int64, limit int) ([]store.Event, error) {
	c.reads.Add(1)
	return c.Store.Events(ctx, rm, after, limit)
}

func (c *countingStore) Room(ctx context.Context, rm string) (store.Room, error) {
	c.reads.Add(1)
	return c.Store.Room(ctx, rm)
}

func (c *countingStore) RoomIDs(ctx context.Context) ([]string, error) {
	c.reads.Add(1)
	return c.Store.RoomIDs(ctx)
}

func (c *countingStore) Approvals(ctx context.Context, rm string, pending bool) ([]store.Approval, error) {
	c.reads.Add(1)
	return c.Store.Approvals(ctx, rm, pending)
}

func (c *countingStore) Questions(ctx context.Context, rm string, pending bool) ([]store.Question, error) {
	c.reads.Add(1)
	return c.Store.Questions(ctx, rm, pending)
}

type pagingStore struct {
	*countingStore
	db *store.DB
}

func (p pagingStore) RoomPage(ctx context.Context, after string, limit int) ([]store.Room, error) {
	p.reads.Add(1)
	return p.db.RoomPage(ctx, after, limit)
}

func (p pagingStore) RoomCount(ctx context.Context) (int, error) {
	p.reads.Add(1)
	return p.db.RoomCount(ctx)
}

func (p pagingStore) Tap(fn func([]store.Event)) func() { return p.db.Tap(fn) }

// roomsHarness is a server over a store of n rooms written before it
// started (room-000 ... with a settled exchange each; approvals pending in
// the rooms of pending), through a counting store.
type roomsHarness struct {
	*harness
	cs *countingStore
}

func newRoomsHarness(t *testing.T, n int, pending []int, paging bool) *roomsHarness {
	t.Helper()
	dir := t.TempDir()
	db, err := store.Open(t.Context(), filepath.Join(dir, "agenthost.db"), store.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Write(t.Context(), func(w *store.Writer) error {
		for i := range n {
			id := fmt.Sprintf("room-%03d", i)
			for _, typ := range []string{"message.accepted", "turn.started", "turn.ended", "message.ended"} {
				if _, err := w.Append(id, typ, map[string]string{"turn_id": "t" + id, "outcome": "settled"}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cs := &countingStore{Store: roomsqlite.New(db)}
	var st room.Store = cs
	if paging {
		st = pagingStore{cs, db}
	}
	h := &harness{t: t, db: db, f: newFakeTransport(), seen: &observed{m: map[string]map[int]bool{}}}
	if h.m, err = room.New(room.Options{Store: st, Transport: h.f, Root: filepath.Join(dir, "rooms")}); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if h.s, err = New(Options{Manager: h.m, Token: testToken}); err != nil {
		t.Fatal(err)
	}
	h.s.observe = h.seen.add
	h.ts = httptest.NewServer(h.s)
	t.Cleanup(func() {
		h.s.Close()
		h.ts.Close()
		_ = h.m.Close()
		wctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_ = h.m.Wait(wctx)
		cancel()
		_ = db.Close()
	})
	// What waits on people is written as a running turn's agent would ask
	// it, after the start (which expires what a previous host left).
	err = db.Write(t.Context(), func(w *store.Writer) error {
		now := time.Now()
		for _, i := range pending {
			id := fmt.Sprintf("room-%03d", i)
			if err := w.PutApproval(store.Approval{ID: "a" + id, Room: id, TurnID: "t" + id, Tool: "bash",
				Options: []string{"allow"}, Created: now, Deadline: now.Add(time.Hour)}); err != nil {
				return err
			}
			if err := w.PutQuestion(store.Question{ID: "q" + id, Room: id, TurnID: "t" + id, Title: "which?",
				Options: []string{"a"}, Created: now, Deadline: now.Add(time.Hour)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return &roomsHarness{harness: h, cs: cs}
}

type roomsPage struct {
	Rooms []roomView `json:"rooms"`
	Total int        `json:"total"`
	Next  *string    `json:"next"`
}

func (h *roomsHarness) page(query string) roomsPage {
	h.t.Helper()
	r := h.do("GET", "/v1/rooms"+query, nil)
	if r.status != 200 {
		h.t.Fatalf("GET /v1/rooms%s: %d %s", query, r.status, r.body)
	}
	var p roomsPage
	if err := json.Unmarshal(r.body, &p); err != nil {
		h.t.Fatalf("GET /v1/rooms%s: %v", query, err)
	}
	return p
}

// TestListRoomsPages: GET /v1/rooms answers pages in order of id, each
// room once across the pages, with the total and a next cursor while
// rooms follow; a bad limit or cursor is 400.
func TestListRoomsPages(t *testing.T) {
	for _, paging := range []bool{true, false} {
		t.Run(fmt.Sprintf("paging-store=%v", paging), func(t *testing.T) {
			const n = 25
			h := newRoomsHarness(t, n, []int{12}, paging)
			want := make([]string, n)
			for i := range want {
				want[i] = fmt.Sprintf("room-%03d", i)
			}
			// The default page holds them all, in the unpaged shape.
			p := h.page("")
			if p.Total != n || p.Next != nil || len(p.Rooms) != n {
				t.Fatalf("default page: total %d, next %v, %d rooms; want %d, none, %d", p.Total, p.Next, len(p.Rooms), n, n)
			}
			var got []string
			after := ""
			for pages := 0; ; pages++ {
				if pages > n {
					t.Fatal("paging does not end")
				}
				p := h.page("?limit=10&after=" + after)
				if p.Total != n {
					t.Fatalf("total %d, want %d", p.Total, n)
				}
				for _, r := range p.Rooms {
					got = append(got, r.ID)
					if r.LastSeq != 4 {
						t.Errorf("%s: last_seq %d, want 4", r.ID, r.LastSeq)
					}
					wantPending := 0
					if r.ID == "room-012" {
						wantPending = 1
					}
					if len(r.Approvals) != wantPending || len(r.Questions) != wantPending {
						t.Errorf("%s: %d approvals, %d questions; want %d each", r.ID, len(r.Approvals), len(r.Questions), wantPending)
					}
				}
				if p.Next == nil {
					if len(p.Rooms) != n%10 {
						t.Fatalf("last page: %d rooms, want %d", len(p.Rooms), n%10)
					}
					break
				}
				if len(p.Rooms) != 10 || *p.Next != p.Rooms[len(p.Rooms)-1].ID {
					t.Fatalf("page after %q: %d rooms, next %q", after, len(p.Rooms), *p.Next)
				}
				after = *p.Next
			}
			if !slices.Equal(got, want) {
				t.Fatalf("rooms across pages:\n%v\nwant\n%v", got, want)
			}
			// A cursor between ids, or past the last, is a place in the order.
			if p := h.page("?limit=2&after=room-004a"); len(p.Rooms) != 2 || p.Rooms[0].ID != "room-005" || p.Next == nil || *p.Next != "room-006" {
				t.Fatalf("after room-004a: %+v", p)
			}
			if p := h.page("?after=room-024"); len(p.Rooms) != 0 || p.Next != nil || p.Total != n {
				t.Fatalf("after the last: %+v", p)
			}
			if p := h.page(fmt.Sprintf("?limit=%d", MaxRoomsPage)); len(p.Rooms) != n {
				t.Fatalf("limit %d: %d rooms", MaxRoomsPage, len(p.Rooms))
			}
			for _, q := range []string{"?limit=0", "?limit=-1", "?limit=x", fmt.Sprintf("?limit=%d", MaxRoomsPage+1), "?after=..", "?after=%20x", "?after=" + strings.Repeat("a", room.MaxIDLen+1)} {
				r := h.do("GET", "/v1/rooms"+q, nil)
				if r.status != 400 || r.json(t)["error"] == "" {
					t.Errorf("GET /v1/rooms%s: %d %s, want 400 with an error", q, r.status, r.body)
				}
			}
		})
	}
}

// TestListAndScrapeReadsIndependentOfRooms: with a store that pages its
// rooms and reports its commits, a page of the listing and a /metrics
// scrape each make a few store reads, however many rooms there are (the
// unpaged listing and the scrape read every room's state, and the scrape
// every room's log).
func TestListAndScrapeReadsIndependentOfRooms(t *testing.T) {
	h := newRoomsHarness(t, 60, nil, true)
	before := h.cs.reads.Load()
	if p := h.page("?limit=5"); len(p.Rooms) != 5 {
		t.Fatalf("%d rooms", len(p.Rooms))
	}
	if n := h.cs.reads.Load() - before; n > 4 {
		t.Errorf("a page of 5 rooms made %d store reads, want at most 4", n)
	}
	before = h.cs.reads.Load()
	if r := h.do("GET", "/metrics", nil); r.status != 200 {
		t.Fatalf("metrics: %d", r.status)
	}
	if n := h.cs.reads.Load() - before; n > 3 {
		t.Errorf("a scrape made %d store reads, want at most 3", n)
	}
}

// TestMetricsWithManyRooms: the gauges count every room the store holds
// and what waits on people in any of them; the counters count only what
// is written while the server runs, and count it once. The same with a
// store that cannot report its commits (read at each scrape).
func TestMetricsWithManyRooms(t *testing.T) {
	for _, paging := range []bool{true, false} {
		t.Run(fmt.Sprintf("paging-store=%v", paging), func(t *testing.T) {
			h := newRoomsHarness(t, 30, []int{3, 17}, paging)
			want := map[string]float64{
				"agenthost_rooms":                    30,
				`agenthost_pending{kind="approval"}`: 2,
				`agenthost_pending{kind="question"}`: 2,
				"agenthost_events_written_total":     0,
				"agenthost_rooms_resident":           0,
				"agenthost_turns_running":            0,
				"agenthost_messages_queued":          0,
			}
			waitMetrics(t, h.harness, want)
			// A turn in a room of the old ones, one in a new room.
			for _, rm := range []string{"room-007", "new"} {
				acc := h.post(rm, "hello")
				h.ended(rm, acc)
			}
			var written int64
			for _, rm := range []string{"room-007", "new"} {
				st, err := h.m.State(t.Context(), rm)
				if err != nil {
					t.Fatal(err)
				}
				written += st.LastSeq
			}
			written -= 4 // room-007's seeded events
			if err := h.m.Approve(t.Context(), "room-017", "aroom-017", true); err != nil {
				t.Fatal(err)
			}
			want["agenthost_rooms"] = 31
			want[`agenthost_pending{kind="approval"}`] = 1
			want[`agenthost_turns_total{outcome="settled"}`] = 2
			want[`agenthost_turn_duration_seconds_count{outcome="settled"}`] = 2
			want["agenthost_rooms_resident"] = 2
			for range 2 { // a second scrape counts nothing twice
				body := string(h.do("GET", "/metrics", nil).body)
				// approval.resolved is one more event, in room-017.
				want["agenthost_events_written_total"] = float64(written + 1)
				for name, v := range want {
					if got := metricValue(body, name); got != v {
						t.Errorf("%s = %v, want %v", name, got, v)
					}
				}
				if got := metricValue(body, `agenthost_approvals_resolved_total{by="person",decision="allow"}`); got != 1 {
					t.Errorf("approvals resolved (allow, person) = %v, want 1", got)
				}
			}
		})
	}
}
