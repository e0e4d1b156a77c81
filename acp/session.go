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
	mu   sync.Mutex
	text strings.Builder
	cut  bool
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
	if ev.Update.AgentMessageChunk != nil && ev.Update.AgentMessageChunk.Content.Text != nil {
		c.mu.Lock()
		t := c.turns[p.SessionID]
		c.mu.Unlock()
		if t != nil {
			t.add(ev.Update.AgentMessageChunk.Content.Text.Text)
		}
	}
	c.emit(ev)
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
	resp, err := c.conn.LoadSession(ctx, sdk.LoadSessionRequest{SessionId: sdk.SessionId(id), Cwd: cwd, McpServers: mcp, Meta: c.opts.SessionMeta})
	if err != nil {
		var re *sdk.RequestError
		if errors.As(err, &re) && !c.gone() && ctx.Err() == nil {
			// Any refusal of a well-formed load: the session is not
			// there for this agent. The message, not the data, is kept.
			return nil, fmt.Errorf("%w: %s (code %d)", ErrSessionNotFound, trim(re.Message, 200), re.Code)
		}
		return nil, c.callErr(ctx, "session/load", err)
	}
	return &Session{ID: id, Models: resp.Models, Modes: resp.Modes, Config: resp.ConfigOptions}, nil
}

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
}

// Prompt runs one turn in session and returns when the agent answered
// session/prompt. If ctx ends first, the agent is sent session/cancel and
// Prompt returns ctx's error once the agent ended the turn, or after
// CancelTimeout with an error that also matches ErrCancelTimeout (then the
// caller should Close the agent). An agent that exits mid-turn gives an
// ExitError.
func (c *Client) Prompt(ctx context.Context, session, text string) (Result, error) {
	t := &turn{done: make(chan struct{})}
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
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.turns, session)
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
				return Result{StopReason: ans.resp.StopReason}, fmt.Errorf("acp: session/prompt: %w", context.Cause(ctx))
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
	return Result{StopReason: resp.StopReason, Text: t.text.String(), Cut: t.cut}, nil
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
	if !c.enter() {
		return
	}
	go func() {
		defer c.handlers.Done()
		_ = c.conn.Cancel(context.Background(), sdk.CancelNotification{SessionId: sdk.SessionId(session)})
	}()
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
