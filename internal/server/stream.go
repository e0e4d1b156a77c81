package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// The event stream. A client first replays the room's log from the store
// (pulled page by page, as fast as it reads, holding no server memory),
// then joins the room's hub: one goroutine per watched room reads each
// commit's new events from the store once, encodes them once, and hands
// them to every live client's bounded buffer. A client whose buffer is
// full is cut off rather than slowing the others; it reconnects with
// Last-Event-ID and loses nothing, since the log is the source of truth.
//
// No gap, no duplicate: a client joins the hub at the hub's cursor H,
// then reads the store after its own cursor C until the store has nothing
// more (so C >= H, as the hub only forwards committed events), and from
// then on takes the hub's events after C, which continue at C+1.
//
// One incarnation: a room deleted and created again under its id starts
// its log at 1 again (room.Manager.Incarnation). A stream serves one
// incarnation, named in its Room-Incarnation header: each page read from
// the store, by a client or a hub, is checked against the room's
// incarnation after it is read (a purge deletes the log in one write, so a
// page read before the check that still finds the incarnation is of it),
// and a stream that finds another ends with a reset event. A client that
// resumes with a Last-Event-ID or after past the log's end, or with
// ?incarnation= naming another incarnation, gets a reset event first and
// then the room's log from its first event.

// frame is one encoded SSE event.
type frame struct {
	seq  int64
	data []byte
}

// encodeFrame encodes ev, an event of the room's incarnation inc. Its id
// is "SEQ.INC": a client that sends it back as Last-Event-ID (as every
// EventSource does by itself) names the incarnation its position is of,
// so a room purged and created again with a longer log is never resumed
// in the middle (its events start at 1 again).
func encodeFrame(ev store.Event, inc string) (frame, error) {
	data, err := json.Marshal(ev)
	if err != nil {
		return frame{}, err
	}
	var b bytes.Buffer
	b.Grow(len(data) + len(ev.Type) + 40)
	b.WriteString("id: ")
	b.WriteString(strconv.FormatInt(ev.Seq, 10))
	if inc != "" {
		b.WriteByte('.')
		b.WriteString(inc)
	}
	b.WriteString("\nevent: ")
	b.WriteString(ev.Type)
	b.WriteString("\ndata: ")
	b.Write(data) // compact JSON: one line
	b.WriteString("\n\n")
	return frame{seq: ev.Seq, data: b.Bytes()}, nil
}

// resetFrame is the reset event: the events a client holds (after
// after) are not of the room's incarnation inc ("" when the room is gone):
// it forgets them, and the room's events from 1 follow (or, when the room
// is gone, the stream ends and the id may name a new room later). Its id
// is 0, so that a client that ignores it resumes from the start.
func resetFrame(room, inc string, after int64, reason string) []byte {
	data, _ := json.Marshal(struct {
		Seq         int64     `json:"seq"`
		Type        string    `json:"type"`
		Room        string    `json:"room"`
		Time        time.Time `json:"time"`
		Incarnation string    `json:"incarnation"`
		After       int64     `json:"after"`
		Reason      string    `json:"reason"`
	}{0, eventReset, room, time.Now().UTC(), inc, after, reason})
	return []byte("id: 0\nevent: " + eventReset + "\ndata: " + string(data) + "\n\n")
}

// eventReset is the stream's own event (never in a room's log).
const eventReset = "reset"

// hubKey is a room's incarnation.
type hubKey struct{ room, inc string }

type hubs struct {
	s  *Server
	mu sync.Mutex
	m  map[hubKey]*hub
}

func newHubs(s *Server) *hubs { return &hubs{s: s, m: map[hubKey]*hub{}} }

// hub fans one room incarnation's new events out to its live clients.
type hub struct {
	hs     *hubs
	room   string
	inc    string
	mu     sync.Mutex
	cursor int64 // the last seq handed out
	subs   map[*sub]struct{}
	stop   context.CancelFunc
}

// sub is a live client of a hub.
type sub struct {
	ch  chan frame
	cut chan struct{} // closed when the hub dropped it (buffer full)
}

// join returns a subscription to the events of the room's incarnation
// inc after the returned cursor, and a function that leaves;
// errIncarnation when the room is not that incarnation now.
func (hs *hubs) join(room, inc string) (*sub, int64, func(), error) {
	hs.mu.Lock()
	key := hubKey{room, inc}
	h := hs.m[key]
	if h == nil {
		var err error
		if h, err = hs.start(room, inc); err != nil {
			hs.mu.Unlock()
			return nil, 0, nil, err
		}
		hs.m[key] = h
	}
	sb := &sub{ch: make(chan frame, hs.s.opts.StreamBuffer), cut: make(chan struct{})}
	h.mu.Lock()
	h.subs[sb] = struct{}{}
	cursor := h.cursor
	h.mu.Unlock()
	hs.mu.Unlock()
	leave := func() {
		hs.mu.Lock()
		defer hs.mu.Unlock()
		h.mu.Lock()
		delete(h.subs, sb)
		empty := len(h.subs) == 0
		h.mu.Unlock()
		if empty && hs.m[key] == h {
			delete(hs.m, key)
			h.stop()
		}
	}
	return sb, cursor, leave, nil
}

// errIncarnation: the room is not (or no longer) the incarnation a stream
// serves.
var errIncarnation = errors.New("stream: the room is another incarnation")

// start starts the hub of a room's incarnation (hs.mu held).
func (hs *hubs) start(room, inc string) (*hub, error) {
	s := hs.s
	if s.ctx.Err() != nil {
		return nil, errClosing
	}
	// Watch before reading the cursor: a commit after the read signals.
	watch, unwatch := s.m.Watch(room)
	ctx, cancel := context.WithCancel(s.ctx)
	st, err := s.m.State(ctx, room)
	if err == nil && st.Incarnation != inc {
		err = errIncarnation
	}
	if err != nil {
		cancel()
		unwatch()
		return nil, err
	}
	h := &hub{hs: hs, room: room, inc: inc, cursor: st.LastSeq, subs: map[*sub]struct{}{}, stop: cancel}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer unwatch()
		h.run(ctx, watch)
	}()
	return h, nil
}

func (h *hub) run(ctx context.Context, watch <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-watch:
			if !ok {
				h.cutAll()
				return
			}
		}
		for {
			h.mu.Lock()
			after := h.cursor
			h.mu.Unlock()
			evs, err := h.hs.s.m.Events(ctx, h.room, after, replayPage)
			if err == nil && len(evs) > 0 {
				// Read before the check: events of another incarnation
				// are never handed out (see the stream's doc).
				err = h.hs.s.checkIncarnation(ctx, h.room, h.inc)
			}
			if errors.Is(err, errIncarnation) || errors.Is(err, room.ErrNotFound) {
				// Purged: the clients end with a reset.
				h.hs.retire(h)
				return
			}
			if err != nil {
				if ctx.Err() == nil {
					h.hs.s.log.Error("server: reading events for the stream failed", "room", h.room, "err", err)
					h.cutAll() // clients reconnect and replay
				}
				break
			}
			frames := make([]frame, 0, len(evs))
			for _, ev := range evs {
				f, err := encodeFrame(ev, h.inc)
				if err != nil {
					continue
				}
				frames = append(frames, f)
			}
			h.mu.Lock()
			for sb := range h.subs {
				for _, f := range frames {
					select {
					case sb.ch <- f:
						continue
					default:
					}
					close(sb.cut)
					delete(h.subs, sb)
					h.hs.s.metrics.streamCut.Inc()
					break
				}
			}
			if len(evs) > 0 {
				h.cursor = evs[len(evs)-1].Seq
			}
			h.mu.Unlock()
			if len(evs) < replayPage {
				break
			}
		}
	}
}

// drop ends the room's hubs and cuts their clients (a purged room: its
// sequence numbers start again; each client ends with a reset).
func (hs *hubs) drop(room string) {
	hs.mu.Lock()
	var gone []*hub
	for k, h := range hs.m {
		if k.room == room {
			delete(hs.m, k)
			gone = append(gone, h)
		}
	}
	hs.mu.Unlock()
	for _, h := range gone {
		h.stop()
		h.cutAll()
	}
}

// retire ends h, whose incarnation is gone, and cuts its clients.
func (hs *hubs) retire(h *hub) {
	hs.mu.Lock()
	if k := (hubKey{h.room, h.inc}); hs.m[k] == h {
		delete(hs.m, k)
	}
	hs.mu.Unlock()
	h.stop()
	h.cutAll()
}

// checkIncarnation is errIncarnation when the room is not incarnation
// inc now, room.ErrNotFound when it is gone.
func (s *Server) checkIncarnation(ctx context.Context, room, inc string) error {
	cur, err := s.m.Incarnation(ctx, room)
	if err != nil {
		return err
	}
	if cur != inc {
		return errIncarnation
	}
	return nil
}

func (h *hub) cutAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for sb := range h.subs {
		close(sb.cut)
		delete(h.subs, sb)
	}
}

// errCut ends a stream whose client fell behind.
var errCut = errors.New("client fell behind")

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	id, ok := roomID(w, r)
	if !ok {
		return
	}
	after, ok := afterParam(w, r)
	if !ok {
		return
	}
	known := r.URL.Query().Get("incarnation")
	if !validIncarnation(known) {
		writeError(w, http.StatusBadRequest, "incarnation must be the Room-Incarnation a stream of the room answered")
		return
	}
	// The browser's EventSource resends the URL it opened (with its
	// ?after) and the last id it saw: the header wins, and the
	// incarnation an id names wins over ?incarnation.
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		n, inc, ok := parseEventID(strings.TrimSpace(v))
		if !ok {
			writeError(w, http.StatusBadRequest, "Last-Event-ID must be an event's id (SEQ.INCARNATION) or a sequence number")
			return
		}
		after = n
		if inc != "" {
			known = inc
		}
	}
	follow := true
	switch r.URL.Query().Get("follow") {
	case "", "1", "true":
	case "0", "false":
		follow = false
	default:
		writeError(w, http.StatusBadRequest, "follow must be 0 or 1")
		return
	}
	state, err := s.m.State(r.Context(), id)
	if err != nil {
		s.fail(w, r, err, "room "+id)
		return
	}
	inc := state.Incarnation
	var reset []byte
	switch {
	case known != "" && known != inc:
		reset = resetFrame(id, inc, after, "the room was deleted and created again: its events start at 1 again")
	case after > state.LastSeq:
		reset = resetFrame(id, inc, after, fmt.Sprintf(
			"event %d is past the room's last event (%d): the room was deleted and created again, so its events start at 1 again",
			after, state.LastSeq))
	}
	if reset != nil {
		after = 0
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()

	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	if inc != "" {
		w.Header().Set(headerIncarnation, inc)
	}
	w.WriteHeader(http.StatusOK)
	s.metrics.streamClients.Inc()
	defer s.metrics.streamClients.Dec()
	// Every write to the connection renews the deadline: the buffer
	// writes through on its own when a frame does not fit, long after
	// the last flush.
	st := &streamWriter{s: s, rc: rc, bw: bufio.NewWriterSize(deadlineWriter{w, rc, s.opts.WriteTimeout}, 32<<10),
		room: id, inc: inc}
	// retry tells EventSource to come back quickly after a cut.
	_, _ = st.bw.WriteString("retry: 1000\n\n")
	if reset != nil {
		_, _ = st.bw.Write(reset)
	}
	cursor, err := st.replay(ctx, after)
	if err == nil && follow {
		err = st.live(ctx, cursor)
	}
	if err == nil {
		err = st.flush()
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		s.log.Debug("server: event stream ended", "room", id, "err", err)
	}
}

// parseEventID reads an event's id: "SEQ.INC" as the stream sends it, or
// a bare sequence number (inc ""), which names no incarnation.
func parseEventID(v string) (seq int64, inc string, ok bool) {
	num, inc, dotted := strings.Cut(v, ".")
	if dotted && (inc == "" || !validIncarnation(inc)) {
		return 0, "", false
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, "", false
	}
	return n, inc, true
}

// validIncarnation: at most 64 printable ASCII bytes, no space.
func validIncarnation(inc string) bool {
	return len(inc) <= 64 && !strings.ContainsFunc(inc, func(c rune) bool { return c < 0x21 || c > 0x7e })
}

// headerIncarnation names the incarnation a stream serves.
const headerIncarnation = "Room-Incarnation"

type streamWriter struct {
	s  *Server
	rc *http.ResponseController
	bw *bufio.Writer
	// room and inc are the room and the incarnation the stream serves.
	room, inc string
}

// check is nil while the room is the stream's incarnation. Otherwise it
// writes the reset event and returns errIncarnation (the stream ends).
func (st *streamWriter) check(ctx context.Context, after int64) error {
	err := st.s.checkIncarnation(ctx, st.room, st.inc)
	if !errors.Is(err, errIncarnation) && !errors.Is(err, room.ErrNotFound) {
		return err
	}
	cur, _ := st.s.m.Incarnation(ctx, st.room) // "" once it is gone
	reason := "the room was deleted: its id may name a new room, whose events start at 1"
	if cur != "" {
		reason = "the room was deleted and created again: its events start at 1 again"
	}
	_, _ = st.bw.Write(resetFrame(st.room, cur, after, reason))
	_ = st.flush()
	return errIncarnation
}

func (st *streamWriter) flush() error {
	if err := st.bw.Flush(); err != nil {
		return err
	}
	_ = st.rc.SetWriteDeadline(time.Now().Add(st.s.opts.WriteTimeout))
	return st.rc.Flush()
}

// deadlineWriter bounds each write to the client by timeout from its
// start.
type deadlineWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

func (d deadlineWriter) Write(b []byte) (int, error) {
	_ = d.rc.SetWriteDeadline(time.Now().Add(d.timeout))
	return d.w.Write(b)
}

// replay writes the room's events after after from the store until it has
// no more, and returns the last seq written.
func (st *streamWriter) replay(ctx context.Context, after int64) (int64, error) {
	for {
		evs, err := st.s.m.Events(ctx, st.room, after, replayPage)
		if err != nil {
			return after, err
		}
		if len(evs) > 0 {
			// Read before the check: see the stream's doc.
			if err := st.check(ctx, after); err != nil {
				return after, err
			}
		}
		for _, ev := range evs {
			f, err := encodeFrame(ev, st.inc)
			if err != nil {
				return after, err
			}
			if _, err := st.bw.Write(f.data); err != nil {
				return after, err
			}
			after = ev.Seq
		}
		if err := st.flush(); err != nil {
			return after, err
		}
		if len(evs) < replayPage {
			return after, nil
		}
	}
}

// live joins the hub of the stream's incarnation and writes its events
// after cursor.
func (st *streamWriter) live(ctx context.Context, cursor int64) error {
	sb, _, leave, err := st.s.hubs.join(st.room, st.inc)
	if errors.Is(err, errIncarnation) || errors.Is(err, room.ErrNotFound) {
		if cerr := st.check(ctx, cursor); cerr != nil {
			return cerr
		}
	}
	if err != nil {
		return err
	}
	defer leave()
	// Catch up on what was committed between the replay and the join.
	if cursor, err = st.replay(ctx, cursor); err != nil {
		return err
	}
	beat := time.NewTicker(st.s.opts.Heartbeat)
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sb.cut:
			// Write what the buffer holds, then end: the client resumes
			// from the last id it got.
			for {
				select {
				case f := <-sb.ch:
					if f.seq == cursor+1 {
						_, _ = st.bw.Write(f.data)
						cursor = f.seq
					}
					continue
				default:
				}
				break
			}
			// Cut by a purge: the client is told (a reset); cut as too
			// slow, it resumes where it stopped.
			if err := st.check(ctx, cursor); err != nil {
				return err
			}
			_ = st.flush()
			return errCut
		case <-beat.C:
			if _, err := st.bw.WriteString(": keep-alive\n\n"); err != nil {
				return err
			}
			if err := st.flush(); err != nil {
				return err
			}
		case f := <-sb.ch:
			n := 0
			for {
				switch {
				case f.seq <= cursor: // replayed already
				case f.seq == cursor+1:
					if _, err := st.bw.Write(f.data); err != nil {
						return err
					}
					cursor = f.seq
					n++
				default:
					// Cannot happen (see the stream's invariant); end the
					// stream rather than skip, and the client resumes.
					_ = st.flush()
					return errors.New("stream: sequence gap")
				}
				select {
				case f = <-sb.ch:
					continue
				default:
				}
				break
			}
			if n > 0 {
				if err := st.flush(); err != nil {
					return err
				}
			}
		}
	}
}
