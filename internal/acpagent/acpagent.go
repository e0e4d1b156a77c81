// Package acpagent is the room transport for agents that speak the Agent
// Client Protocol (omp acp, claude-agent-acp, codex-acp, copilot --acp, or
// any command): each room's agent runs in a custody scope through package
// acp, in the room's workspace with its own home; its permission requests
// become the room's durable approvals, and a room's session is resumed
// with session/load.
package acpagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/acp"
	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agentfs"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/detail"
	"github.com/agenthost/agenthost/internal/roomlimits"
	"github.com/agenthost/agenthost/internal/slotpool"
	"github.com/agenthost/agenthost/internal/startfail"
	"github.com/agenthost/agenthost/internal/usage"
	"github.com/agenthost/agenthost/record"
	"github.com/agenthost/agenthost/room"
	sdk "github.com/coder/acp-go-sdk"
)

// Defaults for Options.
const (
	DefaultStartTimeout = 90 * time.Second
	// MaxDetail bounds tool input and output copied into room events.
	MaxDetail = 4 << 10
	// permissionSlack: the room's own approval deadline decides; the acp
	// client's is a backstop just after it.
	permissionSlack = time.Minute
	// maxMalformedPerTurn bounds the agent.malformed events of one turn;
	// the rest of a flood is one event with their count.
	maxMalformedPerTurn = 10
)

// Recipe is how to run one room's agent over ACP.
type Recipe = agents.ACPRecipe

// Options configure a Transport.
type Options struct {
	// Custodian owns every agent process (required).
	Custodian *custody.Custodian
	// Install locates the agents (required unless every room runs a
	// custom command or Recipe is set).
	Install *agents.Install
	// ModelURL, if set, points every agent home at that scripted model
	// (the built-in one) and selects it unless a room names a model.
	ModelURL string
	// Recipe, if set, replaces the lookup in internal/agents: it returns
	// the command line and environment for a room's agent kind.
	Recipe func(kind agents.Kind, opts agents.ACPOptions) (Recipe, error)
	// StartTimeout bounds an agent's start, initialize and session setup
	// (default 90 s).
	StartTimeout time.Duration
	// MaxLineBytes caps one line from the agent (0: acp's default).
	MaxLineBytes int
	// CloseGrace is how long Close waits for the agent to exit on stdin
	// EOF before custody ends it (0: acp's default, 5 s).
	CloseGrace time.Duration
	// Confine, if set, confines each agent to its room (nil: unconfined).
	Confine *confine.Confiner
	// AgentEnv are more variables every agent gets as the server has them
	// (serve --agent-env), beyond what agents.Env gives.
	AgentEnv []string
	// OTLP, if set, gives a room's agent the variables to export its own
	// spans (serve --otlp-agents; see agents.OTLPEnv).
	OTLP func(room string) []string
	// Pool, if set with a Size, keeps agents started ahead of new rooms
	// (see PoolOptions; StartPool starts it, Close ends it).
	Pool   *PoolOptions
	Logger *slog.Logger
}

// Transport implements room.Transport over ACP.
//
// Its warm pool's methods, StartPool, PoolStats, PoolWait, PoolHeld and
// PoolSignal, are slotpool.Methods' (the same for both transports; each
// does nothing, or says there is no pool, without Options.Pool).
type Transport struct {
	opts Options

	// costs is each session's total cost as its agent last reported it,
	// for the agent that loads it next in this process (an agent that
	// resumes its total on load then charges a turn only what it added).
	costMu sync.Mutex
	costs  map[string]float64

	pool *pool // nil: no warm pool
	// StartPool, PoolStats, PoolWait, PoolHeld and PoolSignal: the warm
	// pool's (those of a transport without one when pool is nil).
	poolMethods
}

// poolMethods is embedded under this alias so that the field stays
// unexported: the transport's surface gains the methods only.
type poolMethods = slotpool.Methods[*poolAgent]

// maxSessionCosts bounds Transport.costs: past it the oldest entries
// are forgotten (a loaded session without its entry counts its agent's
// whole reported total in its first turn).
const maxSessionCosts = 10000

var (
	_ room.Transport  = (*Transport)(nil)
	_ room.LeaseBound = (*agent)(nil)
)

// New returns a Transport.
func New(opts Options) (*Transport, error) {
	if opts.Custodian == nil {
		return nil, errors.New("acpagent: Options.Custodian is required")
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	t := &Transport{opts: opts}
	if opts.Pool != nil && opts.Pool.Size > 0 {
		p, err := newPool(t, *opts.Pool)
		if err != nil {
			return nil, err
		}
		t.pool, t.poolMethods = p, p.Methods()
	}
	return t, nil
}

// Close ends the warm pool's idle agents (the rooms' agents are the
// rooms' to release).
func (t *Transport) Close() error {
	if t.pool != nil {
		t.pool.Close()
	}
	return nil
}

// ErrNoSteer: ACP has no way to deliver text into a running turn.
var ErrNoSteer = errors.New("acpagent: ACP agents take no text during a turn (steer and follow-up queue as the next message)")

func (t *Transport) recipe(spec room.AgentSpec, ws string, user *confine.User) (Recipe, error) {
	cfg := spec.Config
	if len(cfg.Command) > 0 {
		env := agents.Env(os.Environ(), agents.EnvOptions{Home: spec.Home, Model: cfg.Model, Pass: t.opts.AgentEnv})
		return Recipe{Argv: cfg.Command, Env: append(t.otlpEnv(env, spec.Room), cfg.Env...)}, nil
	}
	kind := agents.Kind(cfg.Agent)
	if kind == "" {
		kind = agents.OMP
	}
	opts := agents.ACPOptions{Home: spec.Home, ModelURL: t.opts.ModelURL, Yolo: cfg.ApprovalMode == room.ApprovalYolo,
		Instructions: cfg.Instructions, Workspace: ws, Confined: t.opts.Confine.Enforced(), Owner: user.Owner(), Model: cfg.Model, PassEnv: t.opts.AgentEnv}
	var r Recipe
	var err error
	switch {
	case t.opts.Recipe != nil:
		r, err = t.opts.Recipe(kind, opts)
	case t.opts.Install != nil:
		r, err = t.opts.Install.ACP(kind, opts)
	default:
		return Recipe{}, errors.New("acpagent: no agent install (Options.Install)")
	}
	if err != nil {
		return Recipe{}, fmt.Errorf("acpagent: %s: %w", kind, err)
	}
	r.Env = append(t.otlpEnv(r.Env, spec.Room), cfg.Env...)
	return r, nil
}

// Start implements room.Transport.
func (t *Transport) Start(ctx context.Context, spec room.AgentSpec) (room.Agent, error) {
	if t.pool != nil {
		pctx, cancel := context.WithTimeout(ctx, t.opts.StartTimeout)
		a, ok, err := t.pool.take(pctx, spec)
		cancel()
		if ok {
			return a, err
		}
	}
	a, err := t.start(ctx, spec)
	if err != nil {
		// The agent's stderr or error messages may be in it.
		return nil, redactedErr{err}
	}
	return a, nil
}

func (t *Transport) start(ctx context.Context, spec room.AgentSpec) (room.Agent, error) {
	ctx, cancel := context.WithTimeout(ctx, t.opts.StartTimeout)
	defer cancel()
	cfg := spec.Config
	a := &agent{h: spec.Handler, log: t.opts.Logger, t: t}
	a.loading.Store(true)
	// The room's tools are served before the agent starts: a confined
	// agent may connect to their port only.
	if len(spec.Tools) > 0 {
		a.askFirst = cfg.ApprovalMode != room.ApprovalYolo
		for _, tl := range spec.Tools {
			a.toolNames = append(a.toolNames, tl.Name)
		}
		var err error
		if a.tools, err = serveTools(askFirst(spec.Tools, spec.Handler, cfg.ApprovalMode), t.opts.Logger); err != nil {
			return nil, err
		}
	}
	linkDir := ""
	if spec.SessionID != "" {
		// A room a pool agent served: its sessions' paths are the slot's.
		undo, dir, err := slotHomeLink(spec.Home)
		if err != nil {
			return nil, errors.Join(err, a.tools.close())
		}
		a.cleanup, linkDir = undo, dir
	}
	r, ws, err := t.spawn(ctx, spec, a)
	if err != nil {
		if a.cleanup != nil {
			a.cleanup()
		}
		return nil, errors.Join(err, a.tools.close())
	}
	if linkDir != "" {
		if err := t.revealSlotHome(a, linkDir); err != nil {
			err = a.fail(err)
			a.cleanup()
			return nil, err
		}
	}
	if err := t.openSession(ctx, a, spec, ws, r); err != nil {
		err = a.fail(err)
		if a.cleanup != nil {
			a.cleanup()
		}
		return nil, err
	}
	return a, nil
}

// spawn starts spec's agent for a (its tools' server, if any, already
// serving): the home made, the recipe's command confined to the room
// and started; it returns the recipe and the absolute workspace.
func (t *Transport) spawn(ctx context.Context, spec room.AgentSpec, a *agent) (Recipe, string, error) {
	cfg := spec.Config
	home, err := filepath.Abs(spec.Home)
	if err != nil {
		return Recipe{}, "", fmt.Errorf("acpagent: %w", err)
	}
	// The room's folder is its home's parent (see confine.Confiner.RoomUser);
	// a pool slot's agent runs as its slot's uid (SlotUser).
	user, slot, err := t.slotUser(filepath.Dir(home))
	if !slot && err == nil {
		user, err = t.opts.Confine.RoomUser(filepath.Dir(home))
	}
	if err != nil {
		return Recipe{}, "", fmt.Errorf("acpagent: the agent's user: %w", err)
	}
	d, err := agentfs.Create(spec.Home, 0o700, user.Owner())
	if err != nil {
		return Recipe{}, "", fmt.Errorf("acpagent: %w", err)
	}
	d.Close()
	ws, err := filepath.Abs(spec.Workspace)
	if err != nil {
		return Recipe{}, "", fmt.Errorf("acpagent: %w", err)
	}
	r, err := t.recipe(spec, ws, user)
	if err != nil {
		return Recipe{}, "", err
	}
	var ports []uint16
	if a.tools != nil {
		ports = append(ports, a.tools.port())
	}
	argv, env, pol, err := t.confine(spec, ws, r, ports, a, user)
	if err != nil {
		return Recipe{}, "", err
	}
	// The room's deadlines decide; acp's is a backstop after the later.
	approval := max(cfg.ApprovalTimeout, cfg.QuestionTimeout)
	if approval <= 0 {
		approval = acp.DefaultPermissionTimeout
	}
	a.res = roomlimits.Resources(t.opts.Custodian.Support(), cfg.Limits)
	dir := ws
	if r.Dir != "" {
		dir = r.Dir
	}
	c, err := acp.Start(ctx, acp.Spec{Argv: argv, Dir: dir, Env: env}, acp.Options{
		Custodian:         t.opts.Custodian,
		Limits:            roomlimits.Custody(cfg.Limits),
		FSRoot:            ws,
		FSOwner:           fsOwner(user),
		Events:            a.event,
		Permission:        a.permission,
		Ask:               a.ask,
		PermissionTimeout: approval + permissionSlack,
		MaxLineBytes:      cmpOr(cfg.MaxLineBytes, t.opts.MaxLineBytes),
		CloseGrace:        t.opts.CloseGrace,
		SessionMeta:       r.SessionMeta,
		Logger:            t.opts.Logger,
	})
	if err != nil {
		var exit *acp.ExitError
		stderr := ""
		if errors.As(err, &exit) {
			stderr = exit.Stderr
		}
		return Recipe{}, "", startfail.Explain(fmt.Errorf("acpagent: starting the agent: %w", err), stderr,
			startfail.Info{Command: r.Argv, Custom: len(cfg.Command) > 0, Policy: pol})
	}
	a.c = c
	return r, ws, nil
}

// fail ends a's started agent and its tools' server after err.
func (a *agent) fail(err error) error {
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, cerr := a.c.Close(cctx)
	_ = a.c.Wait(cctx)
	return errors.Join(err, cerr, a.tools.close())
}

// openSession gives a's started agent spec's session in ws (loaded, or
// a new one) with the room's MCP servers and tools, and selects the
// recipe's mode and the room's model.
func (t *Transport) openSession(ctx context.Context, a *agent, spec room.AgentSpec, ws string, r Recipe) error {
	cfg := spec.Config
	c := a.c
	caps := c.Initialize().AgentCapabilities.McpCapabilities
	mcp, err := mcpServers(spec.MCP, caps)
	if err != nil {
		return err
	}
	if a.tools != nil {
		if caps.Http {
			mcp = append(mcp, a.tools.server())
		} else {
			// A named gap: such an agent gets no room tools.
			t.opts.Logger.Warn("acpagent: the agent takes no http MCP servers; the room's tools are not offered", "room", spec.Room)
		}
	}
	var sess *acp.Session
	if spec.SessionID != "" {
		sess, err = c.LoadSession(ctx, spec.SessionID, ws, mcp)
		if errors.Is(err, acp.ErrSessionNotFound) {
			return fmt.Errorf("%w: %w", room.ErrSessionNotFound, err)
		}
	} else {
		sess, err = c.NewSession(ctx, ws, mcp)
	}
	if err != nil {
		return fmt.Errorf("acpagent: %w", err)
	}
	a.session = sess.ID
	kind := cfg.Agent
	if kind == "" {
		kind = string(agents.OMP)
	}
	a.spent = usage.NewACPSession(usage.ACPReportOf(kind), t.sessionCost(sess.ID))
	if r.Mode != "" {
		if err := c.SetMode(ctx, sess.ID, r.Mode); err != nil {
			return fmt.Errorf("acpagent: %w", err)
		}
	}
	model := cmpOr(cfg.Model, r.Model)
	if err := selectModel(ctx, c, sess, model, cfg.Model != "", cfg.Thinking); err != nil {
		return err
	}
	// A load replays the session's history as updates: none of it is
	// this room's new activity.
	a.loading.Store(false)
	return nil
}

// sessionCost is a session's total cost as last reported here (0: none).
func (t *Transport) sessionCost(id string) float64 {
	t.costMu.Lock()
	defer t.costMu.Unlock()
	return t.costs[id]
}

// keepSessionCost keeps a session's total cost for its next agent.
func (t *Transport) keepSessionCost(id string, cost float64) {
	t.costMu.Lock()
	defer t.costMu.Unlock()
	if t.costs == nil {
		t.costs = map[string]float64{}
	}
	if _, ok := t.costs[id]; !ok && len(t.costs) >= maxSessionCosts {
		for k := range t.costs {
			delete(t.costs, k) // any one: the map is a cache
			break
		}
	}
	t.costs[id] = cost
}

// confine wraps the recipe's command in the room's confinement (as given
// when unconfined), as user, and records it on a.
func (t *Transport) confine(spec room.AgentSpec, ws string, r Recipe, ports []uint16, a *agent, user *confine.User) ([]string, []string, *confine.Policy, error) {
	exec := []string{r.Argv[0]}
	for _, name := range slices.Sorted(maps.Keys(spec.MCP)) {
		if s := spec.MCP[name]; len(s.Command) > 0 {
			exec = append(exec, s.Command[0])
		}
	}
	cr := confine.AgentRoom(ws, spec.Home, exec, ports)
	cr.Read = spec.ReadOnly
	cr.User = user
	pol, err := t.opts.Confine.Policy(cr)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("acpagent: confining the agent: %w", err)
	}
	argv, env, err := pol.Wrap(r.Argv, r.Env)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("acpagent: confining the agent: %w", err)
	}
	a.confined = room.Confinement(pol.Report())
	return argv, env, pol, nil
}

// Confinement implements room.Confined: what confines the agents this
// Transport starts.
func (t *Transport) Confinement() room.Confinement { return room.Confinement(t.opts.Confine.Report()) }

// fsOwner is who gets the files the agent's fs/write_text_file creates:
// the room's user (nil: the server's).
func fsOwner(u *confine.User) *acp.FileOwner {
	if u == nil {
		return nil
	}
	return &acp.FileOwner{UID: u.UID, GID: u.GID}
}

func cmpOr[T comparable](a, b T) T {
	var zero T
	if a != zero {
		return a
	}
	return b
}

// selectModel selects the room's model and thinking level when the agent
// offers them (session/set_model or config options); one the room named
// that the agent does not offer refuses the start. The recipe's default
// model is selected only where offered.
func selectModel(ctx context.Context, c *acp.Client, s *acp.Session, model string, named bool, thinking string) error {
	if model != "" {
		err := c.SelectModel(ctx, s, model)
		switch {
		case errors.Is(err, acp.ErrNotOffered) && !named:
		case errors.Is(err, acp.ErrNotOffered):
			return fmt.Errorf("%w: %w", room.ErrSelectionRefused, err)
		case err != nil:
			return fmt.Errorf("%w: model %s: %w", room.ErrSelectionRefused, model, err)
		}
	}
	if thinking != "" {
		if err := c.Select(ctx, s, "thought_level", thinking); err != nil {
			return fmt.Errorf("%w: thinking level: %w", room.ErrSelectionRefused, err)
		}
	}
	return nil
}

// mcpServers converts the room's MCP servers: stdio ones always (every ACP
// agent takes them), http ones only when the agent advertises http.
func mcpServers(servers map[string]room.MCPServer, caps sdk.McpCapabilities) ([]sdk.McpServer, error) {
	names := make([]string, 0, len(servers))
	for n := range servers {
		names = append(names, n)
	}
	sort.Strings(names)
	out := []sdk.McpServer{}
	for _, name := range names {
		s := servers[name]
		if len(s.Command) > 0 {
			env := []sdk.EnvVariable{}
			for _, k := range sortedKeys(s.Env) {
				env = append(env, sdk.EnvVariable{Name: k, Value: s.Env[k]})
			}
			out = append(out, sdk.McpServer{Stdio: &sdk.McpServerStdio{Name: name, Command: s.Command[0], Args: append([]string{}, s.Command[1:]...), Env: env}})
			continue
		}
		if !caps.Http {
			return nil, fmt.Errorf("acpagent: MCP server %q is http, which the agent does not advertise", name)
		}
		headers := []sdk.HttpHeader{}
		for _, k := range sortedKeys(s.Headers) {
			headers = append(headers, sdk.HttpHeader{Name: k, Value: s.Headers[k]})
		}
		out = append(out, sdk.McpServer{Http: &sdk.McpServerHttpInline{Name: name, Url: s.URL, Headers: headers, Type: "http"}})
	}
	return out, nil
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// maxCalls bounds the tool calls of a turn whose names are kept until they
// end; past it, a call's end names the kind it reports, or none.
const maxCalls = 1024

// agent is one running ACP agent with its session.
type agent struct {
	c       *acp.Client
	h       room.Handler
	log     *slog.Logger
	session string
	loading atomic.Bool

	// confined is what confines the agent (room.Confined); res the
	// limits it runs under (room.Resourced).
	confined room.Confinement
	res      room.Resources

	tools *toolServer // the room's tools over MCP (nil: none)
	// toolNames are the room's tools' names; askFirst: they ask the room
	// themselves (always-ask), so the agent's own prompt for one is
	// answered for it (roomTool).
	toolNames []string
	askFirst  bool

	mu        sync.Mutex
	denied    bool              // a permission was denied in the running turn
	calls     map[string]string // the turn's running tool calls' short names by id (at most maxCalls)
	malformed int               // malformed lines since the turn began
	unshown   int               // of those, the ones past maxMalformedPerTurn
	// spent follows the session's usage reports (usage_update's cost,
	// session/prompt's tokens); badUsage counts those it could not read.
	spent    *usage.ACPSession
	badUsage int
	t        *Transport

	// pooled: started ahead of its room by the warm pool and bound to it
	// in bindTime; cleanup, if set, removes its slot's leftovers once it
	// is closed.
	pooled   bool
	bindTime time.Duration
	cleanup  func()
}

// turnUsage is what the turn whose answer this is (nil: none came)
// cost.
func (a *agent) turnUsage(res *acp.Result) record.Usage {
	answer := []byte("{}")
	if res != nil {
		if b, err := usage.ACPAnswer(res.Usage, res.Meta); err == nil {
			answer = b
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	u, _, err := a.spent.EndTurn(answer)
	if err != nil {
		a.badUsage++
	}
	if a.badUsage > 0 {
		a.log.Warn("acpagent: the agent sent usage reports that could not be read; the turn's usage leaves them out", "reports", a.badUsage)
		a.badUsage = 0
	}
	a.t.keepSessionCost(a.session, a.spent.SessionCost())
	return u
}

func (a *agent) SessionID() string { return a.session }

// Confinement implements room.Confined.
func (a *agent) Confinement() room.Confinement { return a.confined }

// Resources implements room.Resourced.
func (a *agent) Resources() room.Resources { return a.res }

// Meter implements room.Metered: the agent's custody scope's usage.
func (a *agent) Meter(context.Context) (room.Meter, error) { return roomlimits.Meter(a.c.Usage()), nil }

// ResetPeak implements room.Metered.
func (a *agent) ResetPeak(context.Context) error { return a.c.ResetPeak() }

// Resources implements room.Resourced: how the limits of the agents this
// Transport starts hold.
func (t *Transport) Resources() room.Resources {
	return roomlimits.Resources(t.opts.Custodian.Support(), room.Limits{})
}

func (a *agent) Run(ctx context.Context, text string) (room.TurnResult, error) {
	a.flushMalformed() // lines between turns
	defer a.flushMalformed()
	a.beginTurn()
	res, err := a.c.Prompt(ctx, a.session, text)
	if err != nil {
		// A ctx that ended was sent session/cancel, bounded, by Prompt.
		return room.TurnResult{Usage: a.turnUsage(nil)}, redactedErr{err}
	}
	spent := a.turnUsage(&res)
	switch res.StopReason {
	case sdk.StopReasonCancelled:
		a.mu.Lock()
		denied := a.denied
		a.mu.Unlock()
		// codex ends a turn whose tool was denied as cancelled; the room
		// did not cancel it, so it settled.
		if !denied {
			return room.TurnResult{Usage: spent}, errors.New("the agent cancelled the turn")
		}
	case sdk.StopReasonRefusal:
		return room.TurnResult{Usage: spent}, errors.New("the agent refused the turn")
	}
	return room.TurnResult{Text: res.Text, Usage: spent}, nil
}

// beginTurn forgets the last turn's denial and its tool calls: calls an
// earlier turn never ended (cancelled, or an agent that never completes
// them) are not kept for the agent's life.
func (a *agent) beginTurn() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.denied = false
	a.calls = nil
}

// redactedErr is an error whose text may carry what the agent wrote (its
// stderr's last line, an error message): the room records it redacted and
// bounded; errors.Is and As see the original.
type redactedErr struct{ err error }

func (e redactedErr) Error() string { return detail.Text(e.err.Error(), MaxDetail) }
func (e redactedErr) Unwrap() error { return e.err }

func (a *agent) Steer(context.Context, string) error    { return ErrNoSteer }
func (a *agent) FollowUp(context.Context, string) error { return ErrNoSteer }

func (a *agent) Done() <-chan struct{} { return a.c.Done() }

// handlersWait bounds how long Close waits for the agent's requests still
// being handled once the agent is gone (their contexts have ended).
const handlersWait = 5 * time.Second

// HoldUntil implements room.LeaseBound: the agent's custody scope is
// frozen at deadline (a cluster's lease).
func (a *agent) HoldUntil(deadline time.Time) error { return a.c.HoldUntil(deadline) }

// Kill implements room.LeaseBound.
func (a *agent) Kill() error { return a.c.Kill() }

func (a *agent) Close(ctx context.Context) (json.RawMessage, error) {
	r, err := a.c.Close(ctx)
	if err == nil {
		// Nothing of the agent reaches the room after its release; but a
		// request handler that ignores its ended context must not hold
		// the release past handlersWait (the agent is gone by now).
		wctx, cancel := context.WithTimeout(ctx, handlersWait)
		_ = a.c.Wait(wctx)
		cancel()
	}
	err = errors.Join(err, a.tools.close())
	if a.cleanup != nil {
		a.cleanup()
	}
	var raw json.RawMessage
	if r != nil {
		raw, _ = json.Marshal(r)
	}
	return raw, err
}

// event maps the agent's updates to room events. Every string the agent
// chose is redacted and bounded on its way (detail): a tool's title carries
// its command line, credentials included.
func (a *agent) event(ev acp.Event) {
	if ev.Type == acp.TypeMalformed {
		// Not history even during a load: the agent sent it now.
		a.malformedLine(ev.Err)
		return
	}
	if a.loading.Load() {
		return
	}
	if ev.Type == "usage_update" {
		a.mu.Lock()
		if a.spent.Update(ev.Raw) != nil {
			a.badUsage++
		}
		a.mu.Unlock()
		a.h.Event(room.AgentEvent{Kind: room.KindActivity})
		return
	}
	u := ev.Update
	switch {
	case u.AgentMessageChunk != nil:
		if t := ev.Text(); t != "" {
			a.h.Event(room.AgentEvent{Kind: room.KindText, Text: t})
			return
		}
	case u.ToolCall != nil:
		tc := u.ToolCall
		id := callID(string(tc.ToolCallId))
		name := toolName(string(tc.Kind))
		a.mu.Lock()
		if a.calls == nil {
			a.calls = map[string]string{}
		}
		if _, known := a.calls[id]; known || len(a.calls) < maxCalls {
			a.calls[id] = name
		}
		a.mu.Unlock()
		a.h.Event(room.AgentEvent{Kind: room.KindToolStarted, Tool: name, CallID: id, Input: input(tc.RawInput, tc.Title)})
		if tc.Status == sdk.ToolCallStatusCompleted || tc.Status == sdk.ToolCallStatusFailed {
			a.toolEnded(id, string(tc.Kind), tc.Content, tc.RawOutput, tc.Status == sdk.ToolCallStatusFailed)
		}
		return
	case u.ToolCallUpdate != nil:
		tu := u.ToolCallUpdate
		if tu.Status != nil && (*tu.Status == sdk.ToolCallStatusCompleted || *tu.Status == sdk.ToolCallStatusFailed) {
			kind := ""
			if tu.Kind != nil {
				kind = string(*tu.Kind)
			}
			a.toolEnded(callID(string(tu.ToolCallId)), kind, tu.Content, tu.RawOutput, *tu.Status == sdk.ToolCallStatusFailed)
			return
		}
	}
	a.h.Event(room.AgentEvent{Kind: room.KindActivity})
}

// malformedLine reports a line the acp client dropped as a room event,
// the first maxMalformedPerTurn of a turn one by one (acp logs each).
func (a *agent) malformedLine(err error) {
	var le *acp.LineError
	if !errors.As(err, &le) {
		le = &acp.LineError{Reason: "malformed"}
	}
	a.mu.Lock()
	a.malformed++
	over := a.malformed > maxMalformedPerTurn
	if over {
		a.unshown++
	}
	a.mu.Unlock()
	if over {
		a.h.Event(room.AgentEvent{Kind: room.KindActivity})
		return
	}
	a.h.Event(room.AgentEvent{Kind: room.KindMalformed, Line: le.Line, Length: le.Len, Reason: text(le.Reason)})
}

// flushMalformed reports how many malformed lines had no event of their
// own, and starts a new count.
func (a *agent) flushMalformed() {
	a.mu.Lock()
	n := a.unshown
	a.malformed, a.unshown = 0, 0
	a.mu.Unlock()
	if n > 0 {
		a.h.Event(room.AgentEvent{Kind: room.KindMalformed, Suppressed: n})
	}
}

func (a *agent) toolEnded(id, kind string, content []sdk.ToolCallContent, raw any, failed bool) {
	a.mu.Lock()
	name, known := a.calls[id]
	delete(a.calls, id)
	a.mu.Unlock()
	if !known {
		name = toolName(kind)
	}
	var out strings.Builder
	for _, c := range content {
		if c.Content != nil && c.Content.Content.Text != nil {
			if out.Len() > maxScan {
				break // bounded below; no need to gather megabytes first
			}
			out.WriteString(c.Content.Content.Text.Text)
		}
	}
	s := out.String()
	if s == "" && raw != nil {
		s = jsonText(raw)
	}
	a.h.Event(room.AgentEvent{Kind: room.KindToolEnded, Tool: name, CallID: id, Output: text(s), IsError: failed})
}

// maxScan bounds what toolEnded gathers of an output before bounding it.
const maxScan = 4 * MaxDetail

// toolName is the short name a room records for a tool call: its ACP kind
// ("execute", "edit", ...), never its title, which is a sentence or a
// command line of the agent's choosing (see input).
func toolName(kind string) string {
	if kind == "" {
		return "tool"
	}
	return detail.Name(kind)
}

// input is a tool call's input for the room: its raw input, else its title
// (the command line, for agents that send no raw input), redacted and
// bounded.
func input(raw any, title string) string {
	if raw != nil {
		return text(jsonText(raw))
	}
	return text(title)
}

// callID bounds an id the agent chose (it reaches the log as call_id).
func callID(id string) string { return detail.Name(id) }

func jsonText(v any) string {
	if v == nil {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// permission makes the agent's permission request a room approval.
func (a *agent) permission(ctx context.Context, req acp.PermissionRequest) bool {
	labels := make([]string, 0, len(req.Options))
	for _, o := range req.Options {
		labels = append(labels, o.Name)
	}
	tool := toolName(req.Kind)
	id := callID(req.ToolCallID)
	a.mu.Lock()
	if n := a.calls[id]; n != "" && req.Kind == "" {
		tool = n
	}
	a.mu.Unlock()
	if (req.Kind == "" || req.Kind == "other") && len(req.RawInput) > 0 && a.roomTool(req.Title) {
		// The agent's own prompt for the room's tool (claude, copilot):
		// the tool asks the room itself when it runs (askFirst).
		return true
	}
	in := text(string(req.RawInput))
	if len(req.RawInput) == 0 {
		in = text(req.Title)
	}
	return a.approve(ctx, room.ApprovalRequest{Tool: tool, Input: in, Options: names(labels)})
}

// askFirst makes each of the room's tools ask the room before it runs, in
// a room that asks (always-ask), with its arguments as the approval's input
// (redacted and bounded), as over RPC: every agent path asks the same, and
// shows what will be posted. A denied call runs nothing and tells the
// agent so.
func askFirst(tools []room.Tool, h room.Handler, mode string) []room.Tool {
	if mode == room.ApprovalYolo || h == nil {
		return tools
	}
	out := make([]room.Tool, 0, len(tools))
	for _, t := range tools {
		run := t.Run
		t.Run = func(ctx context.Context, call room.ToolCall) (string, error) {
			if !h.Approve(ctx, room.ApprovalRequest{Tool: detail.Name(t.Name), Input: text(string(call.Args)), Options: ompApprovalOptions}) {
				return "", fmt.Errorf("the room denied the call of %s", t.Name)
			}
			return run(ctx, call)
		}
		out = append(out, t)
	}
	return out
}

// roomTool reports whether name is how the agent names one of the room's
// tools, served by the MCP server agenthost: exactly, never a part of a
// longer title (a command's text could hold one).
func (a *agent) roomTool(name string) bool {
	if a.tools == nil || !a.askFirst {
		return false
	}
	for _, t := range a.toolNames {
		for _, form := range []string{t, "mcp__" + room.ReservedName + "__" + t, "mcp__" + room.ReservedName + "_" + t,
			room.ReservedName + "__" + t, room.ReservedName + "_" + t, room.ReservedName + "/" + t, room.ReservedName + "." + t} {
			if name == form {
				return true
			}
		}
	}
	return false
}

// approve asks the room, noting a denial (see Run).
func (a *agent) approve(ctx context.Context, req room.ApprovalRequest) bool {
	ok := a.h.Approve(ctx, req)
	if !ok {
		a.mu.Lock()
		a.denied = true
		a.mu.Unlock()
	}
	return ok
}

// ompApprovalPrefix and ompApprovalOptions are omp's own permission prompt,
// which omp acp sends as an elicitation form when the client takes forms
// (for its write and edit tools; bash comes as session/request_permission):
// a choice titled "Allow tool: <tool>\n<details>" of exactly Approve and
// Deny. It is an approval, not a question (as over RPC).
const ompApprovalPrefix = "Allow tool: "

var ompApprovalOptions = []string{"Approve", "Deny"}

// ask makes a field of the agent's elicitation form (omp's ask tool) a
// room question, and omp's permission prompt a room approval.
func (a *agent) ask(ctx context.Context, q acp.Question) (string, bool) {
	if rest, ok := strings.CutPrefix(q.Title, ompApprovalPrefix); ok && slices.Equal(q.Options, ompApprovalOptions) {
		tool, details, _ := strings.Cut(rest, "\n")
		if a.roomTool(tool) {
			// omp's own prompt for the room's tool, which shows no
			// arguments: the tool asks the room itself when it runs.
			return "Approve", true
		}
		if a.approve(ctx, room.ApprovalRequest{Tool: detail.Name(tool), Input: text(details), Options: q.Options}) {
			return "Approve", true
		}
		return "Deny", true
	}
	shown := names(q.Options)
	ans, ok := a.h.Ask(ctx, room.QuestionRequest{Title: text(q.Title), Options: shown})
	// An option the room showed redacted or cut goes back as the agent's.
	if i := slices.Index(shown, strings.TrimSpace(ans)); ok && i >= 0 {
		ans = q.Options[i]
	}
	return ans, ok
}

// text redacts and bounds what the agent says for the room's record.
func text(s string) string { return detail.Text(s, MaxDetail) }

// names redacts and bounds the labels of options.
func names(ss []string) []string { return detail.Names(ss) }

// otlpEnv is env with the OTLP variables of the room's agent, when the
// operator asked for them (Options.OTLP).
func (t *Transport) otlpEnv(env []string, room string) []string {
	if t.opts.OTLP == nil {
		return env
	}
	return append(env, t.opts.OTLP(room)...)
}
