package rpcagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agenthost/agenthost/internal/agentfs"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/slotpool"
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
// boot at a time, once no take has happened for a while (the slots, the
// refill and the counters are internal/slotpool's, shared with the ACP
// pool). A room whose settings match no key, or that finds no idle slot,
// starts cold as before.

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
	MissEmpty      = slotpool.MissEmpty // no idle slot
	MissSettings   = "settings"         // agent, approval mode, model, thinking, limits or environment differ from the pool's
	MissCommand    = "command"          // a custom agent command
	MissMCP        = "mcp"              // the room has MCP servers (read at the agent's start)
	MissInstr      = "instructions"     // the room's instructions differ (read at the agent's start)
	MissTools      = "tools"            // pi: the room's tools differ from those the slot's extension loaded
	MissReadOnly   = "read_only"        // the room reads folders beside its own (a git workspace's objects)
	MissBindFailed = slotpool.MissBindFailed
)

// PoolStats are the pool's counters (/metrics).
type PoolStats = slotpool.Stats

// pool is the warm pool of a Transport: slotpool's bookkeeping, with
// how an rpc agent starts in a slot and is bound to a room.
type pool struct {
	*slotpool.Pool[*poolAgent]
	t    *Transport
	opts PoolOptions
	kind agents.Kind

	mu    sync.Mutex
	tools []room.Tool // pi: the tools the slots' extensions load (learned from rooms)
}

// slot is one started agent and its folders.
type slot = slotpool.Slot[*poolAgent]

// poolAgent is a slot's agent.
type poolAgent struct {
	*agent
	tools string // pi: the signature of the tools it loaded
}

// End implements slotpool.Agent.
func (a *poolAgent) End() {
	ctx, cancel := context.WithTimeout(context.Background(), joinWait)
	_, _ = a.Close(ctx)
	cancel()
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
	}
	if o.Config.ApprovalMode == "" {
		o.Config.ApprovalMode = room.ApprovalAsk // as rooms fill it
	}
	p := &pool{t: t, opts: o, kind: kind}
	core, err := slotpool.New(slotpool.Config[*poolAgent]{Name: "rpcagent", Size: o.Size, Rooms: o.Rooms, Workspaces: o.Workspaces,
		Places: o.Places, OnBind: o.OnBind, Boot: p.boot, StartTimeout: t.opts.StartTimeout, Unsupported: ErrPoolUnsupported,
		UIDs: p.uidBinder(), Logger: t.opts.Logger})
	if err != nil {
		return nil, err
	}
	p.Pool = core
	return p, nil
}

// boot starts a slot's agent (slotpool.Config.Boot); pi's loads the
// rooms' tools, whose calls before the bind (no room's yet) run nothing.
func (p *pool) boot(ctx context.Context, s *slot) (*poolAgent, error) {
	p.mu.Lock()
	tools := p.bootToolsLocked()
	p.mu.Unlock()
	bound := make([]room.Tool, 0, len(tools))
	for _, t := range tools {
		t.Run = func(context.Context, room.ToolCall) (string, error) {
			return "", errors.New("no room is bound to this agent")
		}
		bound = append(bound, t)
	}
	a, err := p.t.start(ctx, room.AgentSpec{Room: "pool-" + s.ID, Workspace: s.WS, Home: s.Home, Config: p.opts.Config, Tools: bound})
	if err != nil {
		return nil, err
	}
	return &poolAgent{agent: a.(*agent), tools: toolSig(tools)}, nil
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

// learnTools: the pool learns a pi room's tools (sig their signature),
// which the next slots' agents load; the slots that loaded others are
// replaced as takes pass them over.
func (p *pool) learnTools(spec room.AgentSpec, sig string) {
	if p.kind != agents.Pi {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if toolSig(p.bootToolsLocked()) != sig {
		p.tools = slices.Clone(spec.Tools)
	}
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

// take binds an idle slot's agent to spec's room; ok false: the room
// starts cold (a miss). An error with ok is the bind's fault hook's (the
// room's start fails, as after a crash there).
func (p *pool) take(ctx context.Context, spec room.AgentSpec) (_ room.Agent, ok bool, _ error) {
	if r := p.mismatch(spec); r != "" {
		p.Miss(r)
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
		p.Miss(reason)
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
	p.learnTools(spec, sig)
	s, stale := p.Pop(func(a *poolAgent) bool { return p.kind != agents.Pi || a.tools == sig })
	if s == nil {
		reason := MissEmpty
		if stale > 0 && p.kind == agents.Pi {
			reason = MissTools
		}
		p.Miss(reason)
		return nil, false, nil
	}
	a, err := p.bind(ctx, s, spec, file)
	if err != nil {
		ok, err := p.Failed(s, spec.Room, err)
		return nil, ok, err
	}
	p.Hit(a.bindTime)
	return a, true, nil
}

// bind hands the slot's agent spec's room: its files into the slot's
// folders, those into the room's place, then the agent into the room's
// session (file, or a new one).
func (p *pool) bind(ctx context.Context, s *slot, spec room.AgentSpec, file string) (*agent, error) {
	began := time.Now()
	a := s.Agent.agent
	if file == "" {
		f, err := newSessionFile(spec.Home, spec.Workspace)
		if err != nil {
			return nil, err
		}
		file = f
	}
	plan, err := s.Plan(spec.Workspace, spec.Home)
	if err != nil {
		return nil, fmt.Errorf("rpcagent: %w", err)
	}
	uids := p.uidBinder()
	if err := uids.Begin(s.Dir, plan); err != nil {
		return nil, err
	}
	if err := warmpool.Bind(filepath.Join(s.Dir, warmpool.Journal), plan, p.opts.Fault); err != nil {
		return nil, uids.BindFailed(s.Dir, err)
	}
	// As root with agent uids: the room's folders (now the slot's) and
	// the room to the slot's uid, shown to its agent.
	if err := uids.HandOver(s.Dir, plan, a.c.Process()); err != nil {
		return nil, err
	}
	if err := s.Link(plan); err != nil {
		return nil, fmt.Errorf("rpcagent: %w", err)
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
	a.cleanup = s.Cleanup
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
