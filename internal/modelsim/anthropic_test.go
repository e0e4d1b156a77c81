package modelsim_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/internal/modelsim"
)

// messagesBody builds a Messages API request body; tools are offered by name.
func messagesBody(stream bool, tools []string, msgs ...map[string]any) map[string]any {
	body := map[string]any{
		"model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": stream, "messages": msgs,
		"system": []any{map[string]any{"type": "text", "text": "be brief"}},
	}
	if len(tools) > 0 {
		var ts []any
		for _, name := range tools {
			ts = append(ts, map[string]any{"name": name, "input_schema": map[string]any{"type": "object"}})
		}
		body["tools"] = ts
	}
	return body
}

// anthropicEvent is the union of the stream events' fields the tests read.
type anthropicEvent struct {
	Type         string `json:"type"`
	Index        int    `json:"index"`
	ContentBlock struct {
		Type, ID, Name string
	} `json:"content_block"`
	Delta struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		PartialJSON string `json:"partial_json"`
		StopReason  string `json:"stop_reason"`
	} `json:"delta"`
	Message struct {
		ID, Role, Model string
		Usage           struct {
			InputTokens int `json:"input_tokens"`
		}
	} `json:"message"`
	Usage struct {
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

func TestServer_MessagesStreamToolUse(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	resp := post(t, s.URL()+"/messages?beta=true", messagesBody(true, []string{"Bash"},
		map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "text", "text": "<system-reminder>cwd</system-reminder>"},
			map[string]any{"type": "text", "text": `[[say:checking]] [[tool:Bash {"command":"echo hi"}]]`},
		}}))
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var types []string
	var text, args strings.Builder
	var textDeltas, argDeltas int
	var evs []anthropicEvent
	for i, raw := range readEvents(t, resp.Body) {
		var ev anthropicEvent
		if err := json.Unmarshal([]byte(raw.data), &ev); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if raw.name != ev.Type {
			t.Errorf("event %d: event line %q, type %q", i, raw.name, ev.Type)
		}
		evs = append(evs, ev)
		if len(types) == 0 || types[len(types)-1] != ev.Type {
			types = append(types, ev.Type)
		}
		switch ev.Delta.Type {
		case "text_delta":
			text.WriteString(ev.Delta.Text)
			textDeltas++
			if ev.Index != 0 {
				t.Errorf("text delta at index %d", ev.Index)
			}
		case "input_json_delta":
			args.WriteString(ev.Delta.PartialJSON)
			argDeltas++
			if ev.Index != 1 {
				t.Errorf("input_json_delta at index %d", ev.Index)
			}
		}
	}
	want := []string{"message_start", "content_block_start", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}
	if strings.Join(types, " ") != strings.Join(want, " ") {
		t.Fatalf("event order:\n got %v\nwant %v", types, want)
	}
	if text.String() != "checking" || textDeltas < 2 {
		t.Errorf("text %q in %d deltas", text.String(), textDeltas)
	}
	if args.String() != `{"command":"echo hi"}` || argDeltas < 2 {
		t.Errorf("input JSON %q in %d deltas", args.String(), argDeltas)
	}
	first := evs[0].Message
	if first.Role != "assistant" || first.Model != "claude-sonnet-4-5" || !strings.HasPrefix(first.ID, "msg_") || first.Usage.InputTokens < 1 {
		t.Errorf("message_start = %+v", first)
	}
	var toolStart anthropicEvent
	for _, ev := range evs {
		if ev.Type == "content_block_start" && ev.ContentBlock.Type == "tool_use" {
			toolStart = ev
		}
	}
	if toolStart.ContentBlock.Name != "Bash" || !strings.HasPrefix(toolStart.ContentBlock.ID, "toolu_") || toolStart.Index != 1 {
		t.Errorf("tool_use block start = %+v", toolStart)
	}
	end := evs[len(evs)-2]
	if end.Delta.StopReason != "tool_use" || end.Usage.OutputTokens < 1 {
		t.Errorf("message_delta = %+v", end)
	}

	reqs := s.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests logged", len(reqs))
	}
	r := reqs[0]
	if r.Path != "/v1/messages" || len(r.Messages) != 2 || r.Messages[0].Role != "system" || r.Messages[0].Content != "be brief" ||
		r.Messages[1].Role != "user" || len(r.Tools) != 1 || r.Tools[0] != "Bash" {
		t.Errorf("logged %+v", r)
	}
}

// The tool result comes back in a user message (with Claude Code's reminder text beside it): the
// answer is "done", and the normalised conversation has the call and its result.
func TestServer_MessagesToolResult(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	resp := post(t, s.URL()+"/messages", messagesBody(false, []string{"Bash"},
		map[string]any{"role": "user", "content": `[[tool:Bash {"command":"echo hi"}]]`},
		map[string]any{"role": "assistant", "content": []any{
			map[string]any{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": map[string]any{"command": "echo hi"}},
		}},
		map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": []any{map[string]any{"type": "text", "text": "hi"}}},
			map[string]any{"type": "text", "text": "<system-reminder>todo list is empty</system-reminder>"},
		}}))
	var got struct {
		Type, Role  string
		StopReason  string `json:"stop_reason"`
		Content     []struct{ Type, Text string }
		Usage       struct{ InputTokens, OutputTokens int }
		ContentType string
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || got.Type != "message" || got.Role != "assistant" || got.StopReason != "end_turn" ||
		len(got.Content) != 1 || got.Content[0].Type != "text" || got.Content[0].Text != "done" {
		t.Errorf("status %d, message %+v", resp.StatusCode, got)
	}
	msgs := s.Requests()[0].Messages
	if len(msgs) != 4 || msgs[2].Role != "assistant" || len(msgs[2].ToolCalls) != 1 || msgs[2].ToolCalls[0].ID != "toolu_1" ||
		msgs[2].ToolCalls[0].Arguments != `{"command":"echo hi"}` ||
		msgs[3].Role != "tool" || msgs[3].ToolCallID != "toolu_1" || msgs[3].Content != "hi" {
		t.Errorf("normalised messages = %+v", msgs)
	}
}

// Claude Code's first prompt also asks, without tools, for a title: a tool directive in the
// prompt must not become a call there, and the non-streamed answer is text.
func TestServer_MessagesTitleRequestGetsText(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	resp := post(t, s.URL()+"/messages", messagesBody(false, nil,
		map[string]any{"role": "user", "content": `[[tool:Bash {"command":"echo hi"}]]`}))
	var got struct {
		StopReason string `json:"stop_reason"`
		Content    []struct{ Type, Text string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || got.StopReason != "end_turn" || len(got.Content) != 1 ||
		got.Content[0].Type != "text" || !strings.HasPrefix(got.Content[0].Text, "ok: ") {
		t.Errorf("status %d, message %+v", resp.StatusCode, got)
	}
}

// Scripted statuses and bad requests come back in the Messages API's error shape, which the
// Anthropic SDK reads (and retries on 429 and 5xx).
func TestServer_MessagesErrors(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	cases := []struct {
		name     string
		body     any
		code     int
		typ      string
		inPrompt string
	}{
		{"rate limit", messagesBody(true, nil, map[string]any{"role": "user", "content": "[[status:429]]"}), 429, "rate_limit_error", ""},
		{"overloaded", messagesBody(true, nil, map[string]any{"role": "user", "content": "[[status:529]]"}), 529, "api_error", ""},
		{"no messages", messagesBody(true, nil), 400, "invalid_request_error", "messages is empty"},
		{"not JSON", []byte("{"), 400, "invalid_request_error", "bad request"},
		{"bad directive", messagesBody(true, nil, map[string]any{"role": "user", "content": "[[big:x]]"}), 400, "invalid_request_error", "[[big:x]]"},
	}
	for _, tc := range cases {
		resp := post(t, s.URL()+"/messages", tc.body)
		var got struct {
			Type  string
			Error struct{ Type, Message string }
		}
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if resp.StatusCode != tc.code || got.Type != "error" || got.Error.Type != tc.typ || !strings.Contains(got.Error.Message, tc.inPrompt) {
			t.Errorf("%s: status %d, body %+v; want %d %s", tc.name, resp.StatusCode, got, tc.code, tc.typ)
		}
	}
}

func TestServer_MessagesCountTokens(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	resp := post(t, s.URL()+"/messages/count_tokens", messagesBody(false, nil,
		map[string]any{"role": "user", "content": strings.Repeat("x", 400)}))
	var got struct {
		InputTokens int `json:"input_tokens"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	// 400 bytes of prompt and 8 of system text, at 4 bytes a token.
	if resp.StatusCode != http.StatusOK || got.InputTokens != 102 {
		t.Errorf("status %d, input_tokens %d, want 102", resp.StatusCode, got.InputTokens)
	}
}
