// Package sqlitestore keeps rooms in one SQLite file: the room.Store that
// `agenthost serve` uses on one machine, for a program that hosts rooms in
// its own process.
//
// Open takes the file for this process alone (a lock beside it; a second
// Open, here or in another process, fails with ErrLocked after two
// seconds: a process this one is starting holds a copy of the lock from
// its fork until its exec, so a Store closed and opened again at once
// waits for that copy rather than failing), creates or
// updates its schema, and returns a *Store to give room.Options.Store.
// Every write is one transaction, durable when it returns (synchronous
// FULL, WAL). Close the Store after the room.Manager that uses it has
// finished (Manager.Close, then Manager.Wait).
//
// Besides room.Store, a Store implements the optional interfaces rooms and
// the HTTP API look for: room.SettingsStore and room.ExclusiveStore (rooms'
// own settings), room.Purger (Manager.Purge), room.RoomPager (room pages
// and counts) and room.EventTapper (the API's metrics).
//
// Platforms: the store is pure Go (modernc.org/sqlite) and runs wherever
// Go does; the lock is flock(2) on Unix, and absent elsewhere.
package sqlitestore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/agenthost/agenthost/internal/roomsqlite"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// ErrLocked is returned by Open when another Store, in this process or
// another, holds the file.
var ErrLocked = store.ErrLocked

// ErrClosed is returned by a Store's writes, and by Close, after Close
// (reads fail too, with the database's own error).
var ErrClosed = store.ErrClosed

// Options configure Open. The zero value is ready to use.
type Options struct {
	// Queue bounds the writes waiting for the writer (0: 4096); a write
	// waits for a place, bounded by its context.
	Queue int
	// Logger receives the store's warnings (slow checkpoints, a write
	// that failed); never events' payloads. nil: discard.
	Logger *slog.Logger
}

// Store is a room.Store over one SQLite file. Create it with Open; its
// methods are safe for concurrent use. It has the method sets of
// room.Store, room.SettingsStore, room.ExclusiveStore, room.Purger,
// room.RoomPager and room.EventTapper (see the package doc).
type Store struct {
	rooms
	db *store.DB
}

// rooms is everything a Store offers rooms: embedded, so that the methods
// come from the one adapter `serve` uses and a method room.Store gains
// comes with it.
type rooms interface {
	room.Store
	room.ExclusiveStore
	room.Purger
	room.RoomPager
	room.EventTapper
}

var (
	_ room.Store          = (*Store)(nil)
	_ room.SettingsStore  = (*Store)(nil)
	_ room.ExclusiveStore = (*Store)(nil)
	_ room.Purger         = (*Store)(nil)
	_ room.RoomPager      = (*Store)(nil)
	_ room.EventTapper    = (*Store)(nil)
)

// Open opens the store at path (creating it and its folder, mode 0700,
// if need be). ctx bounds the opening only.
func Open(ctx context.Context, path string, opts Options) (*Store, error) {
	if path == "" {
		return nil, errors.New("sqlitestore: an empty path")
	}
	db, err := store.Open(ctx, path, store.Options{Queue: opts.Queue, Logger: opts.Logger})
	if err != nil {
		return nil, err
	}
	rs, ok := roomsqlite.New(db).(rooms)
	if !ok {
		_ = db.Close()
		return nil, fmt.Errorf("sqlitestore: the SQLite adapter lacks an interface a Store promises")
	}
	return &Store{rooms: rs, db: db}, nil
}

// Close lets the queued writes finish, closes the file and releases its
// lock. Later calls fail: writes and a second Close with ErrClosed.
func (s *Store) Close() error { return s.db.Close() }
