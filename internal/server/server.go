// Package server is agenthost's HTTP API over a room.Manager: JSON routes
// under /v1 behind a bearer token, a lossless Server-Sent Events stream of
// each room's event log, /healthz, /metrics (Prometheus) and the OpenAPI
// document that describes it all.
package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/agenthost/agenthost/internal/buildinfo"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults for Options.
const (
	// DefaultMaxBodyBytes bounds a request body: a message's text
	// (room.MaxMessageBytes) JSON-escaped, with room to spare.
	DefaultMaxBodyBytes = 4 * room.MaxMessageBytes
	// DefaultStreamBuffer bounds the live events waiting for one stream
	// client; a client that falls that far behind is cut off (it
	// reconnects with Last-Event-ID and loses nothing).
	DefaultStreamBuffer = 1024
	// DefaultHeartbeat is the interval of the stream's comment lines,
	// which keep proxies from closing an idle stream.
	DefaultHeartbeat = 15 * time.Second
	// DefaultWriteTimeout bounds one write to a stream client.
	DefaultWriteTimeout = 10 * time.Second
	// DefaultReadHeaderTimeout bounds the reading of a request's headers.
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultBodyTimeout bounds the reading of a request's body.
	DefaultBodyTimeout = 30 * time.Second
	// DefaultIdleTimeout closes a keep-alive connection idle that long.
	DefaultIdleTimeout = 60 * time.Second
	// DefaultMaxConns bounds the connections open at once (each event
	// stream holds one).
	DefaultMaxConns = 1024
	// replayPage is the number of events read from the store at once.
	replayPage = 1000
)

// Options configure a Server. Manager, and Token or Authorize, are required.
type Options struct {
	Manager *room.Manager
	// Token is the bearer token every route but /healthz and / requires.
	Token string
	// Authorize, if set, decides instead of Token whether a request to
	// such a route may pass as the admin (false: a room token's turn, or
	// 401); it must not read the body.
	Authorize func(r *http.Request) bool
	// TokenMessagesPerMinute and TokenStreams bound what one room token
	// may do (DefaultTokenMessagesPerMinute, DefaultTokenStreams): more
	// messages in a minute, or another event stream while that many are
	// open, are 429 with Retry-After. The admin token has no such bound.
	// 0 is the default; a negative value is no bound (a host that limits
	// its callers in front of the server).
	TokenMessagesPerMinute int
	TokenStreams           int
	// Tokens, if set, keeps the room tokens the admin creates (POST
	// /v1/tokens); without it the token routes answer 501 and only the
	// admin token passes.
	Tokens TokenStore
	// MaxBodyBytes bounds a request body (default DefaultMaxBodyBytes);
	// a larger one gets 413.
	MaxBodyBytes int64
	// StreamBuffer, Heartbeat and WriteTimeout tune the event stream (see
	// the defaults).
	StreamBuffer int
	Heartbeat    time.Duration
	WriteTimeout time.Duration
	// ReadHeaderTimeout, BodyTimeout, IdleTimeout and MaxConns bound the
	// connections of HTTPServer and Listener (see the defaults); none
	// applies to an event stream once it is answered.
	ReadHeaderTimeout time.Duration
	BodyTimeout       time.Duration
	IdleTimeout       time.Duration
	MaxConns          int
	// Index, if set, serves GET / (the web page); otherwise a placeholder.
	Index http.Handler
	// Health, if set, is asked by /healthz: an error makes it answer 503
	// with the error as the reason (a part the host needs is down).
	Health func() error
	// Collectors are more metrics /metrics serves (the host's own parts:
	// a cluster node's JetStream).
	Collectors []prometheus.Collector
	Logger     *slog.Logger
	// Version names the build in /healthz and the OpenAPI document's
	// info.version (default: buildinfo.Version()).
	Version string
	// Tracing, if set, traces the API's requests (otelhttp, continuing a
	// caller's W3C traceparent), and a POST .../messages gives its
	// request's span to the message as its trace context: the turn the
	// message starts is that span's child.
	Tracing *Tracing
}

// Tracing is what Options.Tracing takes.
type Tracing struct {
	Provider   trace.TracerProvider
	Propagator propagation.TextMapPropagator
	// Stats, if set, gives /metrics the tracer's counters.
	Stats func() TraceStats
}

// TraceStats are a tracer's counters, for /metrics: spans exported and
// dropped, rooms' events dropped before they became spans, and the
// agents' span batches relayed to the collector and refused (serve
// --otlp-agents).
type TraceStats struct {
	SpansExported, SpansDropped, EventsDropped uint64
	AgentBatchesRelayed, AgentBatchesRefused   uint64
}

// untraced are the routes with no span of their own: scrapes, health
// checks, and event streams (open for hours; their events are the turns'
// spans already).
var untraced = map[string]bool{"GET /healthz": true, "GET /metrics": true, "GET /v1/rooms/{room}/events": true}

// Server is the HTTP API. Create it with New, serve Handler, Close it
// before closing the Manager.
type Server struct {
	opts    Options
	m       *room.Manager
	log     *slog.Logger
	mux     *http.ServeMux
	metrics *metrics
	hubs    *hubs
	tokens  *tokens
	openapi []byte // the OpenAPI document with info.version set

	ctx    context.Context // ends open streams at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// observe, if set, sees the route pattern and status of every
	// response (tests check them against the OpenAPI document).
	observe func(pattern string, status int)
}

// New returns a Server over opts.Manager.
func New(opts Options) (*Server, error) {
	if opts.Manager == nil {
		return nil, errors.New("server: Options.Manager is required")
	}
	if opts.Token == "" && opts.Authorize == nil {
		return nil, errors.New("server: Options.Token or Options.Authorize is required")
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.StreamBuffer <= 0 {
		opts.StreamBuffer = DefaultStreamBuffer
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = DefaultHeartbeat
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultWriteTimeout
	}
	if opts.ReadHeaderTimeout <= 0 {
		opts.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if opts.BodyTimeout <= 0 {
		opts.BodyTimeout = DefaultBodyTimeout
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = DefaultMaxConns
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.TokenMessagesPerMinute == 0 {
		opts.TokenMessagesPerMinute = DefaultTokenMessagesPerMinute
	}
	if opts.TokenStreams == 0 {
		opts.TokenStreams = DefaultTokenStreams
	}
	if opts.Version == "" {
		opts.Version = buildinfo.Version()
	}
	doc, err := openAPIDoc(opts.Version)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	lctx, lcancel := context.WithTimeout(ctx, time.Minute)
	toks, err := newTokens(ctx, lctx, opts.Tokens)
	lcancel()
	if err != nil {
		cancel()
		return nil, err
	}
	s := &Server{opts: opts, m: opts.Manager, log: opts.Logger, ctx: ctx, cancel: cancel, mux: http.NewServeMux(), openapi: doc, tokens: toks}
	s.hubs = newHubs(s)
	s.metrics = newMetrics(s)
	for _, rt := range s.routes() {
		var h http.Handler = rt.handler
		if !rt.open {
			h = s.authFor(rt.pattern, h)
		}
		if t := opts.Tracing; t != nil && !untraced[rt.pattern] {
			// The route's pattern names its spans (never a room's id).
			h = otelhttp.NewHandler(h, rt.pattern, otelhttp.WithTracerProvider(t.Provider), otelhttp.WithPropagators(t.Propagator))
		}
		s.mux.Handle(rt.pattern, h)
	}
	return s, nil
}

// errClosing refuses a stream that joins while the server closes (503).
var errClosing = fmt.Errorf("server closing: %w", room.ErrClosed)

// Close ends the open event streams. It does not close the Manager.
func (s *Server) Close() {
	// Under the hubs' lock, so that a hub is either started before the
	// cancel (and waited for) or refused after it: never added to wg
	// while Wait runs.
	s.hubs.mu.Lock()
	s.cancel()
	s.hubs.mu.Unlock()
	s.wg.Wait()
	s.metrics.close()
	s.tokens.close()
}

type route struct {
	pattern string
	handler http.HandlerFunc
	open    bool // no token
}

// routes are every route the server serves; the OpenAPI test walks them.
func (s *Server) routes() []route {
	return []route{
		{pattern: "GET /{$}", handler: s.index, open: true},
		{pattern: "GET /healthz", handler: s.healthz, open: true},
		{pattern: "GET /metrics", handler: s.metrics.serve},
		{pattern: "GET /v1/openapi.json", handler: s.serveOpenAPI},
		{pattern: "GET /v1/token", handler: s.whoami},
		{pattern: "POST /v1/tokens", handler: s.createToken},
		{pattern: "GET /v1/tokens", handler: s.listTokens},
		{pattern: "DELETE /v1/tokens/{id}", handler: s.revokeToken},
		{pattern: "GET /v1/rooms", handler: s.listRooms},
		{pattern: "GET /v1/rooms/{room}", handler: s.getRoom},
		{pattern: "DELETE /v1/rooms/{room}", handler: s.releaseRoom},
		{pattern: "POST /v1/rooms/{room}/messages", handler: s.postMessage},
		{pattern: "GET /v1/rooms/{room}/messages", handler: s.listMessages},
		{pattern: "GET /v1/rooms/{room}/turns", handler: s.listTurns},
		{pattern: "POST /v1/rooms/{room}/cancel", handler: s.cancelTurn},
		{pattern: "POST /v1/rooms/{room}/approvals/{id}", handler: s.approve},
		{pattern: "POST /v1/rooms/{room}/questions/{id}", handler: s.answer},
		{pattern: "GET /v1/rooms/{room}/events", handler: s.events},
		{pattern: "GET /v1/rooms/{room}/config", handler: s.getConfig},
		{pattern: "PUT /v1/rooms/{room}/config", handler: s.putConfig},
		{pattern: "GET /v1/rooms/{room}/turns/{turn}/diff", handler: s.turnDiff},
		{pattern: "POST /v1/rooms/{room}/turns/{turn}/revert", handler: s.revertTurn},
	}
}

// ServeHTTP serves the API. Requests no route matches get a JSON error
// (404, or 405 with Allow) like every other error.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h, pattern := s.mux.Handler(r)
	if s.observe != nil {
		sw := &statusWriter{ResponseWriter: w}
		w = sw
		defer func() { s.observe(pattern, sw.status) }()
	}
	if pattern == "" {
		// The mux's own 404 or 405: keep its status and headers, give a
		// JSON body.
		cw := &captureWriter{header: w.Header()}
		h.ServeHTTP(cw, r)
		msg := "no such route"
		switch {
		case cw.status == http.StatusMethodNotAllowed:
			msg = "method " + r.Method + " not allowed here"
		case cw.status/100 == 3:
			// The mux redirects a path with . or .. segments (or a double
			// slash) to its clean form: a DELETE of /v1/rooms/.. is no
			// room's, and is told so rather than sent elsewhere.
			w.Header().Del("Location")
			cw.status, msg = http.StatusBadRequest, "the path must be in its clean form: no . or .. segment, no double slash"
		}
		writeError(w, cw.status, msg)
		return
	}
	// The mux (not h) serves, so that it sets the path values.
	s.mux.ServeHTTP(w, r)
}

// statusWriter records the status of a response.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// captureWriter keeps a status and drops the body.
type captureWriter struct {
	header http.Header
	status int
}

func (w *captureWriter) Header() http.Header { return w.header }
func (w *captureWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}
func (w *captureWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return len(b), nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"encoding the response failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// fail maps an error from the Manager to a status and message.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error, what string) {
	if msg := tokenEnded(r); msg != "" {
		unauthorized(w, msg)
		return
	}
	status := http.StatusInternalServerError
	msg := what + ": internal error"
	switch {
	case errors.Is(err, room.ErrBadID), errors.Is(err, room.ErrBadMessage):
		status, msg = http.StatusBadRequest, trimPrefix(err)
	case errors.Is(err, room.ErrQueueFull):
		status, msg = http.StatusTooManyRequests, trimPrefix(err)
		// A place frees when a turn ends; a client that sends again
		// (with its idempotency key) waits this long first.
		w.Header().Set("Retry-After", "1")
	case errors.Is(err, room.ErrBudgetExhausted):
		status, msg = http.StatusTooManyRequests, trimPrefix(err)
	case errors.Is(err, room.ErrKeyReused):
		status, msg = http.StatusUnprocessableEntity, trimPrefix(err)
	case errors.Is(err, room.ErrBadSettings):
		status, msg = http.StatusBadRequest, strings.TrimPrefix(trimPrefix(err), "bad settings: ")
	case errors.Is(err, room.ErrNoSettings):
		status, msg = http.StatusNotImplemented, trimPrefix(err)
	case errors.Is(err, room.ErrNotFound):
		status, msg = http.StatusNotFound, what+": not found"
	case errors.Is(err, room.ErrNotHeld):
		// In a cluster, no node runs the room (nothing of it is pending
		// there): what the request names is not found on any node.
		status, msg = http.StatusNotFound, what+": not found (no node holds the room)"
	case errors.Is(err, room.ErrConflict):
		status, msg = http.StatusConflict, what+": already resolved"
	case errors.Is(err, room.ErrNoTurn):
		status, msg = http.StatusConflict, "no turn is running in this room"
	case errors.Is(err, room.ErrClosed), errors.Is(err, room.ErrNotStarted), errors.Is(err, store.ErrClosed):
		status, msg = http.StatusServiceUnavailable, "the server is shutting down"
	case errors.Is(err, room.ErrUnavailable):
		status, msg = http.StatusServiceUnavailable, trimPrefix(err)
		w.Header().Set("Retry-After", "1")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		status, msg = http.StatusServiceUnavailable, what+": request ended before it completed"
	default:
		s.log.Error("server: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeError(w, status, msg)
}

// trimPrefix drops the "room: " package prefix of a room error.
func trimPrefix(err error) string { return strings.TrimPrefix(err.Error(), "room: ") }

// decode reads a JSON object body into v: 415 for another content type,
// 413 over the size limit, 400 for anything malformed (unknown fields
// included, so a misspelt field is not silently ignored).
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			writeError(w, http.StatusUnsupportedMediaType, "the body must be application/json")
			return false
		}
	}
	// A body that trickles in holds its connection no longer than this
	// (past it the deadline stays: the rest of the body is not waited for).
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(s.opts.BodyTimeout))
	body := http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes)
	var seen bytes.Buffer
	dec := json.NewDecoder(io.TeeReader(body, &seen))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("trailing data after the JSON object")
		}
	}
	var ne net.Error
	timedOut := errors.As(err, &ne) && ne.Timeout()
	if !timedOut {
		_ = rc.SetReadDeadline(time.Time{})
	}
	if err == nil {
		if field := nullField(seen.Bytes(), v); field != "" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("%s must not be null (leave it out instead)", field))
			return false
		}
		return true
	}
	var mbe *http.MaxBytesError
	var ute *json.UnmarshalTypeError
	switch {
	case timedOut:
		writeError(w, http.StatusRequestTimeout, fmt.Sprintf("the body did not arrive within %s", s.opts.BodyTimeout))
	case errors.As(err, &mbe):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is over %d bytes", mbe.Limit))
	case errors.Is(err, io.EOF):
		writeError(w, http.StatusBadRequest, "the body is empty: a JSON object is required")
	case errors.As(err, &ute):
		msg := room.DecodeError(err)
		if ute.Field == "" {
			msg = "the body must be a JSON object"
		}
		writeError(w, http.StatusBadRequest, msg)

	default:
		writeError(w, http.StatusBadRequest, "malformed JSON body: "+strings.TrimPrefix(err.Error(), "json: "))
	}
	return false
}

// nullField names a field of the body object that is null ("" for none):
// a null reads as the field left out, and no field of the bodies decoded
// into a struct has null among its values. A body kept raw (the settings)
// is checked by its reader.
func nullField(body []byte, v any) string {
	if _, raw := v.(*json.RawMessage); raw {
		return ""
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return ""
	}
	var null []string
	for k, val := range top {
		if string(bytes.TrimSpace(val)) == "null" {
			null = append(null, k)
		}
	}
	if len(null) == 0 {
		return ""
	}
	slices.Sort(null)
	return null[0]
}

// roomID returns the path's room id, or writes 400.
func roomID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("room")
	if err := room.ValidateID(id); err != nil {
		writeError(w, http.StatusBadRequest, trimPrefix(err))
		return "", false
	}
	return id, true
}

// objectID checks an approval or question id from the path.
func objectID(w http.ResponseWriter, r *http.Request, what string) (string, bool) {
	id := r.PathValue("id")
	if id == "" || len(id) > 128 || strings.ContainsFunc(id, func(c rune) bool { return c < 0x21 || c > 0x7e }) {
		writeError(w, http.StatusBadRequest, what+" id must be 1 to 128 printable ASCII characters")
		return "", false
	}
	return id, true
}

func (s *Server) index(w http.ResponseWriter, r *http.Request) {
	if s.opts.Index != nil {
		s.opts.Index.ServeHTTP(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = io.WriteString(w, `<!doctype html><meta charset="utf-8"><title>agenthost</title>
<p>agenthost is running. The web page comes in a later version; the API is under <code>/v1</code>
(see <a href="/v1/openapi.json">/v1/openapi.json</a>, bearer token required).</p>
`)
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	if h := s.opts.Health; h != nil {
		if err := h(); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unhealthy", "reason": err.Error(), "version": s.opts.Version})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "version": s.opts.Version})
}

// afterParam parses ?after=N (0 when absent).
func afterParam(w http.ResponseWriter, r *http.Request) (int64, bool) {
	v := r.URL.Query().Get("after")
	if v == "" {
		return 0, true
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		writeError(w, http.StatusBadRequest, "after must be a non-negative integer")
		return 0, false
	}
	return n, true
}

func limitParam(w http.ResponseWriter, r *http.Request, def, max int) (int, bool) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return def, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > max {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("limit must be an integer from 1 to %d", max))
		return 0, false
	}
	return n, true
}
