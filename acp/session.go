package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	sdk "github.com/coder/acp-go-sdk"
)

// Update types an Event can have besides the SDK's own (the update's
// "sessionUpdate" value: "agent_message_chunk", "tool_call", ...).
const (
	// TypeMalformed: a line from the agent was dropped; Err says why.
	TypeMalformed = "malformed"
	// TypeBadUpdate: a session/update whose params could not be decoded
	// (Raw holds them).
	TypeBadUpdate = "bad_update"
)

// Event is one session/update from the agent, or a malformed line.
type Event struct {
	SessionID string
	// Type is the update's "sessionUpdate" value, TypeMalformed or
	// TypeBadUpdate.
	Type string
	// Update is the decoded update; for a kind the SDK does not know it is
	// empty (Known false) and Raw is all there is.
	Update sdk.SessionUpdate
	Known  bool
	// Raw is the update object as the agent sent it.
	Raw json.RawMessage
	// Err says what was wrong (TypeMalformed, TypeBadUpdate). It never
	// holds the payload.
	Err error
}

// Text is the text of an agent_message_chunk (or agent_thought_chunk)
// update, "" for any other.
func (e Event) Text() string {
	switch {
	case e.Update.AgentMessageChunk != nil && e.Update.AgentMessageChunk.Content.Text != nil:
		return e.Update.AgentMessageChunk.Content.Text.Text
	case e.Update.AgentThoughtChunk != nil && e.Update.AgentThoughtChunk.Content.Text != nil:
		return e.Update.AgentThoughtChunk.Content.Text.Text
	}
	return ""
}

// knownUpdates are the update kinds the SDK decodes (v0.13.0); it decodes
// any other as a session_info_update.
var knownUpdates = map[string]bool{
	"user_message_chunk": true, "agent_message_chunk": true, "agent_thought_chunk": true,
	"tool_call": true, "tool_call_update": true, "plan": true, "available_commands_update": true,
	"current_mode_update": true, "config_option_update": true, "session_info_update": true, "usage_update": true,
}

// turn is one running prompt.
type turn struct {
	done chan struct{}
	// sent is closed once the prompt's request was written to the agent
	// (or its write failed): session/cancel goes out only after it, since
	// an agent ignores a cancel for a prompt it has not read yet.
	sent     chan struct{}
	sentOnce sync.Once
	// ctx is the prompt's: once it ends the turn is being cancelled, and a
	// permission request of the session gets the cancelled outcome (kept
	// for the prompt's life only).
	ctx context.Context
	// answered: the agent's answer to the prompt was read (reader only,
	// c.mu held); updates after it are late.
	answered bool
	mu       sync.Mutex
	text     strings.Builder
	cut      bool
}

func (c *Client) update(line int64, n int, params json.RawMessage) {
	var p struct {
		SessionID string          `json:"sessionId"`
		Update    json.RawMessage `json:"update"`
	}
	if err := json.Unmarshal(params, &p); err != nil || len(p.Update) == 0 {
		c.reportMalformed(&LineError{Line: line, Len: int64(n), Reason: "session/update without sessionId and update"})
		return
	}
	var disc struct {
		Kind string `json:"sessionUpdate"`
	}
	ev := Event{SessionID: p.SessionID, Raw: append(json.RawMessage(nil), p.Update...)}
	if err := json.Unmarshal(p.Update, &disc); err != nil || disc.Kind == "" {
		ev.Type, ev.Err = TypeBadUpdate, errors.New("acp: session/update without a sessionUpdate kind")
		c.emit(ev)
		return
	}
	ev.Type = disc.Kind
	if !knownUpdates[disc.Kind] {
		// The SDK would decode it as some other variant, or as nothing:
		// the raw object is all there is.
		c.emit(ev)
		return
	}
	if err := json.Unmarshal(p.Update, &ev.Update); err != nil {
		ev.Type, ev.Err = TypeBadUpdate, fmt.Errorf("acp: session/update %q: %v", disc.Kind, err)
		c.emit(ev)
		return
	}
	ev.Known = true
	c.mu.Lock()
	t, loading := c.turns[p.SessionID], c.loads[p.SessionID] > 0
	late := t == nil || t.answered
	c.mu.Unlock()
	if late && !loading && turnContent[disc.Kind] {
		// After the prompt's answer (or before any): it belongs to no turn,
		// and the next one must not take it for its own.
		c.reportMalformed(&LineError{Line: line, Len: int64(n), Reason: "a " + disc.Kind + " update while no prompt runs in its session"})
		return
	}
	if t != nil && ev.Update.AgentMessageChunk != nil && ev.Update.AgentMessageChunk.Content.Text != nil {
		t.add(ev.Update.AgentMessageChunk.Content.Text.Text)
	}
	c.emit(ev)
}

// turnContent are the update kinds that belong to a turn (a prompt, or a
// load's replay); the others describe the session (commands, modes,
// config, usage, info) and may come at any time.
var turnContent = map[string]bool{
	"user_message_chunk": true, "agent_message_chunk": true, "agent_thought_chunk": true,
	"tool_call": true, "tool_call_update": true, "plan": true,
}

func (t *turn) add(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.text.Len()+len(s) > maxTurnText {
		t.cut = true
		return
	}
	t.text.WriteString(s)
}

// Session is what session/new or session/load returned.
type Session struct {
	ID     string
	Models *sdk.SessionModelState
	Modes  *sdk.SessionModeState
	Config []sdk.SessionConfigOption
}

// NewSession opens a session in cwd (absolute) with the given MCP servers.
func (c *Client) NewSession(ctx context.Context, cwd string, mcp []sdk.McpServer) (*Session, error) {
	if mcp == nil {
		mcp = []sdk.McpServer{}
	}
	resp, err := c.conn.NewSession(ctx, sdk.NewSessionRequest{Cwd: cwd, McpServers: mcp, Meta: c.opts.SessionMeta})
	if err != nil {
		return nil, c.callErr(ctx, "session/new", err)
	}
	if resp.SessionId == "" {
		return nil, errors.New("acp: session/new: the agent returned no session id")
	}
	return &Session{ID: string(resp.SessionId), Models: resp.Models, Modes: resp.Modes, Config: resp.ConfigOptions}, nil
}

// LoadSession loads session id (the agent replays its history as updates).
// An agent without loadSession, or one that refuses the load, gives an
// error matching ErrSessionNotFound; the caller decides what follows.
func (c *Client) LoadSession(ctx context.Context, id, cwd string, mcp []sdk.McpServer) (*Session, error) {
	if !c.init.AgentCapabilities.LoadSession {
		return nil, fmt.Errorf("%w: the agent cannot load sessions", ErrSessionNotFound)
	}
	if mcp == nil {
		mcp = []sdk.McpServer{}
	}
	// The replay comes while no prompt runs: it is let through (see update).
	c.mu.Lock()
	c.loads[id]++
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.loads[id]--; c.loads[id] <= 0 {
			delete(c.loads, id)
		}
		c.mu.Unlock()
	}()
	resp, err := c.conn.LoadSession(ctx, sdk.LoadSessionRequest{SessionId: sdk.SessionId(id), Cwd: cwd, McpServers: mcp, Meta: c.opts.SessionMeta})
	if err != nil {
		var re *sdk.RequestError
		if errors.As(err, &re) && !c.gone() && ctx.Err() == nil {
			// The message, not the data, is kept.
			err := fmt.Errorf("acp: session/load: %s (code %d)", trim(re.Message, 200), re.Code)
			if notFound(re) {
				return nil, fmt.Errorf("%w: %w", ErrSessionNotFound, err)
			}
			// Busy, an internal error, anything else: the session may well
			// be there; a caller that took this as "not found" would drop
			// the room's context for good.
			return nil, err
		}
		return nil, c.callErr(ctx, "session/load", err)
	}
	return &Session{ID: id, Models: resp.Models, Modes: resp.Modes, Config: resp.ConfigOptions}, nil
}

// notFound tells a refused load of a session the agent does not have from
// one that failed for now (busy, an internal error): ACP's resource-not-found
// or invalid-params code, or an error whose message or data says so.
// Measured with the pinned agents, for an id they do not know: claude and
// copilot answer -32002; omp answers -32603 with data.details "ACP session
// not found: ID"; codex -32603 with "no rollout found for thread id ID" (or
// "invalid session id" for one that is no UUID), claude -32603 with "... is
// not a UUID and does not match any session title".
func notFound(re *sdk.RequestError) bool {
	switch re.Code {
	case codeResourceNotFound, codeInvalidParams:
		return true
	}
	text := re.Message
	if re.Data != nil {
		if b, err := json.Marshal(re.Data); err == nil {
			text += " " + string(b)
		}
	}
	text = strings.ToLower(text)
	for _, p := range notFoundPhrases {
		if strings.Contains(text, p) {
			return true
		}
	}
	return false
}

// notFoundPhrases say, in an agent's error, that the session is not there.
var notFoundPhrases = []string{"session not found", "no such session", "unknown session", "invalid session id",
	"no rollout found", "does not match any session", "not found"}

// JSON-RPC and ACP error codes.
const (
	codeInvalidParams    = -32602
	codeResourceNotFound = -32002
)

func (c *Client) gone() bool {
	select {
	case <-c.readerDone:
		return true
	default:
		return false
	}
}

func trim(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// Result is how a prompt ended.
type Result struct {
	StopReason sdk.StopReason
	// Text is the agent_message_chunk text of the turn (bounded; Cut
	// says it was cut).
	Text string
	Cut  bool
	// Usage is the token usage the agent reported in its answer (ACP's
	// unstable field; nil when it sent none), and Meta the answer's _meta:
	// as sent, for internal/usage to read (agents differ in what they
	// count, see its ACPReport).
	Usage *sdk.Usage
	Meta  map[string]any
}

// Prompt runs one turn in session and returns when the agent answered
// session/prompt. If ctx ends first, the agent is sent session/cancel and
// Prompt returns ctx's error once the agent ended the turn, or after
// CancelTimeout with an error that also matches ErrCancelTimeout (then the
// caller should Close the agent). An agent that exits mid-turn gives an
// ExitError.
func (c *Client) Prompt(ctx context.Context, session, text string) (Result, error) {
	t := &turn{done: make(chan struct{}), sent: make(chan struct{}), ctx: ctx}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return Result{}, ErrClosed
	}
	if c.turns[session] != nil {
		c.mu.Unlock()
		return Result{}, fmt.Errorf("acp: a prompt is already running in session %s", session)
	}
	c.turns[session] = t
	// A new turn: permissions are asked again (see outcome).
	delete(c.cancelled, session)
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.turns, session)
		// A prompt the agent never answered leaves no id behind.
		for id, s := range c.promptIDs {
			if s == session {
				delete(c.promptIDs, id)
			}
		}
		c.mu.Unlock()
		close(t.done)
	}()
	// The request runs on its own context: when ctx ends, the agent is
	// sent session/cancel and given CancelTimeout to answer the prompt, so
	// a turn ends cleanly when the agent cooperates.
	inner, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	type answer struct {
		resp sdk.PromptResponse
		err  error
	}
	ch := make(chan answer, 1)
	// Owned by the client: a write to an agent that stopped reading blocks
	// until Close closes its stdin, and Close waits for it.
	if !c.enter() {
		return Result{}, ErrClosed
	}
	go func() {
		defer c.handlers.Done()
		resp, err := c.conn.Prompt(inner, sdk.PromptRequest{SessionId: sdk.SessionId(session), Prompt: []sdk.ContentBlock{sdk.TextBlock(text)}})
		ch <- answer{resp, err}
	}()
	var ans answer
	select {
	case ans = <-ch:
	case <-ctx.Done():
		c.sendCancel(session)
		timer := time.NewTimer(c.opts.CancelTimeout)
		defer timer.Stop()
		select {
		case ans = <-ch:
			if ans.err == nil {
				return Result{StopReason: ans.resp.StopReason, Usage: ans.resp.Usage, Meta: ans.resp.Meta},
					fmt.Errorf("acp: session/prompt: %w", context.Cause(ctx))
			}
		case <-timer.C:
			stop()
			return Result{}, fmt.Errorf("acp: session/prompt: %w (%w)", context.Cause(ctx), ErrCancelTimeout)
		}
	}
	if ans.err != nil {
		return Result{}, c.callErr(ctx, "session/prompt", ans.err)
	}
	resp := ans.resp
	t.mu.Lock()
	defer t.mu.Unlock()
	return Result{StopReason: resp.StopReason, Text: t.text.String(), Cut: t.cut, Usage: resp.Usage, Meta: resp.Meta}, nil
}

// Cancel sends session/cancel and waits, up to CancelTimeout, for the
// running prompt to end (ErrCancelTimeout otherwise; ErrNoTurn when none
// runs).
func (c *Client) Cancel(ctx context.Context, session string) error {
	c.mu.Lock()
	t := c.turns[session]
	c.mu.Unlock()
	if t == nil {
		return ErrNoTurn
	}
	c.sendCancel(session)
	timer := time.NewTimer(c.opts.CancelTimeout)
	defer timer.Stop()
	select {
	case <-t.done:
		return nil
	case <-timer.C:
		return ErrCancelTimeout
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sendCancel sends session/cancel aside: an agent that stopped reading its
// stdin must not hold the caller past its bound (Close's stdin close ends
// a blocked write).
func (c *Client) sendCancel(session string) {
	// From now on the session's permission requests are answered cancelled,
	// a pending one included (its Permission callback is cut short).
	c.mu.Lock()
	c.cancelled[session] = true
	t := c.turns[session]
	c.mu.Unlock()
	if !c.enter() {
		return
	}
	go func() {
		defer c.handlers.Done()
		if t != nil {
			select {
			case <-t.sent:
			case <-t.done:
				return // the prompt ended unsent: nothing to cancel
			}
		}
		_ = c.conn.Cancel(context.Background(), sdk.CancelNotification{SessionId: sdk.SessionId(session)})
	}()
}

// isCancelled reports whether the session's turn is being cancelled: it was
// sent session/cancel since its last prompt began, or that prompt's context
// ended (a room denies the turn's approvals as it cancels it, before
// session/cancel goes out).
func (c *Client) isCancelled(session string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancelled[session] {
		return true
	}
	t := c.turns[session]
	return t != nil && t.ctx.Err() != nil
}

// promptCtx returns the context of the prompt running in session (nil if
// none).
func (c *Client) promptCtx(session string) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := c.turns[session]; t != nil {
		return t.ctx
	}
	return nil
}

// SetModel selects a model for the session (session/set_model, which the
// agent offers when session/new reported models).
func (c *Client) SetModel(ctx context.Context, session, model string) error {
	_, err := c.conn.UnstableSetSessionModel(ctx, sdk.UnstableSetSessionModelRequest{SessionId: sdk.SessionId(session), ModelId: sdk.UnstableModelId(model)})
	if err != nil {
		return c.callErr(ctx, "session/set_model", err)
	}
	return nil
}

// SetMode switches the session's mode (session/set_mode).
func (c *Client) SetMode(ctx context.Context, session, mode string) error {
	_, err := c.conn.SetSessionMode(ctx, sdk.SetSessionModeRequest{SessionId: sdk.SessionId(session), ModeId: sdk.SessionModeId(mode)})
	if err != nil {
		return c.callErr(ctx, "session/set_mode", err)
	}
	return nil
}

// ErrNotOffered: the session offers no such choice (no config option of
// that category, or not that value).
var ErrNotOffered = errors.New("acp: not offered by the agent")

// Option returns the session's select config option of category ("model",
// "thought_level", "mode"), or nil.
func (s *Session) Option(category string) *sdk.SessionConfigOptionSelect {
	for _, o := range s.Config {
		if o.Select != nil && o.Select.Category != nil && string(*o.Select.Category) == category {
			return o.Select
		}
	}
	return nil
}

// values lists a select option's values, grouped or not.
func values(o *sdk.SessionConfigOptionSelect) []string {
	var out []string
	if u := o.Options.Ungrouped; u != nil {
		for _, v := range *u {
			out = append(out, string(v.Value))
		}
	}
	if g := o.Options.Grouped; g != nil {
		for _, grp := range *g {
			for _, v := range grp.Options {
				out = append(out, string(v.Value))
			}
		}
	}
	return out
}

// Select sets the session's config option of category to value with
// session/set_config_option, and checks that the agent took it. A category
// or value the session does not offer gives ErrNotOffered.
func (c *Client) Select(ctx context.Context, s *Session, category, value string) error {
	o := s.Option(category)
	if o == nil {
		return fmt.Errorf("%w: no %s option", ErrNotOffered, category)
	}
	if string(o.CurrentValue) == value {
		return nil
	}
	if !slices.Contains(values(o), value) {
		return fmt.Errorf("%w: %s %q (offered: %s)", ErrNotOffered, category, value, strings.Join(values(o), ", "))
	}
	resp, err := c.conn.SetSessionConfigOption(ctx, sdk.SetSessionConfigOptionRequest{ValueId: &sdk.SetSessionConfigOptionValueId{
		SessionId: sdk.SessionId(s.ID), ConfigId: o.Id, Value: sdk.SessionConfigValueId(value)}})
	if err != nil {
		return c.callErr(ctx, "session/set_config_option", err)
	}
	s.Config = resp.ConfigOptions
	if got := s.Option(category); got == nil || string(got.CurrentValue) != value {
		now := "none"
		if got != nil {
			now = string(got.CurrentValue)
		}
		return fmt.Errorf("acp: session/set_config_option: the agent did not take %s %q (it has %s)", category, value, now)
	}
	return nil
}

// SelectModel selects model: through session/set_model when the session
// listed models, else through its "model" config option. ErrNotOffered
// when neither offers it.
func (c *Client) SelectModel(ctx context.Context, s *Session, model string) error {
	if s.Models == nil {
		return c.Select(ctx, s, string(sdk.SessionConfigOptionCategoryModel), model)
	}
	if string(s.Models.CurrentModelId) == model {
		return nil
	}
	if !slices.ContainsFunc(s.Models.AvailableModels, func(m sdk.ModelInfo) bool { return string(m.ModelId) == model }) {
		return fmt.Errorf("%w: model %q", ErrNotOffered, model)
	}
	return c.SetModel(ctx, s.ID, model)
}
