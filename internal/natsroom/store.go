package natsroom

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// Names in JetStream.
const (
	StreamRooms = "ROOMS" // rooms.<id>.ev (the log) and rooms.<id>.in (the inbox)
	StreamWake  = "WAKE"  // wake.<id>, coalescing work queue
	BucketLease = "room_lease"
	BucketLoad  = "room_workers"
	Dispatch    = "dispatch"

	hdrRoomSeq  = "Room-Seq"
	hdrEpoch    = "Room-Epoch"
	evTakeover  = "takeover"
	maxBatchLen = 1 << 20
)

var (
	// ErrFenced is returned (wrapped, with room.ErrNotHeld) by a write
	// the log refused: another host took the room over.
	ErrFenced = errors.New("natsroom: log append fenced: another host took the room over")
	// ErrLeaseExpired is returned (wrapped, with room.ErrNotHeld) by a
	// write after this host's own lease deadline passed.
	ErrLeaseExpired = errors.New("natsroom: lease deadline passed")
)

// token encodes a room id as one subject token and KV key (room ids may
// hold characters neither allows).
func token(room string) string { return base64.RawURLEncoding.EncodeToString([]byte(room)) }

func untoken(t string) (string, bool) {
	b, err := base64.RawURLEncoding.DecodeString(t)
	return string(b), err == nil
}

func evSubject(room string) string { return "rooms." + token(room) + ".ev" }
func inSubject(room string) string { return "rooms." + token(room) + ".in" }

// Core subjects that say an append is stored: a room's log, its inbox.
func evSignal(room string) string { return "agenthost.ev." + token(room) }
func inSignal(room string) string { return "agenthost.in." + token(room) }
func wakeSubject(room string) string {
	return "wake." + token(room)
}

// isWrongLastSeq: a CAS conflict (10071, or 10164 on a replicated stream
// while another write is in flight).
func isWrongLastSeq(err error) bool {
	var ae *jetstream.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			ae.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return false
}

// Store is room.Store over the ROOMS stream. Reads serve any room (a
// room's records are folded from its log and cached); writes only for
// rooms this host took over, each write one append fenced by the last
// sequence this host wrote to the room's log.
type Store struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	node  string
	fence func(room string, err error) // called once a write is fenced

	// Lock order: a roomLog's mu before mu; mu is held only briefly and
	// never while taking a roomLog's mu.
	mu     sync.Mutex
	rooms  map[string]*roomLog
	stream jetstream.Stream // ROOMS, looked up once
	// msgRoom and turnRoom find the room of a message or turn id (the
	// Tx updates them by id alone).
	msgRoom, turnRoom map[string]string
}

// reqTimeout bounds one JetStream request: a request sent to a stream
// leader cut off by a partition gets no answer, and the caller retries
// (the next leader answers after an election).
const reqTimeout = 5 * time.Second

// rooms returns the ROOMS stream's handle.
func (s *Store) roomsStream(ctx context.Context) (jetstream.Stream, error) {
	s.mu.Lock()
	st := s.stream
	s.mu.Unlock()
	if st != nil {
		return st, nil
	}
	ctx, cancel := context.WithTimeout(ctx, reqTimeout)
	defer cancel()
	st, err := s.js.Stream(ctx, StreamRooms)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.stream = st
	s.mu.Unlock()
	return st, nil
}

// getMsg is one bounded read of the ROOMS stream.
func (s *Store) getMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	st, err := s.roomsStream(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, reqTimeout)
	defer cancel()
	return st.GetMsg(ctx, seq, opts...)
}

type roomLog struct {
	mu    sync.Mutex
	f     *fold
	last  uint64     // stream sequence of the last batch folded
	index []batchRef // batches with events, in order

	// owner side
	owned    bool
	epoch    uint64
	deadline func() time.Time // the lease's local deadline
	inboxAt  uint64           // an inbox cursor to record with the next batch

	used time.Time // last asked for (under Store.mu): see evictIdle
}

type batchRef struct {
	first, last int64 // room sequences
	seq         uint64
}

func newStore(nc *nats.Conn, js jetstream.JetStream, node string) *Store {
	return &Store{nc: nc, js: js, node: node, rooms: map[string]*roomLog{}, msgRoom: map[string]string{}, turnRoom: map[string]string{}}
}

func (s *Store) log(room string) *roomLog {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.rooms[room]
	if l == nil {
		l = &roomLog{f: newFold(room)}
		s.rooms[room] = l
	}
	l.used = time.Now()
	return l
}

// evictIdle drops the folds of the rooms this host does not hold and
// nobody asked for within idle, with their id index entries: a front end
// would otherwise keep every room it ever served (tens of KiB each) for
// its whole life. A dropped room is folded again from its log when next
// asked for. It returns how many it dropped.
func (s *Store) evictIdle(idle time.Duration) int {
	cutoff := time.Now().Add(-idle)
	s.mu.Lock()
	var old []*roomLog
	for _, l := range s.rooms {
		if l.used.Before(cutoff) {
			old = append(old, l)
		}
	}
	s.mu.Unlock()
	n := 0
	for _, l := range old {
		// Lock order: the room's, then the store's. A log() that handed
		// l out since renewed its use, and l stays.
		l.mu.Lock()
		if !l.owned && l.inboxAt == 0 {
			rm := l.f.room.ID
			s.mu.Lock()
			if s.rooms[rm] == l && l.used.Before(cutoff) {
				delete(s.rooms, rm)
				for id := range l.f.msgIdx {
					if s.msgRoom[id] == rm {
						delete(s.msgRoom, id)
					}
				}
				for id := range l.f.turnIdx {
					if s.turnRoom[id] == rm {
						delete(s.turnRoom, id)
					}
				}
				n++
			}
			s.mu.Unlock()
		}
		l.mu.Unlock()
	}
	return n
}

// cached is how many rooms' folds the store keeps.
func (s *Store) cached() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.rooms)
}

// decode reads a stored batch.
func decode(m *jetstream.RawStreamMsg) (*batch, error) {
	var b batch
	if err := json.Unmarshal(m.Data, &b); err != nil {
		return nil, fmt.Errorf("natsroom: log entry %d: %w", m.Sequence, err)
	}
	return &b, nil
}

// syncLocked folds the room's log entries after l.last (the owner's own
// fold is always current).
func (s *Store) syncLocked(ctx context.Context, room string, l *roomLog) error {
	if l.owned {
		return nil
	}
	subj := evSubject(room)
	for {
		m, err := s.getMsg(ctx, l.last+1, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("natsroom: reading the log: %w", err)
		}
		b, err := decode(m)
		if err != nil {
			return err
		}
		l.addLocked(b, m.Sequence)
		s.index(room, b)
	}
}

// index records the rooms of the messages and turns b puts.
func (s *Store) index(rm string, b *batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range b.Ops {
		switch {
		case o.K == opPutMsg && o.Message != nil:
			s.msgRoom[o.Message.ID] = rm
		case o.K == opPutTurn && o.Turn != nil:
			s.turnRoom[o.Turn.ID] = rm
		}
	}
}

func (l *roomLog) addLocked(b *batch, seq uint64) {
	l.f.add(b)
	if n := len(b.Events); n > 0 {
		l.index = append(l.index, batchRef{first: b.Events[0].Seq, last: b.Events[n-1].Seq, seq: seq})
	}
	l.last = seq
}

// read runs fn on the room's current fold.
func (s *Store) read(ctx context.Context, room string, fn func(f *fold)) error {
	l := s.log(room)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := s.syncLocked(ctx, room, l); err != nil {
		return err
	}
	fn(l.f)
	return nil
}

// Events implements room.Store: the room's events after seq after, read
// from the log.
func (s *Store) Events(ctx context.Context, room string, after int64, limit int) ([]store.Event, error) {
	if limit <= 0 || limit > store.MaxEventsPage {
		limit = store.MaxEventsPage
	}
	l := s.log(room)
	l.mu.Lock()
	if err := s.syncLocked(ctx, room, l); err != nil {
		l.mu.Unlock()
		return nil, err
	}
	i := sort.Search(len(l.index), func(i int) bool { return l.index[i].last > after })
	refs := slices.Clone(l.index[i:])
	l.mu.Unlock()
	if len(refs) == 0 {
		return nil, nil
	}
	var out []store.Event
	for _, r := range refs {
		m, err := s.getMsg(ctx, r.seq)
		if err != nil {
			return nil, fmt.Errorf("natsroom: reading the log: %w", err)
		}
		b, err := decode(m)
		if err != nil {
			return nil, err
		}
		for _, e := range b.Events {
			if e.Seq <= after {
				continue
			}
			out = append(out, store.Event{Room: room, Seq: e.Seq, Type: e.Type, Time: time.Unix(0, e.Time), Data: e.Data})
			if len(out) == limit {
				return out, nil
			}
		}
	}
	return out, nil
}

// Watch implements room.Store: a signal per append to the room's log.
func (s *Store) Watch(room string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	sub, err := s.nc.Subscribe(evSignal(room), func(*nats.Msg) {
		select {
		case ch <- struct{}{}:
		default:
		}
	})
	if err != nil {
		// The caller rereads on its heartbeat; a closed connection ends
		// the server anyway.
		return ch, func() {}
	}
	return ch, func() { _ = sub.Unsubscribe() }
}

// Room implements room.Store.
func (s *Store) Room(ctx context.Context, id string) (store.Room, error) {
	var r store.Room
	var ok bool
	err := s.read(ctx, id, func(f *fold) { r, ok = f.room, f.exists })
	if err != nil {
		return store.Room{}, err
	}
	if !ok {
		return store.Room{}, fmt.Errorf("store: room %q: %w", id, store.ErrNotFound)
	}
	return r, nil
}

// RoomIDs implements room.Store: every room with a log.
func (s *Store) RoomIDs(ctx context.Context) ([]string, error) {
	st, err := s.roomsStream(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, reqTimeout)
	defer cancel()
	info, err := st.Info(ctx, jetstream.WithSubjectFilter("rooms.*.ev"))
	if err != nil {
		return nil, err
	}
	var ids []string
	for subj := range info.State.Subjects {
		if len(subj) > len("rooms.")+len(".ev") {
			if id, ok := untoken(subj[len("rooms.") : len(subj)-len(".ev")]); ok {
				ids = append(ids, id)
			}
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// Messages implements room.Store.
func (s *Store) Messages(ctx context.Context, room string, after int64, limit int) ([]store.Message, error) {
	if limit <= 0 || limit > store.MaxEventsPage {
		limit = store.MaxEventsPage
	}
	var out []store.Message
	err := s.read(ctx, room, func(f *fold) {
		for _, m := range f.msgs {
			if m.Seq > after && len(out) < limit {
				out = append(out, m)
			}
		}
	})
	return out, err
}

// Exchanges implements room.Store.
func (s *Store) Exchanges(ctx context.Context, room string, before int64, limit int) ([]store.Exchange, error) {
	var out []store.Exchange
	err := s.read(ctx, room, func(f *fold) {
		for i := len(f.msgs) - 1; i >= 0 && len(out) < limit; i-- {
			m := f.msgs[i]
			if m.Seq >= before {
				continue
			}
			x := store.Exchange{Sender: m.Sender, Text: m.Text}
			if j, ok := f.turnIdx[m.TurnID]; ok {
				x.Answer = f.turns[j].Text
			}
			out = append(out, x)
		}
	})
	return out, err
}

// owned lists the rooms this host took over.
func (s *Store) owned() []*roomLog {
	s.mu.Lock()
	all := make([]*roomLog, 0, len(s.rooms))
	for _, l := range s.rooms {
		all = append(all, l)
	}
	s.mu.Unlock()
	var out []*roomLog
	for _, l := range all {
		l.mu.Lock()
		if l.owned {
			out = append(out, l)
		}
		l.mu.Unlock()
	}
	return out
}

// OpenMessages implements room.Store, for the rooms this host holds.
func (s *Store) OpenMessages(ctx context.Context) ([]store.Message, error) {
	var out []store.Message
	for _, l := range s.owned() {
		l.mu.Lock()
		for _, m := range l.f.msgs {
			if m.Status != store.MessageEnded {
				out = append(out, m)
			}
		}
		l.mu.Unlock()
	}
	return out, nil
}

// OpenTurns implements room.Store, for the rooms this host holds.
func (s *Store) OpenTurns(ctx context.Context) ([]store.Turn, error) {
	var out []store.Turn
	for _, l := range s.owned() {
		l.mu.Lock()
		for _, t := range l.f.turns {
			if t.Ended.IsZero() {
				out = append(out, t)
			}
		}
		l.mu.Unlock()
	}
	return out, nil
}

// Approvals implements room.Store (room "" is every room this host holds).
func (s *Store) Approvals(ctx context.Context, room string, pending bool) ([]store.Approval, error) {
	var out []store.Approval
	pick := func(f *fold) {
		for _, a := range f.approvals {
			if !pending || a.Decision == "" {
				out = append(out, a)
			}
		}
	}
	if room == "" {
		for _, l := range s.owned() {
			l.mu.Lock()
			pick(l.f)
			l.mu.Unlock()
		}
		return out, nil
	}
	return out, s.read(ctx, room, pick)
}

// Questions implements room.Store (room "" is every room this host holds).
func (s *Store) Questions(ctx context.Context, room string, pending bool) ([]store.Question, error) {
	var out []store.Question
	pick := func(f *fold) {
		for _, q := range f.questions {
			if !pending || q.By == "" {
				out = append(out, q)
			}
		}
	}
	if room == "" {
		for _, l := range s.owned() {
			l.mu.Lock()
			pick(l.f)
			l.mu.Unlock()
		}
		return out, nil
	}
	return out, s.read(ctx, room, pick)
}

// Status implements room.StatusStore: the running turn, the queue and
// residency as the room's log shows them.
func (s *Store) Status(ctx context.Context, rm string) (*room.TurnRef, int, bool, error) {
	var turn *room.TurnRef
	var queued int
	var resident bool
	err := s.read(ctx, rm, func(f *fold) {
		if t := f.running(); t != nil {
			turn = &room.TurnRef{ID: t.ID, MessageID: t.MessageID}
		}
		queued, resident = f.queued(), f.resident
	})
	return turn, queued, resident, err
}

// inboxCursor is the last inbox sequence the room's log records.
func (s *Store) inboxCursor(room string) uint64 {
	l := s.log(room)
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(l.f.inbox, l.inboxAt)
}

// inboxPending counts the room's inbox entries past cursor: none when the
// last entry is at or before it, else every entry the inbox holds (taken
// entries are purged, so at most the one being taken is counted twice).
func (s *Store) inboxPending(ctx context.Context, rm string, cursor uint64) (int, error) {
	st, err := s.roomsStream(ctx)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, reqTimeout)
	defer cancel()
	last, err := st.GetLastMsgForSubject(ctx, inSubject(rm))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if last.Sequence <= cursor {
		return 0, nil
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(inSubject(rm)))
	if err != nil {
		return 0, err
	}
	return int(info.State.Subjects[inSubject(rm)]), nil
}

// takeInbox records seq as taken with the room's next write.
func (s *Store) takeInbox(room string, seq uint64) {
	l := s.log(room)
	l.mu.Lock()
	l.inboxAt = max(l.inboxAt, seq)
	l.mu.Unlock()
}

// takeover makes this host the room's writer for epoch: it folds the
// whole log and appends takeover{epoch, node} over the last entry, so
// that any later append of the previous holder fails.
func (s *Store) takeover(ctx context.Context, rm string, epoch uint64, deadline func() time.Time) error {
	l := s.log(rm)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.owned = false
	for attempt := 0; ; attempt++ {
		if err := s.syncLocked(ctx, rm, l); err != nil {
			return err
		}
		l.epoch, l.deadline, l.owned = epoch, deadline, true
		b := &batch{Epoch: epoch, Node: s.node}
		data, _ := json.Marshal(map[string]any{"epoch": epoch, "node": s.node})
		b.Events = []evRec{{Seq: l.f.room.LastSeq + 1, Type: evTakeover, Time: time.Now().UnixNano(), Data: data}}
		err := s.appendLocked(ctx, rm, l, b)
		if err == nil {
			return nil
		}
		l.owned = false
		if !errors.Is(err, ErrFenced) || attempt == 3 {
			return err
		}
		// A stale read or a concurrent writer: read again. The lease
		// keeps a second taker out; a zombie writer loses the next CAS.
	}
}

// disown stops writing the room (lost or given-up lease); reads go on.
func (s *Store) disown(room string) {
	l := s.log(room)
	l.mu.Lock()
	l.owned = false
	l.inboxAt = 0
	l.mu.Unlock()
}

func (s *Store) holds(room string) bool {
	l := s.log(room)
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.owned
}

// appendLocked publishes b as the room's next log entry, fenced by the
// last sequence this host folded; on success it folds b.
func (s *Store) appendLocked(ctx context.Context, rm string, l *roomLog, b *batch) error {
	if !l.owned {
		return fmt.Errorf("%w: %q", room.ErrNotHeld, rm)
	}
	if l.deadline != nil && !time.Now().Before(l.deadline()) {
		return fmt.Errorf("%w: %w", room.ErrNotHeld, ErrLeaseExpired)
	}
	if l.inboxAt > l.f.inbox {
		b.Ops = append(b.Ops, op{K: opInboxCur, Inbox: l.inboxAt})
	}
	data, err := json.Marshal(b)
	if err != nil {
		return err
	}
	if len(data) > maxBatchLen {
		return fmt.Errorf("natsroom: one write of %d bytes is over the %d-byte log entry limit", len(data), maxBatchLen)
	}
	lastSeq := l.f.room.LastSeq
	if n := len(b.Events); n > 0 {
		lastSeq = b.Events[n-1].Seq
	}
	msg := &nats.Msg{Subject: evSubject(rm), Data: data, Header: nats.Header{}}
	msg.Header.Set(hdrRoomSeq, strconv.FormatInt(lastSeq, 10))
	msg.Header.Set(hdrEpoch, strconv.FormatUint(l.epoch, 10))
	msgID := fmt.Sprintf("%s.%d.%d", token(rm), l.epoch, l.last)
	var ack *jetstream.PubAck
	for attempt := 0; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, reqTimeout)
		ack, err = s.js.PublishMsg(pctx, msg, jetstream.WithExpectLastSequencePerSubject(l.last), jetstream.WithMsgID(msgID))
		cancel()
		if err == nil {
			break
		}
		if isWrongLastSeq(err) {
			// A retry of our own append that landed (R1 checks the
			// expected sequence before the duplicate window) is a success.
			if m, gerr := s.lastMsg(ctx, rm); gerr == nil && m.Header.Get(nats.MsgIdHdr) == msgID {
				ack = &jetstream.PubAck{Sequence: m.Sequence}
				break
			}
			l.owned = false
			if s.fence != nil {
				s.fence(rm, err)
			}
			return fmt.Errorf("%w: %w: %w", room.ErrNotHeld, ErrFenced, err)
		}
		if attempt == 2 || ctx.Err() != nil {
			return fmt.Errorf("natsroom: appending to the log: %w", err)
		}
	}
	l.addLocked(b, ack.Sequence)
	s.index(rm, b)
	l.inboxAt = 0
	// Watchers hear of the append only once it is stored (a subscriber
	// to the log subject itself may hear it before a read finds it).
	_ = s.nc.Publish(evSignal(rm), nil)
	return nil
}

func (s *Store) lastMsg(ctx context.Context, rm string) (*jetstream.RawStreamMsg, error) {
	st, err := s.roomsStream(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, reqTimeout)
	defer cancel()
	return st.GetLastMsgForSubject(ctx, evSubject(rm))
}

// Write implements room.Store: fn's changes to each room become one
// fenced log append (a write touching two rooms is two appends).
func (s *Store) Write(ctx context.Context, fn func(tx room.Tx) error) error {
	t := &tx{s: s, rooms: map[string]*txRoom{}}
	defer t.unlock()
	if err := fn(t); err != nil {
		return err
	}
	for _, rm := range t.order {
		r := t.rooms[rm]
		if len(r.b.Events) == 0 && len(r.b.Ops) == 0 {
			continue
		}
		if err := s.appendLocked(ctx, rm, r.l, r.b); err != nil {
			return err
		}
	}
	return nil
}

// tx is one Write: per room, the log is locked, the fold cloned, and the
// changes collected into one batch.
type tx struct {
	s     *Store
	rooms map[string]*txRoom
	order []string
}

type txRoom struct {
	l *roomLog
	f *fold
	b *batch
}

func (t *tx) unlock() {
	for _, r := range t.rooms {
		r.l.mu.Unlock()
	}
}

func (t *tx) room(rm string) (*txRoom, error) {
	if r := t.rooms[rm]; r != nil {
		return r, nil
	}
	l := t.s.log(rm)
	l.mu.Lock()
	if !l.owned {
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: %q", room.ErrNotHeld, rm)
	}
	r := &txRoom{l: l, f: l.f.clone(), b: &batch{Epoch: l.epoch, Node: t.s.node}}
	t.rooms[rm] = r
	t.order = append(t.order, rm)
	return r, nil
}

func (t *tx) op(rm string, o op) error {
	r, err := t.room(rm)
	if err != nil {
		return err
	}
	o.Time = time.Now().UnixNano()
	if err := r.f.apply(o); err != nil {
		return err
	}
	r.b.Ops = append(r.b.Ops, o)
	return nil
}

func (t *tx) Append(rm, typ string, data any) (store.Event, error) {
	r, err := t.room(rm)
	if err != nil {
		return store.Event{}, err
	}
	raw, err := encodeData(data)
	if err != nil {
		return store.Event{}, err
	}
	e := evRec{Seq: r.f.room.LastSeq + 1, Type: typ, Time: time.Now().UnixNano(), Data: raw}
	r.f.event(e)
	r.b.Events = append(r.b.Events, e)
	return store.Event{Room: rm, Seq: e.Seq, Type: typ, Time: time.Unix(0, e.Time), Data: raw}, nil
}

func (t *tx) SetSession(rm, agent, sessionID string) error {
	return t.op(rm, op{K: opSession, Agent: agent, ID: sessionID})
}

func (t *tx) PutMessage(m store.Message) error { return t.op(m.Room, op{K: opPutMsg, Message: &m}) }

func (t *tx) UpdateMessage(id, status, turnID, outcome, reason string) error {
	// The message's room is found among the rooms this write touches or
	// this host holds.
	rm := t.s.roomOfMessage(t, id)
	if rm == "" {
		return fmt.Errorf("store: update message: %w", store.ErrNotFound)
	}
	return t.op(rm, op{K: opMsg, ID: id, Status: status, TurnID: turnID, Outcome: outcome, Reason: reason})
}

func (t *tx) PutTurn(tr store.Turn) error { return t.op(tr.Room, op{K: opPutTurn, Turn: &tr}) }

func (t *tx) EndTurn(id, outcome, reason, text string) error {
	rm := t.s.roomOfTurn(t, id)
	if rm == "" {
		return fmt.Errorf("store: end turn: %w", store.ErrNotFound)
	}
	return t.op(rm, op{K: opEndTurn, ID: id, Outcome: outcome, Reason: reason, Text: text})
}

func (t *tx) PutApproval(a store.Approval) error { return t.op(a.Room, op{K: opPutAppr, Approval: &a}) }

func (t *tx) ResolveApproval(rm, id, decision, by string) error {
	return t.op(rm, op{K: opResolve, ID: id, Status: decision, By: by})
}

func (t *tx) PutQuestion(q store.Question) error { return t.op(q.Room, op{K: opPutQ, Question: &q}) }

func (t *tx) AnswerQuestion(rm, id, answer, by string) error {
	return t.op(rm, op{K: opAnswer, ID: id, Text: answer, By: by})
}

func (t *tx) PutReceipt(rm string, receipt json.RawMessage) (int64, error) {
	if !json.Valid(receipt) {
		return 0, errors.New("store: put receipt: not JSON")
	}
	if err := t.op(rm, op{K: opReceipt}); err != nil {
		return 0, err
	}
	return int64(t.rooms[rm].f.receipts), nil
}

// roomOfMessage finds a message's room: among the rooms the write holds
// (a message it just put), else from the index.
func (s *Store) roomOfMessage(t *tx, id string) string {
	for _, rm := range t.order {
		if _, ok := t.rooms[rm].f.msgIdx[id]; ok {
			return rm
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.msgRoom[id]
}

func (s *Store) roomOfTurn(t *tx, id string) string {
	for _, rm := range t.order {
		if _, ok := t.rooms[rm].f.turnIdx[id]; ok {
			return rm
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.turnRoom[id]
}

// encodeData is store's rule: event data is a JSON object.
func encodeData(data any) (json.RawMessage, error) {
	var raw []byte
	switch d := data.(type) {
	case nil:
		return json.RawMessage("{}"), nil
	case json.RawMessage:
		raw = d
	case []byte:
		raw = d
	default:
		var err error
		if raw, err = json.Marshal(data); err != nil {
			return nil, fmt.Errorf("store: event data: %w", err)
		}
	}
	if len(raw) < 2 || raw[0] != '{' || !json.Valid(raw) {
		return nil, errors.New("store: event data is not a JSON object")
	}
	return raw, nil
}

// errDetachedAgents: a cluster does not keep agents across a host's
// restart (serve refuses --daemon with NATS); a room that moves starts its
// agent afresh on its new holder.
var errDetachedAgents = errors.New("natsroom: agents that outlive their host are not kept in a cluster")

// AgentRooms lists no room: see errDetachedAgents.
func (s *Store) AgentRooms(ctx context.Context) ([]store.Room, error) { return nil, nil }

// SetAgentProc is refused: see errDetachedAgents.
func (t *tx) SetAgentProc(rm, handle string) error { return errDetachedAgents }

// SetAgentOffset is refused: see errDetachedAgents.
func (t *tx) SetAgentOffset(rm string, offset, seen int64) error { return errDetachedAgents }
