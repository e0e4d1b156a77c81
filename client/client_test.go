package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/client"
	"github.com/agenthost/agenthost/room"
)

func newClient(t *testing.T, url string, opts client.Options) *client.Client {
	t.Helper()
	if opts.Token == "" {
		opts.Token = testToken
	}
	c, err := client.New(url, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// untilTurnEnded follows room from after until a turn.ended and returns
// the events seen, turn.ended last.
func untilTurnEnded(t *testing.T, ctx context.Context, c *client.Client, room string, after int64) []client.Event {
	t.Helper()
	var evs []client.Event
	for ev, err := range c.Follow(ctx, room, after) {
		if err != nil {
			t.Fatalf("following %s: %v (after %d events)", room, err, len(evs))
		}
		evs = append(evs, ev)
		if ev.Type == client.TypeTurnEnded {
			return evs
		}
	}
	t.Fatal("the stream ended")
	return nil
}

// Every error the server answers matches its sentinel; the client refuses
// a room id that would name another route, and a dead server is
// ErrUnreachable.
func TestErrorsIs(t *testing.T) {
	api := newAPI(t, room.Options{QueueLimit: 1})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// One attempt: a full queue answers at once (Send's retries have
	// their own tests).
	c := newClient(t, api.URL(), client.Options{SendAttempts: 1})

	_, err := c.Room(ctx, "nosuch")
	check := func(what string, err, want error, status int) {
		t.Helper()
		var ae *client.APIError
		if !errors.Is(err, want) || status > 0 && (!errors.As(err, &ae) || ae.StatusCode != status) {
			t.Errorf("%s: %v, want %v (%d)", what, err, want, status)
		}
	}
	check("unknown room", err, client.ErrNotFound, 404)
	_, err = newClient(t, api.URL(), client.Options{Token: "wrong"}).Rooms(ctx)
	check("wrong token", err, client.ErrUnauthorized, 401)
	_, err = c.Send(ctx, "r", client.NewMessage{Text: ""})
	check("empty text", err, client.ErrBadRequest, 400)
	_, err = c.Send(ctx, "r", client.NewMessage{Text: "x", Delivery: "sideways"})
	check("bad delivery", err, client.ErrBadRequest, 400)
	for _, id := range []string{"..", ".", "a/b", ""} {
		_, err = c.Send(ctx, id, client.NewMessage{Text: "x"})
		check("room "+strconv.Quote(id), err, client.ErrBadRequest, 0)
	}

	// A running turn, one queued message: the next is refused, and the
	// approval of another room is not there.
	hang, err := c.Send(ctx, "q", client.NewMessage{Text: "hang"})
	if err != nil {
		t.Fatal(err)
	}
	for ev, err := range c.Follow(ctx, "q", hang.Seq) {
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == client.TypeTurnStarted {
			break
		}
	}
	if _, err := c.Send(ctx, "q", client.NewMessage{Text: "one"}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Send(ctx, "q", client.NewMessage{Text: "two"})
	check("queue full", err, client.ErrQueueFull, 429)
	_, err = c.Approve(ctx, "q", "a_nope", true)
	check("unknown approval", err, client.ErrNotFound, 404)
	if _, err := c.Release(ctx, "q"); !errors.Is(err, client.ErrConflict) {
		t.Errorf("release during a turn: %v", err)
	}
	cl, err := c.Cancel(ctx, "q")
	if err != nil || !cl.Cancelled {
		t.Fatalf("cancel: %+v %v", cl, err)
	}
	untilTurnEnded(t, ctx, c, "q", hang.Seq) // the cancelled one
	evs := untilTurnEnded(t, ctx, c, "q", evsLast(untilTurnEnded(t, ctx, c, "q", hang.Seq)))
	var te client.TurnEnded
	if err := evs[len(evs)-1].Decode(&te); err != nil || te.Outcome != client.OutcomeSettled || te.Text != "ok: one" {
		t.Fatalf("the queued message's turn: %+v %v", te, err)
	}
	_, err = c.Cancel(ctx, "q")
	check("cancel with no turn", err, client.ErrConflict, 409)
	rel, err := c.Release(ctx, "q")
	if err != nil || !rel.Released || rel.Receipt == nil {
		t.Fatalf("release: %+v %v", rel, err)
	}
	msgs, err := c.Messages(ctx, "q", 0, 0)
	if err != nil || len(msgs) != 2 || msgs[0].Outcome != client.OutcomeCancelled || msgs[1].Outcome != client.OutcomeSettled {
		t.Fatalf("messages: %+v %v", msgs, err)
	}

	api.stop()
	_, err = c.Rooms(ctx)
	check("stopped server", err, client.ErrUnreachable, 0)
}

func evsLast(evs []client.Event) int64 { return evs[len(evs)-1].Seq }

// A follower outlives a server restart: it says it reconnects, resumes
// with Last-Event-ID, and gets every event once, in order.
func TestFollow_ReconnectsAcrossRestart(t *testing.T) {
	api := newAPI(t, room.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var mu sync.Mutex
	var notes []client.Reconnect
	retrying := make(chan struct{}, 100)
	c := newClient(t, api.URL(), client.Options{MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		OnReconnect: func(r client.Reconnect) {
			mu.Lock()
			notes = append(notes, r)
			mu.Unlock()
			if r.Err != nil {
				retrying <- struct{}{}
			}
		}})
	first, err := c.Send(ctx, "g", client.NewMessage{Text: "before"})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	var texts []string
	restarted := make(chan error, 1)
	for ev, err := range c.Follow(ctx, "g", 0) {
		if err != nil {
			t.Fatalf("follow: %v", err)
		}
		seqs = append(seqs, ev.Seq)
		if ev.Type != client.TypeTurnEnded {
			continue
		}
		var te client.TurnEnded
		if err := ev.Decode(&te); err != nil {
			t.Fatal(err)
		}
		texts = append(texts, te.Text)
		if len(texts) == 2 {
			break
		}
		// The server goes away; the follower (this loop) keeps trying,
		// twice at least, until it is back.
		api.stop()
		go func() {
			<-retrying
			<-retrying
			err := api.start(ctx)
			if err == nil {
				_, err = c.Send(ctx, "g", client.NewMessage{Text: "after"})
			}
			restarted <- err
		}()
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	if strings.Join(texts, ",") != "ok: before,ok: after" {
		t.Fatalf("turns %q", texts)
	}
	for i, s := range seqs {
		if s != int64(i+1) {
			t.Fatalf("seqs %v: a gap or a duplicate at %d", seqs, i)
		}
	}
	_ = first
	mu.Lock()
	defer mu.Unlock()
	var failed, resumed int
	for _, n := range notes {
		if n.Room != "g" {
			t.Errorf("reconnect note for room %q", n.Room)
		}
		if n.Err != nil {
			failed++
			if !errors.Is(n.Err, client.ErrUnreachable) && !strings.Contains(n.Err.Error(), "dropped") {
				t.Errorf("reconnect cause %v", n.Err)
			}
		} else {
			resumed++
		}
	}
	if failed < 2 || resumed != 1 {
		t.Fatalf("reconnect notes: %d failed, %d resumed: %+v", failed, resumed, notes)
	}
	ids := api.eventIDs()
	if ids[0] != "0" || ids[len(ids)-1] == "0" {
		t.Fatalf("Last-Event-ID sent: %q (the resume must name the last event received)", ids)
	}
	resume, _ := strconv.ParseInt(ids[len(ids)-1], 10, 64)
	if !slicesContains(seqs, resume) {
		t.Fatalf("resumed after %d, which was not received (%v)", resume, seqs)
	}
}

func slicesContains(s []int64, v int64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// With no server, a follower retries with growing waits for as long as its
// context allows, then ends with the context's error.
func TestFollow_BoundedByContext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	var delays []time.Duration
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	c := newClient(t, url, client.Options{MinBackoff: 10 * time.Millisecond, MaxBackoff: 80 * time.Millisecond,
		OnReconnect: func(r client.Reconnect) {
			if r.Attempt != len(delays)+1 || !errors.Is(r.Err, client.ErrUnreachable) {
				t.Errorf("attempt %d after %d: %v", r.Attempt, len(delays), r.Err)
			}
			delays = append(delays, r.Delay)
			if len(delays) == 6 {
				cancel() // as the caller's deadline would
			}
		}})
	var got error
	for _, err := range c.Follow(ctx, "r", 0) {
		got = err
	}
	if !errors.Is(got, context.Canceled) || len(delays) < 6 {
		t.Fatalf("after %d attempts: %v", len(delays), got)
	}
	// Doubling from 10 ms to the 80 ms cap, each within ±20 %.
	for i, want := range []time.Duration{10, 20, 40, 80, 80, 80} {
		want *= time.Millisecond
		if d := delays[i]; d < want*8/10 || d > want*12/10 {
			t.Errorf("wait %d: %v, want %v ±20 %%", i+1, d, want)
		}
	}
}

// Errors that retrying cannot fix end a stream at once.
func TestFollow_NotRetried(t *testing.T) {
	api := newAPI(t, room.Options{})
	c := newClient(t, api.URL(), client.Options{OnReconnect: func(r client.Reconnect) { t.Errorf("reconnect: %+v", r) }})
	for _, err := range c.Follow(t.Context(), "nosuch", 0) {
		if !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("following an unknown room: %v", err)
		}
	}
	bad := newClient(t, api.URL(), client.Options{Token: "wrong", OnReconnect: func(r client.Reconnect) { t.Errorf("reconnect: %+v", r) }})
	for _, err := range bad.Follow(t.Context(), "r", 0) {
		if !errors.Is(err, client.ErrUnauthorized) {
			t.Fatalf("following with a wrong token: %v", err)
		}
	}
}

// script is an event stream server: each request gets the next of its
// answers (the last one repeats).
type script struct {
	mu      sync.Mutex
	answers []func(w http.ResponseWriter, r *http.Request)
	ids     []string
}

func (s *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.ids = append(s.ids, r.Header.Get("Last-Event-ID"))
	a := s.answers[min(len(s.ids), len(s.answers))-1]
	s.mu.Unlock()
	a(w, r)
}

func sse(w http.ResponseWriter, frames ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, f := range frames {
		fmt.Fprint(w, f)
	}
	w.(http.Flusher).Flush()
}

func frame(seq int64, typ, fields string) string {
	return fmt.Sprintf("id: %d\nevent: %s\ndata: {\"seq\":%d,\"type\":%q,\"room\":\"r\",\"time\":\"2026-01-01T00:00:00Z\"%s}\n\n", seq, typ, seq, typ, fields)
}

// A replay torn mid-event resumes after the last whole event; a stream
// that goes silent (no heartbeat) past IdleTimeout is reconnected.
func TestEvents_TornAndSilentStreams(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	sc := &script{answers: []func(http.ResponseWriter, *http.Request){
		func(w http.ResponseWriter, r *http.Request) {
			sse(w, "retry: 1000\n\n", frame(1, "a", ""), frame(2, "b", ""), "id: 3\nevent: c\ndata: {\"se")
			panic(http.ErrAbortHandler) // the connection drops mid-event
		},
		func(w http.ResponseWriter, r *http.Request) {
			sse(w, frame(3, "c", ""))
			select { // then nothing at all
			case <-block:
			case <-r.Context().Done():
			}
		},
		func(w http.ResponseWriter, r *http.Request) { sse(w, frame(4, "d", "")) },
	}}
	ts := httptest.NewServer(sc)
	defer ts.Close()
	var notes []client.Reconnect
	c := newClient(t, ts.URL, client.Options{MinBackoff: time.Millisecond, IdleTimeout: 200 * time.Millisecond,
		OnReconnect: func(r client.Reconnect) { notes = append(notes, r) }})
	var types []string
	for ev, err := range c.Events(t.Context(), "r", 0) {
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, fmt.Sprint(ev.Seq, ev.Type))
	}
	if strings.Join(types, " ") != "1a 2b 3c 4d" {
		t.Fatalf("events %q", types)
	}
	if strings.Join(sc.ids, ",") != "0,2,3" {
		t.Fatalf("Last-Event-IDs %q", sc.ids)
	}
	if len(notes) != 4 || !strings.Contains(notes[2].Err.Error(), "nothing received for too long") {
		t.Fatalf("reconnect notes %+v", notes)
	}
}

// Wait ends on the message.ended naming its message, past the others'.
func TestWait(t *testing.T) {
	sc := &script{answers: []func(http.ResponseWriter, *http.Request){
		func(w http.ResponseWriter, r *http.Request) {
			sse(w, frame(5, "message.accepted", `,"message_id":"m_2"`),
				frame(6, "message.ended", `,"message_id":"m_1","outcome":"settled","turn_id":"t_1"`))
			panic(http.ErrAbortHandler)
		},
		func(w http.ResponseWriter, r *http.Request) {
			sse(w, frame(7, "question.answered", `,"question_id":"q_1","answer":"blue"`),
				frame(8, "message.ended", `,"message_id":"m_2","outcome":"answered"`))
			<-r.Context().Done()
		},
	}}
	ts := httptest.NewServer(sc)
	defer ts.Close()
	c := newClient(t, ts.URL, client.Options{MinBackoff: time.Millisecond})
	end, err := c.Wait(t.Context(), "r", client.Accepted{ID: "m_2", Seq: 5})
	if err != nil || end != (client.MessageEnded{MessageID: "m_2", Outcome: client.OutcomeAnswered}) {
		t.Fatalf("Wait: %+v %v", end, err)
	}
	if strings.Join(sc.ids, ",") != "4,6" {
		t.Fatalf("Last-Event-IDs %q", sc.ids)
	}
}
