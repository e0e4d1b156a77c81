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
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/acp"
	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/detail"
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
	Logger     *slog.Logger
}

// Transport implements room.Transport over ACP.
type Transport struct{ opts Options }

var _ room.Transport = (*Transport)(nil)

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
	return &Transport{opts: opts}, nil
}

// ErrNoSteer: ACP has no way to deliver text into a running turn.
var ErrNoSteer = errors.New("acpagent: ACP agents take no text during a turn (steer and follow-up queue as the next message)")

func (t *Transport) recipe(spec room.AgentSpec) (Recipe, error) {
	cfg := spec.Config
	if len(cfg.Command) > 0 {
		return Recipe{Argv: cfg.Command, Env: append(os.Environ(), cfg.Env...)}, nil
	}
	kind := agents.Kind(cfg.Agent)
	if kind == "" {
		kind = agents.OMP
	}
	opts := agents.ACPOptions{Home: spec.Home, ModelURL: t.opts.ModelURL, Yolo: cfg.ApprovalMode == room.ApprovalYolo,
		Instructions: cfg.Instructions}
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
	r.Env = append(r.Env, cfg.Env...)
	return r, nil
}

// Start implements room.Transport.
func (t *Transport) Start(ctx context.Context, spec room.AgentSpec) (room.Agent, error) {
	ctx, cancel := context.WithTimeout(ctx, t.opts.StartTimeout)
	defer cancel()
	cfg := spec.Config
	if err := os.MkdirAll(spec.Home, 0o700); err != nil {
		return nil, fmt.Errorf("acpagent: %w", err)
	}
	r, err := t.recipe(spec)
	if err != nil {
		return nil, err
	}
	ws, err := filepath.Abs(spec.Workspace)
	if err != nil {
		return nil, fmt.Errorf("acpagent: %w", err)
	}
	a := &agent{h: spec.Handler, log: t.opts.Logger}
	a.loading.Store(true)
	// The room's deadlines decide; acp's is a backstop after the later.
	approval := max(cfg.ApprovalTimeout, cfg.QuestionTimeout)
	if approval <= 0 {
		approval = acp.DefaultPermissionTimeout
	}
	c, err := acp.Start(ctx, acp.Spec{Argv: r.Argv, Dir: ws, Env: r.Env}, acp.Options{
		Custodian:         t.opts.Custodian,
		FSRoot:            ws,
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
		return nil, fmt.Errorf("acpagent: starting the agent: %w", err)
	}
	a.c = c
	fail := func(err error) (room.Agent, error) {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, cerr := c.Close(cctx)
		return nil, errors.Join(err, cerr, a.tools.close())
	}
	caps := c.Initialize().AgentCapabilities.McpCapabilities
	mcp, err := mcpServers(spec.MCP, caps)
	if err != nil {
		return fail(err)
	}
	if len(spec.Tools) > 0 {
		if caps.Http {
			if a.tools, err = serveTools(spec.Tools, t.opts.Logger); err != nil {
				return fail(err)
			}
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
			return fail(fmt.Errorf("%w: %w", room.ErrSessionNotFound, err))
		}
	} else {
		sess, err = c.NewSession(ctx, ws, mcp)
	}
	if err != nil {
		return fail(fmt.Errorf("acpagent: %w", err))
	}
	a.session = sess.ID
	if r.Mode != "" {
		if err := c.SetMode(ctx, sess.ID, r.Mode); err != nil {
			return fail(fmt.Errorf("acpagent: %w", err))
		}
	}
	model := cmpOr(cfg.Model, r.Model)
	if err := selectModel(ctx, c, sess, model, cfg.Model != "", cfg.Thinking); err != nil {
		return fail(err)
	}
	// A load replays the session's history as updates: none of it is
	// this room's new activity.
	a.loading.Store(false)
	return a, nil
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

// agent is one running ACP agent with its session.
type agent struct {
	c       *acp.Client
	h       room.Handler
	log     *slog.Logger
	session string
	loading atomic.Bool

	tools *toolServer // the room's tools over MCP (nil: none)

	mu        sync.Mutex
	denied    bool              // a permission was denied in the running turn
	calls     map[string]string // running tool calls' names by id
	malformed int               // malformed lines since the turn began
	unshown   int               // of those, the ones past maxMalformedPerTurn
}

func (a *agent) SessionID() string { return a.session }

func (a *agent) Run(ctx context.Context, text string) (room.TurnResult, error) {
	a.flushMalformed() // lines between turns
	defer a.flushMalformed()
	a.mu.Lock()
	a.denied = false
	a.mu.Unlock()
	res, err := a.c.Prompt(ctx, a.session, text)
	if err != nil {
		// A ctx that ended was sent session/cancel, bounded, by Prompt.
		return room.TurnResult{}, err
	}
	switch res.StopReason {
	case sdk.StopReasonCancelled:
		a.mu.Lock()
		denied := a.denied
		a.mu.Unlock()
		// codex ends a turn whose tool was denied as cancelled; the room
		// did not cancel it, so it settled.
		if !denied {
			return room.TurnResult{}, errors.New("the agent cancelled the turn")
		}
	case sdk.StopReasonRefusal:
		return room.TurnResult{}, errors.New("the agent refused the turn")
	}
	return room.TurnResult{Text: res.Text}, nil
}

func (a *agent) Steer(context.Context, string) error    { return ErrNoSteer }
func (a *agent) FollowUp(context.Context, string) error { return ErrNoSteer }

func (a *agent) Done() <-chan struct{} { return a.c.Done() }

func (a *agent) Close(ctx context.Context) (json.RawMessage, error) {
	r, err := a.c.Close(ctx)
	err = errors.Join(err, a.tools.close())
	var raw json.RawMessage
	if r != nil {
		raw, _ = json.Marshal(r)
	}
	return raw, err
}

// event maps the agent's updates to room events.
func (a *agent) event(ev acp.Event) {
	if ev.Type == acp.TypeMalformed {
		// Not history even during a load: the agent sent it now.
		a.malformedLine(ev.Err)
		return
	}
	if a.loading.Load() {
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
		name := toolName(tc.Title, string(tc.Kind))
		a.mu.Lock()
		if a.calls == nil {
			a.calls = map[string]string{}
		}
		a.calls[string(tc.ToolCallId)] = name
		a.mu.Unlock()
		a.h.Event(room.AgentEvent{Kind: room.KindToolStarted, Tool: name, CallID: string(tc.ToolCallId), Input: bound(redact(jsonText(tc.RawInput)))})
		if tc.Status == sdk.ToolCallStatusCompleted || tc.Status == sdk.ToolCallStatusFailed {
			a.toolEnded(string(tc.ToolCallId), tc.Content, tc.RawOutput, tc.Status == sdk.ToolCallStatusFailed)
		}
		return
	case u.ToolCallUpdate != nil:
		tu := u.ToolCallUpdate
		if tu.Status != nil && (*tu.Status == sdk.ToolCallStatusCompleted || *tu.Status == sdk.ToolCallStatusFailed) {
			a.toolEnded(string(tu.ToolCallId), tu.Content, tu.RawOutput, *tu.Status == sdk.ToolCallStatusFailed)
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
	a.h.Event(room.AgentEvent{Kind: room.KindMalformed, Line: le.Line, Length: le.Len, Reason: bound(le.Reason)})
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

func (a *agent) toolEnded(id string, content []sdk.ToolCallContent, raw any, failed bool) {
	a.mu.Lock()
	name := a.calls[id]
	delete(a.calls, id)
	a.mu.Unlock()
	var out strings.Builder
	for _, c := range content {
		if c.Content != nil && c.Content.Content.Text != nil {
			out.WriteString(c.Content.Content.Text.Text)
		}
	}
	text := out.String()
	if text == "" && raw != nil {
		text = jsonText(raw)
	}
	a.h.Event(room.AgentEvent{Kind: room.KindToolEnded, Tool: name, CallID: id, Output: bound(text), IsError: failed})
}

func toolName(title, kind string) string {
	if title != "" {
		return title
	}
	return kind
}

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
	names := make([]string, 0, len(req.Options))
	for _, o := range req.Options {
		names = append(names, o.Name)
	}
	tool := toolName(req.Title, req.Kind)
	a.mu.Lock()
	if n := a.calls[req.ToolCallID]; n != "" && tool == "" {
		tool = n
	}
	a.mu.Unlock()
	ok := a.h.Approve(ctx, room.ApprovalRequest{Tool: tool, Input: bound(redact(string(req.RawInput))), Options: names})
	if !ok {
		a.mu.Lock()
		a.denied = true
		a.mu.Unlock()
	}
	return ok
}

// ask makes a field of the agent's elicitation form (omp's ask tool) a
// room question.
func (a *agent) ask(ctx context.Context, q acp.Question) (string, bool) {
	return a.h.Ask(ctx, room.QuestionRequest{Title: q.Title, Options: q.Options})
}

func redact(s string) string { return detail.Redact(s) }

// bound cuts s to MaxDetail bytes on a rune boundary.
func bound(s string) string { return detail.Bound(s, MaxDetail) }
