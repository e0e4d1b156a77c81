// Package modelsim is a scripted OpenAI- and Anthropic-compatible model server on 127.0.0.1, used by
// tests and as agenthost's built-in default model so that nothing needs an API key or the internet.
//
// It serves POST /v1/chat/completions (streaming and not), POST /v1/responses (the Responses API,
// streaming and not), POST /v1/messages (the Anthropic Messages API, streaming and not, with
// /v1/messages/count_tokens) and GET /v1/models. What it answers is decided by directives such as
// [[tool:bash {"command":"echo hi"}]] in the last user message; [Server] documents the script.
package modelsim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Sentinel errors returned by [Server] methods.
var (
	// ErrClosed is returned by Start after Close.
	ErrClosed = errors.New("modelsim: server closed")
	// ErrAddr is returned by Start for an address that is not 127.0.0.1 or that uses a port the
	// agents probe for local model servers (8080, 11434, 1234).
	ErrAddr = errors.New("modelsim: bad listen address")
)

const (
	defaultAddr   = "127.0.0.1:0"
	defaultMaxLog = 1000
	// maxBody bounds every request body; a larger body gets 413.
	maxBody = 32 << 20
	// maxRaw bounds Request.Raw so the request log stays small.
	maxRaw = 1 << 20
	// maxStatusKeys bounds the [[status:...]] counters; past it they are all forgotten.
	maxStatusKeys = 4096
)

// probedPorts are the local-model ports omp probes at start; a test server there would be
// mistaken for Ollama, llama.cpp or LM Studio.
var probedPorts = map[string]bool{"8080": true, "11434": true, "1234": true}

// Options configures a [Server]. The zero value is ready to use.
type Options struct {
	// Addr is the listen address. It must be on 127.0.0.1; "" means "127.0.0.1:0" (a free port).
	// Ports 8080, 11434 and 1234 are refused.
	Addr string
	// ChunkDelay is the pause between streamed chunks; 0 means none. A [[slow:D]] directive
	// raises it for one answer.
	ChunkDelay time.Duration
	// Logger receives one line per request with path, status and sizes, never prompts or
	// payloads. nil means discard.
	Logger *slog.Logger
	// MaxLog is how many requests [Server.Requests] keeps (newest last). 0 means 1000; a negative
	// value keeps none, which suits a long-running built-in model (each entry can hold up to
	// 1 MiB of Raw plus the normalised conversation).
	MaxLog int
}

// Server is a scripted OpenAI-compatible model server. Create it with [New], then call Start;
// Close stops it. All methods are safe for concurrent use.
//
// The answer to a POST is decided by the request's messages:
//
//   - The last message is a tool result: the text "done", or TEXT if the last user message
//     carries [[after:TEXT]].
//   - [[status:CODE]] or [[status:CODE xN]] in the last user message: HTTP CODE with an
//     OpenAI-style JSON error (and "retry-after: 0" for 429) the first N times (default 1) a
//     request ends with that exact user message, then the answers below. CODE is 400–599.
//   - [[tool:NAME ARGS_JSON]] (ARGS_JSON optional, default {}): a call of tool NAME with those
//     arguments, streamed in pieces; several directives give several calls in one answer. Only
//     honoured when the request offers tools, so side requests such as title generation get text.
//   - [[say:TEXT]]: the text TEXT (sent before any tool calls).
//   - [[big:N]]: a deterministic ASCII text of exactly N bytes, streamed in chunks of ≤256 KiB
//     (few, because agents resend the whole partial message on every update).
//   - [[slow:DURATION]] (a Go duration): that pause between streamed chunks.
//   - Otherwise: "ok: " followed by the first 40 bytes of the last user message (cut at a
//     character boundary).
//
// "The last user message" is the text of the last message with role user, without the
// <system-reminder> blocks omp puts in front of it. A malformed directive gets a 400 whose
// message names it; text like [[foo]] that is no directive is left alone.
//
// Every answer reports token usage computed from the request and the answer by the formula
// [Usage] documents, so tests can assert exact counts.
type Server struct {
	opts Options
	log  *slog.Logger

	seq atomic.Uint64 // ids for completions, items and tool calls

	mu       sync.Mutex
	started  bool
	closed   bool
	srv      *http.Server
	url      string
	reqs     []Request      // ring buffer of the request log
	reqNext  int            // next slot in reqs once it is full
	statuses map[string]int // [[status]] hits per exact user message
	handlers sync.WaitGroup // in-flight handlers; Add only under mu while !closed

	quit     chan struct{} // closed by Close so slow answers stop at once
	serveErr chan error    // the Serve goroutine's result; closed when it returns
}

// New returns a server configured by opts; it does not listen until Start.
func New(opts Options) *Server {
	if opts.Addr == "" {
		opts.Addr = defaultAddr
	}
	if opts.MaxLog == 0 {
		opts.MaxLog = defaultMaxLog
	}
	lg := opts.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	return &Server{
		opts:     opts,
		log:      lg,
		statuses: make(map[string]int),
		quit:     make(chan struct{}),
		serveErr: make(chan error, 1),
	}
}

// Start listens on Options.Addr and serves from a goroutine the server owns until Close. ctx
// bounds only the listen step. Calling Start again after success is a no-op; after Close it
// returns [ErrClosed].
func (s *Server) Start(ctx context.Context) error {
	host, port, err := net.SplitHostPort(s.opts.Addr)
	if err != nil {
		return fmt.Errorf("%w %q: %w", ErrAddr, s.opts.Addr, err)
	}
	if host != "127.0.0.1" {
		return fmt.Errorf("%w %q: host must be 127.0.0.1", ErrAddr, s.opts.Addr)
	}
	if probedPorts[port] {
		return fmt.Errorf("%w %q: port %s is probed by the agents as a local model server", ErrAddr, s.opts.Addr, port)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.started {
		return nil
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.opts.Addr)
	if err != nil {
		return fmt.Errorf("modelsim: listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/chat/completions", s.track(s.handleChat))
	mux.HandleFunc("/v1/responses", s.track(s.handleResponses))
	mux.HandleFunc("/v1/messages", s.track(s.handleMessages))
	mux.HandleFunc("/v1/messages/count_tokens", s.track(s.handleCountTokens))
	mux.HandleFunc("/v1/models", s.track(s.handleModels))
	mux.HandleFunc("/", s.track(s.handleNotFound))
	s.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	s.url = "http://" + ln.Addr().String() + "/v1"
	s.started = true
	go func() {
		err := s.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.serveErr <- err
		close(s.serveErr)
	}()
	s.log.Info("modelsim: listening", "url", s.url)
	return nil
}

// URL returns the base URL to configure clients with, "http://127.0.0.1:PORT/v1", or "" before
// Start.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.url
}

// Close stops listening, ends answers in progress, and waits for the serving goroutine and every
// handler to return. It is idempotent; it returns the serving error, if any, the first time.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	started := s.started
	s.mu.Unlock()

	close(s.quit)
	if !started {
		return nil
	}
	// srv.Close closes the listener and every connection but does not wait for handlers; the
	// quit channel above ends slow answers, and the WaitGroup joins them.
	err := s.srv.Close()
	s.handlers.Wait()
	if serr := <-s.serveErr; serr != nil {
		return fmt.Errorf("modelsim: serve: %w", serr)
	}
	if err != nil {
		return fmt.Errorf("modelsim: close: %w", err)
	}
	return nil
}

// Requests returns a copy of the request log, oldest first, newest last. It holds at most
// Options.MaxLog entries.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, 0, len(s.reqs))
	out = append(out, s.reqs[s.reqNext:]...)
	out = append(out, s.reqs[:s.reqNext]...)
	for i := range out {
		out[i] = out[i].clone()
	}
	return out
}

// record appends r to the bounded request log.
func (s *Server) record(r Request) {
	if s.opts.MaxLog < 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.reqs) < s.opts.MaxLog {
		s.reqs = append(s.reqs, r)
		return
	}
	s.reqs[s.reqNext] = r
	s.reqNext = (s.reqNext + 1) % s.opts.MaxLog
}

// statusHit counts one sighting of key and reports whether it is still among the first n.
func (s *Server) statusHit(key string, n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.statuses) >= maxStatusKeys {
		clear(s.statuses)
	}
	s.statuses[key]++
	return s.statuses[key] <= n
}

// nextID returns a fresh number for ids; ids are unique per server, not random.
func (s *Server) nextID() uint64 { return s.seq.Add(1) }

// statusWriter remembers the status and body size for the log line.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach the underlying writer's Flush.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// track joins h to Close through the handlers WaitGroup and logs one line per request.
func (s *Server) track(h func(w *statusWriter, r *http.Request) int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			writeError(w, http.StatusServiceUnavailable, "server_error", "modelsim: server closed")
			return
		}
		s.handlers.Add(1)
		s.mu.Unlock()
		defer s.handlers.Done()

		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		in := h(sw, r)
		// Debug: a server on the built-in model would log every turn's
		// requests, which says nothing a person needs by default.
		s.log.Debug("modelsim: request", "method", r.Method, "path", r.URL.Path, "status", sw.status,
			"bytes_in", in, "bytes_out", sw.bytes, "duration", time.Since(start))
	}
}

func (s *Server) handleModels(w *statusWriter, r *http.Request) int64 {
	if r.Method != http.MethodGet {
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "modelsim: use GET")
		return 0
	}
	s.record(Request{Path: r.URL.Path})
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []any{map[string]any{
			"id": modelName, "object": "model", "created": 0, "owned_by": "agenthost",
		}},
	})
	return 0
}

func (s *Server) handleNotFound(w *statusWriter, r *http.Request) int64 {
	writeError(w, http.StatusNotFound, "invalid_request_error", "modelsim: no such endpoint: "+strconv.Quote(r.URL.Path))
	return 0
}
