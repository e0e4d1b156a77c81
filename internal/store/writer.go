package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// Writer makes the changes of one Write. It is valid only inside the
// function given to Write; everything it does commits together or not at
// all.
type Writer struct {
	tx *sql.Tx
	db *DB
	// rooms this write appended events to (notified after commit); taken
	// holds each room's cached sequence number before this write (-1: not
	// cached), to undo on rollback.
	rooms map[string]struct{}
	taken map[string]int64
	// appended holds the batch's events for the taps (see DB.Tap), kept
	// only while a tap is set.
	appended []Event
	tapped   bool
	// recent holds the batch's events, and its deletions of a room's
	// events, for DB.recent (added once the batch commits).
	recent []Event
	stmts  map[string]*sql.Stmt // prepared in this batch's transaction
}

func (w *Writer) exec(query string, args ...any) (sql.Result, error) {
	st, err := w.stmt(query)
	if err != nil {
		return nil, err
	}
	return st.Exec(args...)
}

// queryRow is QueryRow with the batch's prepared statement for query.
func (w *Writer) queryRow(query string, args ...any) *sql.Row {
	st, err := w.stmt(query)
	if err != nil {
		// A Row carrying the error: Scan returns it.
		return w.tx.QueryRowContext(context.Background(), query, args...)
	}
	return st.QueryRow(args...)
}

// stmt is the batch's statement for query: the writer's statement
// prepared once (see DB.prepareWanted), bound to this transaction, which
// runs it on the writer's connection without parsing it again; else one
// prepared for this batch. They close with the transaction.
func (w *Writer) stmt(query string) (*sql.Stmt, error) {
	if st, ok := w.stmts[query]; ok {
		return st, nil
	}
	var st *sql.Stmt
	if base, ok := w.db.wstmts[query]; ok {
		st = w.tx.StmtContext(context.Background(), base)
	} else {
		var err error
		if st, err = w.tx.PrepareContext(context.Background(), query); err != nil {
			return nil, err
		}
		if !slices.Contains(w.db.want, query) {
			w.db.want = append(w.db.want, query)
		}
	}
	if w.stmts == nil {
		w.stmts = map[string]*sql.Stmt{}
	}
	w.stmts[query] = st
	return st, nil
}

// EnsureRoom creates the room if it does not exist.
func (w *Writer) EnsureRoom(room string) error {
	_, err := w.seq(room)
	return err
}

// seq returns the room's last sequence number, creating the room if it
// is new.
func (w *Writer) seq(room string) (int64, error) {
	if s, ok := w.db.seqs[room]; ok {
		return s, nil
	}
	if _, err := w.exec("INSERT OR IGNORE INTO rooms (id, created_ns) VALUES (?, ?)", room, time.Now().UnixNano()); err != nil {
		return 0, fmt.Errorf("store: room: %w", err)
	}
	var s int64
	err := w.queryRow("SELECT COALESCE(MAX(seq), 0) FROM events WHERE room = ?", room).Scan(&s)
	if err != nil {
		return 0, fmt.Errorf("store: room: %w", err)
	}
	if _, ok := w.taken[room]; !ok {
		w.taken[room] = -1
	}
	w.db.seqs[room] = s
	return s, nil
}

// Append adds an event to the room's log (creating the room if needed)
// and returns it with its sequence number. data must marshal to a JSON
// object (nil for none).
func (w *Writer) Append(room, typ string, data any) (Event, error) {
	raw, err := encodeData(data)
	if err != nil {
		return Event{}, err
	}
	last, err := w.seq(room)
	if err != nil {
		return Event{}, err
	}
	ev := Event{Room: room, Seq: last + 1, Type: typ, Time: time.Now(), Data: raw}
	if _, err := w.exec("INSERT INTO events (room, seq, type, time_ns, data) VALUES (?, ?, ?, ?, ?)",
		room, ev.Seq, typ, ev.Time.UnixNano(), raw); err != nil {
		return Event{}, fmt.Errorf("store: append: %w", err)
	}
	if _, ok := w.taken[room]; !ok {
		w.taken[room] = last
	}
	w.db.seqs[room] = ev.Seq
	w.rooms[room] = struct{}{}
	if w.tapped {
		w.appended = append(w.appended, ev)
	}
	w.recent = append(w.recent, ev)
	return ev, nil
}

// SetSession records the room's agent and its session id.
func (w *Writer) SetSession(room, agent, sessionID string) error {
	if err := w.EnsureRoom(room); err != nil {
		return err
	}
	_, err := w.exec("UPDATE rooms SET agent = ?, session_id = ? WHERE id = ?", agent, sessionID, room)
	return wrap("set session", err)
}

// SetConfig records the room's own settings (JSON), creating the room.
func (w *Writer) SetConfig(room string, config json.RawMessage) error {
	if err := w.EnsureRoom(room); err != nil {
		return err
	}
	_, err := w.exec("UPDATE rooms SET config = ? WHERE id = ?", []byte(config), room)
	return wrap("set config", err)
}

// DeleteRoom deletes the room and everything recorded of it: a new room
// may then take its id (its events start at 1 again).
func (w *Writer) DeleteRoom(room string) error {
	for _, table := range []string{"events", "messages", "turns", "approvals", "questions", "receipts", "room_usage"} {
		if _, err := w.exec("DELETE FROM "+table+" WHERE room = ?", room); err != nil {
			return wrap("delete room", err)
		}
	}
	if _, err := w.exec("DELETE FROM rooms WHERE id = ?", room); err != nil {
		return wrap("delete room", err)
	}
	delete(w.db.seqs, room)
	w.recent = append(w.recent, Event{Room: room, Seq: deletedSeq})
	return nil
}

// SetAgentProc records the handle of the room's agent that outlives the
// host ("" when it has none), its output read from the start.
func (w *Writer) SetAgentProc(room, handle string) error {
	if err := w.EnsureRoom(room); err != nil {
		return err
	}
	_, err := w.exec("UPDATE rooms SET agent_proc = ?, agent_offset = 0, agent_seen = 0 WHERE id = ?", handle, room)
	return wrap("set agent proc", err)
}

// SetAgentOffset records, with this write, where a new host reads the
// room's agent's output from (offset) and up to where its events are
// recorded (seen). Neither moves back.
func (w *Writer) SetAgentOffset(room string, offset, seen int64) error {
	_, err := w.exec("UPDATE rooms SET agent_offset = MAX(agent_offset, ?), agent_seen = MAX(agent_seen, ?) WHERE id = ?", offset, seen, room)
	return wrap("set agent offset", err)
}

// PutMessage stores a new message.
func (w *Writer) PutMessage(m Message) error {
	if err := w.EnsureRoom(m.Room); err != nil {
		return err
	}
	_, err := w.exec(`INSERT INTO messages (id, room, seq, sender, text, delivery, status, outcome, reason, turn_id, accepted_ns, started_ns, ended_ns)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		m.ID, m.Room, m.Seq, m.Sender, m.Text, m.Delivery, m.Status, m.Outcome, m.Reason, m.TurnID,
		ns(m.Accepted), ns(m.Started), ns(m.Ended))
	return wrap("put message", err)
}

// UpdateMessage moves a message to status, recording its turn when it
// starts and its outcome when it ends.
func (w *Writer) UpdateMessage(id, status, turnID, outcome, reason string) error {
	now := time.Now().UnixNano()
	var res sql.Result
	var err error
	switch status {
	case MessageStarted:
		res, err = w.exec("UPDATE messages SET status = ?, turn_id = ?, started_ns = ? WHERE id = ?", status, turnID, now, id)
	case MessageEnded:
		res, err = w.exec(`UPDATE messages SET status = ?, turn_id = CASE WHEN ? = '' THEN turn_id ELSE ? END,
			outcome = ?, reason = ?, ended_ns = ? WHERE id = ?`, status, turnID, turnID, outcome, reason, now, id)
	default:
		res, err = w.exec("UPDATE messages SET status = ? WHERE id = ?", status, id)
	}
	return affected("update message", res, err)
}

// PutTurn stores a turn that started.
func (w *Writer) PutTurn(t Turn) error {
	_, err := w.exec("INSERT INTO turns (id, room, message_id, started_ns) VALUES (?, ?, ?, ?)",
		t.ID, t.Room, t.MessageID, ns(t.Started))
	return wrap("put turn", err)
}

// EndTurn records a turn's outcome and what it cost, and counts it in its
// room's totals under the sender of its message. A turn ends once: ending
// it again is ErrConflict.
func (w *Writer) EndTurn(id, outcome, reason, text string, u Usage) error {
	res, err := w.exec(`UPDATE turns SET outcome = ?, reason = ?, text = ?, ended_ns = ?, input_tokens = ?, output_tokens = ?,
		cache_read_tokens = ?, cache_write_tokens = ?, cost_usd = ? WHERE id = ? AND ended_ns = 0`,
		outcome, reason, text, time.Now().UnixNano(), u.InputTokens, u.OutputTokens, u.CacheReadTokens, u.CacheWriteTokens, u.CostUSD, id)
	if err := affectedOrConflict("end turn", res, err, w, "SELECT 1 FROM turns WHERE id = ?", id); err != nil {
		return err
	}
	_, err = w.exec(`INSERT INTO room_usage (room, sender, turns, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost_usd)
		SELECT t.room, COALESCE(m.sender, ''), 1, ?, ?, ?, ?, ? FROM turns t LEFT JOIN messages m ON m.id = t.message_id WHERE t.id = ?
		ON CONFLICT (room, sender) DO UPDATE SET turns = turns + 1, input_tokens = input_tokens + excluded.input_tokens,
			output_tokens = output_tokens + excluded.output_tokens, cache_read_tokens = cache_read_tokens + excluded.cache_read_tokens,
			cache_write_tokens = cache_write_tokens + excluded.cache_write_tokens, cost_usd = cost_usd + excluded.cost_usd`,
		u.InputTokens, u.OutputTokens, u.CacheReadTokens, u.CacheWriteTokens, u.CostUSD, id)
	return wrap("end turn", err)
}

// AddCompute counts what a turn's processes used in its room's totals
// (record.Room's Compute).
func (w *Writer) AddCompute(room string, c Compute) error {
	_, err := w.exec(`UPDATE rooms SET cpu_seconds = cpu_seconds + ?, peak_memory_bytes = MAX(peak_memory_bytes, ?),
		processes = processes + ? WHERE id = ?`, c.CPUSeconds, c.PeakMemoryBytes, c.Processes, room)
	return wrap("add compute", err)
}

// PutApproval stores a pending approval.
func (w *Writer) PutApproval(a Approval) error {
	opts, err := json.Marshal(a.Options)
	if err != nil {
		return wrap("put approval", err)
	}
	_, err = w.exec(`INSERT INTO approvals (id, room, turn_id, tool, input, options, created_ns, deadline_ns)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, a.ID, a.Room, a.TurnID, a.Tool, a.Input, opts, ns(a.Created), ns(a.Deadline))
	return wrap("put approval", err)
}

// ResolveApproval records a pending approval's decision: ErrNotFound for
// an unknown one, ErrConflict for one already resolved.
func (w *Writer) ResolveApproval(room, id, decision, by string) error {
	res, err := w.exec("UPDATE approvals SET decision = ?, by = ?, resolved_ns = ? WHERE id = ? AND room = ? AND decision = ''",
		decision, by, time.Now().UnixNano(), id, room)
	return affectedOrConflict("resolve approval", res, err, w, "SELECT 1 FROM approvals WHERE id = ? AND room = ?", id, room)
}

// PutQuestion stores a pending question.
func (w *Writer) PutQuestion(q Question) error {
	opts, err := json.Marshal(q.Options)
	if err != nil {
		return wrap("put question", err)
	}
	_, err = w.exec(`INSERT INTO questions (id, room, turn_id, title, options, created_ns, deadline_ns)
		VALUES (?, ?, ?, ?, ?, ?, ?)`, q.ID, q.Room, q.TurnID, q.Title, opts, ns(q.Created), ns(q.Deadline))
	return wrap("put question", err)
}

// AnswerQuestion records a pending question's answer (by says who or what
// answered: a person, the next message, the deadline): ErrNotFound for an
// unknown one, ErrConflict for one already answered.
func (w *Writer) AnswerQuestion(room, id, answer, by string) error {
	res, err := w.exec("UPDATE questions SET answer = ?, by = ?, answered_ns = ? WHERE id = ? AND room = ? AND by = ''",
		answer, by, time.Now().UnixNano(), id, room)
	return affectedOrConflict("answer question", res, err, w, "SELECT 1 FROM questions WHERE id = ? AND room = ?", id, room)
}

// PutReceipt records a custody receipt (a JSON value) for the room.
func (w *Writer) PutReceipt(room string, receipt json.RawMessage) (int64, error) {
	if !json.Valid(receipt) {
		return 0, fmt.Errorf("store: put receipt: not JSON")
	}
	res, err := w.exec("INSERT INTO receipts (room, time_ns, receipt) VALUES (?, ?, ?)", room, time.Now().UnixNano(), []byte(receipt))
	if err != nil {
		return 0, wrap("put receipt", err)
	}
	id, err := res.LastInsertId()
	return id, wrap("put receipt", err)
}

func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("store: %s: %w", op, err)
}

func affected(op string, res sql.Result, err error) error {
	if err != nil {
		return wrap(op, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return wrap(op, err)
	} else if n == 0 {
		return fmt.Errorf("store: %s: %w", op, ErrNotFound)
	}
	return nil
}

// affectedOrConflict tells a row that is missing (ErrNotFound) from one in
// the wrong state (ErrConflict) when a guarded update changed nothing.
func affectedOrConflict(op string, res sql.Result, err error, w *Writer, exists string, args ...any) error {
	if err := affected(op, res, err); err == nil || !isNotFound(err) {
		return err
	}
	var one int
	if err := w.queryRow(exists, args...).Scan(&one); err == sql.ErrNoRows {
		return fmt.Errorf("store: %s: %w", op, ErrNotFound)
	} else if err != nil {
		return wrap(op, err)
	}
	return fmt.Errorf("store: %s: %w", op, ErrConflict)
}
