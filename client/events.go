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
)

// Event types of a room's log.
const (
	TypeMessageAccepted  = "message.accepted"
	TypeMessageQueued    = "message.queued"
	TypeMessageDelivered = "message.delivered"
	// TypeMessageEnded is the one terminal event of every accepted message.
	TypeMessageEnded      = "message.ended"
	TypeTurnWaiting       = "turn.waiting"
	TypeTurnStarted       = "turn.started"
	TypeTurnEnded         = "turn.ended"
	TypeTextDelta         = "text.delta"
	TypeToolStarted       = "tool.started"
	TypeToolEnded         = "tool.ended"
	TypeApprovalRequested = "approval.requested"
	TypeApprovalResolved  = "approval.resolved"
	TypeQuestionAsked     = "question.asked"
	TypeQuestionAnswered  = "question.answered"
	TypeAgentStarted      = "agent.started"
	TypeAgentAttached     = "agent.attached"
	TypeAgentReleased     = "agent.released"
	TypeContextLost       = "context.lost"
	TypeRoomPost          = "room.post"
	TypeEventsDropped     = "events.dropped"
	TypeWorkspaceReverted = "workspace.reverted"
)

// Event is one event of a room's log. Data is the whole event as the
// server sent it (a flat JSON object: seq, type, room, time and the
// type's own fields); Decode reads it into one of the payload types below.
type Event struct {
	// Seq is the room's sequence number: 1 for the first event, up by
	// exactly one per event.
	Seq  int64           `json:"seq"`
	Type string          `json:"type"`
	Room string          `json:"room"`
	Time time.Time       `json:"time"`
	Data json.RawMessage `json:"-"`
}

// Decode reads the event's fields into v (for example a *MessageEnded).
func (e Event) Decode(v any) error { return json.Unmarshal(e.Data, v) }

// Payloads of the event types a client usually acts on.
type (
	// MessageEnded (message.ended) ends every accepted message, whatever
	// consumed it: a turn (TurnID set), a question's answer, a cancel.
	MessageEnded struct {
		MessageID string `json:"message_id"`
		// Outcome is one of the Outcome constants.
		Outcome string `json:"outcome"`
		TurnID  string `json:"turn_id,omitempty"`
		// Reason says why, when the outcome is not settled or answered.
		Reason string `json:"reason,omitempty"`
	}
	// TurnStarted (turn.started): MessageID's turn runs.
	TurnStarted struct {
		TurnID    string `json:"turn_id"`
		MessageID string `json:"message_id"`
	}
	// TurnWaiting (turn.waiting): the turn waits for an agent slot.
	TurnWaiting struct {
		TurnID    string `json:"turn_id"`
		MessageID string `json:"message_id"`
		Slots     int    `json:"slots"`
		Resident  int    `json:"resident"`
	}
	// TurnEnded (turn.ended): Text is the turn's answer.
	TurnEnded struct {
		TurnID    string `json:"turn_id"`
		MessageID string `json:"message_id"`
		Outcome   string `json:"outcome"`
		Reason    string `json:"reason,omitempty"`
		Text      string `json:"text,omitempty"`
		// Changes is what the turn changed in the workspace; nil when the
		// server takes no snapshots, or when they failed (ChangesError
		// says why).
		Changes      *Changes `json:"changes,omitempty"`
		ChangesError string   `json:"changes_error,omitempty"`
		// Usage is what the turn cost, as the agent reported it (zeros
		// for an agent that reports nothing).
		Usage Usage `json:"usage"`
	}
	// WorkspaceReverted (workspace.reverted): the workspace was restored
	// to its state before TurnID.
	WorkspaceReverted struct {
		TurnID string   `json:"turn_id"`
		Files  []string `json:"files"`
		// Count is every path restored; FilesOmitted those not listed.
		Count        int      `json:"count"`
		FilesOmitted int      `json:"files_omitted,omitempty"`
		Kept         []string `json:"kept,omitempty"`
	}
	// MessageDelivered (message.delivered): a steer or follow-up reached
	// the running turn's agent.
	MessageDelivered struct {
		MessageID string `json:"message_id"`
		TurnID    string `json:"turn_id"`
		Delivery  string `json:"delivery"`
	}
	// TextDelta (text.delta): a piece of the turn's answer.
	TextDelta struct {
		TurnID string `json:"turn_id"`
		Text   string `json:"text"`
	}
	// ToolStarted (tool.started) and ToolEnded (tool.ended).
	ToolStarted struct {
		TurnID string `json:"turn_id"`
		Tool   string `json:"tool"`
		CallID string `json:"call_id"`
		Input  string `json:"input,omitempty"`
	}
	ToolEnded struct {
		TurnID  string `json:"turn_id"`
		Tool    string `json:"tool"`
		CallID  string `json:"call_id"`
		Output  string `json:"output,omitempty"`
		IsError bool   `json:"is_error"`
	}
	// ApprovalRequested (approval.requested): decide it with Approve.
	ApprovalRequested struct {
		ApprovalID string    `json:"approval_id"`
		TurnID     string    `json:"turn_id"`
		Tool       string    `json:"tool"`
		Input      string    `json:"input,omitempty"`
		Options    []string  `json:"options"`
		Deadline   time.Time `json:"deadline"`
	}
	// ApprovalResolved (approval.resolved): By is who decided ("person",
	// "deadline", "cancel", "policy", ...).
	ApprovalResolved struct {
		ApprovalID string `json:"approval_id"`
		Decision   string `json:"decision"`
		By         string `json:"by"`
	}
	// QuestionAsked (question.asked): answer it with Answer.
	QuestionAsked struct {
		QuestionID string    `json:"question_id"`
		TurnID     string    `json:"turn_id"`
		Title      string    `json:"title"`
		Options    []string  `json:"options"`
		Deadline   time.Time `json:"deadline"`
	}
	// QuestionAnswered (question.answered).
	QuestionAnswered struct {
		QuestionID string `json:"question_id"`
		Answer     string `json:"answer"`
		By         string `json:"by"`
		Cancelled  bool   `json:"cancelled"`
	}
)

// Events returns the room's events after sequence number after, in order
// and each once, and ends after the last one the server has. A dropped
// connection is resumed where it stopped. The sequence yields one error
// and stops: an *APIError, ErrUnreachable after the retries, or ctx's error.
func (c *Client) Events(ctx context.Context, room string, after int64) iter.Seq2[Event, error] {
	return c.stream(ctx, room, after, false)
}

// Follow returns the room's events after sequence number after, then the
// new ones as they come, until ctx ends or the loop stops. Whenever the
// stream drops (the server restarted, cut a slow reader, went silent past
// IdleTimeout, or answered 503) it reconnects with Last-Event-ID, waiting
// between attempts with backoff, for as long as ctx allows: no event is
// missed or repeated. Errors the server answers otherwise (401, 404, ...)
// and ctx's end are yielded once and end the sequence.
func (c *Client) Follow(ctx context.Context, room string, after int64) iter.Seq2[Event, error] {
	return c.stream(ctx, room, after, true)
}

func (c *Client) stream(ctx context.Context, room string, after int64, follow bool) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		p, err := roomPath(room, "events")
		if err != nil {
			yield(Event{}, err)
			return
		}
		s := &streamState{c: c, ctx: ctx, path: p, room: room, after: after, follow: follow, yield: yield}
		if err := s.run(); err != nil && !errors.Is(err, errStopped) {
			yield(Event{}, err)
		}
	}
}

// errStopped: the caller's loop ended.
var errStopped = errors.New("client: stopped")

type streamState struct {
	c      *Client
	ctx    context.Context
	path   string
	room   string
	after  int64
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
		if !retryable(err) {
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
func retryable(err error) bool {
	return errors.Is(err, ErrUnreachable) || errors.Is(err, ErrUnavailable) || errors.Is(err, errDropped)
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
	for sc.Scan() {
		alive()
		line := sc.Text()
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch {
		case line == "":
			if data != nil && hasID {
				if err := s.dispatch(id, data); err != nil {
					return err
				}
			}
			data, hasID = nil, false
		case field == "": // a comment: the heartbeat
		case field == "id":
			n, err := strconv.ParseInt(value, 10, 64)
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
// ended. ctx bounds the wait, reconnects included.
func (c *Client) Wait(ctx context.Context, room string, acc Accepted) (MessageEnded, error) {
	for ev, err := range c.Follow(ctx, room, acc.Seq-1) {
		if err != nil {
			return MessageEnded{}, err
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
