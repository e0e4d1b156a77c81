package server

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the server's Prometheus metrics. The counters are derived
// from the events written to the rooms' logs while this server runs. With
// a store that reports its commits (the SQLite one, room.EventTapper)
// each event is counted as it is committed, so a scrape costs the same
// whatever the number of rooms; with another store each scrape first
// reads what every room's log gained since the last one. The gauges
// (rooms, resident agents, queued messages, running turns, what waits on
// people) are the Manager's Gauges at each scrape.
type metrics struct {
	s   *Server
	reg *prometheus.Registry
	h   http.Handler

	turns         *prometheus.CounterVec
	turnDuration  *prometheus.HistogramVec
	events        prometheus.Counter
	streamClients prometheus.Gauge
	streamCut     prometheus.Counter
	receipts      *prometheus.CounterVec
	approvals     *prometheus.CounterVec
	tokens        *prometheus.CounterVec
	cost          prometheus.Counter
	cpu           prometheus.Counter
	limits        *prometheus.CounterVec

	mu      sync.Mutex           // serialises counting
	tapped  bool                 // events are counted as committed
	untap   func()               // stops that
	cursor  map[string]int64     // per room, the last seq counted (not tapped)
	started map[string]time.Time // running turns' starts, by turn id
}

func newMetrics(s *Server) *metrics {
	mt := &metrics{
		s: s, reg: prometheus.NewRegistry(), cursor: map[string]int64{}, started: map[string]time.Time{},
		turns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agenthost_turns_total", Help: "Turns ended, by outcome.",
		}, []string{"outcome"}),
		turnDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "agenthost_turn_duration_seconds", Help: "Duration of turns, from turn.started to turn.ended, by outcome.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
		}, []string{"outcome"}),
		events: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agenthost_events_written_total", Help: "Events written to the rooms' logs.",
		}),
		streamClients: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agenthost_stream_clients", Help: "Open event streams.",
		}),
		streamCut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agenthost_stream_cut_total", Help: "Event stream clients cut off because they fell behind.",
		}),
		receipts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agenthost_receipts_total", Help: "Agents released, by the outcome of their custody receipt (clean, leaked, error, none).",
		}, []string{"outcome"}),
		approvals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agenthost_approvals_resolved_total", Help: "Approvals resolved, by decision and by whom.",
		}, []string{"decision", "by"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agenthost_tokens_total", Help: "Tokens the rooms' turns used, as their agents reported them, by kind (input, output, cache_read, cache_write).",
		}, []string{"kind"}),
		cost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agenthost_cost_usd_total", Help: "What the rooms' turns cost, in dollars, as their agents reported it.",
		}),
		cpu: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agenthost_room_cpu_seconds_total", Help: "CPU time the rooms' processes used in their turns, as the rooms' groups measured it (turn.ended's compute).",
		}),
		limits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agenthost_room_limits_total", Help: "Processes killed at a room's memory limit and forks refused at its pids limit (room.limit), by limit.",
		}, []string{"limit"}),
	}
	for _, k := range tokenKinds {
		mt.tokens.WithLabelValues(k) // every kind is shown from the start, at 0
	}
	for _, l := range []string{event.LimitMemory, event.LimitPids} {
		mt.limits.WithLabelValues(l)
	}
	mt.reg.MustRegister(mt.turns, mt.turnDuration, mt.events, mt.streamClients, mt.streamCut, mt.receipts, mt.approvals, mt.tokens, mt.cost,
		mt.cpu, mt.limits,
		stateCollector{s}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if t := s.opts.Tracing; t != nil && t.Stats != nil {
		stat := func(f func(TraceStats) uint64) func() float64 {
			return func() float64 { return float64(f(t.Stats())) }
		}
		mt.reg.MustRegister(
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "agenthost_trace_spans_exported_total", Help: "Spans the collector took (serve --otlp).",
			}, stat(func(s TraceStats) uint64 { return s.SpansExported })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "agenthost_trace_spans_dropped_total", Help: "Spans dropped: their export queue was full, or their export failed (a collector down or too slow).",
			}, stat(func(s TraceStats) uint64 { return s.SpansDropped })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "agenthost_trace_events_dropped_total", Help: "Rooms' events never made spans: the tracer's queue was full.",
			}, stat(func(s TraceStats) uint64 { return s.EventsDropped })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "agenthost_trace_agent_batches_relayed_total", Help: "Batches of the agents' own spans relayed to the collector (serve --otlp-agents).",
			}, stat(func(s TraceStats) uint64 { return s.AgentBatchesRelayed })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "agenthost_trace_agent_batches_refused_total", Help: "Batches of the agents' own spans refused: the collector busy, failing or down (the agent's exporter drops them).",
			}, stat(func(s TraceStats) uint64 { return s.AgentBatchesRefused })),
		)
	}
	mt.reg.MustRegister(s.opts.Collectors...)
	mt.h = promhttp.HandlerFor(mt.reg, promhttp.HandlerOpts{})
	mt.untap, mt.tapped = s.m.TapEvents(func(evs []store.Event) {
		mt.mu.Lock()
		defer mt.mu.Unlock()
		for _, ev := range evs {
			mt.count(ev.Type, ev.Time, ev.Data)
		}
	})
	if mt.tapped {
		return mt
	}
	// Rooms present now count from their current end; rooms made later
	// from their start.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ids, err := s.m.Rooms(ctx); err == nil {
		for _, id := range ids {
			if st, err := s.m.State(ctx, id); err == nil {
				mt.cursor[id] = st.LastSeq
			}
		}
	}
	return mt
}

func (mt *metrics) serve(w http.ResponseWriter, r *http.Request) {
	// A store that cannot be read now (a cluster whose JetStream is down)
	// leaves the counters as last read, for the next scrape to catch up:
	// the gauges that say why are served all the same, without waiting
	// for the store longer than a scrape would.
	ctx, cancel := context.WithTimeout(r.Context(), catchUpWait)
	defer cancel()
	if err := mt.catchUp(ctx); err != nil && r.Context().Err() == nil {
		mt.s.log.Warn("server: metrics: counting the events written since the last scrape failed; served as last counted", "err", err)
	}
	mt.h.ServeHTTP(w, r)
}

// catchUpWait bounds a scrape's reading of the rooms' logs.
const catchUpWait = 5 * time.Second

// close stops counting committed events.
func (mt *metrics) close() { mt.untap() }

// catchUp counts the events written since the last scrape, unless they
// are counted as committed.
func (mt *metrics) catchUp(ctx context.Context) error {
	if mt.tapped {
		return nil
	}
	mt.mu.Lock()
	defer mt.mu.Unlock()
	ids, err := mt.s.m.Rooms(ctx)
	if err != nil {
		return err
	}
	for _, id := range ids {
		for {
			evs, err := mt.s.m.Events(ctx, id, mt.cursor[id], replayPage)
			if err != nil {
				return err
			}
			for _, ev := range evs {
				mt.count(ev.Type, ev.Time, ev.Data)
				mt.cursor[id] = ev.Seq
			}
			if len(evs) < replayPage {
				break
			}
		}
	}
	return nil
}

func (mt *metrics) count(typ string, at time.Time, data json.RawMessage) {
	mt.events.Inc()
	switch typ {
	case event.TypeTurnStarted, event.TypeTurnEnded, event.TypeApprovalResolved, event.TypeAgentReleased, event.TypeRoomLimit:
	default:
		return
	}
	p, err := event.Decode(typ, data)
	if err != nil {
		return // counted as an event; its fields are unreadable
	}
	switch d := p.(type) {
	case event.TurnStarted:
		mt.started[d.TurnID] = at
	case event.TurnEnded:
		mt.turns.WithLabelValues(d.Outcome).Inc()
		u := d.Usage
		for i, n := range []int64{u.InputTokens, u.OutputTokens, u.CacheReadTokens, u.CacheWriteTokens} {
			if n > 0 {
				mt.tokens.WithLabelValues(tokenKinds[i]).Add(float64(n))
			}
		}
		if u.CostUSD > 0 {
			mt.cost.Add(u.CostUSD)
		}
		if c := d.Compute; c != nil && c.CPUSeconds > 0 {
			mt.cpu.Add(c.CPUSeconds)
		}
		if t0, ok := mt.started[d.TurnID]; ok {
			mt.turnDuration.WithLabelValues(d.Outcome).Observe(at.Sub(t0).Seconds())
			delete(mt.started, d.TurnID)
		}
	case event.ApprovalResolved:
		mt.approvals.WithLabelValues(d.Decision, d.By).Inc()
	case event.AgentReleased:
		mt.receipts.WithLabelValues(receiptOutcome(d.Error, d.Receipt)).Inc()
	case event.RoomLimit:
		if d.Count > 0 && (d.Limit == event.LimitMemory || d.Limit == event.LimitPids) {
			mt.limits.WithLabelValues(d.Limit).Add(float64(d.Count))
		}
	}
}

// tokenKinds are agenthost_tokens_total's kinds, in store.Usage's order.
var tokenKinds = []string{"input", "output", "cache_read", "cache_write"}

// receiptOutcome: error (the release failed), leaked (a process still ran
// when custody gave up), clean, or none (no receipt).
func receiptOutcome(errText string, raw json.RawMessage) string {
	if errText != "" {
		return "error"
	}
	if len(raw) == 0 {
		return "none"
	}
	var rc struct {
		Processes []struct {
			Ended string `json:"ended"`
		} `json:"processes"`
	}
	if json.Unmarshal(raw, &rc) != nil {
		return "none"
	}
	for _, p := range rc.Processes {
		if p.Ended == "" {
			return "leaked"
		}
	}
	return "clean"
}

// stateCollector reads the Manager's Gauges at scrape time.
type stateCollector struct{ s *Server }

var (
	residentDesc = prometheus.NewDesc("agenthost_rooms_resident", "Rooms with a resident agent.", nil, nil)
	roomsDesc    = prometheus.NewDesc("agenthost_rooms", "Rooms the store knows.", nil, nil)
	queuedDesc   = prometheus.NewDesc("agenthost_messages_queued", "Messages waiting in the rooms' queues.", nil, nil)
	runningDesc  = prometheus.NewDesc("agenthost_turns_running", "Turns running.", nil, nil)
	pendingDesc  = prometheus.NewDesc("agenthost_pending", "Approvals and questions waiting on a person.", []string{"kind"}, nil)
)

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- residentDesc
	ch <- roomsDesc
	ch <- queuedDesc
	ch <- runningDesc
	ch <- pendingDesc
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(c.s.ctx, 10*time.Second)
	defer cancel()
	g, err := c.s.m.Gauges(ctx)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(residentDesc, prometheus.GaugeValue, float64(g.Resident))
	ch <- prometheus.MustNewConstMetric(roomsDesc, prometheus.GaugeValue, float64(g.Rooms))
	ch <- prometheus.MustNewConstMetric(queuedDesc, prometheus.GaugeValue, float64(g.Queued))
	ch <- prometheus.MustNewConstMetric(runningDesc, prometheus.GaugeValue, float64(g.Running))
	ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(g.Approvals), "approval")
	ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(g.Questions), "question")
}
