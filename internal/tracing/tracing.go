// Package tracing exports OpenTelemetry traces of rooms over OTLP/HTTP:
// a span per turn (invoke_agent, per the GenAI semantic conventions), with
// child spans for its tool calls (execute_tool), approval and question
// waits, the agent's start, the workspace snapshots and git checkouts. It
// derives them from the events the rooms' logs commit (room.Options.
// Observe) and the steps no event starts (room.Phase), so rooms know
// nothing of OpenTelemetry.
//
// Nothing here holds a room up: Observe queues a commit's events and
// returns (past the queue's bound they are dropped and counted), one
// goroutine turns them into spans, and ended spans wait in a second
// bounded queue for export in batches (dropped and counted when it is full
// or an export fails). A dead collector costs the drops and nothing else.
//
// A message's trace context (room.Message.TraceParent, the HTTP request's
// span) is the parent of the turn it starts; a message steered or followed
// up into a running turn is a link of that turn's span. The contexts live
// in memory: a message that runs after a restart starts a trace of its
// own (its ids are on the span).
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/agenthost/agenthost/room"
)

// Defaults for Config.
const (
	DefaultEventQueue = 4096 // commits waiting to become spans
	DefaultSpanQueue  = 4096 // ended spans waiting for export
	DefaultInterval   = 2 * time.Second
	// maxMessages bounds the trace contexts of messages not ended yet.
	maxMessages = 65536
	// maxReason bounds a turn's reason on its span.
	maxReason = 1024
)

// Config configures a Tracer.
type Config struct {
	// Endpoint is the collector's OTLP/HTTP URL (serve --otlp): a base
	// URL, to which /v1/traces is added unless it ends so. "" takes the
	// standard variables (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, then
	// OTEL_EXPORTER_OTLP_ENDPOINT, with OTEL_EXPORTER_OTLP_HEADERS,
	// _TIMEOUT, _COMPRESSION, _CERTIFICATE, ...), which the exporter reads.
	Endpoint string
	// Exporter, if set, replaces the OTLP exporter (tests).
	Exporter sdktrace.SpanExporter
	// ToolInput puts each tool call's input (as the room's log has it,
	// redacted and bounded) on its span (gen_ai.tool.call.arguments).
	ToolInput bool
	// RoomInfo, if set, names a room's agent and model ("provider/id")
	// for its turns' spans.
	RoomInfo func(ctx context.Context, room string) (agent, model string, err error)
	// Resource describes this host (service.name agenthost, its version;
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are merged over it).
	Version    string
	EventQueue int
	SpanQueue  int
	// Interval is the longest an ended span waits for its batch.
	Interval time.Duration
	// AgentRelay, if set, is the collector's traces URL (with
	// AgentHeaders) to which the agents' own spans are relayed, placed in
	// their turns' traces (serve --otlp-agents; see AgentURL).
	AgentRelay   string
	AgentHeaders map[string]string
	Logger       *slog.Logger
}

// Tracer turns rooms' events into spans. Create it with New, give its
// Observe to room.Options.Observe, and Close it after the Manager.
type Tracer struct {
	cfg  Config
	log  *slog.Logger
	tp   *sdktrace.TracerProvider
	tr   trace.Tracer
	proc *queueProcessor
	prop propagation.TextMapPropagator

	relay   *relay  // the agents' OTLP endpoint (nil: none)
	windows windows // rooms' recent turns, for the relay

	in            chan []room.Observed
	eventsDropped atomic.Uint64
	stop          chan struct{}
	done          chan struct{}
	closeOnce     sync.Once

	// The consumer's own (run): no lock.
	msgs     map[string]trace.SpanContext // accepted messages' callers, by message id
	msgOrder []string                     // msgs' keys, oldest first (bound)
	turns    map[string]*turnSpan         // by turn id
	running  map[string]string            // room id: its running turn's id
	agentAt  map[string]*room.Phase       // room id: its agent's start, until agent.started
	pending  map[string]*pendingSpan      // approvals and questions, by id
}

type turnSpan struct {
	span    trace.Span
	ctx     context.Context
	room    string
	started time.Time
	tools   map[string]trace.Span
}

type pendingSpan struct {
	span    trace.Span
	turn    string
	started time.Time
}

// ErrProtocol: the OTEL_* variables ask for a protocol other than
// OTLP/HTTP with protobuf, the only one agenthost sends.
var ErrProtocol = errors.New("tracing: only OTLP/HTTP (http/protobuf) is supported")

// Enabled reports whether the standard variables (getenv) ask for traces
// to be exported: an OTLP endpoint is set, OTEL_SDK_DISABLED is not true
// and OTEL_TRACES_EXPORTER is not none.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")), "none") {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
}

// CheckProtocol refuses (ErrProtocol) an OTEL_EXPORTER_OTLP_*PROTOCOL
// other than http/protobuf.
func CheckProtocol(getenv func(string) string) error {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := strings.TrimSpace(getenv(name)); v != "" && v != "http/protobuf" {
			return fmt.Errorf("%w: %s is %q", ErrProtocol, name, v)
		}
	}
	return nil
}

// TracesURL is the traces endpoint for a base URL (serve --otlp): its
// path with /v1/traces added, unless it ends so already.
func TracesURL(base string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("tracing: %q is not an http(s) URL", base)
	}
	if !strings.HasSuffix(u.Path, "/v1/traces") {
		u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	}
	return u.String(), nil
}

// New starts a Tracer (its goroutines end at Close).
func New(ctx context.Context, cfg Config) (*Tracer, error) {
	if cfg.EventQueue <= 0 {
		cfg.EventQueue = DefaultEventQueue
	}
	if cfg.SpanQueue <= 0 {
		cfg.SpanQueue = DefaultSpanQueue
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	exp := cfg.Exporter
	if exp == nil {
		opts := []otlptracehttp.Option{
			otlptracehttp.WithRetry(otlptracehttp.RetryConfig{
				Enabled: true, InitialInterval: time.Second, MaxInterval: 5 * time.Second, MaxElapsedTime: 10 * time.Second,
			}),
		}
		if cfg.Endpoint != "" {
			u, err := TracesURL(cfg.Endpoint)
			if err != nil {
				return nil, err
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(u))
		}
		var err error
		if exp, err = otlptracehttp.New(ctx, opts...); err != nil {
			return nil, fmt.Errorf("tracing: %w", err)
		}
	}
	res, err := resource.Merge(resource.NewSchemaless(
		attribute.String("service.name", "agenthost"), attribute.String("service.version", cfg.Version),
	), envResource(ctx))
	if err != nil {
		res = resource.NewSchemaless(attribute.String("service.name", "agenthost"))
	}
	proc := newQueueProcessor(exp, cfg.SpanQueue, cfg.Interval, cfg.Logger)
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())),
		sdktrace.WithSpanProcessor(proc),
	)
	t := &Tracer{
		cfg: cfg, log: cfg.Logger, tp: tp, tr: tp.Tracer("github.com/agenthost/agenthost"), proc: proc,
		prop: propagation.TraceContext{},
		in:   make(chan []room.Observed, cfg.EventQueue), stop: make(chan struct{}), done: make(chan struct{}),
		msgs: map[string]trace.SpanContext{}, turns: map[string]*turnSpan{}, running: map[string]string{},
		agentAt: map[string]*room.Phase{}, pending: map[string]*pendingSpan{},
	}
	if cfg.AgentRelay != "" {
		if t.relay, err = newRelay(t, cfg.AgentRelay, cfg.AgentHeaders); err != nil {
			_ = tp.Shutdown(ctx)
			return nil, err
		}
	}
	go t.run()
	return t, nil
}

// AgentURL is the OTLP/HTTP traces endpoint to give the room's agent
// (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT): the relay's, which places the
// agent's spans in the room's turns; "" without Config.AgentRelay.
func (t *Tracer) AgentURL(room string) string {
	if t.relay == nil {
		return ""
	}
	return t.relay.url(room)
}

// AgentPort is the relay's loopback port (0: none), which a confined
// agent must be let connect to.
func (t *Tracer) AgentPort() int {
	if t.relay == nil {
		return 0
	}
	return t.relay.port()
}

// envResource is what OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES say
// (an empty resource when they say nothing or cannot be read).
func envResource(ctx context.Context) *resource.Resource {
	r, err := resource.New(ctx, resource.WithFromEnv())
	if err != nil && r == nil {
		return resource.Empty()
	}
	return r
}

// Provider is the Tracer's provider, for the HTTP API's spans (otelhttp).
func (t *Tracer) Provider() trace.TracerProvider { return t.tp }

// Propagator reads and writes W3C trace context (traceparent, tracestate).
func (t *Tracer) Propagator() propagation.TextMapPropagator { return t.prop }

// Stats are the Tracer's counters since New.
type Stats struct {
	// SpansExported reached the collector; SpansDropped did not (queue
	// full, or their export failed); EventsDropped were never made
	// spans (the event queue was full).
	SpansExported, SpansDropped, EventsDropped uint64
	// AgentBatches the relay forwarded and refused (the collector busy or
	// failing), and AgentSpansUnplaced: agents' spans that began in no
	// turn of their room (forwarded in a trace of their own).
	AgentBatchesForwarded, AgentBatchesRefused, AgentSpansUnplaced uint64
}

// Stats returns the counters.
func (t *Tracer) Stats() Stats {
	s := Stats{SpansExported: t.proc.exported.Load(), SpansDropped: t.proc.dropped.Load(), EventsDropped: t.eventsDropped.Load()}
	if r := t.relay; r != nil {
		s.AgentBatchesForwarded, s.AgentBatchesRefused, s.AgentSpansUnplaced = r.forwarded.Load(), r.refused.Load(), r.unplaced.Load()
	}
	return s
}

// Observe is room.Options.Observe: it queues evs and returns at once.
func (t *Tracer) Observe(evs []room.Observed) {
	select {
	case t.in <- evs:
	default:
		t.eventsDropped.Add(uint64(len(evs)))
	}
}

// Flush turns every commit observed before it into spans and exports
// every span ended, or gives up when ctx ends (tests, and the screenshot).
func (t *Tracer) Flush(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case t.in <- []room.Observed{{Phase: &room.Phase{Name: flushMark, End: time.Now()}}, {Payload: flushReply(done)}}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return t.tp.ForceFlush(ctx)
}

// flushMark and flushReply are Flush's marker in the queue.
const flushMark = "flush"

type flushReply chan struct{}

func (flushReply) EventType() string { return flushMark }

// Close ends the spans still open (turns the host leaves running, with
// agenthost.turn.unfinished), exports what is queued, within ctx, and
// stops. Call it after the Manager's Close or Detach.
func (t *Tracer) Close(ctx context.Context) error {
	t.closeOnce.Do(func() { close(t.stop) })
	var relayErr error
	if t.relay != nil {
		// The agents' last posts end first (bounded by ctx); the host's
		// spans are exported whatever became of them.
		relayErr = t.relay.close(ctx)
	}
	select {
	case <-t.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return errors.Join(relayErr, t.tp.Shutdown(ctx))
}

// run turns queued commits into spans until Close.
func (t *Tracer) run() {
	defer close(t.done)
	for {
		select {
		case evs := <-t.in:
			t.handle(evs)
		case <-t.stop:
			for {
				select {
				case evs := <-t.in:
					t.handle(evs)
					continue
				default:
				}
				break
			}
			t.endOpen(time.Now())
			return
		}
	}
}

func (t *Tracer) handle(evs []room.Observed) {
	for _, o := range evs {
		if r, ok := o.Payload.(flushReply); ok {
			close(r)
			continue
		}
		if o.Phase != nil {
			t.phase(*o.Phase)
			continue
		}
		t.event(o)
	}
}

// endOpen ends every span still open, as left unfinished.
func (t *Tracer) endOpen(at time.Time) {
	for id, p := range t.pending {
		p.span.SetAttributes(attribute.Bool("agenthost.unfinished", true))
		p.span.End(trace.WithTimestamp(at))
		delete(t.pending, id)
	}
	for id, ts := range t.turns {
		for _, s := range ts.tools {
			s.SetAttributes(attribute.Bool("agenthost.unfinished", true))
			s.End(trace.WithTimestamp(at))
		}
		ts.span.SetAttributes(attribute.Bool("agenthost.turn.unfinished", true))
		ts.span.End(trace.WithTimestamp(at))
		delete(t.turns, id)
	}
}

// noteMessage keeps a message's caller context, within maxMessages.
func (t *Tracer) noteMessage(id string, sc trace.SpanContext) {
	if _, ok := t.msgs[id]; !ok {
		t.msgOrder = append(t.msgOrder, id)
	}
	t.msgs[id] = sc
	for len(t.msgs) > maxMessages && len(t.msgOrder) > 0 {
		delete(t.msgs, t.msgOrder[0])
		t.msgOrder = t.msgOrder[1:]
	}
	if len(t.msgOrder) > 2*maxMessages {
		// Ended messages leave their ids in msgOrder: compact.
		kept := t.msgOrder[:0]
		for _, k := range t.msgOrder {
			if _, ok := t.msgs[k]; ok {
				kept = append(kept, k)
			}
		}
		t.msgOrder = kept
	}
}

// callerContext is the span context a message's trace context names.
func (t *Tracer) callerContext(traceparent, tracestate string) trace.SpanContext {
	c := propagation.MapCarrier{"traceparent": traceparent}
	if tracestate != "" {
		c["tracestate"] = tracestate
	}
	return trace.SpanContextFromContext(t.prop.Extract(context.Background(), c))
}

// redactURL drops a URL's user information (a token in a clone URL).
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return ""
	}
	u.User = nil
	return u.String()
}

func bound(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
