package room

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/record"
)

// Limits bound what a room's processes (its agent and everything the
// agent starts) may take together: memory, tasks and CPU. A zero field
// is no limit. The Manager's Config.Limits are every room's defaults and
// ceilings; a room's settings (resources) may lower them, never raise
// them. They take effect at the agent's next start.
type Limits struct {
	// Memory is in bytes; its JSON takes a number or a size ("512M",
	// "2G", "1.5GiB": K, M, G and T are powers of 1024, as Docker's
	// --memory).
	Memory Bytes `json:"memory"`
	// Pids counts tasks: processes and their threads.
	Pids int64 `json:"pids"`
	// CPU is in cores (1.5: one and a half cores' time per second).
	CPU float64 `json:"cpu"`
}

// IsZero: no limit at all.
func (l Limits) IsZero() bool { return l == Limits{} }

// Bounds of a limit: below them an agent cannot start (Bun alone runs
// a dozen threads and a hundred MiB), above them they mean nothing.
const (
	MinMemory = 64 << 20
	MaxMemory = 1 << 50
	MinPids   = 16
	MaxPids   = 1 << 22 // the kernel's most pids
	MinCPU    = 0.05
	MaxCPU    = 4096
)

// check says what is wrong with l (field names as in settings).
func (l Limits) check() error {
	switch {
	case l.Memory != 0 && (l.Memory < MinMemory || l.Memory > MaxMemory):
		return fmt.Errorf("resources.memory must be from %s to %s (or 0 for the server's)", FormatBytes(MinMemory), FormatBytes(MaxMemory))
	case l.Pids != 0 && (l.Pids < MinPids || l.Pids > MaxPids):
		return fmt.Errorf("resources.pids must be from %d to %d (or 0 for the server's)", MinPids, MaxPids)
	case l.CPU != 0 && (l.CPU < MinCPU || l.CPU > MaxCPU || math.IsNaN(l.CPU)):
		return fmt.Errorf("resources.cpu must be from %g to %g cores (or 0 for the server's)", MinCPU, float64(MaxCPU))
	}
	return nil
}

// CheckLimits says what is wrong with l as a server's defaults.
func CheckLimits(l Limits) error {
	if err := l.check(); err != nil {
		return fmt.Errorf("%w: %s", ErrBadSettings, err)
	}
	return nil
}

// merge returns l with o's set fields over it.
func (l Limits) merge(o Limits) Limits {
	if o.Memory != 0 {
		l.Memory = o.Memory
	}
	if o.Pids != 0 {
		l.Pids = o.Pids
	}
	if o.CPU != 0 {
		l.CPU = o.CPU
	}
	return l
}

// over names the first limit of l above ceiling c ("" for none).
func (l Limits) over(c Limits) string {
	switch {
	case c.Memory > 0 && l.Memory > c.Memory:
		return fmt.Sprintf("resources.memory %s is over the server's ceiling, %s", FormatBytes(int64(l.Memory)), FormatBytes(int64(c.Memory)))
	case c.Pids > 0 && l.Pids > c.Pids:
		return fmt.Sprintf("resources.pids %d is over the server's ceiling, %d", l.Pids, c.Pids)
	case c.CPU > 0 && l.CPU > c.CPU:
		return fmt.Sprintf("resources.cpu %g is over the server's ceiling, %g cores", l.CPU, c.CPU)
	}
	return ""
}

// within is l held to ceiling c.
func (l Limits) within(c Limits) Limits {
	if c.Memory > 0 && (l.Memory == 0 || l.Memory > c.Memory) {
		l.Memory = c.Memory
	}
	if c.Pids > 0 && (l.Pids == 0 || l.Pids > c.Pids) {
		l.Pids = c.Pids
	}
	if c.CPU > 0 && (l.CPU == 0 || l.CPU > c.CPU) {
		l.CPU = c.CPU
	}
	return l
}

// Bytes is a size in bytes whose JSON is a number, or a string with a
// unit when read (ParseBytes).
type Bytes int64

// UnmarshalJSON reads a number of bytes or a size string.
func (b *Bytes) UnmarshalJSON(data []byte) error {
	var n json.Number
	if err := json.Unmarshal(data, &n); err == nil {
		v, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil {
			return fmt.Errorf("a size is a whole number of bytes or a string such as \"2G\"")
		}
		*b = Bytes(v)
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("a size is a whole number of bytes or a string such as \"2G\"")
	}
	v, err := ParseBytes(s)
	if err != nil {
		return err
	}
	*b = Bytes(v)
	return nil
}

// ParseBytes reads a size: a whole number of bytes, or a number with a
// unit, K, M, G or T (powers of 1024), optionally followed by i and B
// ("512M", "2GiB", "1.5G"); B alone is bytes. "" is 0.
func ParseBytes(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	if t == "" {
		return 0, nil
	}
	bad := fmt.Errorf("size %q: want bytes, or a number with K, M, G or T (such as 512M or 2G)", s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.TrimSpace(t[i:])
	}
	mult := map[string]int64{"": 1, "B": 1}
	for j, u := range []string{"K", "M", "G", "T"} {
		m := int64(1) << (10 * (j + 1))
		mult[u], mult[u+"B"], mult[u+"IB"] = m, m, m
	}
	k, ok := mult[unit]
	v, err := strconv.ParseFloat(num, 64)
	if !ok || err != nil || v < 0 || v*float64(k) > math.MaxInt64/2 || k == 1 && v != math.Trunc(v) {
		return 0, bad
	}
	return int64(v * float64(k)), nil
}

// FormatBytes writes a size in the largest unit it holds one of, to two
// decimals at most ("4 GiB", "1.5 GiB", "100 bytes").
func FormatBytes(n int64) string {
	for _, u := range []struct {
		shift int
		name  string
	}{{40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n >= 1<<u.shift {
			v := strconv.FormatFloat(float64(n)/float64(int64(1)<<u.shift), 'f', 2, 64)
			return strings.TrimSuffix(strings.TrimRight(v, "0"), ".") + " " + u.name
		}
	}
	return fmt.Sprintf("%d bytes", n)
}

// Resources are the limits a room's processes run under and how they
// hold (event.Resources); ResourcesBy names how each holds.
type (
	Resources   = event.Resources
	ResourcesBy = event.ResourcesBy
)

// Resourced is a Transport or an Agent that reports how limits hold: a
// Transport how it would enforce them for the agents it starts (its
// Resources name no limits), an Agent the limits it runs under and how
// they hold.
type Resourced interface {
	Resources() Resources
}

// resources is what x (an Agent or a Transport) reports, or nil.
func resources(x any) *Resources {
	if c, ok := x.(Resourced); ok {
		r := c.Resources()
		return &r
	}
	return nil
}

// Meter is what an agent's processes have used since it started, read
// from its groups.
type Meter struct {
	// CPU is the CPU time of every process of the agent (the agent and
	// what it started, those that ended too).
	CPU time.Duration
	// PeakMemory is the most memory they held at once since the last
	// ResetPeak (or the start).
	PeakMemory int64
	// Processes counts the processes seen.
	Processes int64
	// OOMKills counts the processes killed at the memory limit,
	// ForksRefused the forks refused at the pids limit.
	OOMKills, ForksRefused int64
	// Metered: CPU and PeakMemory were read (false: only the counts).
	Metered bool
}

// Metered is an Agent whose transport measures its processes: turn.ended
// carries what each turn used (compute), and room.limit records the
// limits they reached.
type Metered interface {
	// Meter reads what the agent's processes have used so far.
	Meter(ctx context.Context) (Meter, error)
	// ResetPeak starts a new window for Meter's PeakMemory.
	ResetPeak(ctx context.Context) error
}

// ComputeTx is a Tx that keeps each room's compute totals (record.Room's
// Compute): both stores of this module are.
type ComputeTx interface {
	AddCompute(room string, c record.Compute) error
}

// addCompute counts c in the room's totals, where the store keeps them.
func addCompute(tx Tx, room string, c record.Compute) error {
	if o, ok := tx.(*offsetTx); ok {
		tx = o.Tx
	}
	if ct, ok := tx.(ComputeTx); ok {
		return ct.AddCompute(room, c)
	}
	return nil
}

// meterTimeout bounds one read of an agent's meter.
const meterTimeout = 5 * time.Second

// limitSeen is what of an agent's limit counts the room has recorded
// (room.limit); agent is whose.
type limitSeen struct {
	agent       Agent
	oom, forks  int64
	limits      Limits
	initialized bool
}

// turnMeter measures one turn on a Metered agent: what it used from its
// start (compute), and the limits reached meanwhile, looked at when a
// tool ends (kick) and at the turn's end.
type turnMeter struct {
	m     *Manager
	r     *roomState
	t     *turnRun
	a     Agent
	mt    Metered
	start Meter
	ok    bool // start was read

	kicks chan struct{}
	done  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex // one look at the counters at a time
}

// startMeter begins measuring turn t on the room's agent a (nil when a
// is not Metered).
func (m *Manager) startMeter(r *roomState, t *turnRun, a Agent) *turnMeter {
	mt, ok := a.(Metered)
	if !ok {
		return nil
	}
	tm := &turnMeter{m: m, r: r, t: t, a: a, mt: mt, kicks: make(chan struct{}, 1), done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(m.ctx, meterTimeout)
	defer cancel()
	start, err := mt.Meter(ctx)
	if err == nil {
		tm.start, tm.ok = start, true
		if err := mt.ResetPeak(ctx); err != nil {
			m.log.Debug("room: the agent's peak memory could not be reset; the turn's is its agent's", "room", r.id, "err", err)
		}
	}
	r.mu.Lock()
	if r.limitSeen.agent != a {
		// Counts before this host watched the agent (an attached one's)
		// were the previous host's to record.
		// The limits it runs under: its own word (an attached agent's
		// were its first host's), else what it was started with.
		lim := Limits{}
		if res := resources(a); res != nil {
			lim = Limits{Memory: Bytes(res.Memory), Pids: res.Pids, CPU: res.CPU}
		} else if r.startedCfg != nil {
			lim = r.startedCfg.Limits
		}
		r.limitSeen = limitSeen{agent: a, oom: start.OOMKills, forks: start.ForksRefused, limits: lim, initialized: err == nil}
	}
	t.meter = tm
	r.mu.Unlock()
	tm.wg.Add(1)
	go tm.watch()
	return tm
}

// kick asks for a look at the limits (a tool ended). Never blocks.
func (tm *turnMeter) kick() {
	if tm == nil {
		return
	}
	select {
	case tm.kicks <- struct{}{}:
	default:
	}
}

func (tm *turnMeter) watch() {
	defer tm.wg.Done()
	for {
		select {
		case <-tm.kicks:
			ctx, cancel := context.WithTimeout(tm.m.ctx, meterTimeout)
			if mt, err := tm.mt.Meter(ctx); err == nil {
				tm.limits(mt, false)
			}
			cancel()
		case <-tm.done:
			return
		}
	}
}

// limits records a room.limit for each limit whose count rose since the
// room last recorded it; agentGone: the agent itself has ended.
func (tm *turnMeter) limits(mt Meter, agentGone bool) (memory, pids bool) {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	r := tm.r
	r.mu.Lock()
	seen := &r.limitSeen
	if seen.agent != tm.a {
		r.mu.Unlock()
		return false, false
	}
	if !seen.initialized {
		seen.oom, seen.forks, seen.initialized = mt.OOMKills, mt.ForksRefused, true
	}
	dOOM, dForks := mt.OOMKills-seen.oom, mt.ForksRefused-seen.forks
	seen.oom, seen.forks = max(seen.oom, mt.OOMKills), max(seen.forks, mt.ForksRefused)
	lim := seen.limits
	r.mu.Unlock()
	turnID := ""
	if tm.t != nil && tm.t.stored {
		turnID = tm.t.id
	}
	if dOOM > 0 {
		r.events.add(event.RoomLimit{Limit: event.LimitMemory, Count: dOOM, Value: int64(lim.Memory), TurnID: turnID, AgentKilled: agentGone}, 0)
	}
	if dForks > 0 {
		r.events.add(event.RoomLimit{Limit: event.LimitPids, Count: dForks, Value: lim.Pids, TurnID: turnID, AgentKilled: agentGone && dOOM == 0}, 0)
	}
	return dOOM > 0, dForks > 0
}

// finish ends the measure with the turn's end: its compute, the limits
// reached, and, for a turn that failed because the agent itself ended at
// a limit, a reason that names it.
func (tm *turnMeter) finish(end *turnEnd) {
	if tm == nil {
		return
	}
	close(tm.done)
	tm.wg.Wait()
	tm.r.mu.Lock()
	if tm.t.meter == tm {
		tm.t.meter = nil
	}
	tm.r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), meterTimeout)
	defer cancel()
	mt, err := tm.mt.Meter(ctx)
	if err != nil {
		tm.m.log.Debug("room: the agent's meter could not be read at the turn's end", "room", tm.r.id, "err", err)
		return
	}
	gone := false
	select {
	case <-tm.a.Done():
		gone = true
	default:
	}
	memory, pids := tm.limits(mt, gone && end.outcome == OutcomeFailed)
	if gone && end.outcome == OutcomeFailed {
		tm.r.mu.Lock()
		lim := tm.r.limitSeen.limits
		tm.r.mu.Unlock()
		switch {
		case memory:
			end.reason = fmt.Sprintf("the agent was killed at the room's memory limit (%s): %s", FormatBytes(int64(lim.Memory)), end.reason)
		case pids:
			end.reason = fmt.Sprintf("the agent ended after the room's pids limit (%d) refused its forks: %s", lim.Pids, end.reason)
		}
	}
	if tm.ok && mt.Metered {
		end.compute = &record.Compute{
			CPUSeconds:      max(mt.CPU-tm.start.CPU, 0).Seconds(),
			PeakMemoryBytes: mt.PeakMemory,
			Processes:       max(mt.Processes-tm.start.Processes, 0),
		}
	}
}

// limitsState is the room's Resources for its state: the resident agent's,
// else how the transport would hold the room's limits (its settings'
// over the Manager's); r is the room's state in memory (nil: none).
func (m *Manager) limitsState(ctx context.Context, room string, r *roomState) *Resources {
	var known *Limits
	if r != nil {
		r.mu.Lock()
		a := r.agent
		if r.settingsRead {
			if c, err := m.configLocked(r); err == nil {
				known = &c.Limits
			}
		}
		r.mu.Unlock()
		if res := resources(a); res != nil {
			return res
		}
	}
	res := resources(m.opts.Transport)
	if res == nil {
		return nil
	}
	if known == nil {
		s, _, err := m.loadSettings(ctx, room)
		if err != nil {
			m.log.Debug("room: reading the room's settings for its limits", "room", room, "err", err)
		}
		c := m.opts.Config
		if m.opts.RoomConfig != nil {
			c = c.merge(m.opts.RoomConfig(room))
		}
		l := c.merge(s.config()).Limits.within(m.opts.Config.Limits)
		known = &l
	}
	res.Memory, res.Pids, res.CPU = int64(known.Memory), known.Pids, known.CPU
	return res
}
