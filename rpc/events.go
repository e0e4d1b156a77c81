package rpc

import "encoding/json"

// Event types both agents send, and omp's and pi's own.
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
	EventResponse            = "response"
	// omp
	EventReady               = "ready"
	EventPromptResult        = "prompt_result"
	EventAutoCompactionStart = "auto_compaction_start"
	EventAutoCompactionEnd   = "auto_compaction_end"
	EventNotice              = "notice"
	EventModelChanged        = "model_changed"
	EventHostToolCall        = "host_tool_call"
	EventHostToolCancel      = "host_tool_cancel"
	// pi
	EventQueueUpdate     = "queue_update"
	EventCompactionStart = "compaction_start"
	EventCompactionEnd   = "compaction_end"
)

// ReadyEvent is omp's first frame.
type ReadyEvent struct {
	ProtocolVersion           int   `json:"protocolVersion"`
	SupportedProtocolVersions []int `json:"supportedProtocolVersions"`
	MaxFrameBytes             int64 `json:"maxFrameBytes"`
	MaxReassembledFrameBytes  int64 `json:"maxReassembledFrameBytes"`
}

// AgentEndEvent ends an agent run. omp may omit messages already streamed
// (MessageCount then says how many there were) and marks a run that will
// continue (after auto-compaction) with IsTerminal false.
type AgentEndEvent struct {
	Messages     []Message `json:"messages"`
	MessageCount *int      `json:"messageCount,omitempty"`
	IsTerminal   *bool     `json:"isTerminal,omitempty"`
}

// MessageEndEvent carries a finished message.
type MessageEndEvent struct {
	Message Message `json:"message"`
}

// MessageUpdateEvent repeats the partial message with the latest delta.
type MessageUpdateEvent struct {
	Message               Message         `json:"message"`
	AssistantMessageEvent json.RawMessage `json:"assistantMessageEvent,omitempty"`
}

// ToolExecutionEvent is tool_execution_start, _update and _end.
type ToolExecutionEvent struct {
	ToolCallID    string          `json:"toolCallId"`
	ToolName      string          `json:"toolName"`
	Args          json.RawMessage `json:"args,omitempty"`
	PartialResult json.RawMessage `json:"partialResult,omitempty"`
	Result        json.RawMessage `json:"result,omitempty"`
	IsError       bool            `json:"isError,omitempty"`
}

// PromptResultEvent reports whether a prompt invoked the agent (omp).
type PromptResultEvent struct {
	ID           string `json:"id,omitempty"`
	AgentInvoked bool   `json:"agentInvoked"`
}

// HostToolCallEvent asks the host to run one of its tools (omp).
type HostToolCallEvent struct {
	ID         string          `json:"id"`
	ToolCallID string          `json:"toolCallId"`
	ToolName   string          `json:"toolName"`
	Arguments  json.RawMessage `json:"arguments"`
}

// ExtensionUIRequestEvent is an extension's UI request: a dialog (select,
// confirm, input, editor) or a fire-and-forget method.
type ExtensionUIRequestEvent struct {
	ID          string   `json:"id"`
	Method      string   `json:"method"`
	Title       string   `json:"title,omitempty"`
	Message     string   `json:"message,omitempty"`
	Options     []string `json:"options,omitempty"`
	Placeholder string   `json:"placeholder,omitempty"`
	Prefill     string   `json:"prefill,omitempty"`
	Timeout     int64    `json:"timeout,omitempty"`
	TargetID    string   `json:"targetId,omitempty"`
	NotifyType  string   `json:"notifyType,omitempty"`
	StatusKey   string   `json:"statusKey,omitempty"`
	StatusText  string   `json:"statusText,omitempty"`
	Text        string   `json:"text,omitempty"`
	URL         string   `json:"url,omitempty"`
}
