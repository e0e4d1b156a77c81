package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/acpagent"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/rpcagent"
	"github.com/agenthost/agenthost/room"
	"github.com/prometheus/client_golang/prometheus"
)

// warmPool is serve's --pool: the rpc transport's warm pool for the
// server's default agent, its rooms' manager (set once made) and its
// metrics.
type warmPool struct {
	opts *rpcagent.PoolOptions
	// acp is the acp transport's pool (new rooms only; --transport acp).
	acp  *acpagent.PoolOptions
	m    atomic.Pointer[room.Manager]
	bind prometheus.Histogram
	// off says why the pool does not run ("" when it does or was not
	// asked for).
	off string
	// uids: the pool's agents run as uids of their own (root,
	// --agent-uids), as the rooms' do.
	uids bool
}

// newWarmPool is the pool serve asks the transport for (nil opts: none).
func newWarmPool(f serveFlags, kind agents.Kind, custom []string, clustered bool, limits room.Limits) *warmPool {
	w := &warmPool{bind: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "agenthost_pool_bind_seconds",
		Help:    "How long binding a pool agent to a room took (its files moved in, the agent switched to the room's session).",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5},
	})}
	switch {
	case f.pool <= 0:
		return w
	case len(custom) > 0:
		w.off = "a custom agent command starts cold"
	case clustered:
		w.off = "not in a NATS cluster"
	case f.daemon:
		w.off = "not with --daemon"
	case f.otlpAgents:
		w.off = "not with --otlp-agents (each agent gets its room's tracing variables)"
	}
	if w.off != "" {
		return w
	}
	places := func() (int, int) {
		if m := w.m.Load(); m != nil {
			return m.Resident(), f.maxResident
		}
		return 0, f.maxResident
	}
	if f.transport == transportACP {
		w.acp = &acpagent.PoolOptions{Size: f.pool,
			Config: room.Config{Agent: string(kind), Model: f.model, ApprovalMode: f.approvalMode,
				ApprovalTimeout: f.approvalTimeout, QuestionTimeout: f.questionTimeout, Limits: limits},
			Rooms: filepath.Join(f.data, "rooms"), Workspaces: f.workspaces, Places: places,
			OnBind: func(s float64) { w.bind.Observe(s) },
		}
		return w
	}
	w.opts = &rpcagent.PoolOptions{Size: f.pool,
		Config: room.Config{Agent: string(kind), Model: f.model, ApprovalMode: f.approvalMode, Limits: limits},
		Rooms:  filepath.Join(f.data, "rooms"), Workspaces: f.workspaces,
		Places: func() (int, int) {
			if m := w.m.Load(); m != nil {
				return m.Resident(), f.maxResident
			}
			return 0, f.maxResident
		},
		Tools: func() []room.Tool {
			if m := w.m.Load(); m != nil {
				return m.ToolDefs()
			}
			return nil
		},
		OnBind: func(s float64) { w.bind.Observe(s) },
	}
	return w
}

// transport makes the rpc transport with the pool, or without it when the
// pool cannot run here (said in w.off).
func (w *warmPool) transport(opts rpcagent.Options, log *slog.Logger) (*rpcagent.Transport, error) {
	opts.Pool = w.opts
	w.uids = !opts.Confine.AgentUsers().Empty()
	tr, err := rpcagent.New(opts)
	if errors.Is(err, rpcagent.ErrPoolUnsupported) {
		w.off, w.opts = err.Error(), nil
		log.Warn("serve: the warm pool is off", "why", err)
		opts.Pool = nil
		tr, err = rpcagent.New(opts)
	}
	return tr, err
}

// acpTransport makes the acp transport with the pool (new rooms only), or
// without it when the pool cannot run here (said in w.off).
func (w *warmPool) acpTransport(opts acpagent.Options, log *slog.Logger) (*acpagent.Transport, error) {
	opts.Pool = w.acp
	w.uids = !opts.Confine.AgentUsers().Empty()
	tr, err := acpagent.New(opts)
	if errors.Is(err, acpagent.ErrPoolUnsupported) {
		w.off, w.acp = err.Error(), nil
		log.Warn("serve: the warm pool is off", "why", err)
		opts.Pool = nil
		tr, err = acpagent.New(opts)
	}
	return tr, err
}

// print says at start what the pool does.
func (w *warmPool) print(stdout io.Writer, kind agents.Kind) {
	switch {
	case w.opts != nil:
		uids := ""
		if w.uids {
			uids = ", each as a uid of its own (--agent-uids), handed to the room it is bound to"
		}
		fmt.Fprintf(stdout, "agenthost: warm pool: %d %s agent(s) started ahead of their rooms%s\n", w.opts.Size, kind, uids)
	case w.acp != nil:
		uids := ""
		if w.uids {
			uids = ", each as a uid of its own (--agent-uids), handed to the room it is bound to"
		}
		fmt.Fprintf(stdout, "agenthost: warm pool: %d %s acp agent(s) started ahead of new rooms%s (woken rooms start cold)\n", w.acp.Size, kind, uids)
	case w.off != "":
		fmt.Fprintf(stdout, "agenthost: warm pool off: %s\n", w.off)
	}
}

// collectors are the pool's metrics (none without a pool).
func (w *warmPool) collectors(tr room.Transport) []prometheus.Collector {
	switch t := tr.(type) {
	case *rpcagent.Transport:
		if w.opts != nil {
			return []prometheus.Collector{w.bind, poolCollector{func() (poolStats, bool) {
				st, ok := t.PoolStats()
				return poolStats{st.Size, st.Idle, st.Booting, st.Hits, st.Misses}, ok
			}}}
		}
	case *acpagent.Transport:
		if w.acp != nil {
			return []prometheus.Collector{w.bind, poolCollector{func() (poolStats, bool) {
				st, ok := t.PoolStats()
				return poolStats{st.Size, st.Idle, st.Booting, st.Hits, st.Misses}, ok
			}}}
		}
	}
	return nil
}

// poolStats are what the metrics show of either transport's pool.
type poolStats struct {
	size, idle, booting int
	hits                int64
	misses              map[string]int64
}

// poolCollector reads the pool's counters at each scrape.
type poolCollector struct{ stats func() (poolStats, bool) }

var (
	poolAgentsDesc = prometheus.NewDesc("agenthost_pool_agents", "The warm pool's agents: idle (ready to bind) or booting.", []string{"state"}, nil)
	poolSizeDesc   = prometheus.NewDesc("agenthost_pool_size", "The warm pool's configured size (serve --pool).", nil, nil)
	poolHitsDesc   = prometheus.NewDesc("agenthost_pool_hits_total", "Rooms whose agent was a pool agent bound to them.", nil, nil)
	poolMissDesc   = prometheus.NewDesc("agenthost_pool_misses_total", "Rooms whose agent started cold, by reason (empty: no idle agent; settings, instructions, mcp, tools, command, read_only: the room's settings match no pool agent; resume: an acp room that resumes a session; large: as root, a woken room's files are too many to give to the pool agent's uid; bind_failed).", []string{"reason"}, nil)
)

// poolMissReasons are the reasons either pool counts (each exported,
// zero until counted).
var poolMissReasons = []string{rpcagent.MissEmpty, rpcagent.MissSettings, rpcagent.MissInstr, rpcagent.MissMCP, rpcagent.MissTools,
	rpcagent.MissCommand, rpcagent.MissReadOnly, acpagent.MissResume, rpcagent.MissLarge, rpcagent.MissBindFailed}

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolAgentsDesc
	ch <- poolSizeDesc
	ch <- poolHitsDesc
	ch <- poolMissDesc
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	st, ok := c.stats()
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(poolAgentsDesc, prometheus.GaugeValue, float64(st.idle), "idle")
	ch <- prometheus.MustNewConstMetric(poolAgentsDesc, prometheus.GaugeValue, float64(st.booting), "booting")
	ch <- prometheus.MustNewConstMetric(poolSizeDesc, prometheus.GaugeValue, float64(st.size))
	ch <- prometheus.MustNewConstMetric(poolHitsDesc, prometheus.CounterValue, float64(st.hits))
	for _, r := range poolMissReasons {
		ch <- prometheus.MustNewConstMetric(poolMissDesc, prometheus.CounterValue, float64(st.misses[r]), r)
	}
}

// poolProbe is what probePool needs of either transport with a pool.
type poolProbe interface {
	room.Transport
	StartPool() error
	PoolWait(ctx context.Context, n int) error
	PoolStats() (rpcagent.PoolStats, bool)
	Close() error
}

// probePool checks that a warm pool of agent k over transport (rpc: omp,
// pi; acp: codex, copilot) starts and binds: a pool of one in a scratch
// data dir, confined as serve would (Landlock where the kernel has it; as
// root, agents as uids of their own, doctorPoolUIDs), on the built-in
// model; ready is its agent's boot, bind a new room's bind to it.
func probePool(ctx context.Context, log *slog.Logger, k agents.Kind, transport string, timeout time.Duration) (ready, bind time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "agenthost-doctor-pool-")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	in, err := agents.Find()
	if err != nil {
		return 0, 0, err
	}
	sim := modelsim.New(modelsim.Options{Logger: log})
	if err := sim.Start(ctx); err != nil {
		return 0, 0, err
	}
	defer sim.Close()
	cust, err := custody.New(custody.Options{})
	if err != nil {
		return 0, 0, err
	}
	defer cust.Close()
	cf, err := confine.New(confine.Options{Mode: confine.ModeAuto, Tools: in.Dir, AgentUIDs: doctorPoolUIDs()})
	if err != nil {
		return 0, 0, err
	}
	rooms := filepath.Join(dir, "rooms")
	var tr poolProbe
	if transport == transportACP {
		tr, err = acpagent.New(acpagent.Options{Custodian: cust, Install: in, ModelURL: sim.URL(), Confine: cf, Logger: log,
			Pool: &acpagent.PoolOptions{Size: 1, Config: room.Config{Agent: string(k)}, Rooms: rooms}})
	} else {
		tr, err = rpcagent.New(rpcagent.Options{Custodian: cust, Install: in, ModelURL: sim.URL(), Confine: cf, Logger: log,
			Pool: &rpcagent.PoolOptions{Size: 1, Config: room.Config{Agent: string(k)}, Rooms: rooms}})
	}
	if err != nil {
		return 0, 0, err
	}
	defer tr.Close()
	t0 := time.Now()
	if err := tr.StartPool(); err != nil {
		return 0, 0, err
	}
	if err := tr.PoolWait(ctx, 1); err != nil {
		return 0, 0, err
	}
	ready = time.Since(t0)
	spec := room.AgentSpec{Room: "doctor", Workspace: filepath.Join(rooms, "doctor", "workspace"), Home: filepath.Join(rooms, "doctor", "home"),
		Config: room.Config{Agent: string(k), ApprovalMode: room.ApprovalAsk}}
	for _, d := range []string{spec.Workspace, spec.Home} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return 0, 0, err
		}
	}
	a, err := tr.Start(ctx, spec)
	if err != nil {
		return 0, 0, err
	}
	defer a.Close(context.WithoutCancel(ctx))
	p, ok := a.(room.Pooled)
	pooled, bind := false, time.Duration(0)
	if ok {
		pooled, bind = p.Pooled()
	}
	if !pooled {
		st, _ := tr.PoolStats()
		return ready, 0, fmt.Errorf("the room was not given the pool's agent (misses %v)", st.Misses)
	}
	if rng := cf.AgentUsers(); !rng.Empty() {
		// The pool agent's uid is the room's now.
		var rec struct {
			UID int `json:"uid"`
		}
		b, err := os.ReadFile(filepath.Join(rooms, "doctor", "agent-uid"))
		if err == nil {
			err = json.Unmarshal(b, &rec)
		}
		if err != nil || rec.UID < rng.First || rec.UID > rng.Last {
			return ready, 0, fmt.Errorf("the bound room holds no uid of its own (%s): %v", rng, err)
		}
	}
	return ready, bind, nil
}

// doctorPoolUIDs are the uids of probePool's agents as root: two (the
// slot's, and the one the new room holds until the slot's is handed to
// it) past doctorAgentUID, out of serve's default range.
func doctorPoolUIDs() confine.UIDRange {
	return confine.UIDRange{First: doctorAgentUID() + 1, Last: doctorAgentUID() + 2}
}
