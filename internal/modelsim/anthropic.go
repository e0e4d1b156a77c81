package modelsim

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strings"
)

// The Anthropic Messages API (POST /v1/messages), which Claude Code and claude-agent-acp speak.
// Requests are normalised into the same [Request] as the OpenAI paths, so one script drives all
// three APIs.

// anthropicRequest is the part of a Messages API request the server reads.
type anthropicRequest struct {
	Model    string          `json:"model"`
	Stream   bool            `json:"stream"`
	System   json.RawMessage `json:"system"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Name string `json:"name"`
	} `json:"tools"`
}

// anthropicBlock is one content block of a Messages API message.
type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`          // tool_use
	Name      string          `json:"name"`        // tool_use
	Input     json.RawMessage `json:"input"`       // tool_use
	ToolUseID string          `json:"tool_use_id"` // tool_result
	Content   json.RawMessage `json:"content"`     // tool_result: a string or text blocks
}

// parseAnthropic decodes and normalises a Messages API body. A user message's tool_result blocks
// become messages with Role "tool"; text sent beside them (Claude Code adds reminders there) is
// left out, so that "the last message is a tool result" holds as on the other APIs.
func parseAnthropic(body []byte) (Request, bool, error) {
	var ar anthropicRequest
	if err := json.Unmarshal(body, &ar); err != nil {
		return Request{}, false, fmt.Errorf("%w: %w", errBadRequest, err)
	}
	if len(ar.Messages) == 0 {
		return Request{}, false, fmt.Errorf("%w: messages is empty", errBadRequest)
	}
	req := Request{Model: ar.Model}
	if sys, err := anthropicText(ar.System); err != nil {
		return Request{}, false, fmt.Errorf("%w: system: %w", errBadRequest, err)
	} else if sys != "" {
		req.Messages = append(req.Messages, Message{Role: "system", Content: sys})
	}
	for _, m := range ar.Messages {
		blocks, err := anthropicBlocks(m.Content)
		if err != nil {
			return Request{}, false, fmt.Errorf("%w: message content: %w", errBadRequest, err)
		}
		var texts []string
		var calls []ToolCall
		var results []Message
		for _, b := range blocks {
			switch b.Type {
			case "text":
				texts = append(texts, b.Text)
			case "tool_use":
				args := "{}"
				if in := bytes.TrimSpace(b.Input); len(in) > 0 && string(in) != "null" {
					var buf bytes.Buffer
					if err := json.Compact(&buf, in); err != nil {
						return Request{}, false, fmt.Errorf("%w: tool_use input: %w", errBadRequest, err)
					}
					args = buf.String()
				}
				calls = append(calls, ToolCall{ID: b.ID, Name: b.Name, Arguments: args})
			case "tool_result":
				text, err := anthropicText(b.Content)
				if err != nil {
					return Request{}, false, fmt.Errorf("%w: tool_result content: %w", errBadRequest, err)
				}
				results = append(results, Message{Role: "tool", Content: text, ToolCallID: b.ToolUseID})
			default:
				// thinking, image, document, ...: carry no text the script looks at.
			}
		}
		if len(results) > 0 {
			req.Messages = append(req.Messages, results...)
			continue
		}
		req.Messages = append(req.Messages, Message{Role: m.Role, Content: strings.Join(texts, "\n"), ToolCalls: calls})
	}
	for _, t := range ar.Tools {
		if t.Name != "" {
			req.Tools = append(req.Tools, t.Name)
		}
	}
	return req, ar.Stream, nil
}

// anthropicBlocks reads a content value: a string (one text block), null, or a list of blocks.
func anthropicBlocks(raw json.RawMessage) ([]anthropicBlock, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return []anthropicBlock{{Type: "text", Text: s}}, nil
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return nil, err
	}
	return blocks, nil
}

// anthropicText flattens a content value to its text blocks joined by "\n".
func anthropicText(raw json.RawMessage) (string, error) {
	blocks, err := anthropicBlocks(raw)
	if err != nil {
		return "", err
	}
	var texts []string
	for _, b := range blocks {
		if b.Type == "text" {
			texts = append(texts, b.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// handleMessages serves POST /v1/messages.
func (s *Server) handleMessages(w *statusWriter, r *http.Request) int64 {
	return s.serveAPI(w, r, parseAnthropic, s.writeAnthropic, writeAnthropicError, true)
}

// handleCountTokens serves POST /v1/messages/count_tokens with the prompt tokens T of the formula
// the answers report (see [Usage]).
func (s *Server) handleCountTokens(w *statusWriter, r *http.Request) int64 {
	body, ok := readBody(w, r)
	if !ok {
		return int64(len(body))
	}
	req, _, err := parseAnthropic(body)
	req.Path, req.Raw = r.URL.Path, capRaw(body)
	s.record(req)
	if err != nil {
		writeAnthropicError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return int64(len(body))
	}
	writeJSON(w, http.StatusOK, map[string]int{"input_tokens": promptTokens(req)})
	return int64(len(body))
}

// writeAnthropic answers a Messages API request. A stream is: message_start, per content block
// (the text first, then each tool_use) content_block_start, its text_delta or input_json_delta
// pieces and content_block_stop, then message_delta with the stop reason and usage, and
// message_stop.
func (s *Server) writeAnthropic(ctx context.Context, w http.ResponseWriter, req Request, p plan, stream bool) {
	seq := s.nextID()
	u := req.Usage
	stop := "end_turn"
	if len(p.calls) > 0 {
		stop = "tool_use"
	}
	toolID := func(i int) string { return fmt.Sprintf("toolu_%d_%d", seq, i) }
	var content []any
	if p.text != "" || len(p.calls) == 0 {
		content = append(content, map[string]any{"type": "text", "text": p.text})
	}
	for i, c := range p.calls {
		content = append(content, map[string]any{
			"type": "tool_use", "id": toolID(i), "name": c.name, "input": json.RawMessage(c.args),
		})
	}
	msg := map[string]any{
		"id": fmt.Sprintf("msg_%d", seq), "type": "message", "role": "assistant",
		"model": cmp.Or(req.Model, modelName), "content": content,
		"stop_reason": stop, "stop_sequence": nil,
		"usage": anthropicUsage(u, u.Output),
	}
	if !stream {
		writeJSON(w, http.StatusOK, msg)
		return
	}

	ev := s.newSSE(ctx, w, p.delay)
	send := func(typ string, fields map[string]any) bool {
		fields["type"] = typ
		return ev.send(typ, fields)
	}
	start := maps.Clone(msg)
	start["content"] = []any{}
	start["stop_reason"] = nil
	start["usage"] = anthropicUsage(u, 1)
	if !send("message_start", map[string]any{"message": start}) {
		return
	}
	index := 0
	if p.text != "" || len(p.calls) == 0 {
		if !send("content_block_start", map[string]any{"index": index, "content_block": map[string]any{"type": "text", "text": ""}}) {
			return
		}
		for _, piece := range split(p.text) {
			if !send("content_block_delta", map[string]any{"index": index, "delta": map[string]any{"type": "text_delta", "text": piece}}) {
				return
			}
		}
		if !send("content_block_stop", map[string]any{"index": index}) {
			return
		}
		index++
	}
	for i, c := range p.calls {
		block := map[string]any{"type": "tool_use", "id": toolID(i), "name": c.name, "input": map[string]any{}}
		if !send("content_block_start", map[string]any{"index": index, "content_block": block}) {
			return
		}
		for _, piece := range split(c.args) {
			if !send("content_block_delta", map[string]any{"index": index, "delta": map[string]any{"type": "input_json_delta", "partial_json": piece}}) {
				return
			}
		}
		if !send("content_block_stop", map[string]any{"index": index}) {
			return
		}
		index++
	}
	if !send("message_delta", map[string]any{
		"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
		"usage": map[string]int{"output_tokens": u.Output},
	}) {
		return
	}
	send("message_stop", map[string]any{})
}

// anthropicUsage is u in the Messages API's shape, with output as its output_tokens.
func anthropicUsage(u Usage, output int) map[string]int {
	return map[string]int{
		"input_tokens": u.Input, "cache_read_input_tokens": u.CacheRead,
		"cache_creation_input_tokens": u.CacheWrite, "output_tokens": output,
	}
}

// writeAnthropicError writes the Messages API's error shape: {"type":"error","error":{"type","message"}}.
func writeAnthropicError(w http.ResponseWriter, code int, typ, msg string) {
	switch {
	case code == http.StatusTooManyRequests:
		typ = "rate_limit_error"
	case code >= 500 && typ == "server_error":
		typ = "api_error"
	}
	writeJSON(w, code, map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}})
}
