package rpcagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agenthost/agenthost/internal/agentfs"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/warmpool"
	"github.com/agenthost/agenthost/room"
)

// The warm pool (Options.Pool): agents started ahead of their rooms, each
// in a slot of its own (a workspace, a home and a TMPDIR made for it, to
// which it is confined), so that a room whose agent is not running (a new
// room, or one that wakes after a release) is answered without the agent's
// boot. A room's start takes an idle slot whose key (what cannot change
// after the agent started) matches the room's settings and binds it: the
// room's files are moved into the slot's folders and those are renamed
// into the room's place (internal/warmpool, journaled), then the agent is
// switched to the room's session file (pi: switch_session to a file whose
// header names the room's workspace; omp: /move to the workspace, then
// switch_session). A slot serves one room ever: a released agent is killed
// like any other, and the pool starts a replacement in the background, one
// boot at a time, once no take has happened for refillQuiet. A room whose
// settings match no key, or that finds no idle slot, starts cold as
// before.

// PoolOptions configure the warm pool.
type PoolOptions struct {
	// Size is how many agents the pool keeps started (0: no pool).
	Size int
	// Config is the room configuration the pool's agents are started
	// with (the server's default): a room whose agent, approval mode,
	// model, thinking level, instructions, limits or environment differ
	// starts cold.
	Config room.Config
	// Rooms is the folder of the rooms' folders (room.Options.Root);
	// Workspaces that of their workspaces ("": each in its room's
	// folder). Slots are made beside them (same file systems).
	Rooms, Workspaces string
	// Places, if set, are the agents the rooms hold and the most that may
	// run (the server's --max-resident): the pool's agents count against
	// it. The pool starts one only while a place is free, and a room that
	// starts cold when every place is taken ends an idle agent of the
	// pool first (a room that binds one takes its place).
	Places func() (resident, max int)
	// Tools, if set, are the rooms' tools (room.Manager.ToolDefs): pi's
	// extension loads them at its start. Otherwise the pool learns them
	// from the first pi room (which starts cold).
	Tools func() []room.Tool
	// OnBind, if set, is given each bind's duration in seconds (a
	// metric).
	OnBind func(seconds float64)
	// Fault, if set, is called before each step of a bind
	// (warmpool.Steps; tests): an error stops the bind there, as a crash
	// would, and the room's start fails with it.
	Fault func(step string) error
}

// Miss reasons (PoolStats.Misses).
const (
	MissEmpty      = "empty"        // no idle slot
	MissSettings   = "settings"     // agent, approval mode, model, thinking, limits or environment differ from the pool's
	MissCommand    = "command"      // a custom agent command
	MissMCP        = "mcp"          // the room has MCP servers (read at the agent's start)
	MissInstr      = "instructions" // the room's instructions differ (read at the agent's start)
	MissTools      = "tools"        // pi: the room's tools differ from those the slot's extension loaded
	MissReadOnly   = "read_only"    // the room reads folders beside its own (a git workspace's objects)
	MissBindFailed = "bind_failed"  // the bind failed before the room's folders were touched
)

// PoolStats are the pool's counters (/metrics).
type PoolStats struct {
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

// refillQuiet is how long the pool waits after a take before it starts a
// replacement: a burst of rooms starting cold is not slowed by the
// pool's own boots.
const refillQuiet = 500 * time.Millisecond

// placesPoll is how often a pool short of agents looks for a free place
// while every place (--max-resident) is taken.
const placesPoll = 2 * time.Second

// slotsDir is the pool's folder under the rooms' and the workspaces'
// folders (a room's folder name never starts with a dot).
const slotsDir = ".pool"

// pool is the warm pool of a Transport.
type pool struct {
	t    *Transport
	opts PoolOptions
	kind agents.Kind

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	wake   chan struct{}

	watches sync.WaitGroup // each idle slot's watch (see watch)

	mu       sync.Mutex
	idle     []*slot
	booting  int
	tools    []room.Tool // pi: the tools the slots' extensions load (learned from rooms)
	lastTake time.Time
	hits     int64
	misses   map[string]int64
	binds    []float64
	lastErr  string
	closed   bool
	// changed is closed (and replaced) when an agent becomes idle.
	changed chan struct{}
}

// slot is one started agent and its folders.
type slot struct {
	dir, ws, home, tmp string
	a                  *agent
	tools              string // pi: the signature of the tools it loaded
	// taken is closed when the slot leaves the idle list (its watch
	// ends).
	taken chan struct{}
}

// ErrPoolUnsupported: the pool cannot run with these options.
var ErrPoolUnsupported = errors.New("rpcagent: the warm pool cannot run here")

func newPool(t *Transport, o PoolOptions) (*pool, error) {
	kind := agents.Kind(o.Config.Agent)
	if kind == "" {
		kind = agents.OMP
	}
	switch {
	case kind != agents.OMP && kind != agents.Pi:
		return nil, fmt.Errorf("%w: agent %q (omp or pi)", ErrPoolUnsupported, kind)
	case len(o.Config.Command) > 0:
		return nil, fmt.Errorf("%w: a custom agent command", ErrPoolUnsupported)
	case t.opts.Daemon != nil:
		return nil, fmt.Errorf("%w: agents run in the process daemon", ErrPoolUnsupported)
	case t.opts.OTLP != nil:
		return nil, fmt.Errorf("%w: each agent gets its room's tracing variables (--otlp-agents)", ErrPoolUnsupported)
	case o.Rooms == "":
		return nil, fmt.Errorf("%w: no rooms folder", ErrPoolUnsupported)
	}
	if o.Config.ApprovalMode == "" {
		o.Config.ApprovalMode = room.ApprovalAsk // as rooms fill it
	}
	var err error
	if o.Rooms, err = filepath.Abs(o.Rooms); err == nil && o.Workspaces != "" {
		o.Workspaces, err = filepath.Abs(o.Workspaces)
	}
	if err != nil {
		return nil, fmt.Errorf("rpcagent: %w", err)
	}
	return &pool{t: t, opts: o, kind: kind, misses: map[string]int64{}, changed: make(chan struct{}), wake: make(chan struct{}, 1), done: make(chan struct{})}, nil
}

// start recovers the binds a crash stopped, removes the slots left
// behind, and starts refilling.
func (p *pool) start() error {
	for _, d := range p.slotRoots() {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("rpcagent: the pool's folder: %w", err)
		}
		if same, err := warmpool.SameDevice(d, filepath.Dir(d)); err != nil || !same {
			return fmt.Errorf("%w: %s is not on the file system of %s", ErrPoolUnsupported, d, filepath.Dir(d))
		}
	}
	journals, _ := filepath.Glob(filepath.Join(p.opts.Rooms, slotsDir, "*", warmpool.Journal))
	for _, j := range journals {
		if err := warmpool.Recover(j); err != nil {
			return fmt.Errorf("rpcagent: recovering a bind the last server left: %w", err)
		}
		p.t.opts.Logger.Warn("rpcagent: recovered a room's bind a crash had stopped", "slot", filepath.Base(filepath.Dir(j)))
	}
	if err := p.recoverUIDs(); err != nil {
		return err
	}
	for _, d := range p.slotRoots() {
		// Slots of the last server (their agents are gone): their own
		// folders, or links to rooms they were bound to, removed
		// themselves.
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(d, e.Name())); err != nil {
				return fmt.Errorf("rpcagent: removing an old slot: %w", err)
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
				timer := time.NewTimer(wait)
				select {
				case <-p.ctx.Done():
					timer.Stop()
					return
				case <-timer.C:
				}
				continue
			}
			if err := p.boot(); err != nil {
				if p.ctx.Err() != nil {
					return
				}
				p.t.opts.Logger.Warn("rpcagent: starting a pool agent", "err", err)
				timer := time.NewTimer(backoff)
				select {
				case <-p.ctx.Done():
					timer.Stop()
					return
				case <-timer.C:
				}
				backoff = min(2*backoff, time.Minute)
				continue
			}
			backoff = time.Second
		}
	}
}

// needs says whether the pool should start an agent now (ok), or after
// wait (a take was recent).
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
		// Every place is taken: look again later (or when a release
		// signals).
		return placesPoll, true
	}
	p.booting++
	return 0, true
}

// overLocked: n more agents of the pool would pass the places (p.mu
// held; Places takes the rooms' lock, never the other way round).
func (p *pool) overLocked(n int) bool {
	if p.opts.Places == nil {
		return false
	}
	resident, most := p.opts.Places()
	return resident+len(p.idle)+p.booting+n > most
}

// boot starts one agent in a new slot (p.booting counts it).
func (p *pool) boot() (err error) {
	s, spec, err := p.newSlot()
	if err == nil {
		var a room.Agent
		ctx, cancel := context.WithTimeout(p.ctx, p.t.opts.StartTimeout)
		a, err = p.t.start(ctx, spec)
		cancel()
		if err == nil {
			s.a = a.(*agent)
		}
	}
	p.mu.Lock()
	p.booting--
	if err == nil && !p.closed && !p.overLocked(0) {
		p.idle = append(p.idle, s)
		s.taken = make(chan struct{})
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
	if s != nil {
		p.discard(s)
	}
	if err == nil {
		err = errors.New("rpcagent: the pool closed")
	}
	return err
}

// newSlot makes a slot's folders and the spec its agent starts with.
func (p *pool) newSlot() (*slot, room.AgentSpec, error) {
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
			return s, room.AgentSpec{}, fmt.Errorf("rpcagent: the slot's folders: %w", err)
		}
	}
	p.mu.Lock()
	tools := p.bootToolsLocked()
	p.mu.Unlock()
	s.tools = toolSig(tools)
	bound := make([]room.Tool, 0, len(tools))
	for _, t := range tools {
		// The definitions the extension loads; a call before the bind
		// (no room's yet) runs nothing.
		t.Run = func(context.Context, room.ToolCall) (string, error) {
			return "", errors.New("no room is bound to this agent")
		}
		bound = append(bound, t)
	}
	tools = bound
	return s, room.AgentSpec{Room: "pool-" + id, Workspace: s.ws, Home: s.home, Config: p.opts.Config, Tools: tools}, nil
}

// bootToolsLocked are the tools a new slot's agent loads (p.mu held):
// those of the last room that differed, else the rooms' (Tools).
func (p *pool) bootToolsLocked() []room.Tool {
	if p.kind != agents.Pi {
		return nil
	}
	if p.tools == nil && p.opts.Tools != nil {
		return p.opts.Tools()
	}
	return p.tools
}

// toolSig is what a pi extension loads of tools (their names,
// descriptions and parameters).
func toolSig(tools []room.Tool) string {
	type def struct {
		N, D string
		P    json.RawMessage
	}
	defs := make([]def, 0, len(tools))
	for _, t := range tools {
		defs = append(defs, def{t.Name, t.Description, t.Parameters})
	}
	b, _ := json.Marshal(defs)
	return string(b)
}

// discard ends a slot's agent and removes its folders.
func (p *pool) discard(s *slot) {
	if s.a != nil {
		ctx, cancel := context.WithTimeout(context.Background(), joinWait)
		_, _ = s.a.Close(ctx)
		cancel()
	}
	for _, d := range []string{s.ws, s.dir} {
		if err := os.RemoveAll(d); err != nil {
			p.t.opts.Logger.Warn("rpcagent: removing a slot", "err", err)
		}
	}
}

// miss reason for spec, "" when its settings match the pool's.
func (p *pool) mismatch(spec room.AgentSpec) string {
	c, o := spec.Config, p.opts.Config
	switch {
	case len(c.Command) > 0:
		return MissCommand
	case len(spec.MCP) > 0:
		return MissMCP
	case c.Instructions != o.Instructions:
		return MissInstr
	case len(spec.ReadOnly) > 0:
		return MissReadOnly
	case c.Agent != o.Agent && !(c.Agent == "" && p.kind == agents.OMP) && !(o.Agent == "" && c.Agent == string(agents.OMP)),
		c.ApprovalMode != o.ApprovalMode, c.Model != o.Model, c.Thinking != o.Thinking,
		c.Limits != o.Limits, len(c.Env) > 0 || len(o.Env) > 0, c.MaxLineBytes != o.MaxLineBytes:
		return MissSettings
	}
	return ""
}

func (p *pool) missed(reason string) {
	p.mu.Lock()
	p.misses[reason]++
	p.mu.Unlock()
}

// take binds an idle slot's agent to spec's room; ok false: the room
// starts cold (a miss). An error with ok is the bind's fault hook's (the
// room's start fails, as after a crash there).
func (p *pool) take(ctx context.Context, spec room.AgentSpec) (_ room.Agent, ok bool, _ error) {
	if r := p.mismatch(spec); r != "" {
		p.missed(r)
		p.makeRoom()
		return nil, false, nil
	}
	sig := ""
	if p.kind == agents.Pi {
		sig = toolSig(spec.Tools)
	}
	// What a cold start does to the room's home first, before a slot is
	// spent (a workspace the room's agent refuses is the room's error):
	// the home is made safe and its configuration written as a start now
	// would, so that the room's files (which win over the slot's in the
	// bind) are current.
	user, reason, err := p.roomUser(spec)
	if err != nil {
		return nil, true, err
	}
	if reason != "" {
		p.missed(reason)
		p.makeRoom()
		return nil, false, nil
	}
	if err := p.t.prepareHome(spec, user.Owner()); err != nil {
		return nil, true, err
	}
	if _, _, _, err := p.t.launch(spec, user); err != nil {
		return nil, true, err
	}
	// The room's session: a session the room cannot resume is the
	// room's to handle, and no slot is spent on it.
	file := ""
	if spec.SessionID != "" {
		f, err := resumeSession(spec.Home, spec.SessionID, user.Owner())
		if err != nil {
			return nil, true, err
		}
		file = f
	}
	s, reason, stale := p.pop(spec, sig)
	for _, st := range stale {
		p.discard(st)
	}
	if s == nil {
		p.missed(reason)
		p.makeRoom()
		return nil, false, nil
	}
	a, err := p.bind(ctx, s, spec, file)
	if errors.Is(err, warmpool.ErrFault) {
		// As a crash there: the agent ends, the folders stay as they are
		// for the next start's recovery.
		ctx, cancel := context.WithTimeout(context.Background(), joinWait)
		_, _ = s.a.Close(ctx)
		cancel()
		return nil, true, err
	}
	if err != nil {
		p.discard(s)
		p.missed(MissBindFailed)
		p.makeRoom()
		p.t.opts.Logger.Warn("rpcagent: binding a pool agent failed; the room starts its own", "room", spec.Room, "err", err)
		return nil, false, nil
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

// pop takes an idle slot whose agent runs and whose tools are sig's, or
// says why there is none, with the slots to discard (gone, or loaded
// other tools). The pool learns a pi room's tools: slots that
// loaded others are replaced.
func (p *pool) pop(spec room.AgentSpec, sig string) (_ *slot, reason string, stale []*slot) {
	defer p.signal()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastTake = time.Now()
	if p.kind == agents.Pi && toolSig(p.bootToolsLocked()) != sig {
		p.tools = slices.Clone(spec.Tools)
	}
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
		if p.kind == agents.Pi && s.tools != sig {
			stale = append(stale, s)
			continue
		}
		return s, "", stale
	}
	if len(stale) > 0 && p.kind == agents.Pi {
		return nil, MissTools, stale
	}
	return nil, MissEmpty, stale
}

// bind hands the slot's agent spec's room: its files into the slot's
// folders, those into the room's place, then the agent into the room's
// session (file, or a new one).
func (p *pool) bind(ctx context.Context, s *slot, spec room.AgentSpec, file string) (*agent, error) {
	began := time.Now()
	a := s.a
	if file == "" {
		f, err := newSessionFile(spec.Home, spec.Workspace)
		if err != nil {
			return nil, err
		}
		file = f
	}
	roomTmp := filepath.Join(filepath.Dir(spec.Home), "tmp")
	plan := warmpool.Plan{
		Workspace: warmpool.Pair{Slot: s.ws, Room: spec.Workspace},
		Home:      warmpool.Pair{Slot: s.home, Room: spec.Home},
		Tmp:       warmpool.Pair{Slot: s.tmp, Room: roomTmp},
	}
	for _, pr := range []*warmpool.Pair{&plan.Workspace, &plan.Home, &plan.Tmp} {
		r, err := filepath.Abs(pr.Room)
		if err != nil {
			return nil, fmt.Errorf("rpcagent: %w", err)
		}
		pr.Room = r
	}
	if err := p.beginUID(s, plan); err != nil {
		return nil, err
	}
	if err := warmpool.Bind(filepath.Join(s.dir, warmpool.Journal), plan, p.opts.Fault); err != nil {
		return nil, p.bindFailed(s, err)
	}
	if err := p.handOver(s, plan); err != nil {
		return nil, err
	}
	// The agent was started with the slot's paths (its HOME, TMPDIR,
	// its extension's and configuration's files): they lead to the
	// room's folders (which are the slot's) for as long as it runs.
	for _, l := range [][2]string{{plan.Home.Room, s.home}, {plan.Tmp.Room, s.tmp}, {plan.Workspace.Room, s.ws}} {
		if err := os.Symlink(l[0], l[1]); err != nil {
			return nil, fmt.Errorf("rpcagent: %w", err)
		}
	}
	c := a.c
	if p.kind == agents.OMP {
		// omp's switch_session refuses another cwd: /move rescopes the
		// agent (cwd, settings, skills) to the workspace first.
		if err := c.Prompt(ctx, "/move "+plan.Workspace.Room, nil); err != nil {
			return nil, fmt.Errorf("rpcagent: moving the agent to the room's workspace: %w", err)
		}
		turn, err := c.WaitTurn(ctx)
		if err != nil {
			return nil, fmt.Errorf("rpcagent: moving the agent to the room's workspace: %w", err)
		}
		if turn.AgentInvoked {
			return nil, errors.New("rpcagent: the agent ran a turn for /move")
		}
	}
	cancelled, err := c.SwitchSession(ctx, file)
	if err == nil && cancelled {
		err = errors.New("the agent refused it")
	}
	if err != nil {
		return nil, fmt.Errorf("rpcagent: switching the agent to the room's session: %w", err)
	}
	model := spec.Config.Model
	if model == "" && p.t.opts.ModelURL != "" {
		model = agents.ModelID
	}
	a.bindRoom(spec)
	if err := a.setup(ctx, c, spec, model, p.kind == agents.OMP); err != nil {
		return nil, err
	}
	if want := sessionOf(file); spec.SessionID == "" && a.session != want {
		return nil, fmt.Errorf("rpcagent: the agent is in session %s, not the room's %s", a.session, want)
	}
	a.pooled, a.bindTime = true, time.Since(began)
	dir, ws := s.dir, s.ws
	a.cleanup = func() {
		// The links and the slot's folder (links removed themselves).
		_ = os.RemoveAll(dir)
		_ = os.Remove(ws)
	}
	return a, nil
}

// sessionOf is the session id of a session file's name (<time>_<id>.jsonl).
func sessionOf(file string) string {
	name := filepath.Base(file)
	if i := strings.LastIndexByte(name, '_'); i >= 0 {
		name = name[i+1:]
	}
	return strings.TrimSuffix(name, ".jsonl")
}

// newSessionFile writes a new session's header into the home's sessions
// (as both agents name and start theirs: "<time>_<id>.jsonl", version 3,
// the cwd the agent is to work in) and returns its path.
func newSessionFile(homeDir, workspace string) (string, error) {
	ws, err := filepath.Abs(workspace)
	if err != nil {
		return "", fmt.Errorf("rpcagent: %w", err)
	}
	home, err := agentfs.Open(homeDir, nil)
	if err != nil {
		return "", fmt.Errorf("rpcagent: the agent's home: %w", err)
	}
	defer home.Close()
	b := make([]byte, 16)
	rand.Read(b)
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	h := hex.EncodeToString(b)
	id := h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
	now := time.Now().UTC()
	line, _ := json.Marshal(map[string]any{"type": "session", "version": 3, "id": id, "timestamp": now.Format("2006-01-02T15:04:05.000Z"), "cwd": ws})
	name := filepath.Join(sessionsDir, now.Format("2006-01-02T15-04-05-000Z")+"_"+id+".jsonl")
	if err := home.WriteFile(name, append(line, '\n'), 0o600); err != nil {
		return "", fmt.Errorf("rpcagent: writing the room's new session: %w", err)
	}
	return filepath.Join(homeDir, name), nil
}

// makeRoom ends idle agents of the pool while the rooms' agents and the
// pool's pass the places (a room starting cold holds its place already).
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

// watch removes the idle slot s whose agent ended by itself (it would hold
// a place and fail its bind) and has the pool start another; it ends once
// s is taken (its goroutine, joined by close).
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
		return // taken meanwhile: its taker sees the agent gone
	}
	p.t.opts.Logger.Warn("rpcagent: a pool agent ended while idle; another starts")
	p.discard(s)
	p.signal()
}

// evict ends one idle agent of the pool (a room needs its place); false
// when none is idle.
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

// held counts the pool's agents, started or starting.
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
			return fmt.Errorf("rpcagent: the pool's agent did not start: %s", last)
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
