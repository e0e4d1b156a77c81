package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/agenthost/agenthost/record"
)

func isNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// MaxEventsPage bounds one Events call (record.MaxPage).
const MaxEventsPage = record.MaxPage

// Events returns up to limit of the room's events after sequence number
// after, in order (limit <= 0 or over MaxEventsPage means MaxEventsPage).
// It reads committed events only, while writes go on.
func (db *DB) Events(ctx context.Context, room string, after int64, limit int) ([]Event, error) {
	if limit <= 0 || limit > MaxEventsPage {
		limit = MaxEventsPage
	}
	if evs, ok := db.recent.events(room, after, limit); ok {
		return evs, nil
	}
	rows, err := db.query(ctx,
		"SELECT seq, type, time_ns, data FROM events WHERE room = ? AND seq > ? ORDER BY seq LIMIT ?", room, after, limit)
	if err != nil {
		return nil, wrap("events", err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var ev Event
		var t int64
		var data []byte
		if err := rows.Scan(&ev.Seq, &ev.Type, &t, &data); err != nil {
			return nil, wrap("events", err)
		}
		ev.Room, ev.Time, ev.Data = room, fromNS(t), data
		out = append(out, ev)
	}
	return out, wrap("events", rows.Err())
}

// LastSeq is the room's last committed sequence number (0 for none).
func (db *DB) LastSeq(ctx context.Context, room string) (int64, error) {
	var s int64
	err := db.queryRow(ctx, "SELECT COALESCE(MAX(seq), 0) FROM events WHERE room = ?", room).Scan(&s)
	return s, wrap("last seq", err)
}

// Room returns a room's stored state, ErrNotFound for an unknown room.
// Its last sequence number and usage totals are read in one snapshot: the
// totals count exactly the turns whose turn.ended is at or before LastSeq.
func (db *DB) Room(ctx context.Context, id string) (Room, error) {
	r := Room{ID: id}
	err := db.snapshot(ctx, []string{roomQuery, usageQuery}, func(q snapReader) error {
		var created int64
		var cfg []byte
		err := q.queryRow(ctx, roomQuery, id).
			Scan(&created, &r.Agent, &r.SessionID, &cfg, &r.AgentProc, &r.AgentOffset, &r.AgentSeen,
				&r.Compute.CPUSeconds, &r.Compute.PeakMemoryBytes, &r.Compute.Processes, &r.LastSeq)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("store: room %q: %w", id, ErrNotFound)
		}
		if err != nil {
			return wrap("room", err)
		}
		r.Created, r.Config = fromNS(created), cfg
		byRoom, err := usage(ctx, q, id, id)
		if err != nil {
			return err
		}
		byRoom[id].fill(&r)
		return nil
	})
	if err != nil {
		return Room{}, err
	}
	return r, nil
}

// The queries of Room and RoomPage.
const (
	roomQuery = `SELECT created_ns, agent, session_id, config, agent_proc, agent_offset, agent_seen,
		cpu_seconds, peak_memory_bytes, processes,
		(SELECT COALESCE(MAX(seq), 0) FROM events WHERE room = rooms.id) FROM rooms WHERE id = ?`
	roomPageQuery = `SELECT id, created_ns, agent, session_id, config, agent_proc, agent_offset, agent_seen,
		cpu_seconds, peak_memory_bytes, processes,
		(SELECT COALESCE(MAX(seq), 0) FROM events WHERE room = rooms.id) FROM rooms WHERE id > ? ORDER BY id LIMIT ?`
	usageQuery = `SELECT room, sender, turns, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd
		FROM room_usage WHERE room >= ? AND room <= ?`
)

// roomUsage is one room's rows of room_usage.
type roomUsage map[string]SenderUsage

// fill sets r's totals from u.
func (u roomUsage) fill(r *Room) {
	r.Turns, r.Usage, r.UsageBySender = 0, Usage{}, map[string]SenderUsage{}
	for sender, s := range u {
		r.Turns += s.Turns
		r.Usage = r.Usage.Add(s.Usage)
		r.UsageBySender[sender] = s
	}
}

// usage reads the usage of the rooms whose ids are from first to last,
// by room: one range read of room_usage's key.
func usage(ctx context.Context, q snapReader, first, last string) (map[string]roomUsage, error) {
	rows, err := q.query(ctx, usageQuery, first, last)
	if err != nil {
		return nil, wrap("usage", err)
	}
	defer rows.Close()
	out := map[string]roomUsage{}
	for rows.Next() {
		var room, sender string
		var s SenderUsage
		if err := rows.Scan(&room, &sender, &s.Turns, &s.Usage.InputTokens, &s.Usage.OutputTokens, &s.Usage.CacheReadTokens,
			&s.Usage.CacheWriteTokens, &s.Usage.CostUSD); err != nil {
			return nil, wrap("usage", err)
		}
		if out[room] == nil {
			out[room] = roomUsage{}
		}
		out[room][sender] = s
	}
	return out, wrap("usage", rows.Err())
}

// RoomConfig returns the room's own settings as recorded by SetConfig
// (nil when it has none, or the room is unknown).
func (db *DB) RoomConfig(ctx context.Context, id string) (json.RawMessage, error) {
	var cfg []byte
	err := db.queryRow(ctx, "SELECT config FROM rooms WHERE id = ?", id).Scan(&cfg)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, wrap("room config", err)
	}
	if s := string(cfg); s == "" || s == "{}" || s == "null" {
		return nil, nil
	}
	return cfg, nil
}

// AgentRooms lists the rooms with a recorded agent handle (see
// Room.AgentProc), in order of id.
func (db *DB) AgentRooms(ctx context.Context) ([]Room, error) {
	rows, err := db.query(ctx, "SELECT id, agent, session_id, agent_proc, agent_offset, agent_seen FROM rooms WHERE agent_proc <> '' ORDER BY id")
	if err != nil {
		return nil, wrap("agent rooms", err)
	}
	defer rows.Close()
	var out []Room
	for rows.Next() {
		var r Room
		if err := rows.Scan(&r.ID, &r.Agent, &r.SessionID, &r.AgentProc, &r.AgentOffset, &r.AgentSeen); err != nil {
			return nil, wrap("agent rooms", err)
		}
		out = append(out, r)
	}
	return out, wrap("agent rooms", rows.Err())
}

// MaxRoomsPage is the largest page of rooms a caller should list.
const MaxRoomsPage = 1000

// RoomPage returns up to limit rooms whose id sorts after after, in order
// of id, each with its last sequence number. limit <= 0 means
// MaxRoomsPage; it is at most MaxRoomsPage+1, so that a caller can read
// its page and one more room to learn whether more follow. One query,
// whatever the room count.
func (db *DB) RoomPage(ctx context.Context, after string, limit int) ([]Room, error) {
	if limit <= 0 {
		limit = MaxRoomsPage
	}
	limit = min(limit, MaxRoomsPage+1)
	var out []Room
	// One snapshot, as Room: each room's totals agree with its LastSeq.
	err := db.snapshot(ctx, []string{roomPageQuery, usageQuery}, func(q snapReader) error {
		rows, err := q.query(ctx, roomPageQuery, after, limit)
		if err != nil {
			return wrap("rooms", err)
		}
		defer rows.Close()
		for rows.Next() {
			var r Room
			var created int64
			var cfg []byte
			if err := rows.Scan(&r.ID, &created, &r.Agent, &r.SessionID, &cfg, &r.AgentProc, &r.AgentOffset, &r.AgentSeen,
				&r.Compute.CPUSeconds, &r.Compute.PeakMemoryBytes, &r.Compute.Processes, &r.LastSeq); err != nil {
				return wrap("rooms", err)
			}
			r.Created, r.Config = fromNS(created), cfg
			out = append(out, r)
		}
		if err := rows.Err(); err != nil || len(out) == 0 {
			return wrap("rooms", err)
		}
		byRoom, err := usage(ctx, q, out[0].ID, out[len(out)-1].ID)
		if err != nil {
			return err
		}
		for i := range out {
			byRoom[out[i].ID].fill(&out[i])
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// RoomCount is the number of rooms the store holds.
func (db *DB) RoomCount(ctx context.Context) (int, error) {
	var n int
	err := db.queryRow(ctx, "SELECT COUNT(*) FROM rooms").Scan(&n)
	return n, wrap("rooms", err)
}

// RoomIDs lists the rooms' ids in order.
func (db *DB) RoomIDs(ctx context.Context) ([]string, error) {
	rows, err := db.query(ctx, "SELECT id FROM rooms ORDER BY id")
	if err != nil {
		return nil, wrap("rooms", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, wrap("rooms", err)
		}
		out = append(out, id)
	}
	return out, wrap("rooms", rows.Err())
}

const messageCols = `id, room, seq, sender, text, delivery, status, outcome, reason, turn_id, accepted_ns, started_ns, ended_ns`

func scanMessages(rows *sql.Rows, err error) ([]Message, error) {
	if err != nil {
		return nil, wrap("messages", err)
	}
	defer rows.Close()
	var out []Message
	for rows.Next() {
		var m Message
		var a, s, e int64
		if err := rows.Scan(&m.ID, &m.Room, &m.Seq, &m.Sender, &m.Text, &m.Delivery, &m.Status,
			&m.Outcome, &m.Reason, &m.TurnID, &a, &s, &e); err != nil {
			return nil, wrap("messages", err)
		}
		m.Accepted, m.Started, m.Ended = fromNS(a), fromNS(s), fromNS(e)
		out = append(out, m)
	}
	return out, wrap("messages", rows.Err())
}

// Messages returns the room's messages in order of acceptance, up to
// limit after the message accepted at seq after.
func (db *DB) Messages(ctx context.Context, room string, after int64, limit int) ([]Message, error) {
	if limit <= 0 || limit > MaxEventsPage {
		limit = MaxEventsPage
	}
	return scanMessages(db.query(ctx,
		"SELECT "+messageCols+" FROM messages WHERE room = ? AND seq > ? ORDER BY seq LIMIT ?", room, after, limit))
}

// Message returns one message of the room, ErrNotFound for an unknown one.
func (db *DB) Message(ctx context.Context, room, id string) (Message, error) {
	ms, err := scanMessages(db.query(ctx, "SELECT "+messageCols+" FROM messages WHERE id = ? AND room = ?", id, room))
	if err != nil {
		return Message{}, err
	}
	if len(ms) == 0 {
		return Message{}, fmt.Errorf("store: message %q: %w", id, ErrNotFound)
	}
	return ms[0], nil
}

// OpenMessages returns every message not yet ended, in every room, by
// room and order of acceptance: what a restarted host must finish.
func (db *DB) OpenMessages(ctx context.Context) ([]Message, error) {
	return scanMessages(db.query(ctx,
		"SELECT "+messageCols+" FROM messages WHERE status <> 'ended' ORDER BY room, seq"))
}

const turnCols = `id, room, message_id, outcome, reason, text, started_ns, ended_ns, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd`

func scanTurns(rows *sql.Rows, err error) ([]Turn, error) {
	if err != nil {
		return nil, wrap("turns", err)
	}
	defer rows.Close()
	var out []Turn
	for rows.Next() {
		var t Turn
		var s, e int64
		if err := rows.Scan(&t.ID, &t.Room, &t.MessageID, &t.Outcome, &t.Reason, &t.Text, &s, &e, &t.Usage.InputTokens,
			&t.Usage.OutputTokens, &t.Usage.CacheReadTokens, &t.Usage.CacheWriteTokens, &t.Usage.CostUSD); err != nil {
			return nil, wrap("turns", err)
		}
		t.Started, t.Ended = fromNS(s), fromNS(e)
		out = append(out, t)
	}
	return out, wrap("turns", rows.Err())
}

// Turns returns up to limit of the room's turns, in order of the message
// each consumed first, for the messages accepted after seq after: with
// Messages, the room's conversation without its event log.
func (db *DB) Turns(ctx context.Context, room string, after int64, limit int) ([]Turn, error) {
	if limit <= 0 || limit > MaxEventsPage {
		limit = MaxEventsPage
	}
	return scanTurns(db.query(ctx, `SELECT t.id, t.room, t.message_id, t.outcome, t.reason, t.text, t.started_ns, t.ended_ns,
		t.input_tokens, t.output_tokens, t.cache_read_tokens, t.cache_write_tokens, t.cost_usd FROM turns t JOIN messages m ON m.id = t.message_id WHERE t.room = ? AND m.seq > ? ORDER BY m.seq, t.started_ns LIMIT ?`, room, after, limit))
}

// OpenTurns returns the turns that started and never ended, in every room.
func (db *DB) OpenTurns(ctx context.Context) ([]Turn, error) {
	return scanTurns(db.query(ctx, "SELECT "+turnCols+" FROM turns WHERE ended_ns = 0 ORDER BY room, started_ns"))
}

// Approvals returns the room's approvals in order of creation (all rooms
// for room ""), only the pending ones if pending is set.
func (db *DB) Approvals(ctx context.Context, room string, pending bool) ([]Approval, error) {
	// Two shapes of query rather than one "(? = '' OR room = ?)", which
	// SQLite cannot answer from an index.
	q := "SELECT id, room, turn_id, tool, input, options, created_ns, deadline_ns, decision, by, resolved_ns FROM approvals WHERE 1"
	var args []any
	if room != "" {
		q += " AND room = ?"
		args = append(args, room)
	}
	if pending {
		q += " AND decision = ''"
	}
	rows, err := db.query(ctx, q+" ORDER BY created_ns, id", args...)
	if err != nil {
		return nil, wrap("approvals", err)
	}
	defer rows.Close()
	var out []Approval
	for rows.Next() {
		var a Approval
		var opts []byte
		var c, d, r int64
		if err := rows.Scan(&a.ID, &a.Room, &a.TurnID, &a.Tool, &a.Input, &opts, &c, &d, &a.Decision, &a.By, &r); err != nil {
			return nil, wrap("approvals", err)
		}
		if err := json.Unmarshal(opts, &a.Options); err != nil {
			return nil, wrap("approvals", err)
		}
		a.Created, a.Deadline, a.Resolved = fromNS(c), fromNS(d), fromNS(r)
		out = append(out, a)
	}
	return out, wrap("approvals", rows.Err())
}

// Questions returns the room's questions in order of creation (all rooms
// for room ""), only the pending ones if pending is set.
func (db *DB) Questions(ctx context.Context, room string, pending bool) ([]Question, error) {
	q := "SELECT id, room, turn_id, title, options, created_ns, deadline_ns, answer, by, answered_ns FROM questions WHERE 1"
	var args []any
	if room != "" {
		q += " AND room = ?"
		args = append(args, room)
	}
	if pending {
		q += " AND by = ''"
	}
	rows, err := db.query(ctx, q+" ORDER BY created_ns, id", args...)
	if err != nil {
		return nil, wrap("questions", err)
	}
	defer rows.Close()
	var out []Question
	for rows.Next() {
		var x Question
		var opts []byte
		var c, d, a int64
		if err := rows.Scan(&x.ID, &x.Room, &x.TurnID, &x.Title, &opts, &c, &d, &x.Answer, &x.By, &a); err != nil {
			return nil, wrap("questions", err)
		}
		if err := json.Unmarshal(opts, &x.Options); err != nil {
			return nil, wrap("questions", err)
		}
		x.Created, x.Deadline, x.Answered = fromNS(c), fromNS(d), fromNS(a)
		out = append(out, x)
	}
	return out, wrap("questions", rows.Err())
}

// Receipts returns the room's custody receipts, oldest first.
func (db *DB) Receipts(ctx context.Context, room string) ([]Receipt, error) {
	rows, err := db.query(ctx, "SELECT id, time_ns, receipt FROM receipts WHERE room = ? ORDER BY id", room)
	if err != nil {
		return nil, wrap("receipts", err)
	}
	defer rows.Close()
	var out []Receipt
	for rows.Next() {
		r := Receipt{Room: room}
		var t int64
		var raw []byte
		if err := rows.Scan(&r.ID, &t, &raw); err != nil {
			return nil, wrap("receipts", err)
		}
		r.Time, r.Receipt = fromNS(t), raw
		out = append(out, r)
	}
	return out, wrap("receipts", rows.Err())
}

// Exchanges returns up to limit of the room's messages accepted before
// seq before, newest first, each with its turn's final text ("" if none).
func (db *DB) Exchanges(ctx context.Context, room string, before int64, limit int) ([]Exchange, error) {
	if limit <= 0 || limit > MaxEventsPage {
		limit = MaxEventsPage
	}
	rows, err := db.query(ctx, `SELECT m.sender, m.text, COALESCE(t.text, '') FROM messages m
		LEFT JOIN turns t ON t.id = m.turn_id WHERE m.room = ? AND m.seq < ? ORDER BY m.seq DESC LIMIT ?`, room, before, limit)
	if err != nil {
		return nil, wrap("exchanges", err)
	}
	defer rows.Close()
	var out []Exchange
	for rows.Next() {
		var x Exchange
		if err := rows.Scan(&x.Sender, &x.Text, &x.Answer); err != nil {
			return nil, wrap("exchanges", err)
		}
		out = append(out, x)
	}
	return out, wrap("exchanges", rows.Err())
}
