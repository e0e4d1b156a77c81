package rpc

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
)

// This file holds the data types shared by commands, responses and events:
// messages and their content, models, session state and the response
// payloads. Decoding ignores fields a type does not name; fields that only
// one agent sends are documented as such. Nested objects whose shape is
// large, unstable or rarely needed are kept as json.RawMessage.

// ImageContent is an image attached to a prompt, steer or follow-up. Data is
// base64 (standard encoding) and MimeType e.g. "image/png". An empty Type is
// sent as "image".
type ImageContent struct {
	Type     string `json:"type"`
	Data     string `json:"data"`
	MimeType string `json:"mimeType"`
}

// NewImage returns an ImageContent holding data, base64-encoded.
func NewImage(mimeType string, data []byte) ImageContent {
	return ImageContent{Type: "image", Data: base64.StdEncoding.EncodeToString(data), MimeType: mimeType}
}

// MarshalJSON writes the image, defaulting Type to "image".
func (i ImageContent) MarshalJSON() ([]byte, error) {
	type wire ImageContent
	w := wire(i)
	if w.Type == "" {
		w.Type = "image"
	}
	return json.Marshal(w)
}

// Content block types (ContentBlock.Type).
const (
	BlockText             = "text"
	BlockThinking         = "thinking"
	BlockRedactedThinking = "redactedThinking" // omp
	BlockImage            = "image"
	BlockToolCall         = "toolCall"
)

// ContentBlock is one element of a message's content: text, thinking,
// redacted thinking, an image or a tool call, told apart by Type. Fields of
// other block types stay empty. omp adds block types (e.g. "fallback") whose
// fields this type does not keep; their Type survives.
//
// Encoding writes only the fields of the block's type, so a text block is
// exactly {"type":"text","text":...}.
type ContentBlock struct {
	Type string `json:"type"`

	// Text is the text of a "text" block.
	Text string `json:"text,omitempty"`
	// TextSignature is provider metadata of a "text" block (omp).
	TextSignature string `json:"textSignature,omitempty"`

	// Thinking is the reasoning text of a "thinking" block.
	Thinking string `json:"thinking,omitempty"`
	// ThinkingSignature is provider metadata of a "thinking" block, e.g.
	// "reasoning_content" for OpenAI-compatible servers.
	ThinkingSignature string `json:"thinkingSignature,omitempty"`

	// Data is the base64 payload of an "image" block or the opaque payload
	// of a "redactedThinking" block.
	Data string `json:"data,omitempty"`
	// MimeType is the type of an "image" block's Data.
	MimeType string `json:"mimeType,omitempty"`

	// ID, Name and Arguments describe a "toolCall" block: the call's id (the
	// toolCallId of its result), the tool's name and its JSON arguments.
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	// Intent is the harness's summary of a tool call's purpose (omp).
	Intent string `json:"intent,omitempty"`
	// ThoughtSignature is Google's opaque signature on a tool call.
	ThoughtSignature string `json:"thoughtSignature,omitempty"`
}

// MarshalJSON writes the fields that belong to the block's type; for an
// unknown type it writes every non-empty field.
func (b ContentBlock) MarshalJSON() ([]byte, error) {
	type wire struct {
		Type              string          `json:"type"`
		Text              *string         `json:"text,omitempty"`
		TextSignature     string          `json:"textSignature,omitempty"`
		Thinking          *string         `json:"thinking,omitempty"`
		ThinkingSignature string          `json:"thinkingSignature,omitempty"`
		Data              *string         `json:"data,omitempty"`
		MimeType          *string         `json:"mimeType,omitempty"`
		ID                *string         `json:"id,omitempty"`
		Name              *string         `json:"name,omitempty"`
		Arguments         json.RawMessage `json:"arguments,omitempty"`
		Intent            string          `json:"intent,omitempty"`
		ThoughtSignature  string          `json:"thoughtSignature,omitempty"`
	}
	w := wire{
		Type:              b.Type,
		TextSignature:     b.TextSignature,
		ThinkingSignature: b.ThinkingSignature,
		Intent:            b.Intent,
		ThoughtSignature:  b.ThoughtSignature,
		Arguments:         b.Arguments,
	}
	nonEmpty := func(s *string) *string {
		if *s == "" {
			return nil
		}
		return s
	}
	switch b.Type {
	case BlockText:
		w.Text = &b.Text
	case BlockThinking:
		w.Thinking = &b.Thinking
	case BlockRedactedThinking:
		w.Data = &b.Data
	case BlockImage:
		w.Data, w.MimeType = &b.Data, &b.MimeType
	case BlockToolCall:
		w.ID, w.Name = &b.ID, &b.Name
		if len(w.Arguments) == 0 {
			w.Arguments = json.RawMessage(`{}`)
		}
	default:
		w.Text, w.Thinking = nonEmpty(&b.Text), nonEmpty(&b.Thinking)
		w.Data, w.MimeType = nonEmpty(&b.Data), nonEmpty(&b.MimeType)
		w.ID, w.Name = nonEmpty(&b.ID), nonEmpty(&b.Name)
	}
	return json.Marshal(w)
}

// UsageCost is the cost of a message's usage, in the model's currency units
// (dollars for priced models), per bucket and in total.
type UsageCost struct {
	Input      float64 `json:"input"`
	Output     float64 `json:"output"`
	CacheRead  float64 `json:"cacheRead"`
	CacheWrite float64 `json:"cacheWrite"`
	Total      float64 `json:"total"`
}

// Usage is the token usage of one assistant message.
type Usage struct {
	Input       int64 `json:"input"`
	Output      int64 `json:"output"`
	CacheRead   int64 `json:"cacheRead"`
	CacheWrite  int64 `json:"cacheWrite"`
	TotalTokens int64 `json:"totalTokens"`
	// ReasoningTokens is the part of Output spent on reasoning, when the
	// provider reports it (omp); 0 means unknown.
	ReasoningTokens int64     `json:"reasoningTokens,omitempty"`
	Cost            UsageCost `json:"cost"`
}

// add accumulates o into u; a nil o adds nothing.
func (u *Usage) add(o *Usage) {
	if o == nil {
		return
	}
	u.Input += o.Input
	u.Output += o.Output
	u.CacheRead += o.CacheRead
	u.CacheWrite += o.CacheWrite
	u.TotalTokens += o.TotalTokens
	u.ReasoningTokens += o.ReasoningTokens
	u.Cost.Input += o.Cost.Input
	u.Cost.Output += o.Cost.Output
	u.Cost.CacheRead += o.Cost.CacheRead
	u.Cost.CacheWrite += o.Cost.CacheWrite
	u.Cost.Total += o.Cost.Total
}

// Message roles (Message.Role).
const (
	RoleUser              = "user"
	RoleAssistant         = "assistant"
	RoleToolResult        = "toolResult"
	RoleDeveloper         = "developer"         // omp
	RoleBashExecution     = "bashExecution"     // the bash command's record
	RoleCustom            = "custom"            // extension and harness messages
	RoleBranchSummary     = "branchSummary"     // pi
	RoleCompactionSummary = "compactionSummary" // pi
)

// Stop reasons (Message.StopReason).
const (
	StopReasonStop    = "stop"
	StopReasonLength  = "length"
	StopReasonToolUse = "toolUse"
	StopReasonError   = "error"
	StopReasonAborted = "aborted"
)

// Message is one agent message (pi's and omp's AgentMessage): a user,
// assistant or tool-result message, or one of the agents' own kinds
// (bashExecution, custom, summaries). Fields not used by a role stay empty.
//
// Content is always decoded as blocks: a message whose content was a plain
// string holds one text block, and encodes back to the string form.
type Message struct {
	Role    string         `json:"role"`
	Content []ContentBlock `json:"content,omitempty"`
	// Timestamp is the message's creation time in Unix milliseconds.
	Timestamp int64 `json:"timestamp,omitempty"`

	// Attribution says who initiated a user or custom message, "user" or
	// "agent" (omp).
	Attribution string `json:"attribution,omitempty"`
	// Synthetic marks a user message the harness injected.
	Synthetic bool `json:"synthetic,omitempty"`
	// Steering marks a user message delivered as a steer (omp).
	Steering bool `json:"steering,omitempty"`

	// API, Provider and Model identify what produced an assistant message.
	API      string `json:"api,omitempty"`
	Provider string `json:"provider,omitempty"`
	Model    string `json:"model,omitempty"`
	// Usage is an assistant message's token usage.
	Usage *Usage `json:"usage,omitempty"`
	// StopReason is why an assistant message ended (StopReason* constants).
	StopReason string `json:"stopReason,omitempty"`
	// ErrorMessage explains a StopReason of "error" or "aborted".
	ErrorMessage string `json:"errorMessage,omitempty"`
	// ResponseID is the provider's id of the response.
	ResponseID string `json:"responseId,omitempty"`
	// Duration and TTFT are the request's duration and time to first token
	// in milliseconds (omp).
	Duration float64 `json:"duration,omitempty"`
	TTFT     float64 `json:"ttft,omitempty"`
	// CompletedAt is when the message finished streaming, in Unix
	// milliseconds on the agent's clock (omp).
	CompletedAt int64 `json:"completedAt,omitempty"`

	// ToolCallID and ToolName tie a toolResult message to its call.
	ToolCallID string `json:"toolCallId,omitempty"`
	ToolName   string `json:"toolName,omitempty"`
	// IsError marks a failed tool result.
	IsError bool `json:"isError,omitempty"`
	// Details is tool- or extension-specific data of a toolResult or custom
	// message.
	Details json.RawMessage `json:"details,omitempty"`

	// Command, Output, ExitCode, Cancelled, Truncated and FullOutputPath
	// describe a bashExecution message (a bash command run by the host).
	// ExitCode is nil when the command was killed.
	Command        string `json:"command,omitempty"`
	Output         string `json:"output,omitempty"`
	ExitCode       *int   `json:"exitCode,omitempty"`
	Cancelled      bool   `json:"cancelled,omitempty"`
	Truncated      bool   `json:"truncated,omitempty"`
	FullOutputPath string `json:"fullOutputPath,omitempty"`

	// CustomType and Display describe a custom message: its kind (e.g.
	// omp's "async-result") and whether a UI shows it.
	CustomType string `json:"customType,omitempty"`
	Display    bool   `json:"display,omitempty"`

	// Summary, FromID and TokensBefore describe pi's branchSummary and
	// compactionSummary messages.
	Summary      string `json:"summary,omitempty"`
	FromID       string `json:"fromId,omitempty"`
	TokensBefore int64  `json:"tokensBefore,omitempty"`

	// contentString records that Content arrived as a plain string.
	contentString bool
}

// messageFields is Message without its methods, for the codecs below.
type messageFields Message

// UnmarshalJSON decodes a message whose content is a string or an array of
// blocks.
func (m *Message) UnmarshalJSON(b []byte) error {
	*m = Message{}
	w := struct {
		*messageFields
		Content json.RawMessage `json:"content"`
	}{messageFields: (*messageFields)(m)}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	c := bytes.TrimSpace(w.Content)
	switch {
	case len(c) == 0 || bytes.Equal(c, []byte("null")):
	case c[0] == '"':
		var s string
		if err := json.Unmarshal(c, &s); err != nil {
			return err
		}
		m.Content = []ContentBlock{{Type: BlockText, Text: s}}
		m.contentString = true
	default:
		if err := json.Unmarshal(c, &m.Content); err != nil {
			return err
		}
	}
	return nil
}

// MarshalJSON encodes the message with the fields its role always carries
// (isError for a tool result, the bash fields for bashExecution, display for
// custom messages) even when zero, and string content back as a string.
func (m Message) MarshalJSON() ([]byte, error) {
	f := messageFields(m)
	// The outer fields shadow the embedded ones of the same JSON name.
	w := struct {
		*messageFields
		Content   json.RawMessage `json:"content,omitempty"`
		IsError   *bool           `json:"isError,omitempty"`
		Command   *string         `json:"command,omitempty"`
		Output    *string         `json:"output,omitempty"`
		Cancelled *bool           `json:"cancelled,omitempty"`
		Truncated *bool           `json:"truncated,omitempty"`
		Display   *bool           `json:"display,omitempty"`
	}{messageFields: &f}
	bash := m.Role == RoleBashExecution
	if m.IsError || m.Role == RoleToolResult {
		w.IsError = &f.IsError
	}
	if m.Command != "" || bash {
		w.Command = &f.Command
	}
	if m.Output != "" || bash {
		w.Output = &f.Output
	}
	if m.Cancelled || bash {
		w.Cancelled = &f.Cancelled
	}
	if m.Truncated || bash {
		w.Truncated = &f.Truncated
	}
	if m.Display || m.Role == RoleCustom {
		w.Display = &f.Display
	}
	var err error
	switch {
	case m.contentString && len(m.Content) == 1 && m.Content[0].Type == BlockText:
		w.Content, err = json.Marshal(m.Content[0].Text)
	case m.Content != nil:
		w.Content, err = json.Marshal(m.Content)
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(w)
}

// Text returns the concatenated text of the message's text blocks (no
// separator, as the agents' get_last_assistant_text does).
func (m *Message) Text() string {
	var b strings.Builder
	for _, c := range m.Content {
		if c.Type == BlockText {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// ToolCalls returns the message's tool-call blocks.
func (m *Message) ToolCalls() []ContentBlock {
	var calls []ContentBlock
	for _, c := range m.Content {
		if c.Type == BlockToolCall {
			calls = append(calls, c)
		}
	}
	return calls
}

// ToolResult is a tool's result as the agents report it in
// tool_execution_update/end events and as a host tool returns it.
type ToolResult struct {
	Content []ContentBlock  `json:"content"`
	Details json.RawMessage `json:"details,omitempty"`
}

// Text returns the concatenated text of the result's text blocks.
func (r *ToolResult) Text() string {
	m := Message{Content: r.Content}
	return m.Text()
}

// ModelCost is a model's price per million tokens, per bucket.
type ModelCost struct {
	Input      float64 `json:"input"`
	Output     float64 `json:"output"`
	CacheRead  float64 `json:"cacheRead"`
	CacheWrite float64 `json:"cacheWrite"`
}

// Model is a model the agent can use, as get_state, set_model and
// get_available_models report it.
type Model struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	API      string `json:"api"`
	Provider string `json:"provider"`
	BaseURL  string `json:"baseUrl"`
	// Reasoning says whether the model supports thinking levels.
	Reasoning bool `json:"reasoning"`
	// Input lists accepted input kinds: "text", "image".
	Input         []string  `json:"input"`
	Cost          ModelCost `json:"cost"`
	ContextWindow int64     `json:"contextWindow"`
	MaxTokens     int64     `json:"maxTokens"`
	// Thinking is omp's thinking capability description (mode, efforts).
	Thinking json.RawMessage `json:"thinking,omitempty"`
	// Compat is omp's resolved provider-compatibility record.
	Compat json.RawMessage `json:"compat,omitempty"`
}

// ContextUsage is the current context-window estimate. Tokens and Percent
// are nil right after a compaction until a new response reports usage (pi).
type ContextUsage struct {
	Tokens        *int64   `json:"tokens"`
	ContextWindow int64    `json:"contextWindow"`
	Percent       *float64 `json:"percent"`
}

// Todo task statuses (TodoItem.Status).
const (
	TodoPending    = "pending"
	TodoInProgress = "in_progress"
	TodoCompleted  = "completed"
	TodoAbandoned  = "abandoned"
	TodoBlocked    = "blocked"
)

// TodoItem is one task of omp's todo list.
type TodoItem struct {
	ID      string `json:"id,omitempty"`
	Content string `json:"content"`
	Status  string `json:"status"`
	// Blocker notes what a "blocked" task waits for.
	Blocker string `json:"blocker,omitempty"`
}

// TodoPhase is a named group of omp todo tasks.
type TodoPhase struct {
	ID    string     `json:"id,omitempty"`
	Name  string     `json:"name"`
	Tasks []TodoItem `json:"tasks"`
}

// State is the session state get_state returns: the union of omp's and pi's
// shapes. Fields marked (omp) are absent from pi's answer and stay zero.
type State struct {
	// Model is the current model; nil when none is selected.
	Model *Model `json:"model,omitempty"`
	// ThinkingLevel is the thinking level (Thinking* constants). omp omits
	// it for models without reasoning.
	ThinkingLevel string `json:"thinkingLevel,omitempty"`
	IsStreaming   bool   `json:"isStreaming"`
	IsCompacting  bool   `json:"isCompacting"`
	// SteeringMode and FollowUpMode are QueueMode* constants.
	SteeringMode string `json:"steeringMode"`
	FollowUpMode string `json:"followUpMode"`
	// InterruptMode is an Interrupt* constant (omp).
	InterruptMode string `json:"interruptMode,omitempty"`
	// SessionFile is the session's JSONL file; empty for in-memory sessions.
	SessionFile           string `json:"sessionFile,omitempty"`
	SessionID             string `json:"sessionId"`
	SessionName           string `json:"sessionName,omitempty"`
	AutoCompactionEnabled bool   `json:"autoCompactionEnabled"`
	MessageCount          int    `json:"messageCount"`
	// QueuedMessageCount (omp) and PendingMessageCount (pi) count the
	// steering and follow-up messages waiting; use Queued.
	QueuedMessageCount  int `json:"queuedMessageCount"`
	PendingMessageCount int `json:"pendingMessageCount"`
	// FastModeEnabled is the session's fast-mode setting, FastModeActive
	// whether fast mode is in effect (omp).
	FastModeEnabled bool `json:"fastModeEnabled"`
	FastModeActive  bool `json:"fastModeActive"`
	// TokensPerSecond is the recent output rate; nil when unknown (omp).
	TokensPerSecond *float64 `json:"tokensPerSecond,omitempty"`
	// TodoPhases is the todo list (omp).
	TodoPhases []TodoPhase `json:"todoPhases"`
	// SystemPrompt is the system prompt's parts (omp).
	SystemPrompt []string `json:"systemPrompt,omitempty"`
	// DumpTools describes the active tools: name, description, JSON
	// Schema parameters, examples (omp).
	DumpTools json.RawMessage `json:"dumpTools,omitempty"`
	// ContextUsage is the context-window estimate (omp).
	ContextUsage *ContextUsage `json:"contextUsage,omitempty"`
}

// Queued returns the number of queued steering and follow-up messages,
// whichever of omp's and pi's fields carried it.
func (s *State) Queued() int {
	return s.QueuedMessageCount + s.PendingMessageCount
}

// CycleModelResult is cycle_model's answer.
type CycleModelResult struct {
	Model Model `json:"model"`
	// ThinkingLevel is the level that applies with the new model; omp
	// omits it for models without reasoning.
	ThinkingLevel string `json:"thinkingLevel,omitempty"`
	// IsScoped says the cycle ran over the --models scope, not all models.
	IsScoped bool `json:"isScoped"`
}

// FastModeResult is set_fast_mode's answer (omp): the session setting and
// whether fast mode is actually in effect.
type FastModeResult struct {
	Enabled bool `json:"enabled"`
	Active  bool `json:"active"`
}

// CompactionResult is a compaction's outcome (compact, and the compaction
// end events).
type CompactionResult struct {
	Summary string `json:"summary"`
	// ShortSummary is a short display summary (omp).
	ShortSummary     string `json:"shortSummary,omitempty"`
	FirstKeptEntryID string `json:"firstKeptEntryId"`
	TokensBefore     int64  `json:"tokensBefore"`
	// Details is strategy- or extension-specific data.
	Details json.RawMessage `json:"details,omitempty"`
	// PreserveData is extension data kept with the compaction entry (omp).
	PreserveData json.RawMessage `json:"preserveData,omitempty"`
}

// BashResult is the bash command's answer. ExitCode is nil when the command
// was killed or cancelled. The line and byte counts, WorkingDir and TimedOut
// are omp's.
type BashResult struct {
	Output    string `json:"output"`
	ExitCode  *int   `json:"exitCode,omitempty"`
	Cancelled bool   `json:"cancelled"`
	Truncated bool   `json:"truncated"`
	// FullOutputPath holds the whole output when Output was truncated (pi).
	FullOutputPath string `json:"fullOutputPath,omitempty"`
	TimedOut       bool   `json:"timedOut,omitempty"`
	TotalLines     int64  `json:"totalLines,omitempty"`
	TotalBytes     int64  `json:"totalBytes,omitempty"`
	OutputLines    int64  `json:"outputLines,omitempty"`
	OutputBytes    int64  `json:"outputBytes,omitempty"`
	// ArtifactID names the stored full output (omp).
	ArtifactID string `json:"artifactId,omitempty"`
	WorkingDir string `json:"workingDir,omitempty"`
}

// TokenStats are a session's summed token counts. Reasoning is omp's.
type TokenStats struct {
	Input      int64 `json:"input"`
	Output     int64 `json:"output"`
	Reasoning  int64 `json:"reasoning"`
	CacheRead  int64 `json:"cacheRead"`
	CacheWrite int64 `json:"cacheWrite"`
	Total      int64 `json:"total"`
}

// SessionStats is get_session_stats' answer.
type SessionStats struct {
	SessionFile       string     `json:"sessionFile,omitempty"`
	SessionID         string     `json:"sessionId"`
	UserMessages      int        `json:"userMessages"`
	AssistantMessages int        `json:"assistantMessages"`
	ToolCalls         int        `json:"toolCalls"`
	ToolResults       int        `json:"toolResults"`
	TotalMessages     int        `json:"totalMessages"`
	Tokens            TokenStats `json:"tokens"`
	// Cost is the session's summed cost.
	Cost float64 `json:"cost"`
	// PremiumRequests counts Copilot premium requests (omp).
	PremiumRequests float64 `json:"premiumRequests"`
	// Credits are credit-metered costs, when the provider reports them (omp).
	Credits json.RawMessage `json:"credits,omitempty"`
	// RoutedModels counts finalized turns per provider-routed model (omp).
	RoutedModels map[string]int `json:"routedModels,omitempty"`
	ContextUsage *ContextUsage  `json:"contextUsage,omitempty"`
}

// Command sources (CommandInfo.Source).
const (
	CommandSourceBuiltin   = "builtin"   // omp
	CommandSourceSkill     = "skill"     // both
	CommandSourceExtension = "extension" // both
	CommandSourceCustom    = "custom"    // omp
	CommandSourceMCPPrompt = "mcp_prompt"
	CommandSourceFile      = "file"   // omp
	CommandSourcePrompt    = "prompt" // pi: a prompt template
)

// CommandInput describes a slash command's argument (omp).
type CommandInput struct {
	Hint string `json:"hint,omitempty"`
}

// SubcommandInfo is one subcommand of a slash command (omp).
type SubcommandInfo struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Usage       string `json:"usage,omitempty"`
}

// CommandSourceInfo says where a pi command was loaded from.
type CommandSourceInfo struct {
	Path    string `json:"path"`
	Source  string `json:"source"`
	Scope   string `json:"scope,omitempty"`
	Origin  string `json:"origin,omitempty"`
	BaseDir string `json:"baseDir,omitempty"`
}

// CommandInfo is a slash command the agent accepts in a prompt ("/name"),
// from omp's get_available_commands and available_commands_update or pi's
// get_commands.
type CommandInfo struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Source is a CommandSource* constant.
	Source      string           `json:"source"`
	Aliases     []string         `json:"aliases,omitempty"`     // omp
	Input       *CommandInput    `json:"input,omitempty"`       // omp
	Subcommands []SubcommandInfo `json:"subcommands,omitempty"` // omp
	// SourceInfo says where the command was loaded from (pi).
	SourceInfo *CommandSourceInfo `json:"sourceInfo,omitempty"`
}

// Host tool load modes (HostToolDefinition.LoadMode).
const (
	// LoadModeEssential shows the tool to the model directly.
	LoadModeEssential = "essential"
	// LoadModeDiscoverable offers the tool only as an xd:// device, omp's
	// default for host tools.
	LoadModeDiscoverable = "discoverable"
)

// HostToolDefinition is a host-owned tool offered to omp's model
// (set_host_tools). Parameters is a JSON Schema object.
type HostToolDefinition struct {
	Name        string          `json:"name"`
	Label       string          `json:"label,omitempty"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	// Hidden hides the tool from the model's tool list.
	Hidden bool `json:"hidden,omitempty"`
	// LoadMode is a LoadMode* constant; omp treats empty as discoverable.
	LoadMode string `json:"loadMode,omitempty"`
	// ReadsSkillURIs lets the tool read skill:// content.
	ReadsSkillURIs bool `json:"readsSkillUris,omitempty"`
}

// HostURIScheme is a URL scheme whose reads (and, when Writable, writes)
// omp forwards to the host as host_uri_request frames (set_host_uri_schemes).
// Scheme has no "://"; omp lowercases it.
type HostURIScheme struct {
	Scheme      string `json:"scheme"`
	Description string `json:"description,omitempty"`
	Writable    bool   `json:"writable,omitempty"`
	// Immutable suppresses hashline anchors for resolved content.
	Immutable bool `json:"immutable,omitempty"`
}

// BranchResult is omp's branch and pi's fork answer: the text of the user
// message branched from, and whether an extension cancelled the branch.
type BranchResult struct {
	Text      string `json:"text"`
	Cancelled bool   `json:"cancelled"`
}

// BranchMessage is a user message one can branch (omp) or fork (pi) from.
type BranchMessage struct {
	EntryID string `json:"entryId"`
	Text    string `json:"text"`
}

// HandoffResult is omp's handoff answer.
type HandoffResult struct {
	SavedPath string `json:"savedPath,omitempty"`
}

// MessagesPage is one page of omp's get_messages_page. NextCursor is empty on
// the last page.
type MessagesPage struct {
	Messages      []Message `json:"messages"`
	NextCursor    string    `json:"nextCursor,omitempty"`
	TotalMessages int       `json:"totalMessages"`
}

// Error codes get_messages_page failures carry (ResponseError.Code).
const (
	CodeSessionBusy = "session_busy"
	CodeStaleCursor = "stale_cursor"
)

// LoginProvider is an OAuth provider omp can log in to.
type LoginProvider struct {
	ID            string `json:"id"`
	Name          string `json:"name"`
	Available     bool   `json:"available"`
	Authenticated bool   `json:"authenticated"`
}

// SubagentSnapshot is one running omp subagent (get_subagents). Progress is
// the latest progress payload, kept raw.
type SubagentSnapshot struct {
	ID               string          `json:"id"`
	Index            int             `json:"index"`
	Agent            string          `json:"agent"`
	AgentSource      string          `json:"agentSource,omitempty"`
	Description      string          `json:"description,omitempty"`
	Status           string          `json:"status"`
	Task             string          `json:"task,omitempty"`
	Assignment       string          `json:"assignment,omitempty"`
	SessionFile      string          `json:"sessionFile,omitempty"`
	LastUpdate       int64           `json:"lastUpdate"`
	Progress         json.RawMessage `json:"progress,omitempty"`
	ParentToolCallID string          `json:"parentToolCallId,omitempty"`
}

// SubagentMessages is a slice of a subagent's transcript
// (get_subagent_messages): raw session entries and the messages among them,
// from FromByte up to NextByte. Reset says the file shrank and reading
// restarted at 0.
type SubagentMessages struct {
	SessionFile string          `json:"sessionFile"`
	FromByte    int64           `json:"fromByte"`
	NextByte    int64           `json:"nextByte"`
	Reset       bool            `json:"reset"`
	Entries     json.RawMessage `json:"entries"`
	Messages    []Message       `json:"messages"`
}
