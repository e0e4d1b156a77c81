package rpc

import "context"

// Typed wrappers over Call, one per command. Each blocks until the agent
// answers or ctx ends; a refusal (success:false) is a *ResponseError. The
// turn commands (prompt, steer, follow_up, abort, abort_and_prompt) and
// set_host_tools have their own methods with turn and tool handling.
// Methods marked (omp) or (pi) fail with a *ResponseError ("Unknown
// command") on the other agent.

// GetState returns the session state.
func (c *Client) GetState(ctx context.Context) (*State, error) {
	var s State
	if err := c.Call(ctx, GetStateCommand{}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// GetMessages returns every message of the session. On omp the answer can
// exceed protocol v1's 1 MiB frame (it is then cut); GetMessagesPage pages.
func (c *Client) GetMessages(ctx context.Context) ([]Message, error) {
	var d struct {
		Messages []Message `json:"messages"`
	}
	if err := c.Call(ctx, GetMessagesCommand{}, &d); err != nil {
		return nil, err
	}
	return d.Messages, nil
}

// GetMessagesPage returns one page of messages (omp): the first with cursor
// "", the next with the previous page's NextCursor. limit 0 means omp's
// default. A *ResponseError with Code CodeSessionBusy or CodeStaleCursor
// means retry later or restart from the first page.
func (c *Client) GetMessagesPage(ctx context.Context, cursor string, limit int) (*MessagesPage, error) {
	var p MessagesPage
	if err := c.Call(ctx, GetMessagesPageCommand{Cursor: cursor, Limit: limit}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// NewSession starts a fresh session, recording parent (a session file) when
// not empty; cancelled reports an extension's veto.
func (c *Client) NewSession(ctx context.Context, parent string) (cancelled bool, err error) {
	var d struct {
		Cancelled bool `json:"cancelled"`
	}
	err = c.Call(ctx, NewSessionCommand{ParentSession: parent}, &d)
	return d.Cancelled, err
}

// SwitchSession loads the session file path; cancelled reports an
// extension's veto.
func (c *Client) SwitchSession(ctx context.Context, path string) (cancelled bool, err error) {
	var d struct {
		Cancelled bool `json:"cancelled"`
	}
	err = c.Call(ctx, SwitchSessionCommand{SessionPath: path}, &d)
	return d.Cancelled, err
}

// SetModel switches to the model provider/modelID and returns it.
func (c *Client) SetModel(ctx context.Context, provider, modelID string) (*Model, error) {
	var m Model
	if err := c.Call(ctx, SetModelCommand{Provider: provider, ModelID: modelID}, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// CycleModel switches to the next model; it returns nil, nil when there is
// no other model.
func (c *Client) CycleModel(ctx context.Context) (*CycleModelResult, error) {
	var r *CycleModelResult
	if err := c.Call(ctx, CycleModelCommand{}, &r); err != nil {
		return nil, err
	}
	return r, nil
}

// GetAvailableModels lists the models the agent can switch to.
func (c *Client) GetAvailableModels(ctx context.Context) ([]Model, error) {
	var d struct {
		Models []Model `json:"models"`
	}
	if err := c.Call(ctx, GetAvailableModelsCommand{}, &d); err != nil {
		return nil, err
	}
	return d.Models, nil
}

// SetThinkingLevel sets the thinking level (Thinking* constants).
func (c *Client) SetThinkingLevel(ctx context.Context, level string) error {
	return c.Call(ctx, SetThinkingLevelCommand{Level: level}, nil)
}

// CycleThinkingLevel moves to the next thinking level and returns it; ""
// means the model has no thinking levels.
func (c *Client) CycleThinkingLevel(ctx context.Context) (string, error) {
	var d *struct {
		Level string `json:"level"`
	}
	if err := c.Call(ctx, CycleThinkingLevelCommand{}, &d); err != nil || d == nil {
		return "", err
	}
	return d.Level, nil
}

// SetSteeringMode sets how queued steering messages are delivered
// (QueueMode* constants).
func (c *Client) SetSteeringMode(ctx context.Context, mode string) error {
	return c.Call(ctx, SetSteeringModeCommand{Mode: mode}, nil)
}

// SetFollowUpMode sets how queued follow-up messages are delivered
// (QueueMode* constants).
func (c *Client) SetFollowUpMode(ctx context.Context, mode string) error {
	return c.Call(ctx, SetFollowUpModeCommand{Mode: mode}, nil)
}

// SetInterruptMode sets when steering interrupts tool calls (Interrupt*
// constants, omp).
func (c *Client) SetInterruptMode(ctx context.Context, mode string) error {
	return c.Call(ctx, SetInterruptModeCommand{Mode: mode}, nil)
}

// Compact compacts the context now, guided by customInstructions when not
// empty. It blocks while the model writes the summary.
func (c *Client) Compact(ctx context.Context, customInstructions string) (*CompactionResult, error) {
	var r CompactionResult
	if err := c.Call(ctx, CompactCommand{CustomInstructions: customInstructions}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// SetAutoCompaction turns automatic compaction on or off.
func (c *Client) SetAutoCompaction(ctx context.Context, enabled bool) error {
	return c.Call(ctx, SetAutoCompactionCommand{Enabled: enabled}, nil)
}

// SetAutoRetry turns automatic retries of transient errors on or off.
func (c *Client) SetAutoRetry(ctx context.Context, enabled bool) error {
	return c.Call(ctx, SetAutoRetryCommand{Enabled: enabled}, nil)
}

// AbortRetry cancels a pending automatic retry.
func (c *Client) AbortRetry(ctx context.Context) error {
	return c.Call(ctx, AbortRetryCommand{}, nil)
}

// Bash runs command in the agent's shell, outside any turn, and waits for
// it; the output joins the context of the next prompt. AbortBash stops it.
func (c *Client) Bash(ctx context.Context, command string) (*BashResult, error) {
	var r BashResult
	if err := c.Call(ctx, BashCommand{Command: command}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// AbortBash kills the running bash command.
func (c *Client) AbortBash(ctx context.Context) error {
	return c.Call(ctx, AbortBashCommand{}, nil)
}

// GetSessionStats returns the session's token, cost and context counters.
func (c *Client) GetSessionStats(ctx context.Context) (*SessionStats, error) {
	var s SessionStats
	if err := c.Call(ctx, GetSessionStatsCommand{}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// ExportHTML writes the session as HTML to outputPath (the agent's default
// when empty) and returns the path written.
func (c *Client) ExportHTML(ctx context.Context, outputPath string) (string, error) {
	var d struct {
		Path string `json:"path"`
	}
	err := c.Call(ctx, ExportHTMLCommand{OutputPath: outputPath}, &d)
	return d.Path, err
}

// GetLastAssistantText returns the last assistant message's text; ok is
// false when there is none.
func (c *Client) GetLastAssistantText(ctx context.Context) (text string, ok bool, err error) {
	var d struct {
		Text *string `json:"text"`
	}
	if err := c.Call(ctx, GetLastAssistantTextCommand{}, &d); err != nil || d.Text == nil {
		return "", false, err
	}
	return *d.Text, true, nil
}

// SetSessionName names the session; the agents refuse an empty name.
func (c *Client) SetSessionName(ctx context.Context, name string) error {
	return c.Call(ctx, SetSessionNameCommand{Name: name}, nil)
}

// Branch branches the session at the user message entryID (omp).
func (c *Client) Branch(ctx context.Context, entryID string) (*BranchResult, error) {
	var r BranchResult
	if err := c.Call(ctx, BranchCommand{EntryID: entryID}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// GetBranchMessages lists the user messages one can branch from (omp).
func (c *Client) GetBranchMessages(ctx context.Context) ([]BranchMessage, error) {
	var d struct {
		Messages []BranchMessage `json:"messages"`
	}
	if err := c.Call(ctx, GetBranchMessagesCommand{}, &d); err != nil {
		return nil, err
	}
	return d.Messages, nil
}

// Fork forks the session at the user message entryID (pi).
func (c *Client) Fork(ctx context.Context, entryID string) (*BranchResult, error) {
	var r BranchResult
	if err := c.Call(ctx, ForkCommand{EntryID: entryID}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// GetForkMessages lists the user messages one can fork from (pi).
func (c *Client) GetForkMessages(ctx context.Context) ([]BranchMessage, error) {
	var d struct {
		Messages []BranchMessage `json:"messages"`
	}
	if err := c.Call(ctx, GetForkMessagesCommand{}, &d); err != nil {
		return nil, err
	}
	return d.Messages, nil
}

// Clone duplicates the current branch into a new session (pi); cancelled
// reports an extension's veto.
func (c *Client) Clone(ctx context.Context) (cancelled bool, err error) {
	var d struct {
		Cancelled bool `json:"cancelled"`
	}
	err = c.Call(ctx, CloneCommand{}, &d)
	return d.Cancelled, err
}

// Handoff hands the session off to a fresh context with a generated summary
// (omp). It returns nil, nil when omp reports nothing saved.
func (c *Client) Handoff(ctx context.Context, customInstructions string) (*HandoffResult, error) {
	var r *HandoffResult
	if err := c.Call(ctx, HandoffCommand{CustomInstructions: customInstructions}, &r); err != nil {
		return nil, err
	}
	return r, nil
}

// SetTodos replaces omp's todo list and returns it as omp normalized it.
func (c *Client) SetTodos(ctx context.Context, phases []TodoPhase) ([]TodoPhase, error) {
	if phases == nil {
		phases = []TodoPhase{}
	}
	var d struct {
		TodoPhases []TodoPhase `json:"todoPhases"`
	}
	if err := c.Call(ctx, SetTodosCommand{Phases: phases}, &d); err != nil {
		return nil, err
	}
	return d.TodoPhases, nil
}

// SetHostURISchemes replaces the URL schemes omp forwards to the host and
// returns the registered (lowercased) names (omp).
func (c *Client) SetHostURISchemes(ctx context.Context, schemes []HostURIScheme) ([]string, error) {
	if schemes == nil {
		schemes = []HostURIScheme{}
	}
	var d struct {
		Schemes []string `json:"schemes"`
	}
	if err := c.Call(ctx, SetHostURISchemesCommand{Schemes: schemes}, &d); err != nil {
		return nil, err
	}
	return d.Schemes, nil
}

// GetAvailableCommands lists omp's slash commands.
func (c *Client) GetAvailableCommands(ctx context.Context) ([]CommandInfo, error) {
	var d struct {
		Commands []CommandInfo `json:"commands"`
	}
	if err := c.Call(ctx, GetAvailableCommandsCommand{}, &d); err != nil {
		return nil, err
	}
	return d.Commands, nil
}

// GetCommands lists pi's extension commands, prompt templates and skills.
func (c *Client) GetCommands(ctx context.Context) ([]CommandInfo, error) {
	var d struct {
		Commands []CommandInfo `json:"commands"`
	}
	if err := c.Call(ctx, GetCommandsCommand{}, &d); err != nil {
		return nil, err
	}
	return d.Commands, nil
}

// SetFastMode turns omp's fast mode on or off and returns the resulting
// setting and state.
func (c *Client) SetFastMode(ctx context.Context, enabled bool) (*FastModeResult, error) {
	var r FastModeResult
	if err := c.Call(ctx, SetFastModeCommand{Enabled: enabled}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// SetSubagentSubscription selects which subagent frames omp forwards
// (Subagent* constants) and returns the level in effect.
func (c *Client) SetSubagentSubscription(ctx context.Context, level string) (string, error) {
	var d struct {
		Level string `json:"level"`
	}
	err := c.Call(ctx, SetSubagentSubscriptionCommand{Level: level}, &d)
	return d.Level, err
}

// GetSubagents lists omp's running subagents.
func (c *Client) GetSubagents(ctx context.Context) ([]SubagentSnapshot, error) {
	var d struct {
		Subagents []SubagentSnapshot `json:"subagents"`
	}
	if err := c.Call(ctx, GetSubagentsCommand{}, &d); err != nil {
		return nil, err
	}
	return d.Subagents, nil
}

// GetSubagentMessages reads part of a subagent's transcript (omp), chosen
// by sel's SubagentID or SessionFile, from sel.FromByte.
func (c *Client) GetSubagentMessages(ctx context.Context, sel GetSubagentMessagesCommand) (*SubagentMessages, error) {
	var r SubagentMessages
	if err := c.Call(ctx, sel, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// GetLoginProviders lists omp's OAuth providers.
func (c *Client) GetLoginProviders(ctx context.Context) ([]LoginProvider, error) {
	var d struct {
		Providers []LoginProvider `json:"providers"`
	}
	if err := c.Call(ctx, GetLoginProvidersCommand{}, &d); err != nil {
		return nil, err
	}
	return d.Providers, nil
}

// Login runs omp's OAuth login for providerID. omp asks through extension
// UI requests (open_url, input), so the client needs a UI handler; Login
// blocks until the flow ends.
func (c *Client) Login(ctx context.Context, providerID string) error {
	return c.Call(ctx, LoginCommand{ProviderID: providerID}, nil)
}
