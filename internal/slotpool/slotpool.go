// Package slotpool is the bookkeeping of a warm pool, shared by the pools
// of internal/rpcagent (omp, pi) and internal/acpagent (codex, copilot):
// the slots (an agent started ahead of its room, with its own workspace,
// home and TMPDIR under .pool beside the rooms' folders), the idle list,
// the refill (one boot at a time, after a quiet spell following a take,
// with a backoff after a failed boot, within the places --max-resident
// leaves), the watch that replaces an idle agent that ended, eviction
// when a room needs a place, the hit and miss counters, and waiting for
// idle agents. At its start it recovers the binds a crash stopped
// (internal/warmpool's journals, then internal/slotuid's) and removes the
// last server's slots.
//
// What differs per transport stays with it: how a slot's agent starts
// (Config.Boot), how it ends (Agent.End), which rooms a slot may serve
// and the bind itself. The pool names the transport in its logs and
// errors (Config.Name), so that they read as they did when each
// transport kept a copy of this code.
package slotpool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/slotuid"
	"github.com/agenthost/agenthost/internal/warmpool"
)

// Dir is the pool's folder under the rooms' and the workspaces' folders
// (a room's folder name never starts with a dot).
const Dir = ".pool"

// Miss reasons the pool itself counts (Stats.Misses); the transports add
// theirs.
const (
	MissEmpty      = "empty"       // no idle slot
	MissBindFailed = "bind_failed" // the bind failed before the room's folders were touched
)

const (
	// refillQuiet is how long the pool waits after a take before it
	// starts a replacement: a burst of rooms starting cold is not slowed
	// by the pool's own boots.
	refillQuiet = 500 * time.Millisecond
	// placesPoll is how often a pool short of agents looks for a free
	// place while every place (--max-resident) is taken.
	placesPoll = 2 * time.Second
	// maxBinds bounds Stats.BindSeconds.
	maxBinds = 1024
)

// Agent is a slot's started agent, as the pool sees it.
type Agent interface {
	// Done is closed once the agent ended (an idle one is then replaced).
	Done() <-chan struct{}
	// End ends the agent, within a deadline of the transport's.
	End()
}

// Slot is one started agent and its folders.
type Slot[A Agent] struct {
	// ID is the slot's name (16 hex digits), its folder's under Dir.
	ID string
	// Dir is the slot's folder (the server's: its journals, its home
	// and TMPDIR); WS its workspace (in Dir, or under the workspaces'
	// Dir).
	Dir, WS, Home, Tmp string
	// Agent is set once Config.Boot started it.
	Agent A
	// taken is closed when the slot leaves the idle list (its watch
	// ends).
	taken chan struct{}
}

// Plan is the bind of s to a room's workspace and home (the room's
// TMPDIR beside its home), the room's paths made absolute.
func (s *Slot[A]) Plan(workspace, home string) (warmpool.Plan, error) {
	plan := warmpool.Plan{
		Workspace: warmpool.Pair{Slot: s.WS, Room: workspace},
		Home:      warmpool.Pair{Slot: s.Home, Room: home},
		Tmp:       warmpool.Pair{Slot: s.Tmp, Room: filepath.Join(filepath.Dir(home), "tmp")},
	}
	for _, pr := range []*warmpool.Pair{&plan.Workspace, &plan.Home, &plan.Tmp} {
		r, err := filepath.Abs(pr.Room)
		if err != nil {
			return warmpool.Plan{}, err
		}
		pr.Room = r
	}
	return plan, nil
}

// Link makes the slot's paths lead to the room's folders once
// warmpool.Bind made those the slot's: the agent was started with the
// slot's paths (its HOME, TMPDIR, its configuration's files), which must
// reach them for as long as it runs.
func (s *Slot[A]) Link(plan warmpool.Plan) error {
	for _, l := range [][2]string{{plan.Home.Room, s.Home}, {plan.Tmp.Room, s.Tmp}, {plan.Workspace.Room, s.WS}} {
		if err := os.Symlink(l[0], l[1]); err != nil {
			return err
		}
	}
	return nil
}

// Cleanup removes what a bound slot leaves once its agent ended: the
// links and the slot's folder (links are removed themselves, never
// followed).
func (s *Slot[A]) Cleanup() {
	_ = os.RemoveAll(s.Dir)
	_ = os.Remove(s.WS)
}

// Config configures a Pool.
type Config[A Agent] struct {
	// Name is the transport's package ("rpcagent"): the prefix of the
	// pool's log messages and errors.
	Name string
	// Size is how many agents the pool keeps started.
	Size int
	// Rooms is the folder of the rooms' folders; Workspaces that of their
	// workspaces ("": each in its room's folder). Slots are made beside
	// them (same file systems).
	Rooms, Workspaces string
	// Places, if set, are the agents the rooms hold and the most that may
	// run: the pool's agents count against it.
	Places func() (resident, max int)
	// OnBind, if set, is given each bind's duration in seconds.
	OnBind func(seconds float64)
	// Boot starts an agent confined to s's folders (made already); on an
	// error nothing of it runs. Its context ends after StartTimeout or at
	// Close.
	Boot         func(ctx context.Context, s *Slot[A]) (A, error)
	StartTimeout time.Duration
	// Unsupported is the transport's error for a pool that cannot run
	// here (errors.Is target of New's and Start's refusals).
	Unsupported error
	// UIDs hand a slot's uid to its room as root with agent uids; Start
	// recovers what a crash left of theirs.
	UIDs   slotuid.Binder
	Logger *slog.Logger
}

// Stats are the pool's counters (/metrics).
type Stats struct {
	// Size is the configured size; Idle the agents ready to bind;
	// Booting those starting.
	Size, Idle, Booting int
	Hits                int64
	Misses              map[string]int64
	// BindSeconds are the binds' durations (the last 1024).
	BindSeconds []float64
	// LastErr is the last boot's failure ("" when it started).
	LastErr string
}

// Pool is a warm pool's slots. Start starts it, Close ends it.
type Pool[A Agent] struct {
	c Config[A]

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	wake   chan struct{}

	watches sync.WaitGroup // each idle slot's watch (see watch)

	mu       sync.Mutex
	idle     []*Slot[A]
	booting  int
	lastTake time.Time
	hits     int64
	misses   map[string]int64
	binds    []float64
	lastErr  string
	closed   bool
	// changed is closed (and replaced) when an agent becomes idle or a
	// boot fails.
	changed chan struct{}
}

// New returns a pool of c (not started); its folders are made absolute.
func New[A Agent](c Config[A]) (*Pool[A], error) {
	if c.Rooms == "" {
		return nil, fmt.Errorf("%w: no rooms folder", c.Unsupported)
	}
	var err error
	if c.Rooms, err = filepath.Abs(c.Rooms); err == nil && c.Workspaces != "" {
		c.Workspaces, err = filepath.Abs(c.Workspaces)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Name, err)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return &Pool[A]{c: c, misses: map[string]int64{}, changed: make(chan struct{}), wake: make(chan struct{}, 1), done: make(chan struct{})}, nil
}

// Start recovers the binds a crash stopped, removes the slots left
// behind, and starts refilling.
func (p *Pool[A]) Start() error {
	name := p.c.Name
	for _, d := range p.slotRoots() {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("%s: the pool's folder: %w", name, err)
		}
		if same, err := warmpool.SameDevice(d, filepath.Dir(d)); err != nil || !same {
			return fmt.Errorf("%w: %s is not on the file system of %s", p.c.Unsupported, d, filepath.Dir(d))
		}
	}
	journals, _ := filepath.Glob(filepath.Join(p.c.Rooms, Dir, "*", warmpool.Journal))
	for _, j := range journals {
		if err := warmpool.Recover(j); err != nil {
			return fmt.Errorf("%s: recovering a bind the last server left: %w", name, err)
		}
		p.c.Logger.Warn(name+": recovered a room's bind a crash had stopped", "slot", filepath.Base(filepath.Dir(j)))
	}
	// The uid part of those binds, after warmpool's and before the slots
	// are removed and any room starts.
	slots, err := p.c.UIDs.RecoverAll(filepath.Join(p.c.Rooms, Dir))
	for _, s := range slots {
		p.c.Logger.Warn(name+": gave a room's files back to its uid after a stopped bind", "slot", s)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	for _, d := range p.slotRoots() {
		// Slots of the last server (their agents are gone): their own
		// folders, or links to rooms they were bound to, removed
		// themselves.
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(d, e.Name())); err != nil {
				return fmt.Errorf("%s: removing an old slot: %w", name, err)
			}
		}
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	go p.refill()
	p.Signal()
	return nil
}

func (p *Pool[A]) slotRoots() []string {
	roots := []string{filepath.Join(p.c.Rooms, Dir)}
	if p.c.Workspaces != "" {
		roots = append(roots, filepath.Join(p.c.Workspaces, Dir))
	}
	return roots
}

// IsSlot reports whether dir is a slot's folder of this pool.
func (p *Pool[A]) IsSlot(dir string) bool { return filepath.Dir(dir) == filepath.Join(p.c.Rooms, Dir) }

// SlotUser is the user of a slot's agent when dir (a home's parent) is a
// slot's folder (ok), as confine.Confiner.SlotUser allocates it.
func (p *Pool[A]) SlotUser(dir string) (u *confine.User, ok bool, err error) {
	if !p.IsSlot(dir) {
		return nil, false, nil
	}
	u, err = p.c.UIDs.Confine.SlotUser(dir)
	if err != nil {
		return nil, true, fmt.Errorf("%s: the pool agent's user: %w", p.c.Name, err)
	}
	return u, true, nil
}

// Signal tells the pool a place may have come free: it refills if it is
// short.
func (p *Pool[A]) Signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// refill keeps the pool full, one boot at a time (its goroutine, ended by
// Close).
func (p *Pool[A]) refill() {
	defer close(p.done)
	backoff := time.Second
	sleep := func(d time.Duration) bool {
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-p.ctx.Done():
			return false
		case <-timer.C:
			return true
		}
	}
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-p.wake:
		}
		for {
			wait, ok := p.needs()
			if !ok {
				break
			}
			if wait > 0 {
				if !sleep(wait) {
					return
				}
				continue
			}
			if err := p.boot(); err != nil {
				if p.ctx.Err() != nil {
					return
				}
				p.c.Logger.Warn(p.c.Name+": starting a pool agent", "err", err)
				if !sleep(backoff) {
					return
				}
				backoff = min(2*backoff, time.Minute)
				continue
			}
			backoff = time.Second
		}
	}
}

// needs says whether the pool should start an agent now (ok), or after
// wait (a take was recent, or every place is taken).
func (p *Pool[A]) needs() (wait time.Duration, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle)+p.booting >= p.c.Size {
		return 0, false
	}
	if d := refillQuiet - time.Since(p.lastTake); d > 0 {
		return d, true
	}
	if p.overLocked(1) {
		// Every place is taken: look again later (or when a release
		// signals).
		return placesPoll, true
	}
	p.booting++
	return 0, true
}

// overLocked: n more agents of the pool would pass the places (p.mu
// held; Places takes the rooms' lock, never the other way round).
func (p *Pool[A]) overLocked(n int) bool {
	if p.c.Places == nil {
		return false
	}
	resident, most := p.c.Places()
	return resident+len(p.idle)+p.booting+n > most
}

// boot starts one agent in a new slot (p.booting counts it).
func (p *Pool[A]) boot() error {
	s, err := p.newSlot()
	if err == nil {
		ctx, cancel := context.WithTimeout(p.ctx, p.c.StartTimeout)
		s.Agent, err = p.c.Boot(ctx, s)
		cancel()
	}
	p.mu.Lock()
	p.booting--
	if err == nil && !p.closed && !p.overLocked(0) {
		s.taken = make(chan struct{})
		p.idle = append(p.idle, s)
		p.watches.Add(1)
		go p.watch(s)
		p.lastErr = ""
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
		return nil
	}
	if err != nil {
		p.lastErr = err.Error()
		// Waiters see the failure.
		close(p.changed)
		p.changed = make(chan struct{})
	}
	p.mu.Unlock()
	switch {
	case err == nil:
		p.discard(s)
		err = fmt.Errorf("%s: the pool closed", p.c.Name)
	case s != nil:
		p.removeFolders(s) // its agent did not start
	}
	return err
}

// newSlot makes a slot's folders (its TMPDIR is the agent's start's).
func (p *Pool[A]) newSlot() (*Slot[A], error) {
	b := make([]byte, 8)
	rand.Read(b)
	id := hex.EncodeToString(b)
	s := &Slot[A]{ID: id, Dir: filepath.Join(p.c.Rooms, Dir, id)}
	s.Home, s.Tmp = filepath.Join(s.Dir, "home"), filepath.Join(s.Dir, "tmp")
	s.WS = filepath.Join(s.Dir, "workspace")
	if p.c.Workspaces != "" {
		s.WS = filepath.Join(p.c.Workspaces, Dir, id)
	}
	for _, d := range []string{s.Dir, s.WS, s.Home} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return s, fmt.Errorf("%s: the slot's folders: %w", p.c.Name, err)
		}
	}
	return s, nil
}

// discard ends a slot's agent and removes its folders.
func (p *Pool[A]) discard(s *Slot[A]) {
	s.Agent.End()
	p.removeFolders(s)
}

func (p *Pool[A]) removeFolders(s *Slot[A]) {
	for _, d := range []string{s.WS, s.Dir} {
		if err := os.RemoveAll(d); err != nil {
			p.c.Logger.Warn(p.c.Name+": removing a slot", "err", err)
		}
	}
}

// Miss counts a room that starts cold for reason, and ends idle agents
// of the pool while the rooms' and the pool's pass the places (the room
// holds its place already).
func (p *Pool[A]) Miss(reason string) {
	p.mu.Lock()
	p.misses[reason]++
	p.mu.Unlock()
	for {
		p.mu.Lock()
		over := p.overLocked(0)
		p.mu.Unlock()
		if !over || !p.evict() {
			return
		}
	}
}

// Pop takes the first idle slot whose agent runs and that fits (nil: any)
// off the idle list, or nil; the slots it passed over (ended, or not
// fitting) are discarded, and stale counts them. The pool refills after
// its quiet spell.
func (p *Pool[A]) Pop(fits func(A) bool) (s *Slot[A], stale int) {
	var passed []*Slot[A]
	p.mu.Lock()
	p.lastTake = time.Now()
	for len(p.idle) > 0 && s == nil {
		next := p.idle[0]
		p.idle = p.idle[1:]
		close(next.taken)
		select {
		case <-next.Agent.Done():
			passed = append(passed, next)
			continue
		default:
		}
		if fits != nil && !fits(next.Agent) {
			passed = append(passed, next)
			continue
		}
		s = next
	}
	p.mu.Unlock()
	for _, st := range passed {
		p.discard(st)
	}
	p.Signal()
	return s, len(passed)
}

// Hit counts a bind of s that served its room, which took d.
func (p *Pool[A]) Hit(d time.Duration) {
	if p.c.OnBind != nil {
		p.c.OnBind(d.Seconds())
	}
	p.mu.Lock()
	p.hits++
	p.binds = append(p.binds, d.Seconds())
	if len(p.binds) > maxBinds {
		p.binds = slices.Delete(p.binds, 0, len(p.binds)-maxBinds)
	}
	p.mu.Unlock()
}

// Failed ends the bind of s to room that failed with err before the
// room's folders were touched (or was stopped by its fault hook). ok
// false: the room starts cold (a miss; s is discarded). ok with the
// fault hook's error: as after a crash there, the agent ends and the
// folders stay as they are for the next start's recovery, and the
// room's start fails with it.
func (p *Pool[A]) Failed(s *Slot[A], room string, err error) (ok bool, _ error) {
	if errors.Is(err, warmpool.ErrFault) {
		s.Agent.End()
		return true, err
	}
	p.discard(s)
	p.Miss(MissBindFailed)
	p.c.Logger.Warn(p.c.Name+": binding a pool agent failed; the room starts its own", "room", room, "err", err)
	return false, nil
}

// watch removes the idle slot s whose agent ended by itself (it would hold
// a place and fail its bind) and has the pool start another; it ends once
// s is taken (its goroutine, joined by Close).
func (p *Pool[A]) watch(s *Slot[A]) {
	defer p.watches.Done()
	select {
	case <-s.taken:
		return
	case <-s.Agent.Done():
	}
	p.mu.Lock()
	i := slices.Index(p.idle, s)
	if i >= 0 {
		p.idle = slices.Delete(p.idle, i, i+1)
		close(s.taken)
	}
	p.mu.Unlock()
	if i < 0 {
		return // taken meanwhile: its taker sees the agent gone
	}
	p.c.Logger.Warn(p.c.Name + ": a pool agent ended while idle; another starts")
	p.discard(s)
	p.Signal()
}

// evict ends one idle agent of the pool (a room needs its place); false
// when none is idle.
func (p *Pool[A]) evict() bool {
	p.mu.Lock()
	if len(p.idle) == 0 {
		p.mu.Unlock()
		return false
	}
	s := p.idle[len(p.idle)-1]
	p.idle = p.idle[:len(p.idle)-1]
	close(s.taken)
	p.mu.Unlock()
	p.discard(s)
	return true
}

// Held counts the pool's agents, started or starting.
func (p *Pool[A]) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle) + p.booting
}

// Idle are the idle slots, first to be taken first, and a channel closed
// when the next agent becomes idle or a boot fails (tests).
func (p *Pool[A]) Idle() ([]*Slot[A], <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.idle), p.changed
}

// Stats are the pool's counters.
func (p *Pool[A]) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Stats{Size: p.c.Size, Idle: len(p.idle), Booting: p.booting, Hits: p.hits, Misses: map[string]int64{},
		BindSeconds: slices.Clone(p.binds), LastErr: p.lastErr}
	for k, v := range p.misses {
		st.Misses[k] = v
	}
	return st
}

// Close stops refilling and ends the idle agents.
func (p *Pool[A]) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	idle := p.idle
	p.idle = nil
	for _, s := range idle {
		close(s.taken)
	}
	p.mu.Unlock()
	if p.cancel != nil {
		p.cancel()
		<-p.done
	}
	p.watches.Wait()
	for _, s := range idle {
		p.discard(s)
	}
}

// Wait returns once n agents of the pool are idle, or with the failure of
// a start that ended while it waited, or with ctx's error.
func (p *Pool[A]) Wait(ctx context.Context, n int) error {
	for first := true; ; first = false {
		p.mu.Lock()
		idle, changed, last := len(p.idle), p.changed, p.lastErr
		p.mu.Unlock()
		if idle >= n {
			return nil
		}
		if !first && last != "" {
			return fmt.Errorf("%s: the pool's agent did not start: %s", p.c.Name, last)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			if last != "" {
				return fmt.Errorf("%w (the last pool agent's start: %s)", ctx.Err(), last)
			}
			return ctx.Err()
		}
	}
}

// Methods are the pool's part of a transport's exported methods, the
// same for both transports; the zero Methods are those of a transport
// without a pool. A transport embeds them under an unexported alias, so
// that these names are its only surface of them.
type Methods[A Agent] struct{ p *Pool[A] }

// Methods are p's.
func (p *Pool[A]) Methods() Methods[A] { return Methods[A]{p} }

// StartPool recovers the binds a crash stopped (before any room starts),
// then starts filling the warm pool in the background; without a pool it
// does nothing.
func (m Methods[A]) StartPool() error {
	if m.p == nil {
		return nil
	}
	return m.p.Start()
}

// PoolStats are the warm pool's counters; ok false without a pool.
func (m Methods[A]) PoolStats() (st Stats, ok bool) {
	if m.p == nil {
		return st, false
	}
	return m.p.Stats(), true
}

// PoolWait returns once n agents of the warm pool are ready to bind, or
// with ctx's error (and the last start's failure); at once without a pool.
func (m Methods[A]) PoolWait(ctx context.Context, n int) error {
	if m.p == nil {
		return nil
	}
	return m.p.Wait(ctx, n)
}

// PoolHeld is how many agents the warm pool holds, started or starting.
func (m Methods[A]) PoolHeld() int {
	if m.p == nil {
		return 0
	}
	return m.p.Held()
}

// PoolSignal tells the warm pool a place may have come free (a room's
// agent was released): it refills if it is short.
func (m Methods[A]) PoolSignal() {
	if m.p != nil {
		m.p.Signal()
	}
}
