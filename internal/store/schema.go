package store

import (
	"context"
	"database/sql"
	"fmt"
)

// migrations are applied in order; migrations[i] brings the schema to
// version i+1. Never edit a released one: append a new one.
var migrations = []string{
	// 1: rooms, the event log, messages, turns, approvals, questions,
	// receipts. Times are Unix nanoseconds; 0 means not yet.
	`
CREATE TABLE rooms (
	id         TEXT PRIMARY KEY,
	created_ns INTEGER NOT NULL,
	agent      TEXT NOT NULL DEFAULT '',
	session_id TEXT NOT NULL DEFAULT '',
	config     BLOB NOT NULL DEFAULT '{}'
) WITHOUT ROWID;
CREATE TABLE events (
	room    TEXT NOT NULL,
	seq     INTEGER NOT NULL,
	type    TEXT NOT NULL,
	time_ns INTEGER NOT NULL,
	data    BLOB NOT NULL,
	PRIMARY KEY (room, seq)
) WITHOUT ROWID;
CREATE TABLE messages (
	id          TEXT PRIMARY KEY,
	room        TEXT NOT NULL,
	seq         INTEGER NOT NULL,
	sender      TEXT NOT NULL,
	text        TEXT NOT NULL,
	delivery    TEXT NOT NULL,
	status      TEXT NOT NULL,
	outcome     TEXT NOT NULL DEFAULT '',
	reason      TEXT NOT NULL DEFAULT '',
	turn_id     TEXT NOT NULL DEFAULT '',
	accepted_ns INTEGER NOT NULL,
	started_ns  INTEGER NOT NULL DEFAULT 0,
	ended_ns    INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX messages_room ON messages (room, seq);
CREATE INDEX messages_open ON messages (status) WHERE status <> 'ended';
CREATE TABLE turns (
	id         TEXT PRIMARY KEY,
	room       TEXT NOT NULL,
	message_id TEXT NOT NULL,
	outcome    TEXT NOT NULL DEFAULT '',
	reason     TEXT NOT NULL DEFAULT '',
	text       TEXT NOT NULL DEFAULT '',
	started_ns INTEGER NOT NULL,
	ended_ns   INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX turns_room ON turns (room, started_ns);
CREATE INDEX turns_open ON turns (ended_ns) WHERE ended_ns = 0;
CREATE TABLE approvals (
	id          TEXT PRIMARY KEY,
	room        TEXT NOT NULL,
	turn_id     TEXT NOT NULL,
	tool        TEXT NOT NULL,
	input       TEXT NOT NULL,
	options     BLOB NOT NULL,
	created_ns  INTEGER NOT NULL,
	deadline_ns INTEGER NOT NULL,
	decision    TEXT NOT NULL DEFAULT '',
	by          TEXT NOT NULL DEFAULT '',
	resolved_ns INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX approvals_room ON approvals (room, created_ns);
CREATE TABLE questions (
	id          TEXT PRIMARY KEY,
	room        TEXT NOT NULL,
	turn_id     TEXT NOT NULL,
	title       TEXT NOT NULL,
	options     BLOB NOT NULL,
	created_ns  INTEGER NOT NULL,
	deadline_ns INTEGER NOT NULL,
	answer      TEXT NOT NULL DEFAULT '',
	by          TEXT NOT NULL DEFAULT '',
	answered_ns INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX questions_room ON questions (room, created_ns);
CREATE TABLE receipts (
	id      INTEGER PRIMARY KEY AUTOINCREMENT,
	room    TEXT NOT NULL,
	time_ns INTEGER NOT NULL,
	receipt BLOB NOT NULL
);
CREATE INDEX receipts_room ON receipts (room, id);
`,
	// 2: a room's agent that outlives the host (a process daemon's): the
	// transport's handle to it, and the position in its output past the
	// last frame whose effects are committed with the room's events.
	`
ALTER TABLE rooms ADD COLUMN agent_proc TEXT NOT NULL DEFAULT '';
ALTER TABLE rooms ADD COLUMN agent_offset INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rooms ADD COLUMN agent_seen INTEGER NOT NULL DEFAULT 0;
`,
	// 3: the approvals and questions still waiting on a person, read at
	// every listing and scrape, without a walk of all that were resolved.
	`
CREATE INDEX approvals_pending ON approvals (room, created_ns) WHERE decision = '';
CREATE INDEX questions_pending ON questions (room, created_ns) WHERE by = '';
`,
	// 4: what each turn cost, and each room's totals by sender (kept as
	// turns end, so that a room's totals cost one read of a few rows).
	// Turns that ended before count, with nothing spent.
	`
ALTER TABLE turns ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE turns ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE turns ADD COLUMN cache_read_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE turns ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE turns ADD COLUMN cost_usd REAL NOT NULL DEFAULT 0;
CREATE TABLE room_usage (
	room               TEXT NOT NULL,
	sender             TEXT NOT NULL,
	turns              INTEGER NOT NULL DEFAULT 0,
	input_tokens       INTEGER NOT NULL DEFAULT 0,
	output_tokens      INTEGER NOT NULL DEFAULT 0,
	cache_read_tokens  INTEGER NOT NULL DEFAULT 0,
	cache_write_tokens INTEGER NOT NULL DEFAULT 0,
	cost_usd           REAL NOT NULL DEFAULT 0,
	PRIMARY KEY (room, sender)
) WITHOUT ROWID;
INSERT INTO room_usage (room, sender, turns)
	SELECT t.room, COALESCE(m.sender, ''), COUNT(*) FROM turns t LEFT JOIN messages m ON m.id = t.message_id
	WHERE t.ended_ns <> 0 GROUP BY 1, 2;
`,
	// 5: what each room's processes used, measured by its groups: CPU
	// time and processes summed over its turns, the highest peak of
	// memory (record.Compute).
	`
ALTER TABLE rooms ADD COLUMN cpu_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE rooms ADD COLUMN peak_memory_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rooms ADD COLUMN processes INTEGER NOT NULL DEFAULT 0;
`,
}

// SchemaVersion is the schema version this agenthost writes.
var SchemaVersion = len(migrations)

// migrate brings the schema to SchemaVersion, one transaction per step,
// and refuses a store from a newer agenthost.
func migrate(ctx context.Context, db *sql.DB) error {
	var v int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return fmt.Errorf("store: schema version: %w", err)
	}
	if v > len(migrations) {
		return fmt.Errorf("%w: version %d, this agenthost knows %d", ErrNewerSchema, v, len(migrations))
	}
	for ; v < len(migrations); v++ {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("store: migrate to %d: %w", v+1, err)
		}
		if _, err := tx.ExecContext(ctx, migrations[v]); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("store: migrate to %d: %w", v+1, err)
		}
		// PRAGMA takes no parameters; v+1 is our own integer.
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", v+1)); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("store: migrate to %d: %w", v+1, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("store: migrate to %d: %w", v+1, err)
		}
	}
	return nil
}
