package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/acpagent"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/roomsqlite"
	"github.com/agenthost/agenthost/internal/rpcagent"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/record"
	"github.com/agenthost/agenthost/room"
)

// The cold-room bench (bench --cold): message → first text.delta of rooms
// whose agent is not running, (a) new rooms and (b) rooms woken after a
// release, with the warm pool on (a pool of one) and off, per agent (omp
// and pi over RPC, codex and copilot over ACP, whose pool serves new rooms
// only: a woken ACP room is a miss), on the built-in model. Each arm is a room manager of its own (its own
// data dir, transport and pool, confined as serve with --agent-uids off
// confines), and the arms take turns room by room, so that the machine's
// load falls on all of them alike. Before a pooled sample the pool's agent
// is ready (PoolWait): the figures are a hit's; a burst that finds the
// pool empty starts cold, as the off arm does.

// coldArm is one agent with the pool on (pool agents) or off.
type coldArm struct {
	agent agents.Kind
	pool  bool
	size  int
	m     *room.Manager
	tr    coldPool
	close func()

	mu    sync.Mutex
	first map[string]chan time.Time // a room's next first text.delta
	// New and Woken are the samples (message → first text.delta).
	New, Woken []time.Duration
	// Misses are the samples of each kind (new, woken) whose agent was
	// not the pool's.
	Misses [2]int
}

// coldPool is either transport's pool.
type coldPool interface {
	StartPool() error
	PoolWait(ctx context.Context, n int) error
	Close() error
}

// coldACP: the agents the bench runs over ACP.
func coldACP(k agents.Kind) bool { return k == agents.Codex || k == agents.Copilot }

func (a *coldArm) name() string {
	tr := "rpc"
	if coldACP(a.agent) {
		tr = "acp"
	}
	if a.pool {
		return fmt.Sprintf("%s %s, pool of %d", a.agent, tr, a.size)
	}
	return fmt.Sprintf("%s %s, pool off", a.agent, tr)
}

// runColdBench runs rooms rooms per arm and prints the table.
func runColdBench(ctx context.Context, w io.Writer, kinds []agents.Kind, rooms int, log *slog.Logger) error {
	in, err := agents.Find()
	if err != nil {
		return err
	}
	sim := modelsim.New(modelsim.Options{Logger: log})
	if err := sim.Start(ctx); err != nil {
		return err
	}
	defer sim.Close()
	var arms []*coldArm
	defer func() {
		for _, a := range arms {
			a.close()
		}
	}()
	for _, k := range kinds {
		for _, pool := range []bool{false, true} {
			size := 0
			if pool {
				size = 1
			}
			a, err := newColdArm(ctx, in, sim.URL(), k, size, 0, log)
			if err != nil {
				return err
			}
			arms = append(arms, a)
		}
	}
	fmt.Fprintf(w, "cold rooms: message → first text.delta, %d rooms per arm, interleaved; the built-in model\n", rooms)
	for i := range rooms {
		for _, a := range arms {
			if err := a.sample(ctx, fmt.Sprintf("bench-%d", i)); err != nil {
				return fmt.Errorf("bench: %s, room %d: %w", a.name(), i, err)
			}
		}
		fmt.Fprintf(os.Stderr, "bench --cold: %d/%d rooms\n", i+1, rooms)
	}
	fmt.Fprintf(w, "  %-20s %-6s %9s %9s %9s %9s  %s\n", "arm", "rooms", "median", "p90", "min", "max", "pool misses")
	for _, a := range arms {
		for i, s := range []struct {
			what string
			d    []time.Duration
		}{{"new", a.New}, {"woken", a.Woken}} {
			misses := ""
			if a.pool {
				misses = fmt.Sprint(a.Misses[i])
			}
			fmt.Fprintf(w, "  %-20s %-6s %8.3fs %8.3fs %8.3fs %8.3fs  %s\n", a.name(), s.what, quantile(s.d, 0.5).Seconds(), quantile(s.d, 0.9).Seconds(),
				slices.Min(s.d).Seconds(), slices.Max(s.d).Seconds(), misses)
		}
	}
	return nil
}

// quantile is the q-quantile of d (nearest rank).
func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s))*q+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// newColdArm makes an arm with a pool of size (0: none) and maxResident
// places (0: the default).
func newColdArm(ctx context.Context, in *agents.Install, modelURL string, k agents.Kind, size, maxResident int, log *slog.Logger) (*coldArm, error) {
	pool := size > 0
	dir, err := os.MkdirTemp("", "agenthost-bench-cold-")
	if err != nil {
		return nil, err
	}
	a := &coldArm{agent: k, pool: pool, size: size, first: map[string]chan time.Time{}}
	var closers []func()
	a.close = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
		os.RemoveAll(dir)
	}
	fail := func(err error) (*coldArm, error) {
		a.close()
		return nil, err
	}
	db, err := store.Open(ctx, filepath.Join(dir, "agenthost.db"), store.Options{Logger: log})
	if err != nil {
		return fail(err)
	}
	closers = append(closers, func() { db.Close() })
	cust, err := custody.New(custody.Options{})
	if err != nil {
		return fail(err)
	}
	closers = append(closers, func() { cust.Close() })
	cf, err := confine.New(confine.Options{Mode: confine.ModeAuto, Tools: in.Dir})
	if err != nil {
		return fail(err)
	}
	cfg := room.Config{Agent: string(k), ApprovalMode: room.ApprovalYolo}
	var mgr *room.Manager
	var tr interface {
		room.Transport
		coldPool
	}
	if coldACP(k) {
		opts := acpagent.Options{Custodian: cust, Install: in, ModelURL: modelURL, Confine: cf, Logger: log}
		if pool {
			opts.Pool = &acpagent.PoolOptions{Size: size, Config: cfg, Rooms: filepath.Join(dir, "rooms")}
		}
		tr, err = acpagent.New(opts)
	} else {
		opts := rpcagent.Options{Custodian: cust, Install: in, ModelURL: modelURL, Confine: cf, Logger: log}
		if pool {
			opts.Pool = &rpcagent.PoolOptions{Size: size, Config: cfg, Rooms: filepath.Join(dir, "rooms"),
				Tools: func() []room.Tool { return mgr.ToolDefs() }}
		}
		tr, err = rpcagent.New(opts)
	}
	if err != nil {
		return fail(err)
	}
	closers = append(closers, func() { tr.Close() })
	m, err := room.New(room.Options{Store: roomsqlite.New(db), Transport: tr, Root: filepath.Join(dir, "rooms"), Config: cfg, Logger: log,
		MaxResident: maxResident})
	if err != nil {
		return fail(err)
	}
	mgr = m
	closers = append(closers, func() { m.Close() })
	if err := tr.StartPool(); err != nil {
		return fail(err)
	}
	if err := m.Start(ctx); err != nil {
		return fail(err)
	}
	untap, ok := m.TapEvents(a.tap)
	if !ok {
		return fail(errors.New("the store cannot tap events"))
	}
	closers = append(closers, untap)
	a.m, a.tr = m, tr
	return a, nil
}

// tap notes the time of a room's first text.delta after its message.
func (a *coldArm) tap(evs []record.Event) {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, ev := range evs {
		if ev.Type != room.KindText {
			continue
		}
		if ch := a.first[ev.Room]; ch != nil {
			ch <- now
			delete(a.first, ev.Room)
		}
	}
}

// sample runs a new room's first message and, after a release, its second.
func (a *coldArm) sample(ctx context.Context, id string) error {
	for i, dst := range []*[]time.Duration{&a.New, &a.Woken} {
		if a.pool {
			wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			err := a.tr.PoolWait(wctx, 1)
			cancel()
			if err != nil {
				return err
			}
		}
		d, pooled, err := a.message(ctx, id, fmt.Sprintf("[[say:hello %d]]", i))
		if err != nil {
			return err
		}
		if a.pool && !pooled {
			a.Misses[i]++
		}
		*dst = append(*dst, d)
		if err := a.m.Release(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// message sends text to the room and returns how long its first
// text.delta took, once the turn settled.
func (a *coldArm) message(ctx context.Context, id, text string) (time.Duration, bool, error) {
	ch := make(chan time.Time, 1)
	a.mu.Lock()
	a.first[id] = ch
	a.mu.Unlock()
	t0 := time.Now()
	acc, err := a.m.Submit(ctx, id, room.Message{Text: text})
	if err != nil {
		return 0, false, err
	}
	var first time.Time
	select {
	case first = <-ch:
	case <-ctx.Done():
		return 0, false, ctx.Err()
	case <-time.After(5 * time.Minute):
		return 0, false, errors.New("no text.delta in 5 minutes")
	}
	// The turn's end, and whether its agent was the pool's.
	deadline := time.Now().Add(5 * time.Minute)
	pooled := false
	for after := acc.Seq; ; {
		evs, err := a.m.Events(ctx, id, after, 100)
		if err != nil {
			return 0, false, err
		}
		for _, ev := range evs {
			after = ev.Seq
			switch ev.Type {
			case "agent.started":
				pooled = strings.Contains(string(ev.Data), `"pooled":true`)
			case "turn.ended":
				return first.Sub(t0), pooled, nil
			}
		}
		if time.Now().After(deadline) {
			return 0, false, errors.New("the turn did not end in 5 minutes")
		}
		changed, stop := a.m.Watch(id)
		if evs2, _ := a.m.Events(ctx, id, after, 1); len(evs2) == 0 {
			select {
			case <-changed:
			case <-time.After(time.Second):
			case <-ctx.Done():
				stop()
				return 0, false, ctx.Err()
			}
		}
		stop()
	}
}

// runColdBurst sends burst new rooms their first message at once, on a
// pool of size and on no pool, per agent (one arm after the other: a
// burst takes the whole machine), and prints each arm's figures. Every
// room has a place (--max-resident of burst plus the pool): the figures
// are the agents' starts, not a wait for a place.
func runColdBurst(ctx context.Context, w io.Writer, kinds []agents.Kind, burst, size int, log *slog.Logger) error {
	in, err := agents.Find()
	if err != nil {
		return err
	}
	sim := modelsim.New(modelsim.Options{Logger: log})
	if err := sim.Start(ctx); err != nil {
		return err
	}
	defer sim.Close()
	fmt.Fprintf(w, "a burst of %d new rooms at once: message → first text.delta; the built-in model\n", burst)
	fmt.Fprintf(w, "  %-20s %9s %9s %9s  %s\n", "arm", "median", "p90", "max", "pooled")
	for _, k := range kinds {
		for _, n := range []int{0, size} {
			a, err := newColdArm(ctx, in, sim.URL(), k, n, burst+n, log)
			if err != nil {
				return err
			}
			err = a.burst(ctx, burst, w)
			a.close()
			if err != nil {
				return fmt.Errorf("bench: %s: %w", a.name(), err)
			}
		}
	}
	return nil
}

func (a *coldArm) burst(ctx context.Context, n int, w io.Writer) error {
	if a.pool {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		err := a.tr.PoolWait(wctx, a.size)
		cancel()
		if err != nil {
			return err
		}
	}
	d := make([]time.Duration, n)
	pooled := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d[i], pooled[i], errs[i] = a.message(ctx, fmt.Sprintf("burst-%d", i), "[[say:hello]]")
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	hits := 0
	for _, p := range pooled {
		if p {
			hits++
		}
	}
	fmt.Fprintf(w, "  %-20s %8.3fs %8.3fs %8.3fs  %d of %d\n", a.name(), quantile(d, 0.5).Seconds(), quantile(d, 0.9).Seconds(), slices.Max(d).Seconds(), hits, n)
	return nil
}
