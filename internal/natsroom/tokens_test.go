package natsroom

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agenthost/agenthost/internal/store"
)

func testToken(id string) store.Token {
	sum := sha256.Sum256([]byte("aht_secret-of-" + id))
	now := time.Now()
	return store.Token{ID: id, Label: "label of " + id, Hash: sum[:], Rooms: []string{"r1", "team-*"}, Can: []string{"read", "send"},
		Created: now, Expires: now.Add(time.Hour)}
}

// tokenFeed collects what a WatchTokens delivers.
type tokenFeed struct {
	mu   sync.Mutex
	seen map[string]store.Token
	ch   chan struct{} // a token arrived
}

func newTokenFeed() *tokenFeed {
	return &tokenFeed{seen: map[string]store.Token{}, ch: make(chan struct{}, 1)}
}

func (f *tokenFeed) changed(t store.Token) {
	f.mu.Lock()
	f.seen[t.ID] = t
	f.mu.Unlock()
	select {
	case f.ch <- struct{}{}:
	default:
	}
}

// wait waits until ok holds of the token id as the feed last saw it.
func (f *tokenFeed) wait(ctx context.Context, t *testing.T, id string, ok func(store.Token) bool) store.Token {
	t.Helper()
	for {
		f.mu.Lock()
		tok, found := f.seen[id]
		f.mu.Unlock()
		if found && ok(tok) {
			return tok
		}
		select {
		case <-f.ch:
		case <-ctx.Done():
			t.Fatalf("token %s: the feed never showed the change (last: %+v, found %v)", id, tok, found)
		}
	}
}

// The token store on one node: a created token is listed with its hash,
// never a secret; an id taken is ErrConflict; a revocation keeps its
// first time; an unknown id is ErrNotFound; a second connection's watch
// sees what was stored before it and the changes after.
func TestTokens_StoreAndWatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, js := singleNode(t, ctx)
	a, err := OpenTokens(ctx, nc, js, 1)
	if err != nil {
		t.Fatal(err)
	}
	if all, err := a.AllTokens(ctx); err != nil || len(all) != 0 {
		t.Fatalf("an empty store: %v %v", all, err)
	}
	t1 := testToken("tok_1")
	if err := a.CreateToken(ctx, t1); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateToken(ctx, testToken("tok_1")); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("an id taken: %v, want ErrConflict", err)
	}
	// Another client of the cluster (another API node).
	nc2, err := nc.Opts.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	js2, _ := jetstream.New(nc2)
	b, err := OpenTokens(ctx, nc2, js2, 1)
	if err != nil {
		t.Fatal(err)
	}
	feed := newTokenFeed()
	stop, err := b.WatchTokens(ctx, feed.changed)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	got := feed.wait(ctx, t, "tok_1", func(store.Token) bool { return true })
	if got.Label != t1.Label || !bytes.Equal(got.Hash, t1.Hash) || !got.Expires.Equal(t1.Expires) || fmt.Sprint(got.Rooms, got.Can) != fmt.Sprint(t1.Rooms, t1.Can) {
		t.Fatalf("the watch's first token %+v, want %+v", got, t1)
	}
	t2 := testToken("tok_2")
	if err := a.CreateToken(ctx, t2); err != nil {
		t.Fatal(err)
	}
	feed.wait(ctx, t, "tok_2", func(store.Token) bool { return true })
	at := time.Now().Add(-time.Minute).Round(0)
	if err := a.RevokeToken(ctx, "tok_1", at); err != nil {
		t.Fatal(err)
	}
	feed.wait(ctx, t, "tok_1", func(tok store.Token) bool { return tok.Revoked.Equal(at) })
	// Revoked again (through the other node): the first time stays.
	if err := b.RevokeToken(ctx, "tok_1", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := b.RevokeToken(ctx, "tok_nope", time.Now()); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoking an unknown id: %v, want ErrNotFound", err)
	}
	all, err := b.AllTokens(ctx)
	if err != nil || len(all) != 2 || all[0].ID != "tok_1" || all[1].ID != "tok_2" || !all[0].Revoked.Equal(at) || !all[1].Revoked.IsZero() {
		t.Fatalf("all tokens %+v %v", all, err)
	}
	// Only hashes: no record holds anything but the token's fields.
	kv, err := js.KeyValue(ctx, BucketTokens)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, token("tok_2"))
	if err != nil || bytes.Contains(e.Value(), []byte("aht_")) {
		t.Fatalf("the record %s %v", e.Value(), err)
	}
	stop()
}

// Two API nodes of a three-node cluster racing: creating one id, exactly
// one wins; revoking one token, both succeed and every node ends up with
// the one revocation time that landed; a token created through n1 is
// seen by n3's watch, and its revocation through n2 too.
func TestTokens_ClusterRaces(t *testing.T) {
	clusterTests(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx, [3]bool{true, true, true})
	defer tc.stop()
	var ts [3]*Tokens
	for i, h := range tc.hosts {
		var err error
		if ts[i], err = h.c.Tokens(ctx); err != nil {
			t.Fatal(err)
		}
	}
	feed := newTokenFeed()
	stop, err := ts[2].WatchTokens(ctx, feed.changed)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	// Racing creation of one id through two nodes.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok := testToken("tok_race")
			tok.Label = fmt.Sprintf("by n%d", i+1)
			errs[i] = ts[i].CreateToken(ctx, tok)
		}()
	}
	wg.Wait()
	won := -1
	for i, err := range errs {
		switch {
		case err == nil && won < 0:
			won = i
		case err == nil:
			t.Fatalf("both nodes created tok_race")
		case !errors.Is(err, store.ErrConflict):
			t.Fatalf("n%d's create: %v, want nil or ErrConflict", i+1, err)
		}
	}
	if won < 0 {
		t.Fatalf("neither node created tok_race: %v", errs)
	}
	got := feed.wait(ctx, t, "tok_race", func(store.Token) bool { return true })
	if want := fmt.Sprintf("by n%d", won+1); got.Label != want {
		t.Fatalf("n3 sees tok_race labelled %q, want the winner's %q", got.Label, want)
	}

	// Racing revocation through two nodes.
	times := []time.Time{time.Now().Add(-2 * time.Second).Round(0), time.Now().Add(-time.Second).Round(0)}
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = ts[i].RevokeToken(ctx, "tok_race", times[i])
		}()
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("racing revocations: %v", errs)
	}
	got = feed.wait(ctx, t, "tok_race", func(tok store.Token) bool { return !tok.Revoked.IsZero() })
	if !got.Revoked.Equal(times[0]) && !got.Revoked.Equal(times[1]) {
		t.Fatalf("revoked at %v, want one of %v", got.Revoked, times)
	}
	for i := range ts {
		all, err := ts[i].AllTokens(ctx)
		if err != nil || len(all) != 1 || !all[0].Revoked.Equal(got.Revoked) {
			t.Fatalf("n%d's tokens %+v %v, want tok_race revoked at %v", i+1, all, err, got.Revoked)
		}
	}
	stop()
}
