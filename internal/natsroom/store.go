package natsroom

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	BucketWork  = "room_work"
	// BucketSettings holds each room's own settings (room.SettingsStore):
	// any node writes them, outside the room's log, so that a room no
	// node holds can be configured; its holder reads them before each
	// turn.
	BucketSettings = "room_settings"
	Dispatch       = "dispatch"

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
	// unclear counts appends whose first answer was lost and which the
	// log then showed stored.
	unclear atomic.Int64
	logger  *slog.Logger

	settingsMu sync.Mutex
	settings   jetstream.KeyValue // BucketSettings, looked up once
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

// getMsg is one bounded read of the ROOMS stream from the nearest replica
// (a direct get: any replica answers, so reads go on while the stream
// elects a leader, but one may lag the leader by a few writes). A read no
// replica answers within directWait (the nearest one paused, its routes
// still up) goes to the leader.
func (s *Store) getMsg(ctx context.Context, req msgGetReq) (*jetstream.RawStreamMsg, error) {
	st, err := s.roomsStream(ctx)
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, directWait)
	defer cancel()
	var m *jetstream.RawStreamMsg
	if req.NextBySubj != "" {
		m, err = st.GetMsg(dctx, req.Seq, jetstream.WithGetMsgSubject(req.NextBySubj))
	} else {
		m, err = st.GetMsg(dctx, req.Seq)
	}
	if ctx.Err() == nil && unanswered(err) {
		return s.getLeader(ctx, req)
	}
	return m, err
}

// unanswered: a direct read no replica answered.
func unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

// directWait bounds a direct read's wait for the nearest replica.
const directWait = 2 * time.Second

// getRun reads up to batchRead entries of subj from seq on, in one
// request to the nearest replica (a room's history is folded a run at a
// time, not an entry per request); one no replica answers goes to the
// leader, for one entry. No entry: jetstream.ErrMsgNotFound.
func (s *Store) getRun(ctx context.Context, seq uint64, subj string) ([]*jetstream.RawStreamMsg, error) {
	ms, err := s.directRun(ctx, seq, subj)
	if ctx.Err() == nil && unanswered(err) {
		m, err := s.getLeader(ctx, msgGetReq{Seq: seq, NextBySubj: subj})
		if err != nil {
			return nil, err
		}
		return []*jetstream.RawStreamMsg{m}, nil
	}
	return ms, err
}

// batchRead bounds one run of getRun (and batchBytes its size).
const (
	batchRead  = 256
	batchBytes = 8 << 20
)

// directRun is a batched direct get: the replica answers with each entry,
// then an end-of-batch status.
func (s *Store) directRun(ctx context.Context, seq uint64, subj string) ([]*jetstream.RawStreamMsg, error) {
	inbox := s.nc.NewRespInbox()
	sub, err := s.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	body, _ := json.Marshal(map[string]any{"seq": seq, "next_by_subj": subj, "batch": batchRead, "max_bytes": batchBytes})
	if err := s.nc.PublishRequest("$JS.API.DIRECT.GET."+StreamRooms, inbox, body); err != nil {
		return nil, err
	}
	var out []*jetstream.RawStreamMsg
	for {
		// The first answer within directWait; the rest follow at once.
		wait := directWait
		if len(out) > 0 {
			wait = reqTimeout
		}
		mctx, cancel := context.WithTimeout(ctx, wait)
		m, err := sub.NextMsgWithContext(mctx)
		cancel()
		if err != nil {
			if len(out) > 0 && ctx.Err() == nil {
				return out, nil // the rest: the next run
			}
			return nil, err
		}
		if len(m.Data) == 0 && m.Header.Get("Status") != "" {
			switch m.Header.Get("Status") {
			case "204": // end of batch
				return out, nil
			case "404":
				if len(out) > 0 {
					return out, nil
				}
				return nil, jetstream.ErrMsgNotFound
			case "503":
				return nil, nats.ErrNoResponders
			default:
				return nil, fmt.Errorf("natsroom: reading the log: %s %s", m.Header.Get("Status"), m.Header.Get("Description"))
			}
		}
		sq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("natsroom: reading the log: an entry without its sequence")
		}
		out = append(out, &jetstream.RawStreamMsg{Subject: m.Header.Get(jetstream.SubjectHeader), Sequence: sq, Header: m.Header, Data: m.Data})
	}
}

// msgGetReq is JetStream's message get request.
type msgGetReq struct {
	Seq        uint64 `json:"seq,omitempty"`
	LastBySubj string `json:"last_by_subj,omitempty"`
	NextBySubj string `json:"next_by_subj,omitempty"`
}

// getLeader is one bounded read of the ROOMS stream from its leader, which
// has every acknowledged write (a writer resolving its own append, a new
// holder taking the log over, the holder reading its inbox).
func (s *Store) getLeader(ctx context.Context, req msgGetReq) (*jetstream.RawStreamMsg, error) {
	return leaderGet(ctx, s.nc, StreamRooms, req)
}

// leaderGet reads one message of stream from its leader.
func leaderGet(ctx context.Context, nc *nats.Conn, stream string, req msgGetReq) (*jetstream.RawStreamMsg, error) {
	body, _ := json.Marshal(req)
	ctx, cancel := context.WithTimeout(ctx, reqTimeout)
	defer cancel()
	resp, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, err
	}
	var r struct {
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Hdrs    []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, fmt.Errorf("natsroom: reading %s: %w", stream, err)
	}
	switch {
	case r.Error != nil && r.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrMsgNotFound
	case r.Error != nil:
		return nil, r.Error
	case r.Message == nil:
		return nil, jetstream.ErrInvalidJetStreamResponse
	}
	m := &jetstream.RawStreamMsg{Subject: r.Message.Subject, Sequence: r.Message.Seq, Data: r.Message.Data, Time: r.Message.Time}
	if len(r.Message.Hdrs) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(r.Message.Hdrs); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// electionWait bounds how long a reader waits out a log that neither a
// replica nor the leader answers. After kill -9 of a node that led the
// log, no read was answered for over 7 s on a loaded host (the chaos
// test): the stream elects its next leader after NATS's election timeout
// (4 to 9 s, more under load). A reader that gave up then failed an event
// stream through a surviving node that would have opened a moment later.
const electionWait = 15 * time.Second

// waitOut runs read again while nothing answers it (the log electing a
// leader), until electionWait has passed since began or ctx ends.
func waitOut[T any](ctx context.Context, began time.Time, read func() (T, error)) (T, error) {
	for {
		v, err := read()
		if err == nil || !unavailable(err) || ctx.Err() != nil || time.Since(began) >= electionWait {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// unavailable: no replica and no leader answered a read, or JetStream
// said it cannot serve one now.
func unavailable(err error) bool {
	var ae *jetstream.APIError
	return unanswered(err) || errors.As(err, &ae) && ae.Code == 503
}

// readErr is a failed read of a room's log: the caller's own end as is,
// anything else (no replica and no leader answered: an election, a node
// paused) room.ErrUnavailable.
func readErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("natsroom: reading the log: %w", err)
	}
	return fmt.Errorf("%w: the room's log cannot be read now (a leader election?): %v", room.ErrUnavailable, err)
}

// getBatch reads the log entry at seq, which this node folded: from the
// nearest replica, else (a replica behind the leader this node read it
// from) from the leader.
func (s *Store) getBatch(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	m, err := s.getMsg(ctx, msgGetReq{Seq: seq})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return s.getLeader(ctx, msgGetReq{Seq: seq})
	}
	return m, err
}

type roomLog struct {
	mu    logLock
	f     *fold
	last  uint64     // stream sequence of the last batch folded
	index []batchRef // batches with events, in order
	// heard is the highest stream sequence this node heard was appended
	// to the room's log (the holder's signal): a replica that answers
	// with less is behind, and a read goes on from the leader.
	heard atomic.Uint64

	// owner side
	owned    bool
	epoch    uint64
	deadline func() time.Time // how long appends may be tried (the lease's local deadline, and a pause after it)

	used time.Time // last asked for (under Store.mu): see evictIdle
}

// logLock is a room log's lock: a mutex whose reader can stop waiting
// when its context ends (lockCtx). The holder's append keeps it while it
// waits out the log's election (up to appendPatience), and a read with a
// deadline must not outlast that: a /metrics scrape on the holder, whose
// reading of the rooms is bounded, waited over 30 s for one (make chaos,
// just after a full disk was freed).
type logLock chan struct{}

func newLogLock() logLock { return make(logLock, 1) }

func (l logLock) Lock() { l <- struct{}{} }

func (l logLock) Unlock() {
	select {
	case <-l:
	default:
		panic("natsroom: unlock of an unlocked room log")
	}
}

func (l logLock) TryLock() bool {
	select {
	case l <- struct{}{}:
		return true
	default:
		return false
	}
}

// lockCtx locks l, or gives up with ctx's error once ctx ends.
func (l logLock) lockCtx(ctx context.Context) error {
	select {
	case l <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("natsroom: waiting for the room's log (a write waiting out an election?): %w", ctx.Err())
	}
}

type batchRef struct {
	first, last int64 // room sequences
	seq         uint64
}

func newStore(nc *nats.Conn, js jetstream.JetStream, node string) *Store {
	return &Store{nc: nc, js: js, node: node, rooms: map[string]*roomLog{}, msgRoom: map[string]string{}, turnRoom: map[string]string{},
		logger: slog.New(slog.DiscardHandler)}
}

func (s *Store) log(room string) *roomLog {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.rooms[room]
	if l == nil {
		l = &roomLog{mu: newLogLock(), f: newFold(room)}
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
		if !l.owned {
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
	if err := checkFormat(&b, m.Sequence); err != nil {
		return nil, err
	}
	return &b, nil
}

// syncLocked folds the room's log entries after l.last (the owner's own
// fold is always current), read from the nearest replica.
func (s *Store) syncLocked(ctx context.Context, room string, l *roomLog) error {
	if l.owned {
		return nil
	}
	return s.foldLocked(ctx, room, l, l.heard.Load(), false)
}

// replicaCatchUp bounds how long a read waits for a replica that is
// behind what this node heard was stored before it asks the leader.
const replicaCatchUp = 300 * time.Millisecond

// foldLocked folds the room's log after l.last up to at least upTo (when
// the log has it): from the nearest replica, which answers even while the
// stream has no leader; a replica behind upTo is asked again for a moment,
// then the leader is. Unless strict (a takeover must have it all), a room
// this node folded before stays as folded when neither answers: a reader
// then sees the log a few writes behind (the next write signals it again)
// rather than an error.
func (s *Store) foldLocked(ctx context.Context, room string, l *roomLog, upTo uint64, strict bool) error {
	subj := evSubject(room)
	wait := 5 * time.Millisecond
	var waited time.Duration
	began := time.Now()
	for {
		var ms []*jetstream.RawStreamMsg
		var err error
		if !strict && l.last == 0 {
			// A reader with nothing folded has nothing to show
			// instead: it waits out an election.
			ms, err = waitOut(ctx, began, func() ([]*jetstream.RawStreamMsg, error) { return s.getRun(ctx, l.last+1, subj) })
		} else {
			ms, err = s.getRun(ctx, l.last+1, subj)
		}
		if errors.Is(err, jetstream.ErrMsgNotFound) && l.last < upTo {
			if waited < replicaCatchUp {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(wait):
				}
				waited += wait
				wait *= 2
				continue
			}
			var m *jetstream.RawStreamMsg
			m, err = s.getLeader(ctx, msgGetReq{Seq: l.last + 1, NextBySubj: subj})
			ms = []*jetstream.RawStreamMsg{m}
		}
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil && !strict && l.last > 0 && ctx.Err() == nil {
			return nil // what this node folded before, a few writes behind
		}
		if err != nil {
			return readErr(ctx, err)
		}
		for _, m := range ms {
			if m.Sequence <= l.last {
				continue
			}
			b, err := decode(m)
			if err != nil {
				return err
			}
			l.addLocked(b, m.Sequence)
			s.index(room, b)
		}
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
	l.indexLocked(b, seq)
}

// indexLocked records a stored batch whose changes the fold has.
func (l *roomLog) indexLocked(b *batch, seq uint64) {
	if n := len(b.Events); n > 0 {
		l.index = append(l.index, batchRef{first: b.Events[0].Seq, last: b.Events[n-1].Seq, seq: seq})
	}
	l.last = seq
}

// read runs fn on the room's current fold.
func (s *Store) read(ctx context.Context, room string, fn func(f *fold)) error {
	l := s.log(room)
	if err := l.mu.lockCtx(ctx); err != nil {
		return err
	}
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
	began := time.Now()
	l := s.log(room)
	if err := l.mu.lockCtx(ctx); err != nil {
		return nil, err
	}
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
	// The batches come a run at a time (refs are in the order of the
	// log); one the run does not have is read alone.
	var run map[uint64]*jetstream.RawStreamMsg
	for _, r := range refs {
		m := run[r.seq]
		if m == nil {
			// A run that fails leaves the batch to the read below.
			ms, _ := s.getRun(ctx, r.seq, evSubject(room))
			run = map[uint64]*jetstream.RawStreamMsg{}
			for _, x := range ms {
				run[x.Sequence] = x
			}
			if m = run[r.seq]; m == nil {
				var err error
				m, err = waitOut(ctx, began, func() (*jetstream.RawStreamMsg, error) { return s.getBatch(ctx, r.seq) })
				if err != nil {
					return nil, readErr(ctx, err)
				}
			}
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
	sub, err := s.nc.Subscribe(evSignal(room), func(m *nats.Msg) {
		// The signal carries the append's stream sequence: a read
		// after it goes on until it has that much (see foldLocked).
		if seq, err := strconv.ParseUint(string(m.Data), 10, 64); err == nil {
			l := s.log(room)
			for {
				old := l.heard.Load()
				if seq <= old || l.heard.CompareAndSwap(old, seq) {
					break
				}
			}
		}
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
		// In order of acceptance, so of sequence.
		i := sort.Search(len(f.msgs), func(i int) bool { return f.msgs[i].Seq > after })
		out = slices.Clone(f.msgs[i:min(len(f.msgs), i+limit)])
	})
	return out, err
}

// Message finds one of the room's messages by id (room's messageFinder).
func (s *Store) Message(ctx context.Context, room, id string) (store.Message, error) {
	var m store.Message
	found := false
	err := s.read(ctx, room, func(f *fold) {
		if i, ok := f.msgIdx[id]; ok {
			m, found = f.msgs[i], true
		}
	})
	if err == nil && !found {
		err = fmt.Errorf("store: message %q: %w", id, store.ErrNotFound)
	}
	return m, err
}

// Turns implements room.Store.
func (s *Store) Turns(ctx context.Context, room string, after int64, limit int) ([]store.Turn, error) {
	if limit <= 0 || limit > store.MaxEventsPage {
		limit = store.MaxEventsPage
	}
	type keyed struct {
		seq int64
		t   store.Turn
	}
	var ts []keyed
	err := s.read(ctx, room, func(f *fold) {
		for _, t := range f.turns {
			if i, ok := f.msgIdx[t.MessageID]; ok && f.msgs[i].Seq > after {
				ts = append(ts, keyed{f.msgs[i].Seq, t})
			}
		}
	})
	// Turns fold in order of start; a stable sort keeps it among the
	// turns of one message.
	slices.SortStableFunc(ts, func(a, b keyed) int { return cmp.Compare(a.seq, b.seq) })
	out := make([]store.Turn, 0, min(len(ts), limit))
	for _, k := range ts[:min(len(ts), limit)] {
		out = append(out, k.t)
	}
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
	return l.f.inbox
}

// inboxPending counts the room's inbox entries past cursor: none when the
// last entry is at or before it, else every entry the inbox holds (taken
// entries are deleted, so at most the one being taken is counted twice).
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

// inboxKey carries, in a Write's context, the inbox entry the write
// accounts for: the cursor moves past it with that write's batch and no
// other (a turn's write in between took it past an entry the Manager then
// refused, and the entry was lost).
type inboxKey struct{}

type inboxTake struct {
	room string
	seq  uint64
}

// withInbox is ctx for the write that accepts (or refuses) the room's
// inbox entry seq.
func withInbox(ctx context.Context, room string, seq uint64) context.Context {
	return context.WithValue(ctx, inboxKey{}, inboxTake{room, seq})
}

// takeover makes this host the room's writer for epoch: it folds the
// whole log (up to what the stream's leader has) and appends
// takeover{epoch, node} over the last entry, so that any later append of
// the previous holder fails.
func (s *Store) takeover(ctx context.Context, rm string, epoch uint64, deadline func() time.Time) error {
	l := s.log(rm)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.owned = false
	for attempt := 0; ; attempt++ {
		last, err := s.getLeader(ctx, msgGetReq{LastBySubj: evSubject(rm)})
		var upTo uint64
		switch {
		case err == nil:
			upTo = last.Sequence
		case !errors.Is(err, jetstream.ErrMsgNotFound):
			return fmt.Errorf("natsroom: reading the log: %w", err)
		}
		if err := s.foldLocked(ctx, rm, l, upTo, true); err != nil {
			return err
		}
		l.epoch, l.deadline, l.owned = epoch, deadline, true
		b := &batch{Epoch: epoch, Node: s.node}
		data, _ := json.Marshal(map[string]any{"epoch": epoch, "node": s.node})
		b.Events = []evRec{{Seq: l.f.room.LastSeq + 1, Type: evTakeover, Time: time.Now().UnixNano(), Data: data}}
		err = s.appendLocked(ctx, rm, l, b)
		if err == nil {
			return nil
		}
		l.owned = false
		if !errors.Is(err, ErrFenced) || attempt == 3 {
			return err
		}
		// A concurrent writer: read again. The lease keeps a second
		// taker out; a zombie writer loses the next CAS.
	}
}

// disown stops writing the room (lost or given-up lease); reads go on.
func (s *Store) disown(room string) {
	l := s.log(room)
	l.mu.Lock()
	l.owned = false
	l.mu.Unlock()
}

// holds reports whether this host writes the room's log. A room whose
// log is being written is (a write runs only for a room this host owns):
// the answer does not wait for the write, which may wait out the log's
// election.
func (s *Store) holds(room string) bool {
	l := s.log(room)
	if !l.mu.TryLock() {
		return true
	}
	defer l.mu.Unlock()
	return l.owned
}

// Bounds of one log append: each attempt waits appendAttempt for the
// stream's answer; an attempt not answered is sent again (the same
// message) until one is, or the lease's deadline passes.
const (
	appendAttempt = time.Second
	appendBackoff = 100 * time.Millisecond
	// appendPatience bounds one append however long the lease is
	// renewed: a log that answers nothing for that long (it lost its
	// quorum while the lease bucket kept one) is not an election, and
	// the room's writer waits no longer for it.
	appendPatience = 2 * electionWait
)

// errAppendUnresolved: no attempt of an append was answered before the
// lease's deadline (or appendPatience); the write may or may not be in the
// log, and this host no longer holds the room (the next holder folds
// whatever the log has).
var errAppendUnresolved = errors.New("natsroom: the log did not answer before the lease's deadline (the write may have landed; the room moves)")

// appendLocked publishes b as the room's next log entry, fenced by the
// last sequence this host folded; on success it folds b.
//
// Each batch has its own message id, and an attempt whose answer is lost
// (a timeout: the write may have landed) is followed by the same message
// again, never by another: JetStream then answers for the first one (a
// duplicate within the window, or, on one replica, a wrong last sequence
// over our own id), so the batch is in the log exactly once and this host
// knows it before it folds anything or writes again. The caller's ctx
// only stops an append none of whose attempts may have landed.
func (s *Store) appendLocked(ctx context.Context, rm string, l *roomLog, b *batch) error {
	return s.appendBatch(ctx, rm, l, b, false)
}

// appendBatch is appendLocked; applied says the fold has b's changes
// already (a Write made them in place).
func (s *Store) appendBatch(ctx context.Context, rm string, l *roomLog, b *batch, applied bool) error {
	if !l.owned {
		return fmt.Errorf("%w: %q", room.ErrNotHeld, rm)
	}
	// The lease's deadline is read again before every attempt: it moves
	// on with each renewal, and an append that waits out the log's
	// election (seconds) while the lease is renewed must not give the
	// room up at the deadline it read when it began.
	began := time.Now()
	fixed := began.Add(3 * reqTimeout)
	until := func() time.Time { return fixed }
	if l.deadline != nil {
		until = func() time.Time {
			if d := l.deadline(); d.Before(began.Add(appendPatience)) {
				return d
			}
			return began.Add(appendPatience)
		}
	}
	if !time.Now().Before(until()) {
		return fmt.Errorf("%w: %w", room.ErrNotHeld, ErrLeaseExpired)
	}
	if t, ok := ctx.Value(inboxKey{}).(inboxTake); ok && t.room == rm && t.seq > l.f.inbox {
		b.Ops = append(b.Ops, op{K: opInboxCur, Inbox: t.seq})
	}
	b.V = logFormat
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
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	msgID := fmt.Sprintf("%s.%d.%d.%s", token(rm), l.epoch, l.last, hex.EncodeToString(nonce[:]))
	seq, err := s.publish(ctx, rm, l, msg, msgID, until)
	if err != nil {
		return err
	}
	if applied {
		// The Write's own changes are in the fold; the cursor it
		// carries is added here.
		for _, o := range b.Ops {
			if o.K == opInboxCur {
				_ = l.f.apply(o)
			}
		}
		l.indexLocked(b, seq)
	} else {
		l.addLocked(b, seq)
	}
	s.index(rm, b)
	// Watchers hear of the append only once it is stored (a subscriber
	// to the log subject itself may hear it before a read finds it), with
	// its sequence (a replica behind it is not the end of the log).
	_ = s.nc.Publish(evSignal(rm), []byte(strconv.FormatUint(seq, 10)))
	return nil
}

// publish sends msg until JetStream answers for it (see appendLocked) and
// returns its stream sequence; until is the lease's deadline as it is now.
func (s *Store) publish(ctx context.Context, rm string, l *roomLog, msg *nats.Msg, msgID string, until func() time.Time) (uint64, error) {
	unclear := false // an attempt may have landed
	for {
		if !unclear && ctx.Err() != nil {
			return 0, fmt.Errorf("natsroom: appending to the log: %w", ctx.Err())
		}
		pctx, cancel := context.WithTimeout(context.Background(), min(appendAttempt, max(time.Until(until()), time.Millisecond)))
		ack, err := s.js.PublishMsg(pctx, msg, jetstream.WithExpectLastSequencePerSubject(l.last), jetstream.WithMsgID(msgID))
		cancel()
		var ae *jetstream.APIError
		switch {
		case err == nil:
			if unclear {
				s.resolved(rm, ack.Sequence)
			}
			return ack.Sequence, nil
		case errors.As(err, &ae) && ae.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant:
			// 10164: a write to the subject is in flight (on R3, maybe
			// our own attempt before): ask again.
			unclear = true
		case errors.As(err, &ae) && ae.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence:
			// 10071: the log moved past l.last. Our own attempt that
			// landed (one replica checks the sequence before the
			// duplicate window) is a success; anything else is another
			// writer's.
			m, gerr := s.getLeader(context.Background(), msgGetReq{LastBySubj: evSubject(rm)})
			switch {
			case gerr == nil && m.Header.Get(nats.MsgIdHdr) == msgID:
				s.resolved(rm, m.Sequence)
				return m.Sequence, nil
			case gerr == nil && m.Sequence > l.last:
				l.owned = false
				return 0, fmt.Errorf("%w: %w: %w", room.ErrNotHeld, ErrFenced, err)
			case gerr == nil:
				// A log that ends before what this writer stored: a
				// leader behind the log answered (one cut off that does
				// not know it lost its quorum yet, just after a heal).
				// Nothing of this attempt landed; ask again.
				s.logger.Debug("natsroom: an append was answered by a leader behind the log; again", "room", rm, "its_last", m.Sequence, "ours", l.last)
			default:
				unclear = true
			}
		case errors.Is(err, nats.ErrConnectionClosed) && !unclear:
			// Never sent: nothing landed.
			return 0, fmt.Errorf("natsroom: appending to the log: %w", err)
		case errors.Is(err, jetstream.ErrNoStreamResponse):
			// Nobody took this attempt (the stream has no leader, an
			// election): it landed nowhere; ask again until the
			// deadline.
		case errors.As(err, &ae) && storageFull(ae):
			if !unclear {
				return 0, fmt.Errorf("%w: %w", room.ErrUnavailable, err)
			}
		default:
			unclear = true
		}
		if !time.Now().Before(until()) {
			if !unclear {
				// Nothing landed: a clean failure (the deadline ends
				// the room soon enough).
				return 0, fmt.Errorf("%w: the room's log took no write before the lease's deadline (a leader election?): %v", room.ErrUnavailable, err)
			}
			l.owned = false
			return 0, fmt.Errorf("%w: %w", room.ErrNotHeld, errAppendUnresolved)
		}
		if d := min(appendBackoff, time.Until(until())); d > 0 {
			time.Sleep(d) // a backoff between attempts, bounded by the deadline
		}
	}
}

// resolved counts (and says) an append whose first answer was lost and
// which the log showed stored.
func (s *Store) resolved(rm string, seq uint64) {
	s.unclear.Add(1)
	s.logger.Warn("natsroom: an append's answer was lost; the log has it, once", "room", rm, "seq", seq)
}

// storageFull reports a JetStream refusal for want of storage: nothing was
// stored, and nothing will be until an operator frees or adds some.
func storageFull(ae *jetstream.APIError) bool {
	switch ae.ErrorCode {
	case 10023, 10028, 10047: // insufficient (memory or storage) resources
		return true
	case 10077: // a store failure: the stream's own byte limit
		return strings.Contains(ae.Description, "maximum bytes")
	}
	return false
}

// Write implements room.Store: fn's changes to each room become one
// fenced log append (a write touching two rooms is two appends). The
// changes are made in the room's fold as fn makes them, and rolled back
// if fn or the append fails.
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
		if err := s.appendBatch(ctx, rm, r.l, r.b, true); err != nil {
			if !r.l.owned && s.fence != nil {
				// Fenced, or not answered before the deadline: the room
				// is another host's (or nobody's) now.
				s.fence(rm, err)
			}
			return err
		}
		r.l.f.commit()
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

// unlock rolls back what was not committed and releases the rooms.
func (t *tx) unlock() {
	for _, r := range t.rooms {
		r.l.f.rollback()
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
	l.f.begin()
	r := &txRoom{l: l, f: l.f, b: &batch{Epoch: l.epoch, Node: t.s.node}}
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

func (t *tx) PutMessage(m store.Message) error {
	return t.op(m.Room, op{K: opPutMsg, Message: toMsgRec(m)})
}

func (t *tx) UpdateMessage(id, status, turnID, outcome, reason string) error {
	// The message's room is found among the rooms this write touches or
	// this host holds.
	rm := t.s.roomOfMessage(t, id)
	if rm == "" {
		return fmt.Errorf("store: update message: %w", store.ErrNotFound)
	}
	return t.op(rm, op{K: opMsg, ID: id, Status: status, TurnID: turnID, Outcome: outcome, Reason: reason})
}

func (t *tx) PutTurn(tr store.Turn) error {
	return t.op(tr.Room, op{K: opPutTurn, Turn: toTurnRec(tr)})
}

func (t *tx) EndTurn(id, outcome, reason, text string, u store.Usage) error {
	rm := t.s.roomOfTurn(t, id)
	if rm == "" {
		return fmt.Errorf("store: end turn: %w", store.ErrNotFound)
	}
	return t.op(rm, op{K: opEndTurn, ID: id, Outcome: outcome, Reason: reason, Text: text, Usage: toUsageRec(u)})
}

// AddCompute implements room.ComputeTx.
func (t *tx) AddCompute(rm string, c store.Compute) error {
	return t.op(rm, op{K: opCompute, Compute: &c})
}

func (t *tx) PutApproval(a store.Approval) error {
	return t.op(a.Room, op{K: opPutAppr, Approval: toApprovalRec(a)})
}

func (t *tx) ResolveApproval(rm, id, decision, by string) error {
	return t.op(rm, op{K: opResolve, ID: id, Status: decision, By: by})
}

func (t *tx) PutQuestion(q store.Question) error {
	return t.op(q.Room, op{K: opPutQ, Question: toQuestionRec(q)})
}

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

var _ room.SettingsStore = (*Store)(nil)

// settingsKV returns BucketSettings, created (one replica) if missing: a
// store used without a Cluster's setup, which makes it replicated.
func (s *Store) settingsKV(ctx context.Context) (jetstream.KeyValue, error) {
	s.settingsMu.Lock()
	defer s.settingsMu.Unlock()
	if s.settings != nil {
		return s.settings, nil
	}
	ctx, cancel := context.WithTimeout(ctx, reqTimeout)
	defer cancel()
	kv, err := s.js.KeyValue(ctx, BucketSettings)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketSettings})
	}
	if err != nil {
		return nil, fmt.Errorf("%w: room settings: %w", room.ErrUnavailable, err)
	}
	s.settings = kv
	return kv, nil
}

// RoomSettings implements room.SettingsStore.
func (s *Store) RoomSettings(ctx context.Context, id string) (json.RawMessage, error) {
	if _, err := s.settingsKV(ctx); err != nil {
		return nil, err
	}
	// From the bucket's leader, which has every acknowledged write: a
	// replica's direct get may not have a change another node just made
	// (a raised budget must reopen the room at once, from every node).
	m, err := leaderGet(ctx, s.nc, "KV_"+BucketSettings, msgGetReq{LastBySubj: "$KV." + BucketSettings + "." + token(id)})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: room settings: %w", room.ErrUnavailable, err)
	}
	return m.Data, nil
}

// PutRoomSettings implements room.SettingsStore. The room's log is not
// written: a room with settings and no message yet is not listed.
func (s *Store) PutRoomSettings(ctx context.Context, id string, settings json.RawMessage) error {
	kv, err := s.settingsKV(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, reqTimeout)
	defer cancel()
	if _, err := kv.Put(ctx, token(id), settings); err != nil {
		return fmt.Errorf("%w: room settings: %w", room.ErrUnavailable, err)
	}
	return nil
}
