package acpagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/acp"
	"github.com/agenthost/agenthost/internal/agentfs"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/slotuid"
	"github.com/agenthost/agenthost/internal/warmpool"
	"github.com/agenthost/agenthost/room"
)

// The warm pool (Options.Pool) for new rooms: agents of the server's
// default ACP agent (codex or copilot) started ahead of their rooms, each confined to a slot
// of its own (a workspace, a home and a TMPDIR made for it under .pool
// beside the rooms' folders), initialized and waiting. A new room (one with
// no session to resume) whose settings match the pool's key takes an idle
// slot: its folders are renamed into the room's place (internal/warmpool,
// journaled, links never followed), the agent's tools' server (which
// listened from its start: a confined agent reaches that port only) is
// given the room's tools, and session/new opens the room's session in the
// room's workspace with its MCP servers; mode and model are set as a cold
// start sets them. A slot serves one room ever; the pool starts a
// replacement in the background, one boot at a time.
//
// As root with agent uids a slot's agent runs as a uid of its own
// (confine.Confiner.SlotUser), which its bind hands to the new room before
// session/new, the room's paths revealed in the agent's view, journaled and
// recovered at the next start (internal/slotuid, as the rpc pool does).
//
// A room that resumes a session starts cold (MissResume): an ACP agent
// loads a session from the home it was started with, which in a started
// process is the slot's (the support matrix's pooled row says so). Its
// cold agent finds the sessions its pool agent wrote under the slot's
// home's name (see slotMark).

// PoolOptions configure the warm pool.
type PoolOptions struct {
	// Size is how many agents the pool keeps started (0: no pool).
	Size int
	// Config is the room configuration the pool's agents are started
	// with (the server's default): a room whose agent, approval mode,
	// model, thinking level, instructions, limits, timeouts or
	// environment differ starts cold.
	Config room.Config
	// Rooms is the folder of the rooms' folders (room.Options.Root);
	// Workspaces that of their workspaces ("": each in its room's
	// folder). Slots are made beside them (same file systems).
	Rooms, Workspaces string
	// Places, if set, are the agents the rooms hold and the most that may
	// run (--max-resident): the pool's agents count against it.
	Places func() (resident, max int)
	// OnBind, if set, is given each bind's duration in seconds.
	OnBind func(seconds float64)
	// Fault, if set, is called before each step of a bind
	// (warmpool.Steps, and slotuid.Steps as root with agent uids; tests):
	// an error stops the bind there, as a crash would, and the room's
	// start fails with it.
	Fault func(step string) error
}

// Miss reasons (PoolStats.Misses): those of the rpc pool, and resume.
const (
	MissEmpty      = "empty"        // no idle slot
	MissSettings   = "settings"     // agent, approval mode, model, thinking, limits, timeouts or environment differ
	MissCommand    = "command"      // a custom agent command
	MissMCP        = "mcp"          // the room has MCP servers (a stdio one's command is in the agent's confinement)
	MissInstr      = "instructions" // the room's instructions differ (read at the agent's start)
	MissReadOnly   = "read_only"    // the room reads folders beside its own
	MissResume     = "resume"       // the room resumes a session (ACP: the cold path)
	MissBindFailed = "bind_failed"  // the bind failed before the room's folders were touched
	MissLarge      = "large"        // as root with agent uids: the room's files are more than a bind gives to another uid
)

// PoolStats are the pool's counters (/metrics).
type PoolStats struct {
	Size, Idle, Booting int
	Hits                int64
	Misses              map[string]int64
	BindSeconds         []float64
	LastErr             string
}

// ErrPoolUnsupported: the pool cannot run with these options.
var ErrPoolUnsupported = errors.New("acpagent: the warm pool cannot run here")

const (
	// refillQuiet: after a take the pool waits this long before it boots
	// a replacement (a burst of cold rooms is not slowed by it).
	refillQuiet = 500 * time.Millisecond
	// placesPoll: how often a pool short of agents looks for a free
	// place while every place (--max-resident) is taken.
	placesPoll = 2 * time.Second
	// slotsDir is the pool's folder beside the rooms' (a room's folder
	// name never starts with a dot).
	slotsDir = ".pool"
	// discardWait bounds a discarded slot's agent's end.
	discardWait = 30 * time.Second
)

type pool struct {
	t    *Transport
	opts PoolOptions
	kind agents.Kind

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	wake   chan struct{}

	watches sync.WaitGroup

	mu       sync.Mutex
	idle     []*slot
	booting  int
	lastTake time.Time
	hits     int64
	misses   map[string]int64
	binds    []float64
	lastErr  string
	closed   bool
	changed  chan struct{}
}

// slot is one started agent and its folders.
type slot struct {
	dir, ws, home, tmp string
	a                  *agent
	r                  Recipe
	taken              chan struct{}
}

func newPool(t *Transport, o PoolOptions) (*pool, error) {
	kind := agents.Kind(o.Config.Agent)
	if kind == "" {
		kind = agents.OMP
	}
	switch {
	case kind != agents.Codex && kind != agents.Copilot:
		// omp acp's session/new in a started process (0.6-0.9 s) is not
		// tested here yet; claude's adapter starts a CLI per session.
		return nil, fmt.Errorf("%w: agent %q (codex or copilot)", ErrPoolUnsupported, kind)
	case len(o.Config.Command) > 0:
		return nil, fmt.Errorf("%w: a custom agent command", ErrPoolUnsupported)
	case t.opts.OTLP != nil:
		return nil, fmt.Errorf("%w: each agent gets its room's tracing variables (--otlp-agents)", ErrPoolUnsupported)
	case o.Rooms == "":
		return nil, fmt.Errorf("%w: no rooms folder", ErrPoolUnsupported)
	}
	if o.Config.ApprovalMode == "" {
		o.Config.ApprovalMode = room.ApprovalAsk
	}
	var err error
	if o.Rooms, err = filepath.Abs(o.Rooms); err == nil && o.Workspaces != "" {
		o.Workspaces, err = filepath.Abs(o.Workspaces)
	}
	if err != nil {
		return nil, fmt.Errorf("acpagent: %w", err)
	}
	return &pool{t: t, opts: o, kind: kind, misses: map[string]int64{}, changed: make(chan struct{}),
		wake: make(chan struct{}, 1), done: make(chan struct{})}, nil
}

// start recovers the binds a crash stopped, removes the slots left behind
// and starts refilling.
func (p *pool) start() error {
	for _, d := range p.slotRoots() {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("acpagent: the pool's folder: %w", err)
		}
		if same, err := warmpool.SameDevice(d, filepath.Dir(d)); err != nil || !same {
			return fmt.Errorf("%w: %s is not on the file system of %s", ErrPoolUnsupported, d, filepath.Dir(d))
		}
	}
	journals, _ := filepath.Glob(filepath.Join(p.opts.Rooms, slotsDir, "*", warmpool.Journal))
	for _, j := range journals {
		if err := warmpool.Recover(j); err != nil {
			return fmt.Errorf("acpagent: recovering a bind the last server left: %w", err)
		}
		p.t.opts.Logger.Warn("acpagent: recovered a room's bind a crash had stopped", "slot", filepath.Base(filepath.Dir(j)))
	}
	slots, err := p.uidBinder().RecoverAll(filepath.Join(p.opts.Rooms, slotsDir))
	for _, s := range slots {
		p.t.opts.Logger.Warn("acpagent: gave a room's files back to its uid after a stopped bind", "slot", s)
	}
	if err != nil {
		return fmt.Errorf("acpagent: %w", err)
	}
	for _, d := range p.slotRoots() {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(d, e.Name())); err != nil {
				return fmt.Errorf("acpagent: removing an old slot: %w", err)
			}
		}
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	go p.refill()
	p.signal()
	return nil
}

func (p *pool) slotRoots() []string {
	roots := []string{filepath.Join(p.opts.Rooms, slotsDir)}
	if p.opts.Workspaces != "" {
		roots = append(roots, filepath.Join(p.opts.Workspaces, slotsDir))
	}
	return roots
}

func (p *pool) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// refill keeps the pool full, one boot at a time (its goroutine, ended by
// close).
func (p *pool) refill() {
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
				p.t.opts.Logger.Warn("acpagent: starting a pool agent", "err", err)
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

func (p *pool) needs() (wait time.Duration, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle)+p.booting >= p.opts.Size {
		return 0, false
	}
	if d := refillQuiet - time.Since(p.lastTake); d > 0 {
		return d, true
	}
	if p.overLocked(1) {
		return placesPoll, true
	}
	p.booting++
	return 0, true
}

// overLocked: n more agents of the pool would pass the places (p.mu held).
func (p *pool) overLocked(n int) bool {
	if p.opts.Places == nil {
		return false
	}
	resident, most := p.opts.Places()
	return resident+len(p.idle)+p.booting+n > most
}

// boot starts one agent in a new slot (p.booting counts it).
func (p *pool) boot() error {
	s, err := p.newSlot()
	if err == nil {
		ctx, cancel := context.WithTimeout(p.ctx, p.t.opts.StartTimeout)
		err = p.spawn(ctx, s)
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
		close(p.changed)
		p.changed = make(chan struct{})
	}
	p.mu.Unlock()
	if s != nil {
		p.discard(s)
	}
	if err == nil {
		err = errors.New("acpagent: the pool closed")
	}
	return err
}

// newSlot makes a slot's folders.
func (p *pool) newSlot() (*slot, error) {
	b := make([]byte, 8)
	rand.Read(b)
	id := hex.EncodeToString(b)
	s := &slot{dir: filepath.Join(p.opts.Rooms, slotsDir, id)}
	s.home, s.tmp = filepath.Join(s.dir, "home"), filepath.Join(s.dir, "tmp")
	s.ws = filepath.Join(s.dir, "workspace")
	if p.opts.Workspaces != "" {
		s.ws = filepath.Join(p.opts.Workspaces, slotsDir, id)
	}
	for _, d := range []string{s.dir, s.ws, s.home} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return s, fmt.Errorf("acpagent: the slot's folders: %w", err)
		}
	}
	return s, nil
}

// spawn starts the slot's agent, confined to its folders, with a tools'
// server that serves nothing until the bind; no session yet.
func (p *pool) spawn(ctx context.Context, s *slot) error {
	a := &agent{h: &lateHandler{}, log: p.t.opts.Logger, t: p.t}
	a.loading.Store(true)
	var err error
	if a.tools, err = listenTools(p.t.opts.Logger); err != nil {
		return err
	}
	spec := room.AgentSpec{Room: "pool-" + filepath.Base(s.dir), Workspace: s.ws, Home: s.home, Config: p.opts.Config}
	r, _, err := p.t.spawn(ctx, spec, a)
	if err != nil {
		return errors.Join(err, a.tools.close())
	}
	s.a, s.r = a, r
	return nil
}

// discard ends a slot's agent and removes its folders.
func (p *pool) discard(s *slot) {
	if s.a != nil && s.a.c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), discardWait)
		_, _ = s.a.Close(ctx)
		cancel()
	} else if s.a != nil {
		_ = s.a.tools.close()
	}
	for _, d := range []string{s.ws, s.dir} {
		if err := os.RemoveAll(d); err != nil {
			p.t.opts.Logger.Warn("acpagent: removing a slot", "err", err)
		}
	}
}

// mismatch is the miss reason for spec, "" when the pool may serve it.
func (p *pool) mismatch(spec room.AgentSpec) string {
	c, o := spec.Config, p.opts.Config
	switch {
	case len(c.Command) > 0:
		return MissCommand
	case spec.SessionID != "":
		return MissResume
	case len(spec.MCP) > 0:
		return MissMCP
	case c.Instructions != o.Instructions:
		return MissInstr
	case len(spec.ReadOnly) > 0:
		return MissReadOnly
	case c.Agent != o.Agent && !(c.Agent == "" && p.kind == agents.OMP) && !(o.Agent == "" && c.Agent == string(agents.OMP)),
		c.ApprovalMode != o.ApprovalMode, c.Model != o.Model, c.Thinking != o.Thinking,
		c.Limits != o.Limits, len(c.Env) > 0 || len(o.Env) > 0, c.MaxLineBytes != o.MaxLineBytes,
		// acp's permission backstop was set at the agent's start.
		max(c.ApprovalTimeout, c.QuestionTimeout) > p.backstop():
		return MissSettings
	}
	return ""
}

// backstop is the longest room deadline the pool's agents' permission
// backstop (set at their start) leaves to the room.
func (p *pool) backstop() time.Duration {
	o := p.opts.Config
	if d := max(o.ApprovalTimeout, o.QuestionTimeout); d > 0 {
		return d
	}
	return acp.DefaultPermissionTimeout
}

func (p *pool) missed(reason string) {
	p.mu.Lock()
	p.misses[reason]++
	p.mu.Unlock()
}

// take binds an idle slot's agent to spec's room; ok false: the room
// starts cold (a miss). An error with ok is the room's (its workspace
// refused as a cold start would refuse it, or a bind that failed after
// the room's folders were touched).
func (p *pool) take(ctx context.Context, spec room.AgentSpec) (_ room.Agent, ok bool, _ error) {
	if r := p.mismatch(spec); r != "" {
		p.missed(r)
		p.makeRoom()
		return nil, false, nil
	}
	// What a cold start does to the room's home and checks of its
	// workspace, before a slot is spent: the room's files win over the
	// slot's in the bind.
	ws, err := filepath.Abs(spec.Workspace)
	if err != nil {
		return nil, true, fmt.Errorf("acpagent: %w", err)
	}
	if _, err := p.t.recipe(spec, ws, nil); err != nil {
		return nil, true, err
	}
	if b := p.uidBinder(); b.On() && slotuid.CountEntries(slotuid.MaxOwnEntries+1, ws, spec.Home) > slotuid.MaxOwnEntries {
		// As root with agent uids the bind gives the room's files to the
		// slot's uid: past this, a cold start is about as fast.
		p.missed(MissLarge)
		p.makeRoom()
		return nil, false, nil
	}
	s := p.pop()
	if s == nil {
		p.missed(MissEmpty)
		p.makeRoom()
		return nil, false, nil
	}
	a, touched, err := p.bind(ctx, s, spec)
	if errors.Is(err, warmpool.ErrFault) {
		// As a crash there: the agent ends, the folders and journals
		// stay as they are for the next start's recovery.
		ctx, cancel := context.WithTimeout(context.Background(), discardWait)
		_, _ = s.a.Close(ctx)
		cancel()
		return nil, true, err
	}
	if err != nil && !touched {
		p.discard(s)
		p.missed(MissBindFailed)
		p.makeRoom()
		p.t.opts.Logger.Warn("acpagent: binding a pool agent failed; the room starts its own", "room", spec.Room, "err", err)
		return nil, false, nil
	}
	if err != nil {
		// The room's folders are the slot's now: its agent ends, and
		// the room's next start is a cold one in them.
		ctx, cancel := context.WithTimeout(context.Background(), discardWait)
		_, _ = s.a.Close(ctx)
		cancel()
		_ = os.RemoveAll(s.dir)
		_ = os.Remove(s.ws)
		return nil, true, redactedErr{err}
	}
	if p.opts.OnBind != nil {
		p.opts.OnBind(a.bindTime.Seconds())
	}
	p.mu.Lock()
	p.hits++
	p.binds = append(p.binds, a.bindTime.Seconds())
	if len(p.binds) > 1024 {
		p.binds = slices.Delete(p.binds, 0, len(p.binds)-1024)
	}
	p.mu.Unlock()
	return a, true, nil
}

// pop takes an idle slot whose agent runs (nil: none); those that ended
// are discarded.
func (p *pool) pop() *slot {
	defer p.signal()
	var stale []*slot
	defer func() {
		for _, s := range stale {
			p.discard(s)
		}
	}()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastTake = time.Now()
	for len(p.idle) > 0 {
		s := p.idle[0]
		p.idle = p.idle[1:]
		close(s.taken)
		select {
		case <-s.a.Done():
			stale = append(stale, s)
			continue
		default:
		}
		return s
	}
	return nil
}

// bind hands the slot's agent spec's room: the slot's folders into the
// room's place, the room's tools and handler, then session/new in the
// room's workspace. touched: the room's folders were moved (an error
// then is the room's).
func (p *pool) bind(ctx context.Context, s *slot, spec room.AgentSpec) (_ *agent, touched bool, _ error) {
	began := time.Now()
	a := s.a
	// The room's home as a cold start makes it (new rooms may have none).
	d, err := agentfs.Create(spec.Home, 0o700, nil)
	if err != nil {
		return nil, false, fmt.Errorf("acpagent: %w", err)
	}
	d.Close()
	plan := warmpool.Plan{
		Workspace: warmpool.Pair{Slot: s.ws, Room: spec.Workspace},
		Home:      warmpool.Pair{Slot: s.home, Room: spec.Home},
		Tmp:       warmpool.Pair{Slot: s.tmp, Room: filepath.Join(filepath.Dir(spec.Home), "tmp")},
	}
	for _, pr := range []*warmpool.Pair{&plan.Workspace, &plan.Home, &plan.Tmp} {
		r, err := filepath.Abs(pr.Room)
		if err != nil {
			return nil, false, fmt.Errorf("acpagent: %w", err)
		}
		pr.Room = r
	}
	uids := p.uidBinder()
	if err := uids.Begin(s.dir, plan); err != nil {
		return nil, false, err
	}
	if err := warmpool.Bind(filepath.Join(s.dir, warmpool.Journal), plan, p.opts.Fault); err != nil {
		// Bind recovers the room's folders itself on a failure (but a
		// fault's, as a crash's).
		return nil, false, uids.BindFailed(s.dir, err)
	}
	// As root with agent uids: the room's folders and the room to the
	// slot's uid, and the room's paths into the agent's view, before
	// session/new names the room's workspace.
	if err := uids.HandOver(s.dir, plan, a.c); err != nil {
		return nil, true, err
	}
	// The agent was started with the slot's paths (HOME, TMPDIR, its
	// configuration's files): they lead to the room's folders, which are
	// the slot's, for as long as it runs.
	for _, l := range [][2]string{{plan.Home.Room, s.home}, {plan.Tmp.Room, s.tmp}, {plan.Workspace.Room, s.ws}} {
		if err := os.Symlink(l[0], l[1]); err != nil {
			return nil, true, fmt.Errorf("acpagent: %w", err)
		}
	}
	if err := a.c.MoveFSRoot(plan.Workspace.Room); err != nil {
		return nil, true, err
	}
	tools := askFirst(spec.Tools, spec.Handler, spec.Config.ApprovalMode)
	if len(spec.Tools) > 0 {
		a.askFirst = spec.Config.ApprovalMode != room.ApprovalYolo
		for _, tl := range spec.Tools {
			a.toolNames = append(a.toolNames, tl.Name)
		}
		if err := a.tools.setTools(tools, p.t.opts.Logger); err != nil {
			return nil, true, err
		}
	} else {
		_ = a.tools.close()
		a.tools = nil
	}
	a.h.(*lateHandler).bind(spec.Handler)
	if err := p.t.openSession(ctx, a, spec, plan.Workspace.Room, s.r); err != nil {
		return nil, true, err
	}
	if err := markSlot(plan.Home.Room, s.dir); err != nil {
		return nil, true, err
	}
	a.pooled, a.bindTime = true, time.Since(began)
	dir, ws := s.dir, s.ws
	a.cleanup = func() {
		// The links and the slot's folder.
		_ = os.RemoveAll(dir)
		_ = os.Remove(ws)
	}
	return a, true, nil
}

// uidBinder hands a slot's uid to its room as root with agent uids
// (nothing otherwise).
func (p *pool) uidBinder() slotuid.Binder {
	return slotuid.Binder{Confine: p.t.opts.Confine, Fault: p.opts.Fault}
}

// slotUser is the user of a slot's agent when dir (a home's parent) is a
// slot's folder (ok), as confine.Confiner.SlotUser allocates it.
func (t *Transport) slotUser(dir string) (u *confine.User, ok bool, err error) {
	if t.pool == nil || filepath.Dir(dir) != filepath.Join(t.pool.opts.Rooms, slotsDir) {
		return nil, false, nil
	}
	u, err = t.opts.Confine.SlotUser(dir)
	if err != nil {
		return nil, true, fmt.Errorf("acpagent: the pool agent's user: %w", err)
	}
	return u, true, nil
}

// makeRoom ends idle agents of the pool while the rooms' agents and the
// pool's pass the places.
func (p *pool) makeRoom() {
	for {
		p.mu.Lock()
		over := p.overLocked(0)
		p.mu.Unlock()
		if !over || !p.evict() {
			return
		}
	}
}

// watch removes the idle slot s whose agent ended by itself and has the
// pool start another; it ends once s is taken.
func (p *pool) watch(s *slot) {
	defer p.watches.Done()
	select {
	case <-s.taken:
		return
	case <-s.a.Done():
	}
	p.mu.Lock()
	i := slices.Index(p.idle, s)
	if i >= 0 {
		p.idle = slices.Delete(p.idle, i, i+1)
		close(s.taken)
	}
	p.mu.Unlock()
	if i < 0 {
		return
	}
	p.t.opts.Logger.Warn("acpagent: a pool agent ended while idle; another starts")
	p.discard(s)
	p.signal()
}

// evict ends one idle agent of the pool; false when none is idle.
func (p *pool) evict() bool {
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

func (p *pool) held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle) + p.booting
}

func (p *pool) stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := PoolStats{Size: p.opts.Size, Idle: len(p.idle), Booting: p.booting, Hits: p.hits, Misses: map[string]int64{},
		BindSeconds: slices.Clone(p.binds), LastErr: p.lastErr}
	for k, v := range p.misses {
		st.Misses[k] = v
	}
	return st
}

// close stops refilling and ends the idle agents.
func (p *pool) close() {
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

// wait returns once n agents of the pool are idle, or with the failure of
// a start that ended while it waited, or with ctx's error.
func (p *pool) wait(ctx context.Context, n int) error {
	for first := true; ; first = false {
		p.mu.Lock()
		idle, changed, last := len(p.idle), p.changed, p.lastErr
		p.mu.Unlock()
		if idle >= n {
			return nil
		}
		if !first && last != "" {
			return fmt.Errorf("acpagent: the pool's agent did not start: %s", last)
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

// lateHandler is a pool agent's handler: nothing before its bind (an
// event is dropped, a permission denied, a question unanswered), the
// room's after.
type lateHandler struct{ h atomic.Pointer[room.Handler] }

func (l *lateHandler) bind(h room.Handler) {
	if h != nil {
		l.h.Store(&h)
	}
}

func (l *lateHandler) Event(ev room.AgentEvent) {
	if h := l.h.Load(); h != nil {
		(*h).Event(ev)
	}
}

func (l *lateHandler) Approve(ctx context.Context, req room.ApprovalRequest) bool {
	if h := l.h.Load(); h != nil {
		return (*h).Approve(ctx, req)
	}
	return false
}

func (l *lateHandler) Ask(ctx context.Context, req room.QuestionRequest) (string, bool) {
	if h := l.h.Load(); h != nil {
		return (*h).Ask(ctx, req)
	}
	return "", false
}

// Pooled implements room.Pooled.
func (a *agent) Pooled() (bool, time.Duration) { return a.pooled, a.bindTime }

// slotMark is the file in a room's folder (its home's parent, which the
// agent cannot write) naming the slot whose agent first served the room.
//
// An ACP agent records the paths of its sessions under the home it was
// started with (codex: each thread's rollout file, by absolute path, in
// its state database): a pool agent's are the slot's home's, which is
// the room's home under another name. A room that wakes starts cold with
// its home under its own name, so that name (<rooms>/.pool/<slot>/home)
// is made again, a link to the room's home, for as long as its agent runs:
// the agent finds its sessions where it wrote them.
const slotMark = "pool-slot"

// markSlot records in the room's folder the slot bound to it.
func markSlot(roomHome, slotDir string) error {
	if err := os.WriteFile(filepath.Join(filepath.Dir(roomHome), slotMark), []byte(filepath.Base(slotDir)), 0o600); err != nil {
		return fmt.Errorf("acpagent: %w", err)
	}
	return nil
}

// slotHomeLink makes the home name a pool agent served the room under (see
// slotMark) lead to the room's home again; undo removes it (nil: the room
// was never pooled, or its slot's name exists). The slot's name is checked
// (16 hex digits) and made under the rooms' .pool folder, beside the room.
func slotHomeLink(roomHome string) (undo func(), dir string, err error) {
	home, err := filepath.Abs(roomHome)
	if err != nil {
		return nil, "", fmt.Errorf("acpagent: %w", err)
	}
	roomDir := filepath.Dir(home)
	b, err := os.ReadFile(filepath.Join(roomDir, slotMark))
	if errors.Is(err, os.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("acpagent: %w", err)
	}
	id := string(b)
	if _, err := hex.DecodeString(id); err != nil || len(id) != 16 {
		return nil, "", fmt.Errorf("acpagent: %s in the room's folder is not a slot's name", slotMark)
	}
	dir = filepath.Join(filepath.Dir(roomDir), slotsDir, id)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, "", fmt.Errorf("acpagent: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			// Another agent of this room still holds it (a release in
			// progress), or the slot's leftovers: the agent runs
			// without it.
			return nil, "", nil
		}
		return nil, "", fmt.Errorf("acpagent: %w", err)
	}
	if err := os.Symlink(home, filepath.Join(dir, "home")); err != nil {
		_ = os.Remove(dir)
		return nil, "", fmt.Errorf("acpagent: %w", err)
	}
	return func() { _ = os.RemoveAll(dir) }, dir, nil
}

// revealSlotHome shows the folder of the link slotHomeLink made (dir) in
// the view of a's just started agent, as root with agent uids: that view
// (the launcher's) holds the room's folders only. The folder stays the
// server's, searchable only (0711): the agent follows the link (its only
// entry) to the room's home but can neither list it nor change it.
// Nothing without agent uids (the agent sees the server's paths).
func (t *Transport) revealSlotHome(a *agent, dir string) error {
	if t.opts.Confine.AgentUsers().Empty() {
		return nil
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return fmt.Errorf("acpagent: %w", err)
	}
	select {
	case <-a.c.Exited():
		return errors.New("acpagent: the agent exited")
	default:
	}
	// The leader is reaped only after Exited: its pid is not reused yet.
	if err := confine.Reveal(a.c.Pid(), dir); err != nil {
		return fmt.Errorf("acpagent: %w", err)
	}
	return nil
}
