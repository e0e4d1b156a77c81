// Package modeltest runs agenthost's built-in scripted model: an OpenAI-
// and Anthropic-compatible model server on 127.0.0.1 that answers from a
// script in the prompt, so that a program's tests and examples run the
// real agents offline, with no API key and with exact answers and token
// counts. It is the model `agenthost serve` uses when given none.
//
// Give Server.URL to the transports (transport.Options.ModelURL): every
// room's agent is then pointed at this model, and selects it (ModelID)
// unless the room names another.
//
// What the model answers is decided by the last user message:
//
//   - plain text: "ok: " and the first 40 bytes of the text;
//   - [[say:TEXT]]: the text TEXT;
//   - [[tool:NAME ARGS_JSON]]: a call of the agent's tool NAME with those
//     arguments (ARGS_JSON optional), e.g. [[tool:bash {"command":"ls"}]];
//     several give several calls in one answer. After the tool's result the
//     model says "done", or TEXT with [[after:TEXT]];
//   - [[slow:DURATION]] (a Go duration): that pause between streamed
//     pieces (to have a turn to cancel);
//   - [[big:N]]: a text of exactly N bytes;
//   - [[status:CODE]] or [[status:CODE xN]]: that HTTP error the first N
//     times (1 by default), then the answer above.
//
// Every answer reports a usage computed from the request and the answer:
// a token is 4 bytes of the conversation; half the prompt is reported as
// read from the cache.
package modeltest

import (
	"context"
	"log/slog"
	"time"

	"github.com/agenthost/agenthost/internal/modelsim"
)

// ModelID is the model the agents select on this server ("provider/id").
const ModelID = "fake/fake-model"

// ErrAddr is returned by Start for an address that is not on 127.0.0.1 or
// is a port the agents probe for local model servers (8080, 11434, 1234).
var ErrAddr = modelsim.ErrAddr

// Options configure Start. The zero value is ready to use.
type Options struct {
	// Addr is the listen address, on 127.0.0.1 ("": a free port).
	Addr string
	// ChunkDelay is the pause between streamed pieces of an answer (0:
	// none).
	ChunkDelay time.Duration
	// Logger gets a line per request (path, status, sizes; never a
	// prompt). nil: discard.
	Logger *slog.Logger
}

// Server is a running scripted model. Its methods are safe for
// concurrent use.
type Server struct{ s *modelsim.Server }

// Start listens and serves until Close; ctx bounds the listening only.
func Start(ctx context.Context, opts Options) (*Server, error) {
	// MaxLog -1: the request log is not exposed here, so none is kept.
	s := modelsim.New(modelsim.Options{Addr: opts.Addr, ChunkDelay: opts.ChunkDelay, Logger: opts.Logger, MaxLog: -1})
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	return &Server{s: s}, nil
}

// URL is the base URL of the model's API, "http://127.0.0.1:PORT/v1".
func (s *Server) URL() string { return s.s.URL() }

// Close stops the server, ends the answers under way and waits for its
// goroutines. A second Close returns nil.
func (s *Server) Close() error { return s.s.Close() }
