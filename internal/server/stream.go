package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agenthost/agenthost/internal/store"
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

// frame is one encoded SSE event.
type frame struct {
	seq  int64
	data []byte
}

func encodeFrame(ev store.Event) (frame, error) {
	data, err := json.Marshal(ev)
	if err != nil {
		return frame{}, err
	}
	var b bytes.Buffer
	b.Grow(len(data) + len(ev.Type) + 40)
	b.WriteString("id: ")
	b.WriteString(strconv.FormatInt(ev.Seq, 10))
	b.WriteString("\nevent: ")
	b.WriteString(ev.Type)
	b.WriteString("\ndata: ")
	b.Write(data) // compact JSON: one line
	b.WriteString("\n\n")
	return frame{seq: ev.Seq, data: b.Bytes()}, nil
}

type hubs struct {
	s  *Server
	mu sync.Mutex
	m  map[string]*hub
}

func newHubs(s *Server) *hubs { return &hubs{s: s, m: map[string]*hub{}} }

// hub fans one room's new events out to its live clients.
type hub struct {
	hs     *hubs
	room   string
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

// join returns a subscription to the room's events after the returned
// cursor, and a function that leaves.
func (hs *hubs) join(room string) (*sub, int64, func(), error) {
	hs.mu.Lock()
	h := hs.m[room]
	if h == nil {
		var err error
		if h, err = hs.start(room); err != nil {
			hs.mu.Unlock()
			return nil, 0, nil, err
		}
		hs.m[room] = h
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
		if empty && hs.m[room] == h {
			delete(hs.m, room)
			h.stop()
		}
	}
	return sb, cursor, leave, nil
}

// start starts a room's hub (hs.mu held).
func (hs *hubs) start(room string) (*hub, error) {
	s := hs.s
	if s.ctx.Err() != nil {
		return nil, errClosing
	}
	// Watch before reading the cursor: a commit after the read signals.
	watch, unwatch := s.m.Watch(room)
	ctx, cancel := context.WithCancel(s.ctx)
	last, err := lastSeq(ctx, s, room)
	if err != nil {
		cancel()
		unwatch()
		return nil, err
	}
	h := &hub{hs: hs, room: room, cursor: last, subs: map[*sub]struct{}{}, stop: cancel}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer unwatch()
		h.run(ctx, watch)
	}()
	return h, nil
}

// lastSeq is the room's last committed sequence number.
func lastSeq(ctx context.Context, s *Server, room string) (int64, error) {
	st, err := s.m.State(ctx, room)
	if err != nil {
		return 0, err
	}
	return st.LastSeq, nil
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
			if err != nil {
				if ctx.Err() == nil {
					h.hs.s.log.Error("server: reading events for the stream failed", "room", h.room, "err", err)
					h.cutAll() // clients reconnect and replay
				}
				break
			}
			frames := make([]frame, 0, len(evs))
			for _, ev := range evs {
				f, err := encodeFrame(ev)
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

// drop ends the room's hub and cuts its clients (a purged room: its
// sequence numbers start again).
func (hs *hubs) drop(room string) {
	hs.mu.Lock()
	h := hs.m[room]
	delete(hs.m, room)
	hs.mu.Unlock()
	if h != nil {
		h.stop()
		h.cutAll()
	}
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
	// The browser's EventSource resends the URL it opened (with its
	// ?after) and the last id it saw: the header wins.
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "Last-Event-ID must be a non-negative integer")
			return
		}
		after = n
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
	if _, err := s.m.State(r.Context(), id); err != nil {
		s.fail(w, r, err, "room "+id)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()

	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s.metrics.streamClients.Inc()
	defer s.metrics.streamClients.Dec()
	// Every write to the connection renews the deadline: the buffer
	// writes through on its own when a frame does not fit, long after
	// the last flush.
	st := &streamWriter{s: s, rc: rc, bw: bufio.NewWriterSize(deadlineWriter{w, rc, s.opts.WriteTimeout}, 32<<10)}
	// retry tells EventSource to come back quickly after a cut.
	_, _ = st.bw.WriteString("retry: 1000\n\n")
	cursor, err := st.replay(ctx, id, after)
	if err == nil && follow {
		err = st.live(ctx, id, cursor)
	}
	if err == nil {
		err = st.flush()
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		s.log.Debug("server: event stream ended", "room", id, "err", err)
	}
}

type streamWriter struct {
	s  *Server
	rc *http.ResponseController
	bw *bufio.Writer
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
func (st *streamWriter) replay(ctx context.Context, room string, after int64) (int64, error) {
	for {
		evs, err := st.s.m.Events(ctx, room, after, replayPage)
		if err != nil {
			return after, err
		}
		for _, ev := range evs {
			f, err := encodeFrame(ev)
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

// live joins the room's hub and writes its events after cursor.
func (st *streamWriter) live(ctx context.Context, room string, cursor int64) error {
	sb, _, leave, err := st.s.hubs.join(room)
	if err != nil {
		return err
	}
	defer leave()
	// Catch up on what was committed between the replay and the join.
	if cursor, err = st.replay(ctx, room, cursor); err != nil {
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
