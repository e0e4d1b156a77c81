package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"time"

	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/buildinfo"
	"github.com/agenthost/agenthost/internal/server"
	"github.com/agenthost/agenthost/internal/tracing"
	"github.com/agenthost/agenthost/room"
)

// serveTracing is serve's OpenTelemetry export (nil tracer: off).
type serveTracing struct {
	tracer *tracing.Tracer
	// agentEnv gives a room's agent the OTLP settings (--otlp-agents).
	agentEnv func(room string) []string
	// m is the Manager, set once made (the tracer names a room's agent
	// and model from its settings).
	m *room.Manager
}

// startTracing starts the export --otlp or the OTEL_* variables ask for.
func startTracing(ctx context.Context, f serveFlags, log *slog.Logger) (*serveTracing, error) {
	st := &serveTracing{}
	on := f.otlp != "" || tracing.Enabled(os.Getenv)
	if !on {
		if f.otlpAgents || f.otlpToolArgs {
			return nil, &exitError{2, errors.New("serve: --otlp-agents and --otlp-tool-input need --otlp (or OTEL_EXPORTER_OTLP_ENDPOINT)")}
		}
		return st, nil
	}
	if err := tracing.CheckProtocol(os.Getenv); err != nil {
		return nil, &exitError{2, fmt.Errorf("serve: %w", err)}
	}
	tracesURL := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if f.otlp != "" || tracesURL == "" {
		base := f.otlp
		if base == "" {
			base = os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
		}
		u, err := tracing.TracesURL(base)
		if err != nil {
			return nil, &exitError{2, fmt.Errorf("serve: --otlp: %w", err)}
		}
		tracesURL = u
	}
	cfg := tracing.Config{
		Endpoint: f.otlp, ToolInput: f.otlpToolArgs, Version: buildinfo.Version(), Logger: log,
		RoomInfo: func(ctx context.Context, id string) (string, string, error) {
			if st.m == nil {
				return "", "", room.ErrNotStarted
			}
			e, err := st.m.EffectiveSettings(ctx, id)
			if err != nil {
				return "", "", err
			}
			model := e.Model
			if model == "" {
				model = "agenthost/" + agents.ModelID // the built-in scripted model
			}
			return e.Agent, model, nil
		},
	}
	if f.otlpAgents {
		// The agents post to the server's relay, which places their
		// spans in their turns and forwards them with the collector's
		// headers (credentials the agents never see).
		headers := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
		if headers == "" {
			headers = os.Getenv("OTEL_EXPORTER_OTLP_HEADERS")
		}
		cfg.AgentRelay, cfg.AgentHeaders = tracesURL, tracing.ParseHeaders(headers)
	}
	t, err := tracing.New(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	st.tracer = t
	if f.otlpAgents {
		st.agentEnv = func(id string) []string {
			return agents.OTLPEnv(agents.OTLPOptions{TracesURL: t.AgentURL(id), Room: id})
		}
	}
	log.Info("exporting traces", "endpoint", redactedURL(tracesURL), "agents", f.otlpAgents)
	return st, nil
}

// agentURL is the relay's URL, whose port confined agents must reach
// ("": none).
func (st *serveTracing) agentURL() string {
	if st.tracer == nil || st.tracer.AgentPort() == 0 {
		return ""
	}
	return fmt.Sprintf("http://127.0.0.1:%d/", st.tracer.AgentPort())
}

// observe is room.Options.Observe (nil when off).
func (st *serveTracing) observe() func([]room.Observed) {
	if st.tracer == nil {
		return nil
	}
	return st.tracer.Observe
}

// server is server.Options.Tracing (nil when off).
func (st *serveTracing) server() *server.Tracing {
	if st.tracer == nil {
		return nil
	}
	t := st.tracer
	return &server.Tracing{Provider: t.Provider(), Propagator: t.Propagator(), Stats: func() server.TraceStats {
		s := t.Stats()
		return server.TraceStats{SpansExported: s.SpansExported, SpansDropped: s.SpansDropped, EventsDropped: s.EventsDropped,
			AgentBatchesRelayed: s.AgentBatchesForwarded, AgentBatchesRefused: s.AgentBatchesRefused}
	}}
}

// close exports what is left, within a bound: after the rooms.
func (st *serveTracing) close(log *slog.Logger) {
	if st.tracer == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := st.tracer.Close(ctx); err != nil {
		log.Warn("exporting the last spans", "err", err)
	}
}

// redactedURL is u without its user information and query (credentials
// some collectors take there), for the log.
func redactedURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unreadable)"
	}
	p.User, p.RawQuery = nil, ""
	return p.String()
}
