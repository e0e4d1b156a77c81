package natsroom

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agenthost/agenthost/internal/store"
)

// BucketTokens holds a cluster's room tokens (the API's token store):
// one key per token id, its record (the SHA-256 of its secret, never the
// secret). Every API node reads and writes it, so that a token created
// through one node works through all, and a revocation through one ends
// the token's streams on all (each node watches the bucket). On disk and
// replicated like the settings: tokens survive a restart of the whole
// cluster.
const BucketTokens = "room_tokens"

// Tokens is the cluster's token store: store.Tokens over BucketTokens,
// with WatchTokens, which the API server follows. Safe for concurrent
// use.
type Tokens struct {
	nc *nats.Conn
	kv jetstream.KeyValue
}

// tokenRecord is a token as BucketTokens keeps it.
type tokenRecord struct {
	ID      string   `json:"id"`
	Label   string   `json:"label"`
	Hash    []byte   `json:"hash"`
	Rooms   []string `json:"rooms"`
	Can     []string `json:"can"`
	Created int64    `json:"created_ns"`
	Expires int64    `json:"expires_ns"`
	Revoked int64    `json:"revoked_ns,omitempty"`
}

func recordOf(t store.Token) tokenRecord {
	r := tokenRecord{ID: t.ID, Label: t.Label, Hash: t.Hash, Rooms: t.Rooms, Can: t.Can,
		Created: t.Created.UnixNano(), Expires: t.Expires.UnixNano()}
	if !t.Revoked.IsZero() {
		r.Revoked = t.Revoked.UnixNano()
	}
	return r
}

func (r tokenRecord) token() store.Token {
	t := store.Token{ID: r.ID, Label: r.Label, Hash: r.Hash, Rooms: r.Rooms, Can: r.Can,
		Created: time.Unix(0, r.Created), Expires: time.Unix(0, r.Expires)}
	if r.Revoked != 0 {
		t.Revoked = time.Unix(0, r.Revoked)
	}
	return t
}

func decodeToken(e jetstream.KeyValueEntry) (store.Token, error) {
	var r tokenRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return store.Token{}, fmt.Errorf("natsroom: token record %s: %w", e.Key(), err)
	}
	return r.token(), nil
}

// Tokens opens the cluster's token store (creating its bucket, with the
// cluster's replicas, if missing), retrying until ctx ends while
// JetStream cannot answer (a cluster restarting together elects its
// leaders). Call it after Start.
func (c *Cluster) Tokens(ctx context.Context) (*Tokens, error) {
	return OpenTokens(ctx, c.nc, c.js, c.cfg.Replicas)
}

// OpenTokens is Cluster.Tokens over nc and its js.
func OpenTokens(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, replicas int) (*Tokens, error) {
	cfg := jetstream.KeyValueConfig{Bucket: BucketTokens, Replicas: max(replicas, 1)}
	for {
		octx, cancel := context.WithTimeout(ctx, reqTimeout)
		kv, err := js.CreateOrUpdateKeyValue(octx, cfg)
		cancel()
		if err == nil {
			return &Tokens{nc: nc, kv: kv}, nil
		}
		if err := configErr(replicas, err); errors.Is(err, ErrConfig) {
			return nil, fmt.Errorf("natsroom: token bucket: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("natsroom: token bucket: %w", err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// CreateToken stores t; an id stored already is store.ErrConflict (the
// compare-and-set of a new key: of two nodes creating one id, one wins).
// A secret's hash is not checked for uniqueness: ids and secrets are 64
// and 256 random bits.
func (ts *Tokens) CreateToken(ctx context.Context, t store.Token) error {
	data, err := json.Marshal(recordOf(t))
	if err != nil {
		return fmt.Errorf("natsroom: token: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, reqTimeout)
	defer cancel()
	_, err = ts.kv.Create(ctx, token(t.ID), data)
	switch {
	case errors.Is(err, jetstream.ErrKeyExists) || isWrongLastSeq(err):
		return fmt.Errorf("%w: token %s", store.ErrConflict, t.ID)
	case err != nil:
		return fmt.Errorf("natsroom: token %s: %w", t.ID, err)
	}
	return nil
}

// AllTokens answers every token stored, revoked and expired ones
// included, oldest first.
func (ts *Tokens) AllTokens(ctx context.Context) ([]store.Token, error) {
	var out []store.Token
	stop, err := ts.watch(ctx, func(t store.Token) { out = append(out, t) }, false)
	if err != nil {
		return nil, err
	}
	stop()
	sortTokens(out)
	return out, nil
}

func sortTokens(ts []store.Token) {
	slices.SortFunc(ts, func(a, b store.Token) int {
		return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
	})
}

// RevokeToken marks the token revoked at at, by compare-and-set (a token
// revoked before keeps its first time, whichever node revoked it); an
// unknown id is store.ErrNotFound.
func (ts *Tokens) RevokeToken(ctx context.Context, id string, at time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, reqTimeout)
	defer cancel()
	for {
		// From the bucket's leader, which has every acknowledged write: a
		// replica may not have a token another node created a moment ago
		// (its revocation would be a 404).
		e, err := leaderGet(ctx, ts.nc, "KV_"+BucketTokens, msgGetReq{LastBySubj: "$KV." + BucketTokens + "." + token(id)})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("%w: token %s", store.ErrNotFound, id)
		}
		if err != nil {
			return fmt.Errorf("natsroom: token %s: %w", id, err)
		}
		var r tokenRecord
		if err := json.Unmarshal(e.Data, &r); err != nil {
			return fmt.Errorf("natsroom: token record %s: %w", id, err)
		}
		if r.Revoked != 0 {
			return nil
		}
		r.Revoked = at.UnixNano()
		data, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("natsroom: token %s: %w", id, err)
		}
		_, err = ts.kv.Update(ctx, token(id), data, e.Sequence)
		if err == nil {
			return nil
		}
		// Another revocation landed first: read again.
		if !isWrongLastSeq(err) {
			return fmt.Errorf("natsroom: token %s: %w", id, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("natsroom: token %s: %w", id, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// WatchTokens calls changed with every token stored, then returns, and
// goes on calling it with each token created or revoked (through any
// node) as the bucket's watch brings it, a few milliseconds after the
// write, until ctx ends or stop is called (stop waits for the last call
// to return). changed is called from one goroutine at a time; it may see
// a token it knows again (its own writes come back).
func (ts *Tokens) WatchTokens(ctx context.Context, changed func(store.Token)) (stop func(), err error) {
	return ts.watch(ctx, changed, true)
}

// watch delivers the stored tokens, and with follow the changes after
// them from a goroutine that stop ends.
func (ts *Tokens) watch(ctx context.Context, fn func(store.Token), follow bool) (func(), error) {
	wctx, cancel := context.WithCancel(ctx)
	w, err := ts.kv.WatchAll(wctx, jetstream.IgnoreDeletes())
	if err != nil {
		cancel()
		return nil, fmt.Errorf("natsroom: watching the tokens: %w", err)
	}
	end := func() {
		_ = w.Stop()
		cancel()
	}
	// The stored ones, until the watch's marker (nil) says they are all
	// here.
	tctx, tcancel := context.WithTimeout(ctx, reqTimeout)
	defer tcancel()
	for initial := true; initial; {
		select {
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				end()
				return nil, fmt.Errorf("natsroom: watching the tokens: the watch ended")
			case e == nil:
				initial = false
			default:
				if t, err := decodeToken(e); err == nil {
					fn(t)
				}
			}
		case <-tctx.Done():
			end()
			return nil, fmt.Errorf("natsroom: reading the tokens: %w", tctx.Err())
		}
	}
	if !follow {
		end()
		return func() {}, nil
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil || e.Operation() != jetstream.KeyValuePut {
					continue
				}
				// A record no node wrote (not JSON) is skipped: the
				// tokens it would name are unknown here (401).
				if t, err := decodeToken(e); err == nil {
					fn(t)
				}
			case <-wctx.Done():
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			end()
			wg.Wait()
		})
	}, nil
}
