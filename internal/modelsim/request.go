package modelsim

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
)

// modelName is the only model /v1/models lists.
const modelName = "fake-model"

// Request is one request as the server received it, for test assertions.
type Request struct {
	// Path is the URL path, e.g. "/v1/chat/completions".
	Path string
	// Model is the requested model ("" if the body was not valid JSON).
	Model string
	// Messages is the conversation, normalised across the chat and Responses APIs: system
	// instructions, user and assistant turns, and tool results (Role "tool").
	Messages []Message
	// Tools are the names of the tools the request offered, in order.
	Tools []string
	// Raw is the body, cut at 1 MiB.
	Raw []byte
	// Usage is the usage the answer reported (see [Usage] for the formula); zero when the
	// request got an error (a malformed request or directive, a scripted [[status]]) and for
	// GET /v1/models and /v1/messages/count_tokens.
	Usage Usage

	// namespaced maps the Responses API's namespaced tools, listed in Tools as NAMESPACE__NAME,
	// to their namespace and name: a call of one must name both.
	namespaced map[string][2]string
}

// Message is one normalised conversation entry.
type Message struct {
	// Role is "system", "developer", "user", "assistant" or "tool" (a tool result).
	Role string
	// Content is the text of the message, its text parts joined by "\n". Images are left out.
	Content string
	// ToolCallID is, for a tool result, the id of the call it answers.
	ToolCallID string
	// ToolCalls are, for an assistant message, the tool calls it made.
	ToolCalls []ToolCall
}

// ToolCall is a tool call made by the assistant in an earlier turn.
type ToolCall struct {
	ID        string
	Name      string
	Arguments string // the arguments as a JSON text
}

func (r Request) clone() Request {
	r.Messages = slices.Clone(r.Messages)
	for i := range r.Messages {
		r.Messages[i].ToolCalls = slices.Clone(r.Messages[i].ToolCalls)
	}
	r.Tools = slices.Clone(r.Tools)
	r.Raw = slices.Clone(r.Raw)
	return r
}

// errBadRequest marks errors that should become a 400.
var errBadRequest = errors.New("modelsim: bad request")

// readBody reads the body through the size limit. On error it has already written the response.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if r.Method != http.MethodPost {
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "modelsim: use POST")
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error",
				fmt.Sprintf("modelsim: body larger than %d bytes", maxBody))
			return nil, false
		}
		writeError(w, http.StatusBadRequest, "invalid_request_error", "modelsim: reading body: "+err.Error())
		return nil, false
	}
	return body, true
}

func capRaw(body []byte) []byte {
	return slices.Clone(body[:min(len(body), maxRaw)])
}

// chatRequest is the part of a chat completions request the server reads.
type chatRequest struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages []struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCallID string          `json:"tool_call_id"`
		ToolCalls  []struct {
			ID       string `json:"id"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"messages"`
	Tools []struct {
		Name     string `json:"name"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
}

// parseChat decodes and normalises a chat completions body.
func parseChat(body []byte) (Request, bool, error) {
	var cr chatRequest
	if err := json.Unmarshal(body, &cr); err != nil {
		return Request{}, false, fmt.Errorf("%w: %w", errBadRequest, err)
	}
	if len(cr.Messages) == 0 {
		return Request{}, false, fmt.Errorf("%w: messages is empty", errBadRequest)
	}
	req := Request{Model: cr.Model}
	for _, m := range cr.Messages {
		text, err := contentText(m.Content)
		if err != nil {
			return Request{}, false, fmt.Errorf("%w: message content: %w", errBadRequest, err)
		}
		msg := Message{Role: m.Role, Content: text, ToolCallID: m.ToolCallID}
		for _, tc := range m.ToolCalls {
			msg.ToolCalls = append(msg.ToolCalls, ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
		req.Messages = append(req.Messages, msg)
	}
	for _, t := range cr.Tools {
		if name := cmp.Or(t.Function.Name, t.Name); name != "" {
			req.Tools = append(req.Tools, name)
		}
	}
	return req, cr.Stream, nil
}

// responsesRequest is the part of a Responses API request the server reads.
type responsesRequest struct {
	Model        string          `json:"model"`
	Stream       bool            `json:"stream"`
	Instructions string          `json:"instructions"`
	Input        json.RawMessage `json:"input"`
	Tools        []struct {
		Type  string `json:"type"`
		Name  string `json:"name"`
		Tools []struct {
			Name string `json:"name"`
		} `json:"tools"` // a namespace's tools (codex puts each MCP server's in one)
	} `json:"tools"`
}

// responsesItem is one entry of a Responses API input list.
type responsesItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Input     string          `json:"input"`  // custom_tool_call
	Output    json.RawMessage `json:"output"` // function_call_output, custom_tool_call_output
}

// parseResponses decodes and normalises a Responses API body.
func parseResponses(body []byte) (Request, bool, error) {
	var rr responsesRequest
	if err := json.Unmarshal(body, &rr); err != nil {
		return Request{}, false, fmt.Errorf("%w: %w", errBadRequest, err)
	}
	req := Request{Model: rr.Model}
	if rr.Instructions != "" {
		req.Messages = append(req.Messages, Message{Role: "system", Content: rr.Instructions})
	}
	var items []responsesItem
	switch in := bytes.TrimSpace(rr.Input); {
	case len(in) == 0 || string(in) == "null":
	case in[0] == '"':
		var s string
		if err := json.Unmarshal(in, &s); err != nil {
			return Request{}, false, fmt.Errorf("%w: input: %w", errBadRequest, err)
		}
		items = []responsesItem{{Type: "message", Role: "user", Content: in}}
	default:
		if err := json.Unmarshal(in, &items); err != nil {
			return Request{}, false, fmt.Errorf("%w: input: %w", errBadRequest, err)
		}
	}
	for _, it := range items {
		switch it.Type {
		case "", "message":
			text, err := contentText(it.Content)
			if err != nil {
				return Request{}, false, fmt.Errorf("%w: input content: %w", errBadRequest, err)
			}
			req.Messages = append(req.Messages, Message{Role: it.Role, Content: text})
		case "function_call", "custom_tool_call":
			args := it.Arguments
			if it.Type == "custom_tool_call" {
				args = it.Input
			}
			call := ToolCall{ID: it.CallID, Name: it.Name, Arguments: args}
			// Consecutive calls and the text before them are one assistant turn, as in the chat API.
			if n := len(req.Messages); n > 0 && req.Messages[n-1].Role == "assistant" {
				req.Messages[n-1].ToolCalls = append(req.Messages[n-1].ToolCalls, call)
			} else {
				req.Messages = append(req.Messages, Message{Role: "assistant", ToolCalls: []ToolCall{call}})
			}
		case "function_call_output", "custom_tool_call_output":
			text, err := contentText(it.Output)
			if err != nil {
				return Request{}, false, fmt.Errorf("%w: tool output: %w", errBadRequest, err)
			}
			req.Messages = append(req.Messages, Message{Role: "tool", Content: text, ToolCallID: it.CallID})
		default:
			// reasoning, web_search_call, ...: carry no text the script looks at.
		}
	}
	if len(req.Messages) == 0 {
		return Request{}, false, fmt.Errorf("%w: input is empty", errBadRequest)
	}
	for _, t := range rr.Tools {
		if t.Type == "namespace" {
			for _, nt := range t.Tools {
				full := t.Name + "__" + nt.Name
				if req.namespaced == nil {
					req.namespaced = map[string][2]string{}
				}
				req.namespaced[full] = [2]string{t.Name, nt.Name}
				req.Tools = append(req.Tools, full)
			}
			continue
		}
		if t.Name != "" {
			req.Tools = append(req.Tools, t.Name)
		}
	}
	return req, rr.Stream, nil
}

// contentText flattens a content value: a string, null, or a list of parts of which the text
// parts ("text", "input_text", "output_text", "refusal") are joined by "\n".
func contentText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var parts []struct {
		Type    string `json:"type"`
		Text    string `json:"text"`
		Refusal string `json:"refusal"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", err
	}
	var texts []string
	for _, p := range parts {
		switch p.Type {
		case "text", "input_text", "output_text":
			texts = append(texts, p.Text)
		case "refusal":
			texts = append(texts, p.Refusal)
		}
	}
	return strings.Join(texts, "\n"), nil
}
