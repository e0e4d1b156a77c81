package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Token is a scoped API token as stored: never its secret, only the
// SHA-256 of it (the secret is 256 random bits, so a fast hash is as
// good as a slow one: there is nothing to guess).
type Token struct {
	ID      string
	Label   string
	Hash    []byte
	Rooms   []string
	Can     []string
	Created time.Time
	Expires time.Time
	Revoked time.Time // zero while valid
}

// Tokens is the store of scoped API tokens: a small SQLite file of its
// own beside the rooms' store, so that it does not share the event log's
// writer or schema (and a cluster node, whose rooms live elsewhere, has
// one too). Safe for concurrent use.
type Tokens struct {
	db *sql.DB
}

const tokensSchema = `
CREATE TABLE IF NOT EXISTS tokens (
	id         TEXT PRIMARY KEY,
	label      TEXT NOT NULL,
	hash       BLOB NOT NULL UNIQUE,
	rooms      BLOB NOT NULL,
	can        BLOB NOT NULL,
	created_ns INTEGER NOT NULL,
	expires_ns INTEGER NOT NULL,
	revoked_ns INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
`

// OpenTokens opens (creating if needed) the token store at path, the
// server's alone (0600).
func OpenTokens(ctx context.Context, path string) (*Tokens, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("store: tokens: %w", err)
	}
	if err := private(path); err != nil {
		return nil, err
	}
	dsn := fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_txlock=immediate",
		path, DefaultBusyTimeout.Milliseconds())
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("store: tokens: %w", err)
	}
	// One connection: writes are rare (a token created or revoked), and
	// reads happen once, when the server starts.
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, tokensSchema); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("store: tokens: %w", err)
	}
	if err := private(path); err != nil {
		_ = db.Close()
		return nil, err
	}
	return &Tokens{db: db}, nil
}

// Close closes the token store.
func (t *Tokens) Close() error { return t.db.Close() }

// CreateToken stores tok; an id or hash already stored is ErrConflict.
func (t *Tokens) CreateToken(ctx context.Context, tok Token) error {
	rooms, err := json.Marshal(tok.Rooms)
	if err != nil {
		return fmt.Errorf("store: token: %w", err)
	}
	can, err := json.Marshal(tok.Can)
	if err != nil {
		return fmt.Errorf("store: token: %w", err)
	}
	var n int
	if err := t.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM tokens WHERE id = ? OR hash = ?`, tok.ID, tok.Hash).Scan(&n); err != nil {
		return fmt.Errorf("store: token: %w", err)
	}
	if n > 0 {
		return fmt.Errorf("%w: token %s", ErrConflict, tok.ID)
	}
	_, err = t.db.ExecContext(ctx, `INSERT INTO tokens (id, label, hash, rooms, can, created_ns, expires_ns) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		tok.ID, tok.Label, tok.Hash, rooms, can, tok.Created.UnixNano(), tok.Expires.UnixNano())
	if err != nil {
		return fmt.Errorf("store: token: %w", err)
	}
	return nil
}

// AllTokens answers every token stored, revoked and expired ones
// included, oldest first.
func (t *Tokens) AllTokens(ctx context.Context) ([]Token, error) {
	rows, err := t.db.QueryContext(ctx, `SELECT id, label, hash, rooms, can, created_ns, expires_ns, revoked_ns FROM tokens ORDER BY created_ns, id`)
	if err != nil {
		return nil, fmt.Errorf("store: tokens: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []Token
	for rows.Next() {
		var tok Token
		var rooms, can []byte
		var created, expires, revoked int64
		if err := rows.Scan(&tok.ID, &tok.Label, &tok.Hash, &rooms, &can, &created, &expires, &revoked); err != nil {
			return nil, fmt.Errorf("store: tokens: %w", err)
		}
		if err := errors.Join(json.Unmarshal(rooms, &tok.Rooms), json.Unmarshal(can, &tok.Can)); err != nil {
			return nil, fmt.Errorf("store: token %s: %w", tok.ID, err)
		}
		tok.Created, tok.Expires = time.Unix(0, created), time.Unix(0, expires)
		if revoked != 0 {
			tok.Revoked = time.Unix(0, revoked)
		}
		out = append(out, tok)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: tokens: %w", err)
	}
	return out, nil
}

// RevokeToken marks the token revoked at at (a token revoked before keeps
// its first time); an unknown id is ErrNotFound.
func (t *Tokens) RevokeToken(ctx context.Context, id string, at time.Time) error {
	res, err := t.db.ExecContext(ctx, `UPDATE tokens SET revoked_ns = CASE WHEN revoked_ns = 0 THEN ? ELSE revoked_ns END WHERE id = ?`, at.UnixNano(), id)
	if err != nil {
		return fmt.Errorf("store: token: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("store: token: %w", err)
	} else if n == 0 {
		return fmt.Errorf("%w: token %s", ErrNotFound, id)
	}
	return nil
}
