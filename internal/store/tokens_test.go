package store

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestTokens: a token stored is read back as stored, a duplicate id or
// hash is ErrConflict, revoking an unknown id is ErrNotFound, a second
// revocation keeps the first time, and the file is the server's alone.
func TestTokens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.db")
	ts, err := OpenTokens(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, time.Now().UnixNano())
	tok := Token{ID: "tok_1", Label: "ann", Hash: []byte("0123456789abcdef0123456789abcdef"), Rooms: []string{"a", "b*"},
		Can: []string{"read"}, Created: now, Expires: now.Add(time.Hour)}
	if err := ts.CreateToken(t.Context(), tok); err != nil {
		t.Fatal(err)
	}
	dup := tok
	dup.ID = "tok_2"
	if err := ts.CreateToken(t.Context(), dup); !errors.Is(err, ErrConflict) {
		t.Fatalf("same hash: %v", err)
	}
	if err := ts.RevokeToken(t.Context(), "tok_none", now); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoke unknown: %v", err)
	}
	if err := ts.RevokeToken(t.Context(), "tok_1", now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := ts.RevokeToken(t.Context(), "tok_1", now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := ts.Close(); err != nil {
		t.Fatal(err)
	}
	ts, err = OpenTokens(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer ts.Close()
	all, err := ts.AllTokens(t.Context())
	if err != nil || len(all) != 1 {
		t.Fatalf("all: %v %v", all, err)
	}
	got := all[0]
	if got.ID != tok.ID || got.Label != tok.Label || string(got.Hash) != string(tok.Hash) || !slices.Equal(got.Rooms, tok.Rooms) ||
		!slices.Equal(got.Can, tok.Can) || !got.Created.Equal(tok.Created) || !got.Expires.Equal(tok.Expires) ||
		!got.Revoked.Equal(now.Add(time.Minute)) {
		t.Fatalf("read back %+v, stored %+v", got, tok)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode: %v %v", fi.Mode(), err)
	}
}
