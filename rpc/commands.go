package rpc

// Command types, as sent in the "type" field. Every command accepts an id
// that the client adds; the agent echoes it in the response.
const (
	// Both agents.
	CommandPrompt               = "prompt"
	CommandSteer                = "steer"
	CommandFollowUp             = "follow_up"
	CommandAbort                = "abort"
	CommandNewSession           = "new_session"
	CommandGetState             = "get_state"
	CommandGetMessages          = "get_messages"
	CommandSetModel             = "set_model"
	CommandCycleModel           = "cycle_model"
	CommandGetAvailableModels   = "get_available_models"
	CommandSetThinkingLevel     = "set_thinking_level"
	CommandCycleThinkingLevel   = "cycle_thinking_level"
	CommandSetSteeringMode      = "set_steering_mode"
	CommandSetFollowUpMode      = "set_follow_up_mode"
	CommandCompact              = "compact"
	CommandSetAutoCompaction    = "set_auto_compaction"
	CommandSetAutoRetry         = "set_auto_retry"
	CommandAbortRetry           = "abort_retry"
	CommandBash                 = "bash"
	CommandAbortBash            = "abort_bash"
	CommandGetSessionStats      = "get_session_stats"
	CommandExportHTML           = "export_html"
	CommandSwitchSession        = "switch_session"
	CommandGetLastAssistantText = "get_last_assistant_text"
	CommandSetSessionName       = "set_session_name"

	// omp only.
	CommandNegotiateProtocol       = "negotiate_protocol"
	CommandAbortAndPrompt          = "abort_and_prompt"
	CommandSetInterruptMode        = "set_interrupt_mode"
	CommandBranch                  = "branch"
	CommandGetBranchMessages       = "get_branch_messages"
	CommandGetMessagesPage         = "get_messages_page"
	CommandSetTodos                = "set_todos"
	CommandSetHostTools            = "set_host_tools"
	CommandSetHostURISchemes       = "set_host_uri_schemes"
	CommandHandoff                 = "handoff"
	CommandGetAvailableCommands    = "get_available_commands"
	CommandSetFastMode             = "set_fast_mode"
	CommandSetSubagentSubscription = "set_subagent_subscription"
	CommandGetSubagents            = "get_subagents"
	CommandGetSubagentMessages     = "get_subagent_messages"
	CommandGetLoginProviders       = "get_login_providers"
	CommandLogin                   = "login"

	// pi only.
	CommandFork            = "fork"
	CommandClone           = "clone"
	CommandGetForkMessages = "get_fork_messages"
	CommandGetCommands     = "get_commands"
)

// Streaming behaviours of a prompt sent while a turn runs
// (PromptCommand.StreamingBehavior).
const (
	// StreamingSteer delivers the message after the current tool calls,
	// before the next model call.
	StreamingSteer = "steer"
	// StreamingFollowUp delivers the message once the agent would stop.
	StreamingFollowUp = "followUp"
)

// Queue modes for steering and follow-up messages (SetSteeringModeCommand,
// SetFollowUpModeCommand).
const (
	// QueueModeAll delivers every queued message at once.
	QueueModeAll = "all"
	// QueueModeOneAtATime delivers one queued message per turn (default).
	QueueModeOneAtATime = "one-at-a-time"
)

// Interrupt modes (SetInterruptModeCommand, omp).
const (
	// InterruptImmediate checks for steering between tool calls; pending
	// steering can abort the turn's remaining calls (default).
	InterruptImmediate = "immediate"
	// InterruptWait defers steering until the turn completes.
	InterruptWait = "wait"
)

// Thinking levels (SetThinkingLevelCommand). Models without reasoning
// ignore them; omp adds "max", and "inherit"/"auto" as selectors.
const (
	ThinkingOff     = "off"
	ThinkingMinimal = "minimal"
	ThinkingLow     = "low"
	ThinkingMedium  = "medium"
	ThinkingHigh    = "high"
	ThinkingXHigh   = "xhigh"
	ThinkingMax     = "max" // omp
)

// Subagent subscription levels (SetSubagentSubscriptionCommand, omp).
const (
	SubagentOff      = "off"      // no subagent frames (default)
	SubagentProgress = "progress" // lifecycle and progress frames
	SubagentEvents   = "events"   // also every subagent event
)

// PromptCommand sends a user message. Without a turn running it starts one;
// while one runs, StreamingBehavior (StreamingSteer or StreamingFollowUp)
// is required to queue it, or the prompt fails. Slash commands ("/name")
// run the agent's commands, skills and templates.
type PromptCommand struct {
	Message           string         `json:"message"`
	Images            []ImageContent `json:"images,omitempty"`
	StreamingBehavior string         `json:"streamingBehavior,omitempty"`
}

// SteerCommand queues a message delivered after the running turn's current
// tool calls.
type SteerCommand struct {
	Message string         `json:"message"`
	Images  []ImageContent `json:"images,omitempty"`
}

// FollowUpCommand queues a message delivered when the agent would stop.
type FollowUpCommand struct {
	Message string         `json:"message"`
	Images  []ImageContent `json:"images,omitempty"`
}

// AbortCommand aborts the running turn.
type AbortCommand struct{}

// AbortAndPromptCommand aborts the running turn and prompts (omp).
type AbortAndPromptCommand struct {
	Message string         `json:"message"`
	Images  []ImageContent `json:"images,omitempty"`
}

// NewSessionCommand starts a fresh session, optionally recording the parent
// session file. Answer: {cancelled}.
type NewSessionCommand struct {
	ParentSession string `json:"parentSession,omitempty"`
}

// GetStateCommand asks for the session state. Answer: State.
type GetStateCommand struct{}

// GetMessagesCommand asks for every message of the session. Answer:
// {messages}. On omp prefer GetMessagesPageCommand for long sessions.
type GetMessagesCommand struct{}

// SetModelCommand switches the model. Answer: Model.
type SetModelCommand struct {
	Provider string `json:"provider"`
	ModelID  string `json:"modelId"`
}

// CycleModelCommand switches to the next model. Answer: CycleModelResult,
// or null when there is only one.
type CycleModelCommand struct{}

// GetAvailableModelsCommand lists the usable models. Answer: {models}.
type GetAvailableModelsCommand struct{}

// SetThinkingLevelCommand sets the thinking level (Thinking* constants).
type SetThinkingLevelCommand struct {
	Level string `json:"level"`
}

// CycleThinkingLevelCommand moves to the next thinking level. Answer:
// {level}, or null when the model has no thinking.
type CycleThinkingLevelCommand struct{}

// SetSteeringModeCommand sets how queued steering messages are delivered
// (QueueMode* constants).
type SetSteeringModeCommand struct {
	Mode string `json:"mode"`
}

// SetFollowUpModeCommand sets how queued follow-up messages are delivered
// (QueueMode* constants).
type SetFollowUpModeCommand struct {
	Mode string `json:"mode"`
}

// SetInterruptModeCommand sets when steering interrupts tool calls
// (Interrupt* constants, omp).
type SetInterruptModeCommand struct {
	Mode string `json:"mode"`
}

// CompactCommand compacts the context now, optionally guided by
// CustomInstructions. Answer: CompactionResult.
type CompactCommand struct {
	CustomInstructions string `json:"customInstructions,omitempty"`
}

// SetAutoCompactionCommand turns automatic compaction on or off.
type SetAutoCompactionCommand struct {
	Enabled bool `json:"enabled"`
}

// SetAutoRetryCommand turns automatic retries of transient errors on or off.
type SetAutoRetryCommand struct {
	Enabled bool `json:"enabled"`
}

// AbortRetryCommand cancels a pending automatic retry.
type AbortRetryCommand struct{}

// BashCommand runs a shell command outside any turn; its output joins the
// context of the next prompt. Answer: BashResult. omp runs it concurrently
// with other commands.
type BashCommand struct {
	Command string `json:"command"`
}

// AbortBashCommand kills the running bash command.
type AbortBashCommand struct{}

// GetSessionStatsCommand asks for token and cost counters. Answer:
// SessionStats.
type GetSessionStatsCommand struct{}

// ExportHTMLCommand exports the session as HTML, to OutputPath or a default
// path. Answer: {path}.
type ExportHTMLCommand struct {
	OutputPath string `json:"outputPath,omitempty"`
}

// SwitchSessionCommand loads another session file. Answer: {cancelled}.
type SwitchSessionCommand struct {
	SessionPath string `json:"sessionPath"`
}

// GetLastAssistantTextCommand asks for the last assistant message's text.
// Answer: {text}, text null or absent when there is none.
type GetLastAssistantTextCommand struct{}

// SetSessionNameCommand names the session; an empty name is refused.
type SetSessionNameCommand struct {
	Name string `json:"name"`
}

// NegotiateProtocolCommand asks omp for protocol version 2 (chunked large
// frames). Answer: {protocolVersion}.
type NegotiateProtocolCommand struct {
	ProtocolVersion int `json:"protocolVersion"`
}

// BranchCommand branches the session at a user message (omp; pi calls it
// fork). Answer: BranchResult.
type BranchCommand struct {
	EntryID string `json:"entryId"`
}

// GetBranchMessagesCommand lists the user messages one can branch from
// (omp). Answer: {messages: [BranchMessage]}.
type GetBranchMessagesCommand struct{}

// GetMessagesPageCommand asks for a page of messages (omp), from the start
// or from Cursor (a previous page's NextCursor); Limit 0 means omp's default
// (100, at most 256). Fails with code CodeSessionBusy or CodeStaleCursor.
// Answer: MessagesPage.
type GetMessagesPageCommand struct {
	Cursor string `json:"cursor,omitempty"`
	Limit  int    `json:"limit,omitempty"`
}

// SetTodosCommand replaces omp's todo list. Answer: {todoPhases}.
type SetTodosCommand struct {
	Phases []TodoPhase `json:"phases"`
}

// SetHostToolsCommand replaces the host-owned tools omp offers its model.
// Answer: {toolNames}.
type SetHostToolsCommand struct {
	Tools []HostToolDefinition `json:"tools"`
}

// SetHostURISchemesCommand replaces the URL schemes whose reads and writes
// omp forwards to the host. Answer: {schemes}.
type SetHostURISchemesCommand struct {
	Schemes []HostURIScheme `json:"schemes"`
}

// HandoffCommand hands the session off to a fresh context with a generated
// summary (omp); refused while streaming. Answer: HandoffResult or null.
type HandoffCommand struct {
	CustomInstructions string `json:"customInstructions,omitempty"`
}

// GetAvailableCommandsCommand lists omp's slash commands. Answer:
// {commands: [CommandInfo]}.
type GetAvailableCommandsCommand struct{}

// SetFastModeCommand turns omp's fast mode on or off; turning it on fails
// when the model has no fast tier. Answer: FastModeResult.
type SetFastModeCommand struct {
	Enabled bool `json:"enabled"`
}

// SetSubagentSubscriptionCommand selects which subagent frames omp forwards
// (Subagent* constants). Answer: {level}.
type SetSubagentSubscriptionCommand struct {
	Level string `json:"level"`
}

// GetSubagentsCommand lists omp's running subagents. Answer:
// {subagents: [SubagentSnapshot]}.
type GetSubagentsCommand struct{}

// GetSubagentMessagesCommand reads a subagent transcript (omp), chosen by
// SubagentID or SessionFile, from byte FromByte (nil: 0). Answer:
// SubagentMessages.
type GetSubagentMessagesCommand struct {
	SubagentID  string `json:"subagentId,omitempty"`
	SessionFile string `json:"sessionFile,omitempty"`
	FromByte    *int64 `json:"fromByte,omitempty"`
}

// GetLoginProvidersCommand lists omp's OAuth providers. Answer:
// {providers: [LoginProvider]}.
type GetLoginProvidersCommand struct{}

// LoginCommand runs an OAuth login (omp); it asks through extension UI
// requests (open_url, input). Answer: {providerId}.
type LoginCommand struct {
	ProviderID string `json:"providerId"`
}

// ForkCommand forks the session at a user message (pi; omp calls it
// branch). Answer: BranchResult.
type ForkCommand struct {
	EntryID string `json:"entryId"`
}

// CloneCommand duplicates the current branch into a new session (pi).
// Answer: {cancelled}.
type CloneCommand struct{}

// GetForkMessagesCommand lists the user messages one can fork from (pi).
// Answer: {messages: [BranchMessage]}.
type GetForkMessagesCommand struct{}

// GetCommandsCommand lists pi's extension commands, prompt templates and
// skills. Answer: {commands: [CommandInfo]}.
type GetCommandsCommand struct{}

// The CommandType methods give each command's wire type.

func (PromptCommand) CommandType() string                  { return CommandPrompt }
func (SteerCommand) CommandType() string                   { return CommandSteer }
func (FollowUpCommand) CommandType() string                { return CommandFollowUp }
func (AbortCommand) CommandType() string                   { return CommandAbort }
func (AbortAndPromptCommand) CommandType() string          { return CommandAbortAndPrompt }
func (NewSessionCommand) CommandType() string              { return CommandNewSession }
func (GetStateCommand) CommandType() string                { return CommandGetState }
func (GetMessagesCommand) CommandType() string             { return CommandGetMessages }
func (SetModelCommand) CommandType() string                { return CommandSetModel }
func (CycleModelCommand) CommandType() string              { return CommandCycleModel }
func (GetAvailableModelsCommand) CommandType() string      { return CommandGetAvailableModels }
func (SetThinkingLevelCommand) CommandType() string        { return CommandSetThinkingLevel }
func (CycleThinkingLevelCommand) CommandType() string      { return CommandCycleThinkingLevel }
func (SetSteeringModeCommand) CommandType() string         { return CommandSetSteeringMode }
func (SetFollowUpModeCommand) CommandType() string         { return CommandSetFollowUpMode }
func (SetInterruptModeCommand) CommandType() string        { return CommandSetInterruptMode }
func (CompactCommand) CommandType() string                 { return CommandCompact }
func (SetAutoCompactionCommand) CommandType() string       { return CommandSetAutoCompaction }
func (SetAutoRetryCommand) CommandType() string            { return CommandSetAutoRetry }
func (AbortRetryCommand) CommandType() string              { return CommandAbortRetry }
func (BashCommand) CommandType() string                    { return CommandBash }
func (AbortBashCommand) CommandType() string               { return CommandAbortBash }
func (GetSessionStatsCommand) CommandType() string         { return CommandGetSessionStats }
func (ExportHTMLCommand) CommandType() string              { return CommandExportHTML }
func (SwitchSessionCommand) CommandType() string           { return CommandSwitchSession }
func (GetLastAssistantTextCommand) CommandType() string    { return CommandGetLastAssistantText }
func (SetSessionNameCommand) CommandType() string          { return CommandSetSessionName }
func (NegotiateProtocolCommand) CommandType() string       { return CommandNegotiateProtocol }
func (BranchCommand) CommandType() string                  { return CommandBranch }
func (GetBranchMessagesCommand) CommandType() string       { return CommandGetBranchMessages }
func (GetMessagesPageCommand) CommandType() string         { return CommandGetMessagesPage }
func (SetTodosCommand) CommandType() string                { return CommandSetTodos }
func (SetHostToolsCommand) CommandType() string            { return CommandSetHostTools }
func (SetHostURISchemesCommand) CommandType() string       { return CommandSetHostURISchemes }
func (HandoffCommand) CommandType() string                 { return CommandHandoff }
func (GetAvailableCommandsCommand) CommandType() string    { return CommandGetAvailableCommands }
func (SetFastModeCommand) CommandType() string             { return CommandSetFastMode }
func (SetSubagentSubscriptionCommand) CommandType() string { return CommandSetSubagentSubscription }
func (GetSubagentsCommand) CommandType() string            { return CommandGetSubagents }
func (GetSubagentMessagesCommand) CommandType() string     { return CommandGetSubagentMessages }
func (GetLoginProvidersCommand) CommandType() string       { return CommandGetLoginProviders }
func (LoginCommand) CommandType() string                   { return CommandLogin }
func (ForkCommand) CommandType() string                    { return CommandFork }
func (CloneCommand) CommandType() string                   { return CommandClone }
func (GetForkMessagesCommand) CommandType() string         { return CommandGetForkMessages }
func (GetCommandsCommand) CommandType() string             { return CommandGetCommands }
