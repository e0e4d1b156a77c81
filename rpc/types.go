package rpc

import (
	"encoding/json"
	"strings"
)

// ImageContent is an image attached to a prompt.
type ImageContent struct {
	Type     string `json:"type"` // "image"
	Data     string `json:"data"` // base64
	MimeType string `json:"mimeType"`
}

// ContentBlock is one block of a message's content: text, thinking, a tool
// call or an image. Fields not used by a block's type are empty.
type ContentBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	Thinking  string          `json:"thinking,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	Data      string          `json:"data,omitempty"`
	MimeType  string          `json:"mimeType,omitempty"`
}

// Usage is a message's token usage.
type Usage struct {
	Input       int64           `json:"input"`
	Output      int64           `json:"output"`
	CacheRead   int64           `json:"cacheRead"`
	CacheWrite  int64           `json:"cacheWrite"`
	TotalTokens int64           `json:"totalTokens"`
	Cost        json.RawMessage `json:"cost,omitempty"`
}

func (u *Usage) add(o *Usage) {
	u.Input += o.Input
	u.Output += o.Output
	u.CacheRead += o.CacheRead
	u.CacheWrite += o.CacheWrite
	u.TotalTokens += o.TotalTokens
}

// Message is an agent message: user, assistant, toolResult, or an agent's
// own kinds (bashExecution, custom, ...). Content may be a string for user
// messages on the wire; it is normalised to one text block.
type Message struct {
	Role         string         `json:"role"`
	Content      []ContentBlock `json:"-"`
	StopReason   string         `json:"stopReason,omitempty"`
	ErrorMessage string         `json:"errorMessage,omitempty"`
	Usage        *Usage         `json:"usage,omitempty"`
	API          string         `json:"api,omitempty"`
	Provider     string         `json:"provider,omitempty"`
	Model        string         `json:"model,omitempty"`
	ToolCallID   string         `json:"toolCallId,omitempty"`
	ToolName     string         `json:"toolName,omitempty"`
	IsError      bool           `json:"isError,omitempty"`
	Timestamp    int64          `json:"timestamp,omitempty"`
}

type messageAlias Message

// UnmarshalJSON accepts content as a string or as blocks.
func (m *Message) UnmarshalJSON(b []byte) error {
	var w struct {
		messageAlias
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*m = Message(w.messageAlias)
	m.Content = nil
	if len(w.Content) == 0 || string(w.Content) == "null" {
		return nil
	}
	if w.Content[0] == '"' {
		var s string
		if err := json.Unmarshal(w.Content, &s); err != nil {
			return err
		}
		m.Content = []ContentBlock{{Type: "text", Text: s}}
		return nil
	}
	return json.Unmarshal(w.Content, &m.Content)
}

// MarshalJSON writes content as blocks.
func (m Message) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		messageAlias
		Content []ContentBlock `json:"content"`
	}{messageAlias(m), m.Content})
}

// Text concatenates the message's text blocks.
func (m Message) Text() string {
	var b strings.Builder
	for _, c := range m.Content {
		if c.Type == "text" {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// Model is a model as the agents describe it.
type Model struct {
	ID            string          `json:"id"`
	Name          string          `json:"name,omitempty"`
	API           string          `json:"api,omitempty"`
	Provider      string          `json:"provider"`
	BaseURL       string          `json:"baseUrl,omitempty"`
	Reasoning     bool            `json:"reasoning,omitempty"`
	ContextWindow int64           `json:"contextWindow,omitempty"`
	MaxTokens     int64           `json:"maxTokens,omitempty"`
	Cost          json.RawMessage `json:"cost,omitempty"`
}

// State is get_state's answer, the union of omp's and pi's fields.
type State struct {
	Model                 *Model `json:"model,omitempty"`
	ThinkingLevel         string `json:"thinkingLevel,omitempty"`
	IsStreaming           bool   `json:"isStreaming"`
	IsCompacting          bool   `json:"isCompacting"`
	SteeringMode          string `json:"steeringMode,omitempty"`
	FollowUpMode          string `json:"followUpMode,omitempty"`
	InterruptMode         string `json:"interruptMode,omitempty"` // omp
	SessionFile           string `json:"sessionFile,omitempty"`
	SessionID             string `json:"sessionId"`
	SessionName           string `json:"sessionName,omitempty"`
	AutoCompactionEnabled bool   `json:"autoCompactionEnabled"`
	MessageCount          int    `json:"messageCount"`
	// QueuedMessageCount is omp's name, PendingMessageCount pi's; see Queued.
	QueuedMessageCount  int             `json:"queuedMessageCount,omitempty"`
	PendingMessageCount int             `json:"pendingMessageCount,omitempty"`
	FastModeEnabled     bool            `json:"fastModeEnabled,omitempty"` // omp
	TodoPhases          json.RawMessage `json:"todoPhases,omitempty"`      // omp
	ContextUsage        json.RawMessage `json:"contextUsage,omitempty"`    // omp
}

// Queued is the number of queued messages, whichever agent answered.
func (s *State) Queued() int { return s.QueuedMessageCount + s.PendingMessageCount }

// BashResult is the answer to the bash command.
type BashResult struct {
	Output         string `json:"output"`
	ExitCode       *int   `json:"exitCode,omitempty"`
	Cancelled      bool   `json:"cancelled"`
	Truncated      bool   `json:"truncated"`
	FullOutputPath string `json:"fullOutputPath,omitempty"`
}

// SessionStats is get_session_stats' answer.
type SessionStats struct {
	SessionFile       string          `json:"sessionFile,omitempty"`
	SessionID         string          `json:"sessionId"`
	UserMessages      int             `json:"userMessages"`
	AssistantMessages int             `json:"assistantMessages"`
	ToolCalls         int             `json:"toolCalls"`
	ToolResults       int             `json:"toolResults"`
	TotalMessages     int             `json:"totalMessages"`
	Tokens            json.RawMessage `json:"tokens,omitempty"`
	Cost              float64         `json:"cost"`
}

// HostToolDefinition is a host tool as omp's set_host_tools takes it.
type HostToolDefinition struct {
	Name        string          `json:"name"`
	Label       string          `json:"label,omitempty"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Hidden      bool            `json:"hidden,omitempty"`
	LoadMode    string          `json:"loadMode,omitempty"`
}
