package rpc

import "encoding/json"

// Frame types of the events both agents send. Events carry no id; decoding
// any of the *Event structs ignores fields it does not name.
const (
	EventAgentStart          = "agent_start"
	EventAgentEnd            = "agent_end"
	EventTurnStart           = "turn_start"
	EventTurnEnd             = "turn_end"
	EventMessageStart        = "message_start"
	EventMessageUpdate       = "message_update"
	EventMessageEnd          = "message_end"
	EventToolExecutionStart  = "tool_execution_start"
	EventToolExecutionUpdate = "tool_execution_update"
	EventToolExecutionEnd    = "tool_execution_end"
	EventAutoRetryStart      = "auto_retry_start"
	EventAutoRetryEnd        = "auto_retry_end"
	EventExtensionError      = "extension_error"
	EventExtensionUIRequest  = "extension_ui_request"
	// EventThinkingLevelChanged is sent by both, with different fields (see
	// ThinkingLevelChangedEvent).
	EventThinkingLevelChanged = "thinking_level_changed"
	// EventResponse is the type of command responses; they are not events.
	EventResponse = "response"
)

// Frame types only omp sends.
const (
	EventReady                   = "ready"
	EventRPCChunk                = "rpc_chunk"
	EventRPCFrameError           = "rpc_frame_error"
	EventPromptResult            = "prompt_result"
	EventAutoCompactionStart     = "auto_compaction_start"
	EventAutoCompactionEnd       = "auto_compaction_end"
	EventNotice                  = "notice"
	EventModelChanged            = "model_changed"
	EventRetryFallbackApplied    = "retry_fallback_applied"
	EventRetryFallbackSucceeded  = "retry_fallback_succeeded"
	EventTTSRTriggered           = "ttsr_triggered"
	EventTodoReminder            = "todo_reminder"
	EventTodoAutoClear           = "todo_auto_clear"
	EventAvailableCommandsUpdate = "available_commands_update"
	EventAdvisorCostChanged      = "advisor_cost_changed"
	EventAdvisorYielded          = "advisor_yielded"
	EventConfigWarningsChanged   = "config_warnings_changed"
	EventIRCMessage              = "irc_message"
	EventGoalUpdated             = "goal_updated"
	EventToolStreamUpdate        = "tool_stream_update"
	EventHostToolCall            = "host_tool_call"
	EventHostToolCancel          = "host_tool_cancel"
	EventHostURIRequest          = "host_uri_request"
	EventHostURICancel           = "host_uri_cancel"
	EventSubagentLifecycle       = "subagent_lifecycle"
	EventSubagentProgress        = "subagent_progress"
	EventSubagentEvent           = "subagent_event"
	EventCommandOutput           = "command_output"
	EventSessionInfoUpdate       = "session_info_update"
	EventConfigUpdate            = "config_update"
)

// Frame types only pi sends.
const (
	EventQueueUpdate        = "queue_update"
	EventCompactionStart    = "compaction_start"
	EventCompactionEnd      = "compaction_end"
	EventSessionInfoChanged = "session_info_changed"
)

// Frame types the host sends that are not commands: they get no response.
const (
	FrameHostToolUpdate      = "host_tool_update"
	FrameHostToolResult      = "host_tool_result"
	FrameHostURIResult       = "host_uri_result"
	FrameExtensionUIResponse = "extension_ui_response"
)

// TypedEvent is implemented by every *Event struct: EventType is the frame
// type the struct decodes.
type TypedEvent interface {
	EventType() string
}

// NewTypedEvent returns a pointer to a zero struct for frames of type typ,
// ready to decode into, and false for types without a struct here (unknown
// types, rpc_chunk, response).
func NewTypedEvent(typ string) (TypedEvent, bool) {
	var e TypedEvent
	switch typ {
	case EventAgentStart:
		e = &AgentStartEvent{}
	case EventAgentEnd:
		e = &AgentEndEvent{}
	case EventTurnStart:
		e = &TurnStartEvent{}
	case EventTurnEnd:
		e = &TurnEndEvent{}
	case EventMessageStart:
		e = &MessageStartEvent{}
	case EventMessageUpdate:
		e = &MessageUpdateEvent{}
	case EventMessageEnd:
		e = &MessageEndEvent{}
	case EventToolExecutionStart:
		e = &ToolExecutionStartEvent{}
	case EventToolExecutionUpdate:
		e = &ToolExecutionUpdateEvent{}
	case EventToolExecutionEnd:
		e = &ToolExecutionEndEvent{}
	case EventAutoRetryStart:
		e = &AutoRetryStartEvent{}
	case EventAutoRetryEnd:
		e = &AutoRetryEndEvent{}
	case EventExtensionError:
		e = &ExtensionErrorEvent{}
	case EventExtensionUIRequest:
		e = &ExtensionUIRequestEvent{}
	case EventThinkingLevelChanged:
		e = &ThinkingLevelChangedEvent{}
	case EventReady:
		e = &ReadyEvent{}
	case EventRPCFrameError:
		e = &RPCFrameErrorEvent{}
	case EventPromptResult:
		e = &PromptResultEvent{}
	case EventAutoCompactionStart:
		e = &AutoCompactionStartEvent{}
	case EventAutoCompactionEnd:
		e = &AutoCompactionEndEvent{}
	case EventNotice:
		e = &NoticeEvent{}
	case EventModelChanged:
		e = &ModelChangedEvent{}
	case EventRetryFallbackApplied:
		e = &RetryFallbackAppliedEvent{}
	case EventRetryFallbackSucceeded:
		e = &RetryFallbackSucceededEvent{}
	case EventTTSRTriggered:
		e = &TTSRTriggeredEvent{}
	case EventTodoReminder:
		e = &TodoReminderEvent{}
	case EventTodoAutoClear:
		e = &TodoAutoClearEvent{}
	case EventAvailableCommandsUpdate:
		e = &AvailableCommandsUpdateEvent{}
	case EventAdvisorCostChanged:
		e = &AdvisorCostChangedEvent{}
	case EventAdvisorYielded:
		e = &AdvisorYieldedEvent{}
	case EventConfigWarningsChanged:
		e = &ConfigWarningsChangedEvent{}
	case EventIRCMessage:
		e = &IRCMessageEvent{}
	case EventGoalUpdated:
		e = &GoalUpdatedEvent{}
	case EventToolStreamUpdate:
		e = &ToolStreamUpdateEvent{}
	case EventHostToolCall:
		e = &HostToolCallEvent{}
	case EventHostToolCancel:
		e = &HostToolCancelEvent{}
	case EventHostURIRequest:
		e = &HostURIRequestEvent{}
	case EventHostURICancel:
		e = &HostURICancelEvent{}
	case EventSubagentLifecycle:
		e = &SubagentLifecycleEvent{}
	case EventSubagentProgress:
		e = &SubagentProgressEvent{}
	case EventSubagentEvent:
		e = &SubagentEventEvent{}
	case EventCommandOutput:
		e = &CommandOutputEvent{}
	case EventSessionInfoUpdate:
		e = &SessionInfoUpdateEvent{}
	case EventConfigUpdate:
		e = &ConfigUpdateEvent{}
	case EventQueueUpdate:
		e = &QueueUpdateEvent{}
	case EventCompactionStart:
		e = &CompactionStartEvent{}
	case EventCompactionEnd:
		e = &CompactionEndEvent{}
	case EventSessionInfoChanged:
		e = &SessionInfoChangedEvent{}
	default:
		return nil, false
	}
	return e, true
}

// ReadyEvent is omp's first frame, written about a second after start.
// pi sends none, so a client must not wait for it.
type ReadyEvent struct {
	ProtocolVersion           int   `json:"protocolVersion"`
	SupportedProtocolVersions []int `json:"supportedProtocolVersions"`
	// MaxFrameBytes caps a physical line (1 MiB); MaxReassembledFrameBytes
	// caps a frame rebuilt from protocol v2 chunks (64 MiB).
	MaxFrameBytes            int64 `json:"maxFrameBytes"`
	MaxReassembledFrameBytes int64 `json:"maxReassembledFrameBytes"`
}

// RPCFrameErrorEvent replaces a frame omp could not fit into the transport
// limit.
type RPCFrameErrorEvent struct {
	OriginalType string `json:"originalType,omitempty"`
	Error        string `json:"error"`
}

// AgentStartEvent starts an agent run. omp may start several runs (todo
// reminders, async results) before a single terminal agent_end.
type AgentStartEvent struct{}

// AgentEndEvent ends an agent run.
type AgentEndEvent struct {
	// Messages are the run's messages. When the frame would exceed omp's
	// transport limit, omp drops those already streamed in message_end
	// frames and MessageCount gives the full count.
	Messages     []Message `json:"messages"`
	MessageCount *int      `json:"messageCount,omitempty"`
	// IsTerminal is false (omp) when the session resumes on its own
	// (auto-compaction, async results); absent means terminal.
	IsTerminal *bool `json:"isTerminal,omitempty"`
	// Telemetry and Coverage are omp's optional run telemetry.
	Telemetry json.RawMessage `json:"telemetry,omitempty"`
	Coverage  json.RawMessage `json:"coverage,omitempty"`
}

// Terminal reports whether the run is finished: IsTerminal is absent or
// true.
func (e *AgentEndEvent) Terminal() bool { return e.IsTerminal == nil || *e.IsTerminal }

// TurnStartEvent starts a turn: one assistant response and its tool calls.
type TurnStartEvent struct{}

// TurnEndEvent ends a turn with its assistant message and tool results.
type TurnEndEvent struct {
	Message     Message   `json:"message"`
	ToolResults []Message `json:"toolResults"`
}

// MessageStartEvent starts a message (user, assistant, tool result, custom).
type MessageStartEvent struct {
	Message Message `json:"message"`
}

// MessageUpdateEvent streams an assistant message: Message is the whole
// partial message so far, AssistantMessageEvent the delta (see Update).
type MessageUpdateEvent struct {
	Message               Message         `json:"message"`
	AssistantMessageEvent json.RawMessage `json:"assistantMessageEvent,omitempty"`
}

// Update decodes the delta, without its copy of the partial message.
func (e *MessageUpdateEvent) Update() (*AssistantMessageEvent, error) {
	var a AssistantMessageEvent
	if len(e.AssistantMessageEvent) == 0 {
		return &a, nil
	}
	if err := json.Unmarshal(e.AssistantMessageEvent, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// Assistant stream delta types (AssistantMessageEvent.Type).
const (
	DeltaStart         = "start"
	DeltaTextStart     = "text_start"
	DeltaTextDelta     = "text_delta"
	DeltaTextEnd       = "text_end"
	DeltaThinkingStart = "thinking_start"
	DeltaThinkingDelta = "thinking_delta"
	DeltaThinkingEnd   = "thinking_end"
	DeltaToolCallStart = "toolcall_start"
	DeltaToolCallDelta = "toolcall_delta"
	DeltaToolCallEnd   = "toolcall_end"
	DeltaImageEnd      = "image_end"
	DeltaDone          = "done"
	DeltaError         = "error"
)

// AssistantMessageEvent is a streaming delta of an assistant message. Its
// "partial" (and "message"/"error" on done/error) copy of the message is
// not decoded: MessageUpdateEvent.Message holds the same.
type AssistantMessageEvent struct {
	Type string `json:"type"`
	// ContentIndex is the index of the content block the delta belongs to.
	ContentIndex *int `json:"contentIndex,omitempty"`
	// Delta is the new text, thinking or tool-call argument JSON.
	Delta string `json:"delta,omitempty"`
	// Content is the finished block's text (text_end, thinking_end) or
	// image (image_end).
	Content json.RawMessage `json:"content,omitempty"`
	// ToolCall is the finished call (toolcall_end).
	ToolCall *ContentBlock `json:"toolCall,omitempty"`
	// Reason is the stop reason of done and error.
	Reason string `json:"reason,omitempty"`
}

// MessageEndEvent carries a finished message.
type MessageEndEvent struct {
	Message Message `json:"message"`
}

// ToolExecutionStartEvent reports a tool call starting.
type ToolExecutionStartEvent struct {
	ToolCallID string          `json:"toolCallId"`
	ToolName   string          `json:"toolName"`
	Args       json.RawMessage `json:"args"`
	// Intent is the harness's summary of the call's purpose (omp).
	Intent string `json:"intent,omitempty"`
}

// ToolExecutionUpdateEvent streams a running tool's output so far
// (accumulated, not a delta): usually a ToolResult, see DecodePartial.
type ToolExecutionUpdateEvent struct {
	ToolCallID    string          `json:"toolCallId"`
	ToolName      string          `json:"toolName"`
	Args          json.RawMessage `json:"args"`
	PartialResult json.RawMessage `json:"partialResult"`
}

// DecodePartial decodes PartialResult as a ToolResult.
func (e *ToolExecutionUpdateEvent) DecodePartial() (*ToolResult, error) {
	return decodeToolResult(e.PartialResult)
}

// ToolExecutionEndEvent reports a finished tool call. Result is usually a
// ToolResult, see DecodeResult.
type ToolExecutionEndEvent struct {
	ToolCallID string          `json:"toolCallId"`
	ToolName   string          `json:"toolName"`
	Result     json.RawMessage `json:"result"`
	IsError    bool            `json:"isError"`
}

// DecodeResult decodes Result as a ToolResult.
func (e *ToolExecutionEndEvent) DecodeResult() (*ToolResult, error) {
	return decodeToolResult(e.Result)
}

func decodeToolResult(raw json.RawMessage) (*ToolResult, error) {
	var r ToolResult
	if len(raw) == 0 {
		return &r, nil
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// ToolExecutionEvent decodes any of tool_execution_start, _update and _end,
// for listeners that treat them alike.
type ToolExecutionEvent struct {
	ToolCallID    string          `json:"toolCallId"`
	ToolName      string          `json:"toolName"`
	Args          json.RawMessage `json:"args,omitempty"`
	PartialResult json.RawMessage `json:"partialResult,omitempty"`
	Result        json.RawMessage `json:"result,omitempty"`
	IsError       bool            `json:"isError,omitempty"`
}

// ToolStreamUpdateEvent streams a tool's custom update payload (omp).
type ToolStreamUpdateEvent struct {
	ToolCallID string          `json:"toolCallId"`
	ToolName   string          `json:"toolName"`
	Update     json.RawMessage `json:"update"`
}

// AutoRetryStartEvent announces a retry after a transient provider error.
// pi sends it after the failed run's agent_end: the run resumes after
// DelayMs, so an agent_end whose last message failed is not final while a
// retry is pending.
type AutoRetryStartEvent struct {
	Attempt      int    `json:"attempt"`
	MaxAttempts  int    `json:"maxAttempts"`
	DelayMs      int64  `json:"delayMs"`
	ErrorMessage string `json:"errorMessage"`
	// ErrorID is omp's structured error classifier.
	ErrorID int64 `json:"errorId,omitempty"`
}

// AutoRetryEndEvent ends a retry sequence: Success, or FinalError after the
// last attempt.
type AutoRetryEndEvent struct {
	Success    bool   `json:"success"`
	Attempt    int    `json:"attempt"`
	FinalError string `json:"finalError,omitempty"`
	// RetryErrors lists the attempts' errors (omp).
	RetryErrors json.RawMessage `json:"retryErrors,omitempty"`
}

// ExtensionErrorEvent reports an extension handler that threw.
type ExtensionErrorEvent struct {
	ExtensionPath string `json:"extensionPath"`
	// Event is the extension event being handled, e.g. "turn_end".
	Event string `json:"event"`
	Error string `json:"error"`
}

// Extension UI methods (ExtensionUIRequestEvent.Method). The dialogs
// (select, confirm, input, editor) want an extension_ui_response; the rest
// are fire-and-forget.
const (
	UIMethodSelect        = "select"
	UIMethodConfirm       = "confirm"
	UIMethodInput         = "input"
	UIMethodEditor        = "editor"
	UIMethodCancel        = "cancel" // omp: withdraws the dialog TargetID
	UIMethodNotify        = "notify"
	UIMethodSetStatus     = "setStatus"
	UIMethodSetWidget     = "setWidget"
	UIMethodSetTitle      = "setTitle"
	UIMethodSetEditorText = "set_editor_text"
	UIMethodOpenURL       = "open_url" // omp login flows
)

// UISelectOptionDetail describes the select option at the same index (omp).
type UISelectOptionDetail struct {
	Description string `json:"description,omitempty"`
}

// ExtensionUIRequestEvent is an extension's UI request. Which fields are set
// depends on Method:
//
//	select          Title, Options, OptionDetails (omp), Timeout
//	confirm         Title, Message, Timeout
//	input           Title, Placeholder, Timeout
//	editor          Title, Prefill, PromptStyle (omp)
//	cancel          TargetID (omp)
//	notify          Message, NotifyType
//	setStatus       StatusKey, StatusText (nil clears)
//	setWidget       WidgetKey, WidgetLines (nil clears), WidgetPlacement
//	setTitle        Title
//	set_editor_text Text
//	open_url        URL, LaunchURL, Instructions (omp)
//
// Timeout is in milliseconds; the agent resolves a timed dialog itself.
type ExtensionUIRequestEvent struct {
	ID              string                 `json:"id"`
	Method          string                 `json:"method"`
	Title           string                 `json:"title,omitempty"`
	Message         string                 `json:"message,omitempty"`
	Options         []string               `json:"options,omitempty"`
	OptionDetails   []UISelectOptionDetail `json:"optionDetails,omitempty"`
	Placeholder     string                 `json:"placeholder,omitempty"`
	Prefill         string                 `json:"prefill,omitempty"`
	PromptStyle     bool                   `json:"promptStyle,omitempty"`
	Timeout         int64                  `json:"timeout,omitempty"`
	TargetID        string                 `json:"targetId,omitempty"`
	NotifyType      string                 `json:"notifyType,omitempty"`
	StatusKey       string                 `json:"statusKey,omitempty"`
	StatusText      *string                `json:"statusText,omitempty"`
	WidgetKey       string                 `json:"widgetKey,omitempty"`
	WidgetLines     []string               `json:"widgetLines,omitempty"`
	WidgetPlacement string                 `json:"widgetPlacement,omitempty"`
	Text            string                 `json:"text,omitempty"`
	URL             string                 `json:"url,omitempty"`
	LaunchURL       string                 `json:"launchUrl,omitempty"`
	Instructions    string                 `json:"instructions,omitempty"`
	// Start and End are the request frame's position in the agent's
	// stdout, as Event.End (set on the request a UIHandler gets; not on
	// the wire).
	Start int64 `json:"-"`
	End   int64 `json:"-"`
}

// ThinkingLevelChangedEvent reports a new thinking level. omp names the
// field thinkingLevel (absent when thinking is off for a non-reasoning
// model), pi names it level; use Current.
type ThinkingLevelChangedEvent struct {
	ThinkingLevel string `json:"thinkingLevel,omitempty"` // omp
	Level         string `json:"level,omitempty"`         // pi
	// Configured is the user's selector when it differs, e.g. "auto" (omp).
	Configured string `json:"configured,omitempty"`
	// Resolved is the level "auto" resolved to (omp).
	Resolved string `json:"resolved,omitempty"`
}

// Current returns the new level from either agent's field; "" means off or
// not applicable.
func (e *ThinkingLevelChangedEvent) Current() string {
	if e.ThinkingLevel != "" {
		return e.ThinkingLevel
	}
	return e.Level
}

// PromptResultEvent reports that the prompt ID resolved without invoking the
// agent, e.g. a local slash command (omp). Such a prompt sends no agent_end.
type PromptResultEvent struct {
	ID           string `json:"id,omitempty"`
	AgentInvoked bool   `json:"agentInvoked"`
}

// AutoCompactionStartEvent announces omp's automatic compaction.
type AutoCompactionStartEvent struct {
	// Reason is "threshold", "overflow", "idle" or "incomplete".
	Reason string `json:"reason"`
	// Action is "context-full", "remote", "handoff", "shake" or "snapcompact".
	Action string `json:"action"`
}

// AutoCompactionEndEvent ends omp's automatic compaction. WillRetry says
// the interrupted prompt is retried.
type AutoCompactionEndEvent struct {
	Action       string            `json:"action"`
	Result       *CompactionResult `json:"result,omitempty"`
	Aborted      bool              `json:"aborted"`
	WillRetry    bool              `json:"willRetry"`
	ErrorMessage string            `json:"errorMessage,omitempty"`
	// Skipped marks a compaction skipped for a benign reason.
	Skipped bool `json:"skipped"`
}

// CompactionStartEvent announces a compaction (pi), manual or automatic.
type CompactionStartEvent struct {
	// Reason is "manual", "threshold" or "overflow".
	Reason string `json:"reason"`
}

// CompactionEndEvent ends a compaction (pi). Result is nil when it was
// aborted or failed (ErrorMessage); WillRetry says the prompt is retried.
type CompactionEndEvent struct {
	Reason       string            `json:"reason"`
	Result       *CompactionResult `json:"result,omitempty"`
	Aborted      bool              `json:"aborted"`
	WillRetry    bool              `json:"willRetry"`
	ErrorMessage string            `json:"errorMessage,omitempty"`
}

// NoticeEvent is an informational message from omp.
type NoticeEvent struct {
	// Level is "info", "warning" or "error".
	Level   string `json:"level"`
	Message string `json:"message"`
	Source  string `json:"source,omitempty"`
}

// ModelChangedEvent says omp's model changed; get_state tells which.
type ModelChangedEvent struct{}

// QueueUpdateEvent reports pi's pending steering and follow-up messages
// after every change.
type QueueUpdateEvent struct {
	Steering []string `json:"steering"`
	FollowUp []string `json:"followUp"`
}

// SessionInfoChangedEvent reports pi's session name; empty when cleared.
type SessionInfoChangedEvent struct {
	Name string `json:"name,omitempty"`
}

// SessionInfoUpdateEvent reports omp's session title after a builtin slash
// command changed it.
type SessionInfoUpdateEvent struct {
	Title     string `json:"title,omitempty"`
	SessionID string `json:"sessionId"`
}

// ConfigUpdateEvent reports omp's model and thinking level after a builtin
// slash command changed them.
type ConfigUpdateEvent struct {
	Model         *Model `json:"model,omitempty"`
	ThinkingLevel string `json:"thinkingLevel,omitempty"`
}

// CommandOutputEvent is text printed by one of omp's builtin slash commands.
type CommandOutputEvent struct {
	Text string `json:"text"`
}

// HostToolCallEvent asks the host to run one of its tools (omp). Answer with
// host_tool_result frames carrying ID.
type HostToolCallEvent struct {
	ID         string          `json:"id"`
	ToolCallID string          `json:"toolCallId"`
	ToolName   string          `json:"toolName"`
	Arguments  json.RawMessage `json:"arguments"`
}

// HostToolCancelEvent withdraws the host tool call TargetID (omp); a late
// result is ignored.
type HostToolCancelEvent struct {
	ID       string `json:"id"`
	TargetID string `json:"targetId"`
}

// HostURIRequestEvent asks the host to read or write a URL of a scheme it
// registered (omp). Content is the full new content of a "write".
type HostURIRequestEvent struct {
	ID string `json:"id"`
	// Operation is "read" or "write".
	Operation string  `json:"operation"`
	URL       string  `json:"url"`
	Content   *string `json:"content,omitempty"`
}

// HostURICancelEvent withdraws the host URI request TargetID (omp).
type HostURICancelEvent struct {
	ID       string `json:"id"`
	TargetID string `json:"targetId"`
}

// AvailableCommandsUpdateEvent lists omp's slash commands, at start and
// whenever they change.
type AvailableCommandsUpdateEvent struct {
	Commands []CommandInfo `json:"commands"`
}

// TodoReminderEvent says omp re-prompts the model because todos are still
// open; a new agent_start follows without an agent_end in between.
type TodoReminderEvent struct {
	Todos       []TodoItem `json:"todos"`
	Attempt     int        `json:"attempt"`
	MaxAttempts int        `json:"maxAttempts"`
}

// TodoAutoClearEvent says omp cleared a finished todo list.
type TodoAutoClearEvent struct{}

// RetryFallbackAppliedEvent says omp switched model role Role from From to
// To after errors.
type RetryFallbackAppliedEvent struct {
	From string `json:"from"`
	To   string `json:"to"`
	Role string `json:"role"`
}

// RetryFallbackSucceededEvent says a fallback model answered (omp).
type RetryFallbackSucceededEvent struct {
	Model string `json:"model"`
	Role  string `json:"role"`
}

// TTSRTriggeredEvent says omp's stream rules fired; Rules is kept raw.
type TTSRTriggeredEvent struct {
	Rules json.RawMessage `json:"rules"`
}

// AdvisorCostChangedEvent says omp's advisor cost changed (unsolicited).
type AdvisorCostChangedEvent struct{}

// AdvisorYieldedEvent says omp's advisor yielded.
type AdvisorYieldedEvent struct{}

// ConfigWarningsChangedEvent says omp's configuration warnings changed.
type ConfigWarningsChangedEvent struct{}

// IRCMessageEvent carries a custom message between omp agents.
type IRCMessageEvent struct {
	Message Message `json:"message"`
}

// GoalUpdatedEvent reports omp's goal mode state; Goal is null when cleared.
type GoalUpdatedEvent struct {
	Goal  json.RawMessage `json:"goal"`
	State json.RawMessage `json:"state,omitempty"`
}

// SubagentLifecycleEvent reports an omp subagent starting or finishing
// (set_subagent_subscription "progress" or "events"). Payload holds id,
// index, agent, agentSource, status ("started", "completed", "failed",
// "aborted"), sessionFile, parentToolCallId.
type SubagentLifecycleEvent struct {
	Payload json.RawMessage `json:"payload"`
}

// SubagentProgressEvent reports an omp subagent's progress (subscription
// "progress" or "events").
type SubagentProgressEvent struct {
	Payload json.RawMessage `json:"payload"`
}

// SubagentEventEvent forwards one event of an omp subagent (subscription
// "events"): Payload is {id, event}.
type SubagentEventEvent struct {
	Payload json.RawMessage `json:"payload"`
}

// The EventType methods name each struct's frame type.

func (AgentStartEvent) EventType() string              { return EventAgentStart }
func (AgentEndEvent) EventType() string                { return EventAgentEnd }
func (TurnStartEvent) EventType() string               { return EventTurnStart }
func (TurnEndEvent) EventType() string                 { return EventTurnEnd }
func (MessageStartEvent) EventType() string            { return EventMessageStart }
func (MessageUpdateEvent) EventType() string           { return EventMessageUpdate }
func (MessageEndEvent) EventType() string              { return EventMessageEnd }
func (ToolExecutionStartEvent) EventType() string      { return EventToolExecutionStart }
func (ToolExecutionUpdateEvent) EventType() string     { return EventToolExecutionUpdate }
func (ToolExecutionEndEvent) EventType() string        { return EventToolExecutionEnd }
func (AutoRetryStartEvent) EventType() string          { return EventAutoRetryStart }
func (AutoRetryEndEvent) EventType() string            { return EventAutoRetryEnd }
func (ExtensionErrorEvent) EventType() string          { return EventExtensionError }
func (ExtensionUIRequestEvent) EventType() string      { return EventExtensionUIRequest }
func (ThinkingLevelChangedEvent) EventType() string    { return EventThinkingLevelChanged }
func (ReadyEvent) EventType() string                   { return EventReady }
func (RPCFrameErrorEvent) EventType() string           { return EventRPCFrameError }
func (PromptResultEvent) EventType() string            { return EventPromptResult }
func (AutoCompactionStartEvent) EventType() string     { return EventAutoCompactionStart }
func (AutoCompactionEndEvent) EventType() string       { return EventAutoCompactionEnd }
func (NoticeEvent) EventType() string                  { return EventNotice }
func (ModelChangedEvent) EventType() string            { return EventModelChanged }
func (RetryFallbackAppliedEvent) EventType() string    { return EventRetryFallbackApplied }
func (RetryFallbackSucceededEvent) EventType() string  { return EventRetryFallbackSucceeded }
func (TTSRTriggeredEvent) EventType() string           { return EventTTSRTriggered }
func (TodoReminderEvent) EventType() string            { return EventTodoReminder }
func (TodoAutoClearEvent) EventType() string           { return EventTodoAutoClear }
func (AvailableCommandsUpdateEvent) EventType() string { return EventAvailableCommandsUpdate }
func (AdvisorCostChangedEvent) EventType() string      { return EventAdvisorCostChanged }
func (AdvisorYieldedEvent) EventType() string          { return EventAdvisorYielded }
func (ConfigWarningsChangedEvent) EventType() string   { return EventConfigWarningsChanged }
func (IRCMessageEvent) EventType() string              { return EventIRCMessage }
func (GoalUpdatedEvent) EventType() string             { return EventGoalUpdated }
func (ToolStreamUpdateEvent) EventType() string        { return EventToolStreamUpdate }
func (HostToolCallEvent) EventType() string            { return EventHostToolCall }
func (HostToolCancelEvent) EventType() string          { return EventHostToolCancel }
func (HostURIRequestEvent) EventType() string          { return EventHostURIRequest }
func (HostURICancelEvent) EventType() string           { return EventHostURICancel }
func (SubagentLifecycleEvent) EventType() string       { return EventSubagentLifecycle }
func (SubagentProgressEvent) EventType() string        { return EventSubagentProgress }
func (SubagentEventEvent) EventType() string           { return EventSubagentEvent }
func (CommandOutputEvent) EventType() string           { return EventCommandOutput }
func (SessionInfoUpdateEvent) EventType() string       { return EventSessionInfoUpdate }
func (ConfigUpdateEvent) EventType() string            { return EventConfigUpdate }
func (QueueUpdateEvent) EventType() string             { return EventQueueUpdate }
func (CompactionStartEvent) EventType() string         { return EventCompactionStart }
func (CompactionEndEvent) EventType() string           { return EventCompactionEnd }
func (SessionInfoChangedEvent) EventType() string      { return EventSessionInfoChanged }
