package acpagent

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/acp"
	"github.com/agenthost/agenthost/internal/agentfs"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/slotpool"
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
// replacement in the background, one boot at a time (the slots, the
// refill and the counters are internal/slotpool's, shared with the rpc
// pool).
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
	MissEmpty      = slotpool.MissEmpty // no idle slot
	MissSettings   = "settings"         // agent, approval mode, model, thinking, limits, timeouts or environment differ
	MissCommand    = "command"          // a custom agent command
	MissMCP        = "mcp"              // the room has MCP servers (a stdio one's command is in the agent's confinement)
	MissInstr      = "instructions"     // the room's instructions differ (read at the agent's start)
	MissReadOnly   = "read_only"        // the room reads folders beside its own
	MissResume     = "resume"           // the room resumes a session (ACP: the cold path)
	MissBindFailed = slotpool.MissBindFailed
	MissLarge      = "large" // as root with agent uids: the room's files are more than a bind gives to another uid
)

// PoolStats are the pool's counters (/metrics).
type PoolStats = slotpool.Stats

// ErrPoolUnsupported: the pool cannot run with these options.
var ErrPoolUnsupported = errors.New("acpagent: the warm pool cannot run here")

// discardWait bounds a discarded slot's agent's end.
const discardWait = 30 * time.Second

// pool is the warm pool of a Transport: slotpool's bookkeeping, with how
// an ACP agent starts in a slot and is bound to a new room.
type pool struct {
	*slotpool.Pool[*poolAgent]
	t    *Transport
	opts PoolOptions
	kind agents.Kind
}

// slot is one started agent and its folders.
type slot = slotpool.Slot[*poolAgent]

// poolAgent is a slot's agent and the recipe it was started with.
type poolAgent struct {
	*agent
	r Recipe
}

// End implements slotpool.Agent.
func (a *poolAgent) End() {
	if a.c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), discardWait)
		_, _ = a.Close(ctx)
		cancel()
	} else {
		_ = a.tools.close()
	}
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
	}
	if o.Config.ApprovalMode == "" {
		o.Config.ApprovalMode = room.ApprovalAsk
	}
	p := &pool{t: t, opts: o, kind: kind}
	core, err := slotpool.New(slotpool.Config[*poolAgent]{Name: "acpagent", Size: o.Size, Rooms: o.Rooms, Workspaces: o.Workspaces,
		Places: o.Places, OnBind: o.OnBind, Boot: p.spawn, StartTimeout: t.opts.StartTimeout, Unsupported: ErrPoolUnsupported,
		UIDs: p.uidBinder(), Logger: t.opts.Logger})
	if err != nil {
		return nil, err
	}
	p.Pool = core
	return p, nil
}

// spawn starts the slot's agent (slotpool.Config.Boot), confined to its
// folders, with a tools' server that serves nothing until the bind; no
// session yet.
func (p *pool) spawn(ctx context.Context, s *slot) (*poolAgent, error) {
	a := &agent{h: &lateHandler{}, log: p.t.opts.Logger, t: p.t}
	a.loading.Store(true)
	var err error
	if a.tools, err = listenTools(p.t.opts.Logger); err != nil {
		return nil, err
	}
	spec := room.AgentSpec{Room: "pool-" + s.ID, Workspace: s.WS, Home: s.Home, Config: p.opts.Config}
	r, _, err := p.t.spawn(ctx, spec, a)
	if err != nil {
		return nil, errors.Join(err, a.tools.close())
	}
	return &poolAgent{agent: a, r: r}, nil
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

// take binds an idle slot's agent to spec's room; ok false: the room
// starts cold (a miss). An error with ok is the room's (its workspace
// refused as a cold start would refuse it, or a bind that failed after
// the room's folders were touched).
func (p *pool) take(ctx context.Context, spec room.AgentSpec) (_ room.Agent, ok bool, _ error) {
	if r := p.mismatch(spec); r != "" {
		p.Miss(r)
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
		p.Miss(MissLarge)
		return nil, false, nil
	}
	s, _ := p.Pop(nil)
	if s == nil {
		p.Miss(MissEmpty)
		return nil, false, nil
	}
	a, touched, err := p.bind(ctx, s, spec)
	if err != nil && touched && !errors.Is(err, warmpool.ErrFault) {
		// The room's folders are the slot's now: its agent ends, and
		// the room's next start is a cold one in them.
		s.Agent.End()
		s.Cleanup()
		return nil, true, redactedErr{err}
	}
	if err != nil {
		ok, err := p.Failed(s, spec.Room, err)
		return nil, ok, err
	}
	p.Hit(a.bindTime)
	return a, true, nil
}

// bind hands the slot's agent spec's room: the slot's folders into the
// room's place, the room's tools and handler, then session/new in the
// room's workspace. touched: the room's folders were moved (an error
// then is the room's).
func (p *pool) bind(ctx context.Context, s *slot, spec room.AgentSpec) (_ *agent, touched bool, _ error) {
	began := time.Now()
	a := s.Agent.agent
	// The room's home as a cold start makes it (new rooms may have none).
	d, err := agentfs.Create(spec.Home, 0o700, nil)
	if err != nil {
		return nil, false, fmt.Errorf("acpagent: %w", err)
	}
	d.Close()
	plan, err := s.Plan(spec.Workspace, spec.Home)
	if err != nil {
		return nil, false, fmt.Errorf("acpagent: %w", err)
	}
	uids := p.uidBinder()
	if err := uids.Begin(s.Dir, plan); err != nil {
		return nil, false, err
	}
	if err := warmpool.Bind(filepath.Join(s.Dir, warmpool.Journal), plan, p.opts.Fault); err != nil {
		// Bind recovers the room's folders itself on a failure (but a
		// fault's, as a crash's).
		return nil, false, uids.BindFailed(s.Dir, err)
	}
	// As root with agent uids: the room's folders and the room to the
	// slot's uid, and the room's paths into the agent's view, before
	// session/new names the room's workspace.
	if err := uids.HandOver(s.Dir, plan, a.c); err != nil {
		return nil, true, err
	}
	if err := s.Link(plan); err != nil {
		return nil, true, fmt.Errorf("acpagent: %w", err)
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
	if err := p.t.openSession(ctx, a, spec, plan.Workspace.Room, s.Agent.r); err != nil {
		return nil, true, err
	}
	if err := markSlot(plan.Home.Room, s.Dir); err != nil {
		return nil, true, err
	}
	a.pooled, a.bindTime = true, time.Since(began)
	a.cleanup = s.Cleanup
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
	if t.pool == nil {
		return nil, false, nil
	}
	return t.pool.SlotUser(dir)
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
	dir = filepath.Join(filepath.Dir(roomDir), slotpool.Dir, id)
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
