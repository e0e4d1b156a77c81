// Package roomsqlite serves rooms from the embedded SQLite store: it
// adapts internal/store's DB to room.Store. It is its own package so that
// room imports no store at all (a program outside this module brings its
// own through room.Store).
package roomsqlite

import (
	"context"
	"encoding/json"

	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// New is db as a room.Store. The DB's other methods (RoomPage, RoomCount,
// Tap, Receipts) stay reachable: rooms and the server find them through
// the optional interfaces they check for.
func New(db *store.DB) room.Store { return sqliteStore{db} }

type sqliteStore struct{ *store.DB }

func (s sqliteStore) Write(ctx context.Context, fn func(tx room.Tx) error) error {
	return s.DB.Write(ctx, func(w *store.Writer) error { return fn(w) })
}

var _ room.SettingsStore = sqliteStore{}

// RoomSettings implements room.SettingsStore (the rooms table's config).
func (s sqliteStore) RoomSettings(ctx context.Context, id string) (json.RawMessage, error) {
	return s.DB.RoomConfig(ctx, id)
}

// PutRoomSettings implements room.SettingsStore.
func (s sqliteStore) PutRoomSettings(ctx context.Context, id string, settings json.RawMessage) error {
	return s.DB.Write(ctx, func(w *store.Writer) error { return w.SetConfig(id, settings) })
}

var _ room.ExclusiveStore = sqliteStore{}

// Exclusive implements room.ExclusiveStore: the DB is a file this process
// holds locked, and one Manager serves it.
func (s sqliteStore) Exclusive() bool { return true }

var _ room.Purger = sqliteStore{}

// PurgeRoom implements room.Purger.
func (s sqliteStore) PurgeRoom(ctx context.Context, id string) error {
	return s.DB.Write(ctx, func(w *store.Writer) error { return w.DeleteRoom(id) })
}
