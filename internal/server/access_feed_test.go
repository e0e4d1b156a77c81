package server

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// memFeed is a TokenFeed other servers share (a cluster's store, as
// natsroom.Tokens is): what one writes reaches the others' watches from
// a goroutine of each watch, as a bucket's watch does.
type memFeed struct {
	mu       sync.Mutex
	toks     map[string]store.Token
	watchers map[int]chan store.Token
	next     int
}

func newMemFeed() *memFeed {
	return &memFeed{toks: map[string]store.Token{}, watchers: map[int]chan store.Token{}}
}

func (f *memFeed) publish(t store.Token) {
	for _, ch := range f.watchers {
		ch <- t
	}
}

func (f *memFeed) CreateToken(_ context.Context, t store.Token) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.toks[t.ID]; ok {
		return fmt.Errorf("%w: token %s", store.ErrConflict, t.ID)
	}
	f.toks[t.ID] = t
	f.publish(t)
	return nil
}

func (f *memFeed) AllTokens(context.Context) ([]store.Token, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.Token
	for _, t := range f.toks {
		out = append(out, t)
	}
	return out, nil
}

func (f *memFeed) RevokeToken(_ context.Context, id string, at time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.toks[id]
	if !ok {
		return fmt.Errorf("%w: token %s", store.ErrNotFound, id)
	}
	if t.Revoked.IsZero() {
		t.Revoked = at
		f.toks[id] = t
		f.publish(t)
	}
	return nil
}

// put writes t as another node would (its clock, its fields).
func (f *memFeed) put(t store.Token) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.toks[t.ID] = t
	f.publish(t)
}

func (f *memFeed) WatchTokens(ctx context.Context, changed func(store.Token)) (func(), error) {
	f.mu.Lock()
	for _, t := range f.toks {
		changed(t)
	}
	ch := make(chan store.Token, 64)
	id := f.next
	f.next++
	f.watchers[id] = ch
	f.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case t := <-ch:
				changed(t)
			case <-ctx.Done():
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			delete(f.watchers, id)
			f.mu.Unlock()
			cancel()
			<-done
		})
	}, nil
}

// feedToken is a token as another node writes it, with secret sec.
func feedToken(id, sec string, created, expires time.Time) store.Token {
	sum := sha256.Sum256([]byte(sec))
	return store.Token{ID: id, Label: "from another node", Hash: sum[:], Rooms: []string{"r"}, Can: []string{PermRead},
		Created: created, Expires: expires}
}

// getUntil asks GET /v1/rooms/r with tok until the status is want (the
// feed brings a change a moment after it is written).
func getUntil(t *testing.T, h *harness, tok string, want int, reason string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		r := h.as(tok, "GET", "/v1/rooms/r", nil)
		msg, _ := r.json(t)["error"].(string)
		if r.status == want && strings.Contains(msg, reason) {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("GET with the token: %d %s, want %d %q", r.status, r.body, want, reason)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTokenFeed: two servers over one shared token store (two nodes of a
// cluster). A token made through one works through the other; revoked
// through one, its stream open on the other ends and it is 401 there; a
// revocation through a server that has not seen the token yet is a
// revocation. A token another node wrote whose expiry has passed by this
// node's clock is refused at once, whatever the writer's clock said at
// its creation (its expiry is an instant, the same on every node), and
// one that another node created with a clock running behind works until
// that instant.
func TestTokenFeed(t *testing.T) {
	feed := newMemFeed()
	a := newHarness(t, room.Options{}, Options{Tokens: feed})
	a.ended("r", a.post("r", "hello"))
	b, err := New(Options{Manager: a.m, Token: testToken, Tokens: feed})
	if err != nil {
		t.Fatal(err)
	}
	hb := &harness{t: t, s: b, m: a.m, ts: httptest.NewServer(b), seen: a.seen}
	defer func() { b.Close(); hb.ts.Close() }()

	v := mint(t, a, []string{"r"}, []string{PermRead}, "1h", "through a")
	getUntil(t, hb, v.Token, 200, "")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s, err := hb.openAs(ctx, v.Token, "r", "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	for range 7 { // the room's events so far
		if _, err := s.next(); err != nil {
			t.Fatal(err)
		}
	}
	if r := a.do("DELETE", "/v1/tokens/"+v.ID, nil); r.status != 200 {
		t.Fatalf("revoke through a: %d %s", r.status, r.body)
	}
	if _, err := s.next(); !errors.Is(err, io.EOF) {
		t.Fatalf("b's stream of the token revoked through a went on: %v", err)
	}
	getUntil(t, hb, v.Token, http.StatusUnauthorized, "revoked")

	// Another node's token, revoked through b: a reaches the end.
	now := time.Now()
	feed.put(feedToken("tok_other", tokenPrefix+"other", now, now.Add(time.Hour)))
	if r := hb.do("DELETE", "/v1/tokens/tok_other", nil); r.status != 200 {
		t.Fatalf("revoke of another node's token: %d %s", r.status, r.body)
	}
	getUntil(t, a, tokenPrefix+"other", http.StatusUnauthorized, "revoked")
	if r := hb.do("DELETE", "/v1/tokens/tok_none", nil); r.status != http.StatusNotFound {
		t.Fatalf("revoke of no token: %d %s", r.status, r.body)
	}

	// Clocks: a node whose clock runs an hour ahead created a token
	// (created in b's future) whose expiry has passed by b's clock.
	feed.put(feedToken("tok_ahead", tokenPrefix+"ahead", now.Add(time.Hour), now.Add(-time.Second)))
	getUntil(t, hb, tokenPrefix+"ahead", http.StatusUnauthorized, "expired")
	// One whose clock runs an hour behind: its token's expiry is an
	// instant an hour from now; it works until then.
	feed.put(feedToken("tok_behind", tokenPrefix+"behind", now.Add(-2*time.Hour), now.Add(time.Hour)))
	getUntil(t, hb, tokenPrefix+"behind", 200, "")
	getUntil(t, a, tokenPrefix+"behind", 200, "")
}

// TestTokenLimitsNone: a negative limit is none (serve's 0): a token
// sends past the default a minute and opens more streams than the
// default.
func TestTokenLimitsNone(t *testing.T) {
	toks, _ := tokenStore(t)
	h := newHarness(t, room.Options{}, Options{Tokens: toks, TokenMessagesPerMinute: -1, TokenStreams: -1})
	v := mint(t, h, []string{"r"}, []string{PermRead, PermSend}, "1h", "unbounded")
	for i := range DefaultTokenMessagesPerMinute + 5 {
		if r := h.as(v.Token, "POST", "/v1/rooms/r/messages", map[string]string{"text": "hi"}); r.status != http.StatusAccepted {
			t.Fatalf("message %d: %d %s", i, r.status, r.body)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for i := range DefaultTokenStreams + 2 {
		s, err := h.openAs(ctx, v.Token, "r", "", "")
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		defer s.close()
	}
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestTokenSettingsAndPurgeLogged: a settings change is in the room's log
// (settings.changed, with the token), and the server's log says which
// token set settings or purged a room (a purge deletes the room's log; in
// a cluster another node may set settings): its id and label, the fields
// a settings change set, never their values or the secret.
func TestTokenSettingsAndPurgeLogged(t *testing.T) {
	toks, _ := tokenStore(t)
	var out syncBuffer
	h := newHarness(t, room.Options{}, Options{Tokens: toks, Logger: slog.New(slog.NewTextHandler(&out, nil))})
	v := mint(t, h, []string{"cfg"}, []string{PermConfigure, PermPurge, PermSend}, "1h", "ops bob")
	r := h.as(v.Token, "PUT", "/v1/rooms/cfg/config", map[string]any{"model": "m1", "instructions": "the-instructions-text"})
	if r.status != http.StatusOK {
		t.Fatalf("put: %d %s", r.status, r.body)
	}
	h.ended("cfg", h.post("cfg", "hello"))
	ch := h.until("cfg", 0, func(ev sse) bool { return ev.typ == "settings.changed" })
	if tok, _ := ch.data["token"].(map[string]any); tok["id"] != v.ID || tok["label"] != "ops bob" ||
		fmt.Sprint(ch.data["fields"]) != "[instructions model]" || strings.Contains(fmt.Sprint(ch.data), "the-instructions-text") {
		t.Fatalf("settings.changed %v", ch.data)
	}
	if r := h.as(v.Token, "DELETE", "/v1/rooms/cfg?purge=true", nil); r.status != http.StatusOK {
		t.Fatalf("purge: %d %s", r.status, r.body)
	}
	if r := h.do("PUT", "/v1/rooms/cfg2/config", map[string]any{"model": "m2"}); r.status != http.StatusOK {
		t.Fatalf("the admin's put: %d %s", r.status, r.body)
	}
	log := out.String()
	for _, want := range []string{
		`msg="room settings set" room=cfg fields="[instructions model]" token=` + v.ID + ` token_label="ops bob"`,
		`msg="room purged" room=cfg token=` + v.ID + ` token_label="ops bob"`,
		`msg="room settings set" room=cfg2 fields=[model] token=admin`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %s:\n%s", want, log)
		}
	}
	if strings.Contains(log, "the-instructions-text") || strings.Contains(log, v.Token) || strings.Contains(log, "m1") {
		t.Fatalf("the log carries a setting's value or the secret:\n%s", log)
	}
}

// TestTokenFeedRacingRevokes: two admins revoke one token at once through
// two servers over one shared store: both are answered 200, and both
// servers end up listing the one revocation time the store kept.
func TestTokenFeedRacingRevokes(t *testing.T) {
	feed := newMemFeed()
	a := newHarness(t, room.Options{}, Options{Tokens: feed})
	b, err := New(Options{Manager: a.m, Token: testToken, Tokens: feed})
	if err != nil {
		t.Fatal(err)
	}
	hb := &harness{t: t, s: b, m: a.m, ts: httptest.NewServer(b), seen: a.seen}
	defer func() { b.Close(); hb.ts.Close() }()
	v := mint(t, a, []string{"r"}, []string{PermRead}, "1h", "raced")
	getUntil(t, hb, v.Token, http.StatusNotFound, "") // known on b (the room is not)
	var wg sync.WaitGroup
	status := make([]int, 2)
	for i, h := range []*harness{a, hb} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status[i] = h.do("DELETE", "/v1/tokens/"+v.ID, nil).status
		}()
	}
	wg.Wait()
	if status[0] != 200 || status[1] != 200 {
		t.Fatalf("racing revocations: %v", status)
	}
	stored, _ := feed.AllTokens(t.Context())
	want := stored[0].Revoked.UTC().Format(time.RFC3339Nano)
	for _, h := range []*harness{a, hb} {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		for {
			r := h.do("GET", "/v1/tokens", nil)
			var list struct{ Tokens []tokenView }
			if err := json.Unmarshal(r.body, &list); err != nil || len(list.Tokens) != 1 {
				t.Fatalf("list: %d %s", r.status, r.body)
			}
			if rv := list.Tokens[0].Revoked; rv != nil && rv.Format(time.RFC3339Nano) == want {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("the list says %s, the store %s", r.body, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
	}
}

// TestTokenEndedDuringRequest: a request whose token is revoked while it
// runs (the revocation came through another node) is answered 401 with
// the reason, not the 503 of a request cut short.
func TestTokenEndedDuringRequest(t *testing.T) {
	h, _, _ := tokenHarness(t)
	v := mint(t, h, []string{"r"}, []string{PermRead}, "1h", "cut")
	g := h.s.tokens.find(v.Token)
	ctx, cancel := context.WithCancelCause(context.WithValue(t.Context(), principalKey{}, principal{g}))
	g.revoke(time.Now())
	cancel(errTokenEnded)
	w := httptest.NewRecorder()
	h.s.fail(w, httptest.NewRequest("GET", "/v1/rooms/r", nil).WithContext(ctx), context.Canceled, "room r")
	if w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), "this token was revoked") {
		t.Fatalf("a request whose token was revoked meanwhile: %d %s", w.Code, w.Body)
	}
	// A request cut short for another reason stays 503.
	ctx2, cancel2 := context.WithCancel(context.WithValue(t.Context(), principalKey{}, principal{g}))
	cancel2()
	w = httptest.NewRecorder()
	h.s.fail(w, httptest.NewRequest("GET", "/v1/rooms/r", nil).WithContext(ctx2), context.Canceled, "room r")
	if w.Code == http.StatusUnauthorized {
		t.Fatalf("a request cut short by its client: %d %s", w.Code, w.Body)
	}
}
