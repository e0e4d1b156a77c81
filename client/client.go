// Package client is a Go client for agenthost's HTTP API (`agenthost
// serve`): typed calls for rooms, messages, approvals and questions, and a
// room's event stream that replays and follows, reconnecting by itself with
// Last-Event-ID (with backoff) for as long as the caller's context allows.
//
// Every call takes a context.Context, which bounds it, a stream's
// reconnects included. An error the server answered is an *APIError that
// matches one of ErrBadRequest, ErrUnauthorized, ErrNotFound, ErrConflict,
// ErrKeyReused, ErrQueueFull, ErrBudgetExhausted, ErrNotSupported and
// ErrUnavailable with errors.Is; a server that does not answer gives
// ErrUnreachable, and Wait on a message whose room was deleted ErrReset.
//
// New takes the server's address and token; with an empty address and
// token it reads them from AGENTHOST_URL and AGENTHOST_TOKEN, as the
// agenthost command does.
//
// Exactly once: Send sends every message with an idempotency key and, when
// the answer is lost (a dropped connection, a server restarting), sends it
// again with the same key; the room accepts one message per key, so a
// message is accepted once and runs one turn however often it is sent.
//
// A room's events belong to one incarnation of it: a room deleted (Purge)
// and created again under its id starts its log at 1 again. A stream that
// resumes into another incarnation yields a reset event (TypeReset) and
// goes on from the room's first event, so a follower never skips the new
// room's events or takes them for the old one's.
//
// A room's events are package event's types: Event.Payload decodes one.
// The package depends on the standard library and on agenthost's public
// data packages only: event, record, and custody for its receipts.
package client

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Errors; match them with errors.Is.
var (
	// ErrBadRequest: the server refused the request as malformed (400,
	// 413, 415), or the client did before sending it (an invalid room id).
	ErrBadRequest = errors.New("client: bad request")
	// ErrUnauthorized: the bearer token is missing or wrong (401).
	ErrUnauthorized = errors.New("client: unauthorized")
	// ErrForbidden: the token is a room token without the scope the
	// request needs (403): a room it does not reach, a permission it
	// lacks, an admin route. The error's text says which.
	ErrForbidden = errors.New("client: forbidden")
	// ErrNotFound: no such room, approval or question (404).
	ErrNotFound = errors.New("client: not found")
	// ErrConflict: the request conflicts with the room's state (409): an
	// approval or question already resolved, no turn to cancel, a turn
	// running where none may.
	ErrConflict = errors.New("client: conflict")
	// ErrQueueFull: the room's queue is full (429); the message was not
	// accepted.
	ErrQueueFull = errors.New("client: queue full")
	// ErrBudgetExhausted: the room's totals reached its budget (429); the
	// message was not accepted. The error's text names the limit.
	ErrBudgetExhausted = errors.New("client: room budget exhausted")
	// ErrNotSupported: the server cannot do this (501): a purge where
	// rooms are spread over a cluster, settings with a store that keeps
	// none.
	ErrNotSupported = errors.New("client: not supported by this server")
	// ErrUnavailable: the server is shutting down or cannot serve the
	// room now (503, or 502/504 from a proxy). A stream retries these.
	ErrUnavailable = errors.New("client: server unavailable")
	// ErrUnreachable: no answer from the server (refused, reset, no
	// route). A stream retries these.
	ErrUnreachable = errors.New("client: no answer from the server")
	// ErrKeyReused: the room accepted another message with the same
	// idempotency key (422); the error's text names it.
	ErrKeyReused = errors.New("client: idempotency key reused for another message")
	// ErrReset: the room was deleted (purged) while Wait waited for one
	// of its messages; the message is gone with it.
	ErrReset = errors.New("client: the room was deleted")
)

// APIError is an error answer of the server.
type APIError struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Message is the server's error text (its {"error": ...} body).
	Message string
	// RetryAfter is how long the server asked the client to wait before
	// it tries again (its Retry-After header; 0 when it did not say).
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s (HTTP %d)", e.Message, e.StatusCode)
}

// Is matches the sentinel of the error's status.
func (e *APIError) Is(target error) bool {
	switch e.StatusCode {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
		return target == ErrBadRequest
	case http.StatusUnauthorized:
		return target == ErrUnauthorized
	case http.StatusForbidden:
		return target == ErrForbidden
	case http.StatusNotFound:
		return target == ErrNotFound
	case http.StatusConflict:
		return target == ErrConflict
	case http.StatusUnprocessableEntity:
		return target == ErrKeyReused
	case http.StatusTooManyRequests:
		if strings.HasPrefix(e.Message, "room budget exhausted") {
			return target == ErrBudgetExhausted
		}
		return target == ErrQueueFull
	case http.StatusNotImplemented:
		return target == ErrNotSupported
	case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
		return target == ErrUnavailable
	}
	return false
}

// Defaults for Options.
const (
	// DefaultMinBackoff is a stream's first wait before reconnecting when
	// the server names none (its SSE retry field).
	DefaultMinBackoff = 250 * time.Millisecond
	// DefaultMaxBackoff bounds a stream's wait between reconnects.
	DefaultMaxBackoff = 5 * time.Second
	// DefaultIdleTimeout is how long a stream may go without a byte
	// (the server sends a heartbeat every 15 s) before it is taken for
	// dead and reconnected.
	DefaultIdleTimeout = 45 * time.Second
	// DefaultSendAttempts bounds the attempts of one Send.
	DefaultSendAttempts = 5
	// maxRetryAfter bounds the wait a server's Retry-After may ask of
	// Send between two attempts.
	maxRetryAfter = time.Minute
	// maxResponse bounds a JSON answer; maxEventLine bounds one line of
	// an event stream.
	maxResponse  = 64 << 20
	maxEventLine = 64 << 20
)

// Environment variables New reads when its address or token is empty
// (the agenthost command's own).
const (
	EnvURL   = "AGENTHOST_URL"
	EnvToken = "AGENTHOST_TOKEN"
)

// UserAgent is the User-Agent of the client's requests unless
// Options.UserAgent says otherwise.
const UserAgent = "agenthost-go-client"

// Options configure a Client.
type Options struct {
	// Token is the server's bearer token (default: $AGENTHOST_TOKEN); one
	// of them is required.
	Token string
	// UserAgent names the program in each request's User-Agent header,
	// before the client's own (UserAgent).
	UserAgent string
	// HTTPClient sends the requests (default: a new http.Client). Its
	// Timeout, if set, must outlast a followed stream; the context of
	// each call is the intended bound.
	HTTPClient *http.Client
	// MinBackoff is a stream's first wait before reconnecting (default:
	// the server's SSE retry field, else DefaultMinBackoff), and Send's
	// before sending again (default DefaultMinBackoff); the wait doubles
	// per failed attempt up to MaxBackoff (DefaultMaxBackoff).
	MinBackoff, MaxBackoff time.Duration
	// SendAttempts bounds the attempts of one Send (default
	// DefaultSendAttempts; 1: it never sends again).
	SendAttempts int
	// IdleTimeout: a stream silent this long is reconnected (default
	// DefaultIdleTimeout).
	IdleTimeout time.Duration
	// OnReconnect, if set, is told of a stream's reconnects: before each
	// wait (Err says why the stream ended or the attempt failed) and once
	// a reconnect succeeds (Err nil). It runs on the caller's goroutine.
	OnReconnect func(Reconnect)
}

// Reconnect describes a stream reconnecting (see Options.OnReconnect).
type Reconnect struct {
	Room string
	// After is the last sequence number received: the stream resumes
	// after it (Last-Event-ID).
	After int64
	// Attempt counts the attempts since the stream last connected, from 1.
	Attempt int
	// Delay is the wait before this attempt.
	Delay time.Duration
	// Err is why the stream ended or the last attempt failed; nil once
	// the attempt connected.
	Err error
}

// Client talks to one agenthost server. It is safe for concurrent use.
type Client struct {
	base *url.URL // ends with "/"
	opts Options
	hc   *http.Client
}

// New returns a Client for the server at baseURL (for example
// "http://127.0.0.1:7420"). An empty baseURL is $AGENTHOST_URL, and an
// empty Options.Token $AGENTHOST_TOKEN, as for the agenthost command.
func New(baseURL string, opts Options) (*Client, error) {
	if baseURL == "" {
		if baseURL = os.Getenv(EnvURL); baseURL == "" {
			return nil, errors.New("client: no server address: give one, or set AGENTHOST_URL")
		}
	}
	if opts.Token == "" {
		opts.Token = os.Getenv(EnvToken)
	}
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("client: server address %q: %w", baseURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("client: server address %q: want http://HOST:PORT or https://HOST", baseURL)
	}
	if opts.Token == "" {
		return nil, errors.New("client: Options.Token (or AGENTHOST_TOKEN) is required")
	}
	u.Fragment, u.RawQuery = "", ""
	if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{}
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = DefaultMaxBackoff
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.SendAttempts <= 0 {
		opts.SendAttempts = DefaultSendAttempts
	}
	return &Client{base: u, opts: opts, hc: opts.HTTPClient}, nil
}

// URL returns the server's base address.
func (c *Client) URL() string { return c.base.String() }

// roomPath returns "v1/rooms/{room}" + rest, refusing an id that would
// name another route once in a path ("", ".", ".." or with a slash); the
// server judges the rest of its rules.
func roomPath(room string, rest ...string) (string, error) {
	if room == "" || room == "." || room == ".." || strings.ContainsAny(room, "/\\") {
		return "", fmt.Errorf("%w: invalid room id %q", ErrBadRequest, room)
	}
	p := "v1/rooms/" + url.PathEscape(room)
	for _, r := range rest {
		p += "/" + url.PathEscape(r)
	}
	return p, nil
}

// newRequest builds a request for path (relative to the base) with the
// token.
func (c *Client) newRequest(ctx context.Context, method, path string, query url.Values, body io.Reader) (*http.Request, error) {
	u := *c.base
	ref, err := url.Parse(path)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	full := u.ResolveReference(ref)
	if len(query) > 0 {
		full.RawQuery = query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, full.String(), body)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.opts.Token)
	ua := UserAgent
	if c.opts.UserAgent != "" {
		ua = c.opts.UserAgent + " " + ua
	}
	req.Header.Set("User-Agent", ua)
	return req, nil
}

// unreachable wraps a transport error.
func (c *Client) unreachable(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return fmt.Errorf("%w at %s: %w", ErrUnreachable, c.base, err)
}

// do sends a request with a JSON body (if body is not nil) and decodes a
// JSON answer into out (if not nil).
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body, out any) error {
	return c.doWith(ctx, method, path, query, nil, body, out)
}

// doWith is do with extra request headers.
func (c *Client) doWith(ctx context.Context, method, path string, query url.Values, header http.Header, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("client: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := c.newRequest(ctx, method, path, query, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return c.unreachable(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, maxResponse+1))
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return c.unreachable(err)
	}
	if res.StatusCode/100 != 2 {
		e := apiError(res.StatusCode, raw)
		e.RetryAfter = retryAfter(res.Header.Get("Retry-After"))
		return e
	}
	if len(raw) > maxResponse {
		return fmt.Errorf("client: %s %s: the answer is over %d bytes", method, path, maxResponse)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("client: %s %s: decoding the answer: %w", method, path, err)
		}
	}
	return nil
}

// apiError makes the error of a non-2xx answer.
func apiError(status int, raw []byte) *APIError {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(raw, &e) != nil || e.Error == "" {
		e.Error = http.StatusText(status)
	}
	return &APIError{StatusCode: status, Message: e.Error}
}

// retryAfter reads a Retry-After header: seconds or an HTTP date (0 when
// absent or unreadable).
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// Health returns the server's liveness and version (GET /healthz; no
// token needed, though the client sends it).
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	err := c.do(ctx, "GET", "healthz", nil, nil, &h)
	return h, err
}

// MaxRoomsPage is the largest page RoomsPage asks for.
const MaxRoomsPage = 1000

// RoomsPage is one page of GET /v1/rooms: rooms in order of id.
type RoomsPage struct {
	Rooms []Room `json:"rooms"`
	// Total is the number of rooms the server knows.
	Total int `json:"total"`
	// Next, when rooms follow, is the after of the next page ("" on the
	// last page).
	Next string `json:"next,omitempty"`
}

// RoomsPage returns up to limit rooms (the server's default page for 0,
// at most MaxRoomsPage) whose ids sort after after ("" for the first
// page), with their states.
func (c *Client) RoomsPage(ctx context.Context, after string, limit int) (RoomsPage, error) {
	q := url.Values{}
	if after != "" {
		q.Set("after", after)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(min(limit, MaxRoomsPage)))
	}
	var out RoomsPage
	err := c.do(ctx, "GET", "v1/rooms", q, nil, &out)
	return out, err
}

// Rooms lists every room the server knows, with its state, reading the
// pages in turn (ctx bounds them all).
func (c *Client) Rooms(ctx context.Context) ([]Room, error) {
	var all []Room
	after := ""
	for {
		p, err := c.RoomsPage(ctx, after, MaxRoomsPage)
		if err != nil {
			return nil, err
		}
		all = append(all, p.Rooms...)
		if p.Next == "" {
			return all, nil
		}
		// A cursor that does not move on would page forever.
		if p.Next <= after {
			return nil, fmt.Errorf("client: GET /v1/rooms: next %q does not follow %q", p.Next, after)
		}
		after = p.Next
	}
}

// Room returns one room's state (ErrNotFound for a room the server does
// not know).
func (c *Client) Room(ctx context.Context, room string) (Room, error) {
	p, err := roomPath(room)
	if err != nil {
		return Room{}, err
	}
	var r Room
	err = c.do(ctx, "GET", p, nil, nil, &r)
	return r, err
}

// Send submits a message to a room (creating the room on first use). It
// returns once the server has durably accepted it; the message then ends
// with exactly one message.ended event (see Wait).
//
// Send is safe to repeat: the message goes with an idempotency key
// (msg.IdempotencyKey, else a random one) and, after a connection error,
// a 503 (or a proxy's 502 or 504) or a full queue (429), Send sends it
// again with the same key, up to Options.SendAttempts times, waiting
// between attempts with backoff and jitter, and at least as long as the
// server's Retry-After asks: the room accepts it once, and a second
// attempt after a lost answer gets the first one's acceptance. A full
// queue after the last attempt gives ErrQueueFull; an exhausted budget
// (ErrBudgetExhausted) and other refusals are not sent again.
func (c *Client) Send(ctx context.Context, room string, msg NewMessage) (Accepted, error) {
	p, err := roomPath(room, "messages")
	if err != nil {
		return Accepted{}, err
	}
	key := msg.IdempotencyKey
	if key == "" {
		key = newKey()
	}
	header := http.Header{"Idempotency-Key": {key}}
	for attempt := 1; ; attempt++ {
		var acc Accepted
		err = c.doWith(ctx, "POST", p, nil, header, msg, &acc)
		if err == nil || attempt >= c.opts.SendAttempts || !sendAgain(err) || ctx.Err() != nil {
			return acc, err
		}
		t := time.NewTimer(c.sendDelay(attempt, err))
		select {
		case <-ctx.Done():
			t.Stop()
			return Accepted{}, fmt.Errorf("%w (sending again after: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// sendAgain reports whether Send sends a message again after err: the
// server did not answer, could not serve it now, or its queue was full.
func sendAgain(err error) bool {
	return errors.Is(err, ErrUnreachable) || errors.Is(err, ErrUnavailable) || errors.Is(err, ErrQueueFull)
}

// sendDelay is the wait before Send's attempt after attempt (from 1):
// MinBackoff doubled per attempt up to MaxBackoff, half of it random (so
// that clients refused at once do not come back at once), and at least
// the server's Retry-After (bounded).
func (c *Client) sendDelay(attempt int, err error) time.Duration {
	d := c.opts.MinBackoff
	if d <= 0 {
		d = DefaultMinBackoff
	}
	for i := 1; i < attempt && d < c.opts.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, c.opts.MaxBackoff)
	d = d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
	var ae *APIError
	if errors.As(err, &ae) && ae.RetryAfter > d {
		d = min(ae.RetryAfter, maxRetryAfter)
	}
	return d
}

// newKey is a random idempotency key.
func newKey() string {
	var b [16]byte
	_, _ = crand.Read(b[:])
	return "go-" + hex.EncodeToString(b[:])
}

// MaxPage is the largest page Messages and Turns ask for.
const MaxPage = 1000

// pageQuery is the after and limit of a page (limit 0: the server's
// default; over MaxPage: MaxPage).
func pageQuery(after int64, limit int) url.Values {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(min(limit, MaxPage)))
	}
	return q
}

// Messages lists a room's messages with their status and outcome, oldest
// first: up to limit (0: the server's default of 100; at most MaxPage)
// after sequence number after.
func (c *Client) Messages(ctx context.Context, room string, after int64, limit int) ([]Message, error) {
	p, err := roomPath(room, "messages")
	if err != nil {
		return nil, err
	}
	var out struct {
		Messages []Message `json:"messages"`
	}
	err = c.do(ctx, "GET", p, pageQuery(after, limit), nil, &out)
	return out.Messages, err
}

// Turns lists a room's turns with their outcome, final text and usage,
// oldest first: up to limit (0: the server's default of 100; at most
// MaxPage), those of the messages after sequence number after (0: from
// the first). With Messages, it is the conversation without the event log.
func (c *Client) Turns(ctx context.Context, room string, after int64, limit int) ([]Turn, error) {
	p, err := roomPath(room, "turns")
	if err != nil {
		return nil, err
	}
	var out struct {
		Turns []Turn `json:"turns"`
	}
	err = c.do(ctx, "GET", p, pageQuery(after, limit), nil, &out)
	return out.Turns, err
}

// Cancel cancels the room's running turn (ErrConflict when none runs).
func (c *Client) Cancel(ctx context.Context, room string) (Cancelled, error) {
	p, err := roomPath(room, "cancel")
	if err != nil {
		return Cancelled{}, err
	}
	var out Cancelled
	err = c.do(ctx, "POST", p, nil, nil, &out)
	return out, err
}

// Release releases the room's agent and returns its custody receipt
// (ErrConflict while a turn runs). The room and its history stay.
func (c *Client) Release(ctx context.Context, room string) (Released, error) {
	p, err := roomPath(room)
	if err != nil {
		return Released{}, err
	}
	var out Released
	err = c.do(ctx, "DELETE", p, nil, nil, &out)
	return out, err
}

// Purge deletes a room for good (DELETE /v1/rooms/{room}?purge=true):
// its agent is released (the receipt is in the answer only), and its
// session, home, workspace, snapshots, log and settings are deleted; the
// id may then name a new room. ErrConflict while a turn runs or messages
// wait.
func (c *Client) Purge(ctx context.Context, room string) (Purged, error) {
	p, err := roomPath(room)
	if err != nil {
		return Purged{}, err
	}
	var out Purged
	err = c.do(ctx, "DELETE", p, url.Values{"purge": {"true"}}, nil, &out)
	return out, err
}

// Approve decides a pending approval: allow or deny (ErrConflict when it
// is already resolved).
func (c *Client) Approve(ctx context.Context, room, approvalID string, allow bool) (Decision, error) {
	p, err := roomPath(room, "approvals", approvalID)
	if err != nil {
		return Decision{}, err
	}
	d := DecisionDeny
	if allow {
		d = DecisionAllow
	}
	var out Decision
	err = c.do(ctx, "POST", p, nil, map[string]string{"decision": d}, &out)
	return out, err
}

// Answer answers a pending question (ErrConflict when it is already
// answered).
func (c *Client) Answer(ctx context.Context, room, questionID, answer string) (Answered, error) {
	p, err := roomPath(room, "questions", questionID)
	if err != nil {
		return Answered{}, err
	}
	var out Answered
	err = c.do(ctx, "POST", p, nil, map[string]string{"answer": answer}, &out)
	return out, err
}

// TurnDiff returns what a turn changed in the room's workspace
// (ErrNotFound for a turn without snapshots, ErrConflict while it runs).
func (c *Client) TurnDiff(ctx context.Context, room, turn string) (TurnDiff, error) {
	p, err := turnPath(room, turn, "diff")
	if err != nil {
		return TurnDiff{}, err
	}
	var out TurnDiff
	err = c.do(ctx, "GET", p, nil, nil, &out)
	return out, err
}

// Revert restores the room's workspace to its state before a turn, later
// turns' changes included (ErrConflict while a turn runs, ErrNotFound for
// a turn without snapshots).
func (c *Client) Revert(ctx context.Context, room, turn string) (Reverted, error) {
	p, err := turnPath(room, turn, "revert")
	if err != nil {
		return Reverted{}, err
	}
	var out Reverted
	err = c.do(ctx, "POST", p, nil, nil, &out)
	return out, err
}

// turnPath is roomPath for one of a turn's routes.
func turnPath(room, turn, op string) (string, error) {
	if turn == "" || turn == "." || turn == ".." || strings.ContainsAny(turn, "/\\") {
		return "", fmt.Errorf("%w: invalid turn id %q", ErrBadRequest, turn)
	}
	return roomPath(room, "turns", turn, op)
}

// Config returns the room's effective settings: its own, with the
// server's defaults filled in (GET /v1/rooms/{room}/config).
func (c *Client) Config(ctx context.Context, room string) (RoomConfig, error) {
	p, err := roomPath(room, "config")
	if err != nil {
		return RoomConfig{}, err
	}
	var cfg RoomConfig
	err = c.do(ctx, "GET", p, nil, nil, &cfg)
	return cfg, err
}

// SetConfig sets the room's settings, the whole object (a field left
// empty takes the server's default), creating the room, and returns the
// effective ones (PUT /v1/rooms/{room}/config). Settings the server
// refuses give ErrBadRequest, with the reason.
func (c *Client) SetConfig(ctx context.Context, room string, cfg RoomConfig) (RoomConfig, error) {
	p, err := roomPath(room, "config")
	if err != nil {
		return RoomConfig{}, err
	}
	cfg.NextStart = nil
	var out RoomConfig
	err = c.do(ctx, "PUT", p, nil, cfg, &out)
	return out, err
}

// CreateToken creates a room token (POST /v1/tokens; the admin token
// only): it reaches only t.Rooms, with only t.Can, until it expires or is
// revoked. The answer's Secret is the token, given this once.
func (c *Client) CreateToken(ctx context.Context, t NewToken) (Token, error) {
	body := map[string]any{"rooms": t.Rooms, "can": t.Can}
	if t.ExpiresIn != 0 {
		body["expires_in"] = t.ExpiresIn.String()
	}
	if t.Label != "" {
		body["label"] = t.Label
	}
	var out Token
	err := c.do(ctx, "POST", "/v1/tokens", nil, body, &out)
	return out, err
}

// Tokens lists the room tokens, revoked and expired ones included,
// without their secrets (GET /v1/tokens; the admin token only).
func (c *Client) Tokens(ctx context.Context) ([]Token, error) {
	var out struct {
		Tokens []Token `json:"tokens"`
	}
	err := c.do(ctx, "GET", "/v1/tokens", nil, nil, &out)
	return out.Tokens, err
}

// RevokeToken revokes a room token at once: its requests are refused and
// its open event streams end (DELETE /v1/tokens/{id}). ErrNotFound for an
// unknown id; revoking a revoked token again is no error.
func (c *Client) RevokeToken(ctx context.Context, id string) error {
	if id == "" || strings.ContainsAny(id, "/?#% ") {
		return fmt.Errorf("%w: token id %q", ErrBadRequest, id)
	}
	return c.do(ctx, "DELETE", "/v1/tokens/"+url.PathEscape(id), nil, nil, nil)
}
