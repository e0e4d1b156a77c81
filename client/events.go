package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agenthost/agenthost/event"
)

// Event types of a room's log: package event defines them, with one Go
// type per event.
const (
	TypeMessageAccepted  = event.TypeMessageAccepted
	TypeMessageQueued    = event.TypeMessageQueued
	TypeMessageDelivered = event.TypeMessageDelivered
	// TypeMessageEnded is the one terminal event of every accepted message.
	TypeMessageEnded      = event.TypeMessageEnded
	TypeTurnWaiting       = event.TypeTurnWaiting
	TypeWorkspaceReady    = event.TypeWorkspaceReady
	TypeTurnStarted       = event.TypeTurnStarted
	TypeTurnEnded         = event.TypeTurnEnded
	TypeTextDelta         = event.TypeTextDelta
	TypeToolStarted       = event.TypeToolStarted
	TypeToolEnded         = event.TypeToolEnded
	TypeAgentMalformed    = event.TypeAgentMalformed
	TypeApprovalRequested = event.TypeApprovalRequested
	TypeApprovalResolved  = event.TypeApprovalResolved
	TypeQuestionAsked     = event.TypeQuestionAsked
	TypeQuestionAnswered  = event.TypeQuestionAnswered
	TypeRoomLimit         = event.TypeRoomLimit
	TypeBudgetExhausted   = event.TypeBudgetExhausted
	TypeAgentStarted      = event.TypeAgentStarted
	TypeAgentAttached     = event.TypeAgentAttached
	TypeAgentReleased     = event.TypeAgentReleased
	TypeContextLost       = event.TypeContextLost
	TypeRoomPost          = event.TypeRoomPost
	TypeEventsDropped     = event.TypeEventsDropped
	TypeWorkspaceReverted = event.TypeWorkspaceReverted
	TypeSettingsChanged   = event.TypeSettingsChanged
	// TypeReset is the stream's own event, never in a room's log (its
	// Seq is 0): the events yielded before it are of another incarnation
	// of the room (it was deleted, and maybe created again), and the
	// events after it start again at 1 (see Reset).
	TypeReset = "reset"
)

// Reset is a reset event's data (Event.Decode).
type Reset struct {
	// Incarnation is the room's incarnation now; "" when the room is
	// gone (a follower then waits for the id to name a new room).
	Incarnation string `json:"incarnation"`
	// After is where the stream stood, in the old incarnation.
	After  int64  `json:"after"`
	Reason string `json:"reason"`
}

// Event is one event of a room's log. Data is the whole event as the
// server sent it (a flat JSON object: seq, type, room, time and the
// type's own fields); Payload reads it as its type's Go value.
type Event struct {
	// Seq is the room's sequence number: 1 for the first event, up by
	// exactly one per event.
	Seq  int64           `json:"seq"`
	Type string          `json:"type"`
	Room string          `json:"room"`
	Time time.Time       `json:"time"`
	Data json.RawMessage `json:"-"`
}

// Payload reads the event's own fields as its type's value (an
// event.MessageEnded for message.ended, ...); for a type this build does
// not know it returns an error that errors.Is event.ErrUnknownType, and
// a program should skip that event.
func (e Event) Payload() (event.Payload, error) { return event.Decode(e.Type, e.Data) }

// Decode reads the event's fields into v (for example a *MessageEnded).
func (e Event) Decode(v any) error { return json.Unmarshal(e.Data, v) }

// Payloads of the event types a client usually acts on: package event's
// types, under the names this package has always had.
type (
	MessageEnded      = event.MessageEnded
	TurnStarted       = event.TurnStarted
	TurnWaiting       = event.TurnWaiting
	TurnEnded         = event.TurnEnded
	WorkspaceReverted = event.WorkspaceReverted
	MessageDelivered  = event.MessageDelivered
	TextDelta         = event.TextDelta
	ToolStarted       = event.ToolStarted
	ToolEnded         = event.ToolEnded
	ApprovalRequested = event.ApprovalRequested
	ApprovalResolved  = event.ApprovalResolved
	QuestionAsked     = event.QuestionAsked
	QuestionAnswered  = event.QuestionAnswered
)

// Events returns the room's events after sequence number after, in order
// and each once, and ends after the last one the server has. A dropped
// connection is resumed where it stopped. An after past the room's last
// event (a position in a room since deleted) yields a reset event
// (TypeReset) and then the room's events from the first. The sequence
// yields one error and stops: an *APIError, ErrUnreachable after the
// retries, or ctx's error.
func (c *Client) Events(ctx context.Context, room string, after int64) iter.Seq2[Event, error] {
	return c.stream(ctx, room, "", after, false)
}

// Follow returns the room's events after sequence number after, then the
// new ones as they come, until ctx ends or the loop stops. Whenever the
// stream drops (the server restarted, cut a slow reader, went silent past
// IdleTimeout, or answered 503) it reconnects with Last-Event-ID and the
// room's incarnation, waiting between attempts with backoff, for as long
// as ctx allows: no event is missed or repeated. When the room is deleted
// (purged) and its id names a new room, Follow yields a reset event
// (TypeReset) and goes on with the new room's events from its first; while
// the id names no room, it waits for one. Errors the server answers
// otherwise (401, 404 for a room that never was, ...) and ctx's end are
// yielded once and end the sequence.
func (c *Client) Follow(ctx context.Context, room string, after int64) iter.Seq2[Event, error] {
	return c.stream(ctx, room, "", after, true)
}

// FollowAt is Follow from a position of the room's incarnation
// incarnation (Room.Incarnation, Accepted.Incarnation, or a reset's): when
// the room is another incarnation now, the sequence starts with a reset
// event and the room's events from the first.
func (c *Client) FollowAt(ctx context.Context, room, incarnation string, after int64) iter.Seq2[Event, error] {
	return c.stream(ctx, room, incarnation, after, true)
}

func (c *Client) stream(ctx context.Context, room, inc string, after int64, follow bool) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		p, err := roomPath(room, "events")
		if err != nil {
			yield(Event{}, err)
			return
		}
		s := &streamState{c: c, ctx: ctx, path: p, room: room, inc: inc, after: after, follow: follow, yield: yield}
		if err := s.run(); err != nil && !errors.Is(err, errStopped) {
			yield(Event{}, err)
		}
	}
}

// errStopped: the caller's loop ended.
var errStopped = errors.New("client: stopped")

type streamState struct {
	c     *Client
	ctx   context.Context
	path  string
	room  string
	inc   string // the incarnation after is of ("": not known)
	after int64
	// gone: a reset said the room was deleted; until the id names a room
	// again, a follower takes 404 as a wait.
	gone   bool
	follow bool
	yield  func(Event, error) bool
	retry  time.Duration // the server's SSE retry field
}

func (s *streamState) run() error {
	attempt := 0
	for {
		connected, err := s.connect(attempt > 0)
		if err == nil || errors.Is(err, errStopped) {
			return err
		}
		if s.ctx.Err() != nil {
			return s.ctx.Err()
		}
		if !s.retryable(err) {
			return err
		}
		if connected {
			attempt = 0
		}
		attempt++
		delay := s.backoff(attempt)
		if f := s.c.opts.OnReconnect; f != nil {
			f(Reconnect{Room: s.room, After: s.after, Attempt: attempt, Delay: delay, Err: err})
		}
		t := time.NewTimer(delay)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return s.ctx.Err()
		case <-t.C:
		}
	}
}

// retryable reports whether a stream reconnects after err.
func (s *streamState) retryable(err error) bool {
	return errors.Is(err, ErrUnreachable) || errors.Is(err, ErrUnavailable) || errors.Is(err, errDropped) ||
		s.gone && s.follow && errors.Is(err, ErrNotFound)
}

// errDropped: the stream ended before the server meant it to.
var errDropped = errors.New("the stream dropped")

// backoff is the wait before attempt n (from 1): the first wait doubled
// per attempt, capped, with ±20 % jitter so that clients cut at once do
// not come back at once.
func (s *streamState) backoff(n int) time.Duration {
	base := s.c.opts.MinBackoff
	if base <= 0 {
		base = s.retry
	}
	if base <= 0 {
		base = DefaultMinBackoff
	}
	d := base
	for i := 1; i < n && d < s.c.opts.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, s.c.opts.MaxBackoff)
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// connect reads one connection's events; connected says the server
// answered 200. nil means the replay ended (not following).
func (s *streamState) connect(reconnecting bool) (connected bool, err error) {
	ctx, cancel := context.WithCancelCause(s.ctx)
	defer cancel(nil)
	q := url.Values{}
	if !s.follow {
		q.Set("follow", "0")
	}
	if s.inc != "" {
		q.Set("incarnation", s.inc)
	}
	req, err := s.c.newRequest(ctx, "GET", s.path, q, nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Last-Event-ID", strconv.FormatInt(s.after, 10))
	// A silent connection (no event, no heartbeat) is taken for dead.
	idle := time.AfterFunc(s.c.opts.IdleTimeout, func() { cancel(errIdle) })
	defer idle.Stop()
	res, err := s.c.hc.Do(req)
	if err != nil {
		if s.ctx.Err() != nil {
			return false, s.ctx.Err()
		}
		if context.Cause(ctx) == errIdle {
			return false, fmt.Errorf("%w: %w", ErrUnreachable, errIdle)
		}
		return false, s.c.unreachable(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		return false, apiError(res.StatusCode, raw)
	}
	s.gone = false
	if v := res.Header.Get("Room-Incarnation"); v != "" && s.inc == "" {
		// What the stream's events are of (a reset in it says if it
		// is not the one asked for).
		s.inc = v
	}
	if reconnecting {
		if f := s.c.opts.OnReconnect; f != nil {
			f(Reconnect{Room: s.room, After: s.after})
		}
	}
	err = s.read(res.Body, func() { idle.Reset(s.c.opts.IdleTimeout) })
	switch {
	case errors.Is(err, errStopped):
		return true, err
	case s.ctx.Err() != nil:
		return true, s.ctx.Err()
	case context.Cause(ctx) == errIdle:
		return true, fmt.Errorf("%w: %w", errDropped, errIdle)
	case err == io.EOF && !s.follow:
		return true, nil // the replay is complete
	case err == io.EOF:
		return true, fmt.Errorf("%w: the server ended it", errDropped)
	default:
		return true, fmt.Errorf("%w: %w", errDropped, err)
	}
}

// errIdle: nothing came for IdleTimeout.
var errIdle = errors.New("nothing received for too long")

// read parses the event stream, yielding each event after s.after; an
// event is dispatched at its blank line, so a torn last one is dropped
// (and read again on resume). io.EOF means the server ended the body.
func (s *streamState) read(body io.Reader, alive func()) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), maxEventLine)
	var id int64
	var hasID bool
	var data []byte
	var typ string
	for sc.Scan() {
		alive()
		line := sc.Text()
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch {
		case line == "":
			switch {
			case data != nil && typ == TypeReset:
				if err := s.reset(data); err != nil {
					return err
				}
			case data != nil && hasID:
				if err := s.dispatch(id, data); err != nil {
					return err
				}
			}
			data, hasID, typ = nil, false, ""
		case field == "event":
			typ = value
		case field == "": // a comment: the heartbeat
		case field == "id":
			// "SEQ.INCARNATION" (a bare SEQ from a server before
			// incarnations); the incarnation is the stream's, which
			// its Room-Incarnation header already named.
			num, _, _ := strings.Cut(value, ".")
			n, err := strconv.ParseInt(num, 10, 64)
			if err != nil {
				return fmt.Errorf("client: the stream sent a bad id %q", value)
			}
			id, hasID = n, true
		case field == "data":
			if data != nil {
				data = append(data, '\n')
			}
			data = append(data, value...)
		case field == "retry":
			if ms, err := strconv.Atoi(value); err == nil && ms > 0 {
				s.retry = time.Duration(ms) * time.Millisecond
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return io.EOF
}

// reset takes a reset event: the stream's position is of another
// incarnation, so it starts again from the first event of the room's
// present one (or, the room gone, waits for the id to name a new room).
func (s *streamState) reset(data []byte) error {
	var r Reset
	ev := Event{Data: json.RawMessage(data)}
	if err := json.Unmarshal(data, &ev); err != nil {
		return fmt.Errorf("client: reset event: %w", err)
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return fmt.Errorf("client: reset event: %w", err)
	}
	ev.Data, ev.Seq, ev.Type = json.RawMessage(data), 0, TypeReset
	s.inc, s.after, s.gone = r.Incarnation, 0, r.Incarnation == ""
	if !s.yield(ev, nil) {
		return errStopped
	}
	return nil
}

func (s *streamState) dispatch(id int64, data []byte) error {
	if id <= s.after {
		return nil // seen already
	}
	ev := Event{Data: json.RawMessage(data)}
	if err := json.Unmarshal(data, &ev); err != nil {
		return fmt.Errorf("client: event %d: %w", id, err)
	}
	ev.Data = json.RawMessage(data)
	ev.Seq = id
	s.after = id
	if !s.yield(ev, nil) {
		return errStopped
	}
	return nil
}

// Wait follows the room from the accepted message until its
// message.ended event and returns it: its outcome says how the message
// ended. ctx bounds the wait, reconnects included. A room deleted
// meanwhile (its events reset) gives ErrReset: the message is gone.
func (c *Client) Wait(ctx context.Context, room string, acc Accepted) (MessageEnded, error) {
	for ev, err := range c.FollowAt(ctx, room, acc.Incarnation, acc.Seq-1) {
		if err != nil {
			return MessageEnded{}, err
		}
		if ev.Type == TypeReset {
			return MessageEnded{}, fmt.Errorf("%w: message %s went with it", ErrReset, acc.ID)
		}
		if ev.Type != TypeMessageEnded {
			continue
		}
		var me MessageEnded
		if err := ev.Decode(&me); err != nil {
			return MessageEnded{}, fmt.Errorf("client: event %d: %w", ev.Seq, err)
		}
		if me.MessageID == acc.ID {
			return me, nil
		}
	}
	return MessageEnded{}, ctx.Err()
}
