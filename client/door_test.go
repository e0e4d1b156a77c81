package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/client"
	"github.com/agenthost/agenthost/room"
)

// accepted counts the room's message.accepted events.
func accepted(t *testing.T, ctx context.Context, c *client.Client, rm string) int {
	t.Helper()
	n := 0
	for ev, err := range c.Events(ctx, rm, 0) {
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == client.TypeMessageAccepted {
			n++
		}
	}
	return n
}

// A 202 lost on the wire (the server accepted the message, the connection
// dropped before the answer): Send sends it again with the same
// Idempotency-Key and gets the first acceptance; the room accepted one
// message and ran one turn.
func TestSend_LostAnswerIsSentAgainOnce(t *testing.T) {
	api := newAPI(t, room.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	var keys []string
	var first string
	api.mu.Lock()
	api.fault = func(w http.ResponseWriter, r *http.Request, serve http.Handler) bool {
		if r.Method != "POST" || !strings.HasSuffix(r.URL.Path, "/messages") {
			return false
		}
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		lose := len(keys) == 1
		mu.Unlock()
		if !lose {
			return false
		}
		rec := httptest.NewRecorder()
		serve.ServeHTTP(rec, r) // accepted, durably
		mu.Lock()
		first = rec.Body.String()
		mu.Unlock()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close() // ... and the answer is lost
		}
		return true
	}
	api.mu.Unlock()
	c := newClient(t, api.URL(), client.Options{MinBackoff: time.Millisecond})
	acc, err := c.Send(ctx, "lost", client.NewMessage{Text: "once"})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] {
		t.Fatalf("Idempotency-Keys sent: %q", keys)
	}
	if !strings.Contains(first, acc.ID) || !strings.Contains(first, fmt.Sprintf(`"seq":%d`, acc.Seq)) || acc.Incarnation == "" {
		t.Fatalf("Send answered %+v; the lost answer was %s", acc, first)
	}
	mu.Unlock()
	end, err := c.Wait(ctx, "lost", acc)
	if err != nil || end.Outcome != client.OutcomeSettled {
		t.Fatalf("Wait: %+v %v", end, err)
	}
	if n := accepted(t, ctx, c, "lost"); n != 1 {
		t.Fatalf("%d messages accepted, want 1", n)
	}
	// The same key given by the caller is the same message too.
	m := client.NewMessage{Text: "mine", IdempotencyKey: "caller-key"}
	a1, err1 := c.Send(ctx, "lost", m)
	a2, err2 := c.Send(ctx, "lost", m)
	if err1 != nil || err2 != nil || a1 != a2 {
		t.Fatalf("the caller's key twice: %+v %v, %+v %v", a1, err1, a2, err2)
	}
	m.Text = "another"
	if _, err := c.Send(ctx, "lost", m); !errors.Is(err, client.ErrKeyReused) || !strings.Contains(err.Error(), a1.ID) {
		t.Fatalf("the caller's key with another message: %v", err)
	}
}

// Send sends again after a 503 (waiting at least its Retry-After) and a
// full queue (429), with the same key, within its attempts; an exhausted
// budget is not sent again.
func TestSend_Retries(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	var times []time.Time
	answers := []func(w http.ResponseWriter){}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		times = append(times, time.Now())
		a := answers[min(len(keys), len(answers))-1]
		mu.Unlock()
		a(w)
	}))
	defer ts.Close()
	reply := func(status int, body string, header ...string) func(w http.ResponseWriter) {
		return func(w http.ResponseWriter) {
			for i := 0; i+1 < len(header); i += 2 {
				w.Header().Set(header[i], header[i+1])
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			fmt.Fprint(w, body)
		}
	}
	reset := func(as ...func(w http.ResponseWriter)) {
		mu.Lock()
		defer mu.Unlock()
		keys, times, answers = nil, nil, as
	}
	c := newClient(t, ts.URL, client.Options{MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, SendAttempts: 3})
	ctx := t.Context()

	reset(reply(503, `{"error":"the server is shutting down"}`, "Retry-After", "1"),
		reply(429, `{"error":"room \"r\" has 64 waiting messages"}`),
		reply(202, `{"id":"m_1","seq":7,"incarnation":"i1"}`))
	acc, err := c.Send(ctx, "r", client.NewMessage{Text: "hi"})
	if err != nil || acc != (client.Accepted{ID: "m_1", Seq: 7, Incarnation: "i1"}) {
		t.Fatalf("Send: %+v %v", acc, err)
	}
	mu.Lock()
	if len(keys) != 3 || keys[0] == "" || keys[0] != keys[1] || keys[1] != keys[2] {
		t.Fatalf("keys %q", keys)
	}
	if gap := times[1].Sub(times[0]); gap < time.Second {
		t.Fatalf("sent again %v after a 503 with Retry-After: 1", gap)
	}
	mu.Unlock()

	reset(reply(429, `{"error":"room budget exhausted: 1 of 1 turns run"}`))
	if _, err := c.Send(ctx, "r", client.NewMessage{Text: "hi"}); !errors.Is(err, client.ErrBudgetExhausted) {
		t.Fatalf("budget: %v", err)
	}
	reset(reply(503, `{"error":"down"}`))
	if _, err := c.Send(ctx, "r", client.NewMessage{Text: "hi"}); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("always 503: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 3 {
		t.Fatalf("always 503: %d attempts, want SendAttempts (3)", len(keys))
	}
}

// 03_stale_last_event_id, purge_follow_cli (review-outside 3, review-api
// F7): a follower of a room that is purged and made again under its id:
// after the old room's events it gets a reset, then every event of the
// new room once, from 1, also when the new room already has more events
// than the old one when it comes back.
func TestFollow_AcrossPurgeAndRecreate(t *testing.T) {
	api := newAPI(t, room.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c := newClient(t, api.URL(), client.Options{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	old, err := c.Send(ctx, "f", client.NewMessage{Text: "old"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, "f", old); err != nil {
		t.Fatal(err)
	}
	st, err := c.Room(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		ev  client.Event
		err error
	}
	evs := make(chan got, 1000)
	fctx, fcancel := context.WithCancel(ctx)
	defer fcancel()
	go func() {
		defer close(evs)
		for ev, err := range c.Follow(fctx, "f", 0) {
			evs <- got{ev, err}
			if err != nil {
				return
			}
		}
	}()
	next := func() client.Event {
		t.Helper()
		g, ok := <-evs
		if !ok || g.err != nil {
			t.Fatalf("the follower ended: %v", g.err)
		}
		return g.ev
	}
	for i := int64(1); i <= st.LastSeq; i++ {
		if ev := next(); ev.Seq != i {
			t.Fatalf("old room: event %d, want %d", ev.Seq, i)
		}
	}
	if _, err := c.Purge(ctx, "f"); err != nil {
		t.Fatal(err)
	}
	// The stream says the room is gone.
	ev := next()
	var r client.Reset
	if ev.Type != client.TypeReset || ev.Seq != 0 || ev.Decode(&r) != nil || r.Incarnation != "" || r.After != st.LastSeq {
		t.Fatalf("after the purge: %+v %+v", ev, r)
	}
	// A new room under the id, larger than the old one.
	var last client.Accepted
	for i := range 3 {
		if last, err = c.Send(ctx, "f", client.NewMessage{Text: fmt.Sprintf("new %d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Wait(ctx, "f", last); err != nil {
		t.Fatal(err)
	}
	nst, err := c.Room(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	if nst.LastSeq <= st.LastSeq || nst.Incarnation == st.Incarnation {
		t.Fatalf("new room %+v, old %+v", nst, st)
	}
	for i := int64(1); i <= nst.LastSeq; i++ {
		ev := next()
		if ev.Type == client.TypeReset {
			// The follower came back after the new room was made, with
			// nothing of it yet: a reset naming it may come first.
			if i != 1 || ev.Decode(&r) != nil || r.Incarnation != nst.Incarnation {
				t.Fatalf("a reset at %d: %+v", i, ev)
			}
			ev = next()
		}
		if ev.Seq != i {
			t.Fatalf("new room: event %d (%s), want %d", ev.Seq, ev.Type, i)
		}
	}
	// A caller's old acceptance is of the purged room: Wait says so.
	if _, err := c.Wait(ctx, "f", old); !errors.Is(err, client.ErrReset) {
		t.Fatalf("Wait for a purged room's message: %v", err)
	}
	// Resuming at the old room's position, with its incarnation, after
	// the new room outgrew it: a reset, then the new room from 1.
	n := int64(0)
	for ev, err := range c.FollowAt(ctx, "f", st.Incarnation, st.LastSeq) {
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			if ev.Type != client.TypeReset || ev.Decode(&r) != nil || r.Incarnation != nst.Incarnation {
				t.Fatalf("FollowAt the old position: first %+v", ev)
			}
		} else if ev.Seq != n {
			t.Fatalf("FollowAt: event %d, want %d", ev.Seq, n)
		}
		if n == nst.LastSeq {
			break
		}
		n++
	}
}
