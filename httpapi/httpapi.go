// Package httpapi is agenthost's HTTP API as an http.Handler, for a
// program that hosts rooms (a room.Manager) and serves them on its own
// http.Server and mux: the same routes, answers and event streams as
// `agenthost serve` (docs/http.md; the OpenAPI document is served at
// GET /v1/openapi.json), which package client and the agenthost command
// talk to.
//
// The Handler serves /v1/... (rooms, messages, turns, approvals,
// questions, settings, diffs, the Server-Sent Events stream of each
// room's log), /metrics (Prometheus), /healthz and GET /. Every route
// but /healthz and / requires a bearer token (Options.Token), or whatever
// Options.Authorize accepts. Mount it at the root of a mux, or under a
// prefix with http.StripPrefix:
//
//	mux.Handle("/agents/", http.StripPrefix("/agents", h))
//
// The server it is mounted on should bound the reading of headers
// (http.Server.ReadHeaderTimeout), the time a connection stays idle and
// the connections open at once (each event stream holds one; serve allows
// 1024); it must not set WriteTimeout, which would cut the event streams
// (the Handler bounds each write to a stream itself). Request bodies are
// bounded in size (1 MiB) and time (30 s) by the Handler. The OpenAPI
// document and the web page name the routes from the root: under a
// prefix, give clients the prefixed base URL (package client takes one).
package httpapi

import (
	"errors"
	"log/slog"
	"net/http"

	"github.com/agenthost/agenthost/internal/server"
	"github.com/agenthost/agenthost/room"
)

// Options configure New. Manager is required, and Token or Authorize.
type Options struct {
	// Manager serves the rooms; it is started (Start) before the
	// Handler gets requests and closed after the Handler.
	Manager *room.Manager
	// Token is the bearer token ("Authorization: Bearer TOKEN") the
	// routes but /healthz and / require; compared in constant time.
	Token string
	// Authorize, if set, replaces Token: it decides whether a request to
	// such a route passes (false: 401 with a JSON error). It runs before
	// the body is read and must not read it.
	Authorize func(r *http.Request) bool
	// WebPage serves agenthost's web page at GET / (the rooms, their
	// conversations and approvals in a browser; it calls /v1/... from the
	// root, so mount the Handler there for it); otherwise / answers a
	// short text.
	WebPage bool
	// Logger gets a line per failed request (never bodies, prompts or
	// tokens). nil: discard.
	Logger *slog.Logger
}

// Handler serves the API. Create it with New; Close it before closing
// the Manager.
type Handler struct{ s *server.Server }

// New returns the Handler over opts.Manager.
func New(opts Options) (*Handler, error) {
	if opts.Manager == nil {
		return nil, errors.New("httpapi: Options.Manager is required")
	}
	if opts.Token == "" && opts.Authorize == nil {
		return nil, errors.New("httpapi: Options.Token or Options.Authorize is required")
	}
	so := server.Options{Manager: opts.Manager, Token: opts.Token, Authorize: opts.Authorize, Logger: opts.Logger}
	if opts.WebPage {
		so.Index = server.Page()
	}
	s, err := server.New(so)
	if err != nil {
		return nil, err
	}
	return &Handler{s: s}, nil
}

// ServeHTTP serves one request. A request no route matches gets a JSON
// error (404, or 405 with Allow) like every other error.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.s.ServeHTTP(w, r) }

// Close ends the open event streams (their clients reconnect, and lose
// nothing, to whatever serves the rooms next) and waits for them; later
// streams answer 503. It does not close the Manager or the http.Server.
func (h *Handler) Close() { h.s.Close() }
