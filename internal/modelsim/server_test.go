package modelsim_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/modelsim"
)

func TestServer_ChatStreamText(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	tests := []struct {
		name string
		msgs []map[string]any
		want string
	}{
		{"echo", []map[string]any{user("hello there")}, "ok: hello there"},
		{"echo cut at 40 bytes", []map[string]any{user(strings.Repeat("abcdefghij", 6))}, "ok: " + strings.Repeat("abcdefghij", 4)},
		{"echo never splits a character", []map[string]any{user(strings.Repeat("a", 39) + "é and more")}, "ok: " + strings.Repeat("a", 39)},
		{"echo skips omp's system reminder", []map[string]any{user("<system-reminder>\nToday: x\n</system-reminder>\nhi")}, "ok: hi"},
		{"say", []map[string]any{user("please [[say:Hello, wörld!]]")}, "Hello, wörld!"},
		{"tool result answers done", append([]map[string]any{user(`[[tool:bash {"command":"echo hi"}]]`)}, toolTurn("hi\n")...), "done"},
		{"after", append([]map[string]any{user(`[[tool:bash {}]] [[after:all good]]`)}, toolTurn("hi\n")...), "all good"},
		{"tool directive without tools offered is text", []map[string]any{user(`[[tool:bash {}]][[say:no tools]]`)}, "no tools"},
		{"unknown brackets are text", []map[string]any{user("[[foo]] [[x:y]]")}, "ok: [[foo]] [[x:y]]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cs := readChatStream(t, post(t, s.URL()+"/chat/completions", chat(true, nil, tc.msgs...)))
			if cs.text != tc.want {
				t.Errorf("text = %q, want %q", cs.text, tc.want)
			}
			if !cs.roleFirst || cs.finishReason != "stop" || !cs.done || !cs.usageLast {
				t.Errorf("framing: roleFirst=%v finish=%q done=%v usageLast=%v", cs.roleFirst, cs.finishReason, cs.done, cs.usageLast)
			}
			if len(tc.want) >= 4 && len(cs.textPieces) < 2 {
				t.Errorf("text came in %d piece(s), want several", len(cs.textPieces))
			}
			if len(cs.calls) != 0 {
				t.Errorf("unexpected tool calls %v", cs.calls)
			}
		})
	}
}

func TestServer_ChatStreamToolCalls(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	prompt := `run [[tool:bash {"command": "echo ]] hi"}]] then [[tool:read {"path":"/tmp/x"}]] and [[tool:todo]]`
	cs := readChatStream(t, post(t, s.URL()+"/chat/completions", chat(true, []string{"bash", "read"}, user(prompt))))
	if cs.finishReason != "tool_calls" || !cs.done || !cs.usageLast {
		t.Errorf("framing: finish=%q done=%v usageLast=%v", cs.finishReason, cs.done, cs.usageLast)
	}
	want := []struct{ name, args string }{
		{"bash", `{"command":"echo ]] hi"}`},
		{"read", `{"path":"/tmp/x"}`},
		{"todo", `{}`}, // any tool name is honoured, offered or not
	}
	if len(cs.calls) != len(want) {
		t.Fatalf("got %d calls, want %d", len(cs.calls), len(want))
	}
	ids := map[string]bool{}
	for i, w := range want {
		c := cs.calls[i]
		if c == nil {
			t.Fatalf("no call at index %d", i)
		}
		if c.name != w.name || c.args() != w.args {
			t.Errorf("call %d = %s %s, want %s %s", i, c.name, c.args(), w.name, w.args)
		}
		if len(w.args) > 4 && len(c.argPieces) < 2 {
			t.Errorf("call %d arguments came in %d piece(s), want several", i, len(c.argPieces))
		}
		if c.id == "" || ids[c.id] {
			t.Errorf("call %d id %q is empty or repeated", i, c.id)
		}
		ids[c.id] = true
	}
	if cs.text != "" {
		t.Errorf("text = %q, want none", cs.text)
	}
}

func TestServer_ChatBig(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	for _, n := range []int{0, 5, 16 << 10, 100_000, 2 << 20} {
		cs := readChatStream(t, post(t, s.URL()+"/chat/completions", chat(true, nil, user("[[big:"+strconv.Itoa(n)+"]]"))))
		if len(cs.text) != n {
			t.Fatalf("big:%d gave %d bytes", n, len(cs.text))
		}
		if !strings.HasPrefix("lorem ipsum w0 w1 w2 w3 ", cs.text[:min(n, 24)]) {
			t.Errorf("big:%d starts %q", n, cs.text[:min(n, 24)])
		}
		for i, p := range cs.textPieces {
			if len(p) > 256<<10 {
				t.Errorf("big:%d piece %d is %d bytes, over 256 KiB", n, i, len(p))
			}
		}
		want := min(n, 2) // always reassembled from several pieces
		if n >= 1<<20 {
			want = n / (256 << 10)
		}
		if len(cs.textPieces) < want {
			t.Errorf("big:%d came in %d pieces, want at least %d", n, len(cs.textPieces), want)
		}
	}
}

func TestServer_ChatNonStream(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	resp := post(t, s.URL()+"/chat/completions", chat(false, []string{"bash"}, user(`[[say:look]] [[tool:bash {"command":"ls"}]]`)))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var got struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Role      string `json:"role"`
				Content   string `json:"content"`
				ToolCalls []struct {
					ID       string `json:"id"`
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			TotalTokens      int `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.Object != "chat.completion" || len(got.Choices) != 1 {
		t.Fatalf("got %+v", got)
	}
	c := got.Choices[0]
	if c.Message.Role != "assistant" || c.Message.Content != "look" || c.FinishReason != "tool_calls" ||
		len(c.Message.ToolCalls) != 1 || c.Message.ToolCalls[0].Function.Name != "bash" ||
		c.Message.ToolCalls[0].Function.Arguments != `{"command":"ls"}` {
		t.Errorf("choice = %+v", c)
	}
	if got.Usage.PromptTokens < 1 || got.Usage.TotalTokens != got.Usage.PromptTokens+got.Usage.CompletionTokens {
		t.Errorf("usage = %+v", got.Usage)
	}
}

// TestServer_UsageDeterministic checks token counts are bytes/4 of the conversation in and the
// answer out, and the same for the same request.
func TestServer_UsageDeterministic(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	prompt := strings.Repeat("x", 400) + "[[say:" + strings.Repeat("y", 80) + "]]"
	var first map[string]int
	for range 2 {
		cs := readChatStream(t, post(t, s.URL()+"/chat/completions", chat(true, nil, user(prompt))))
		if first == nil {
			first = cs.usage
		} else if cs.usage["prompt_tokens"] != first["prompt_tokens"] || cs.usage["completion_tokens"] != first["completion_tokens"] {
			t.Errorf("usage changed: %v then %v", first, cs.usage)
		}
	}
	if first["prompt_tokens"] != len(prompt)/4 || first["completion_tokens"] != 20 || first["total_tokens"] != len(prompt)/4+20 {
		t.Errorf("usage = %v, want prompt %d completion 20", first, len(prompt)/4)
	}
}

// responsesEvent is the union of the Responses API event fields the tests read.
type responsesEvent struct {
	Type         string          `json:"type"`
	Seq          int             `json:"sequence_number"`
	OutputIndex  int             `json:"output_index"`
	ItemID       string          `json:"item_id"`
	Delta        string          `json:"delta"`
	Text         string          `json:"text"`
	Arguments    string          `json:"arguments"`
	Item         json.RawMessage `json:"item"`
	ResponseJSON json.RawMessage `json:"response"`
}

type responsesItem struct {
	ID, Type, Status, Role, Name, Arguments string
	CallID                                  string `json:"call_id"`
	Content                                 []struct{ Type, Text string }
}

func TestServer_ResponsesStream(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	body := map[string]any{
		"model": "fake-model", "stream": true, "instructions": "be brief",
		"input": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "input_text", "text": `[[say:checking]] [[tool:bash {"command":"echo hi"}]]`},
		}}},
		"tools": []any{map[string]any{"type": "function", "name": "bash"}},
	}
	resp := post(t, s.URL()+"/responses", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var evs []responsesEvent
	for i, raw := range readEvents(t, resp.Body) {
		var ev responsesEvent
		if err := json.Unmarshal([]byte(raw.data), &ev); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if raw.name != ev.Type {
			t.Errorf("event %d: event line %q, type %q", i, raw.name, ev.Type)
		}
		if ev.Seq != i {
			t.Errorf("event %d has sequence_number %d", i, ev.Seq)
		}
		evs = append(evs, ev)
	}
	var types []string
	var text, args strings.Builder
	var textDeltas, argDeltas int
	var doneArgs string
	var items []responsesItem
	for _, ev := range evs {
		if len(types) == 0 || types[len(types)-1] != ev.Type {
			types = append(types, ev.Type)
		}
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
			textDeltas++
		case "response.function_call_arguments.delta":
			args.WriteString(ev.Delta)
			argDeltas++
		case "response.function_call_arguments.done":
			doneArgs = ev.Arguments
		case "response.output_item.done":
			var it responsesItem
			if err := json.Unmarshal(ev.Item, &it); err != nil {
				t.Fatal(err)
			}
			items = append(items, it)
		}
	}
	wantTypes := []string{
		"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.function_call_arguments.delta",
		"response.function_call_arguments.done", "response.output_item.done", "response.completed",
	}
	if strings.Join(types, " ") != strings.Join(wantTypes, " ") {
		t.Errorf("event order:\n got %v\nwant %v", types, wantTypes)
	}
	if text.String() != "checking" || textDeltas < 2 {
		t.Errorf("text %q in %d deltas", text.String(), textDeltas)
	}
	if args.String() != `{"command":"echo hi"}` || doneArgs != args.String() || argDeltas < 2 {
		t.Errorf("arguments %q (done %q) in %d deltas", args.String(), doneArgs, argDeltas)
	}
	if len(items) != 2 || items[0].Type != "message" || items[0].Content[0].Text != "checking" ||
		items[1].Type != "function_call" || items[1].Name != "bash" || items[1].CallID == "" ||
		!strings.HasPrefix(items[1].ID, "fc_") {
		t.Errorf("items = %+v", items)
	}
	var completed struct {
		Status string
		Output []responsesItem
		Usage  struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
			TotalTokens  int `json:"total_tokens"`
		}
	}
	if err := json.Unmarshal(evs[len(evs)-1].ResponseJSON, &completed); err != nil {
		t.Fatal(err)
	}
	if completed.Status != "completed" || len(completed.Output) != 2 || completed.Usage.InputTokens < 1 ||
		completed.Usage.TotalTokens != completed.Usage.InputTokens+completed.Usage.OutputTokens {
		t.Errorf("completed = %+v", completed)
	}

	reqs := s.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests logged", len(reqs))
	}
	r := reqs[0]
	if r.Path != "/v1/responses" || len(r.Messages) != 2 || r.Messages[0].Role != "system" || r.Messages[0].Content != "be brief" ||
		r.Messages[1].Role != "user" || len(r.Tools) != 1 || r.Tools[0] != "bash" {
		t.Errorf("logged %+v", r)
	}
}

func TestServer_ResponsesToolResult(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	body := map[string]any{
		"model": "fake-model", "stream": false,
		"input": []any{
			map[string]any{"role": "user", "content": `[[tool:bash {"command":"echo hi"}]]`},
			map[string]any{"type": "function_call", "call_id": "c1", "name": "bash", "arguments": `{"command":"echo hi"}`},
			map[string]any{"type": "function_call_output", "call_id": "c1", "output": "hi\n"},
		},
	}
	resp := post(t, s.URL()+"/responses", body)
	var got struct {
		Status string
		Output []responsesItem
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || got.Status != "completed" || len(got.Output) != 1 || got.Output[0].Content[0].Text != "done" {
		t.Errorf("status %d, response %+v", resp.StatusCode, got)
	}
	msgs := s.Requests()[0].Messages
	if len(msgs) != 3 || msgs[1].Role != "assistant" || len(msgs[1].ToolCalls) != 1 || msgs[1].ToolCalls[0].ID != "c1" ||
		msgs[2].Role != "tool" || msgs[2].ToolCallID != "c1" || msgs[2].Content != "hi\n" {
		t.Errorf("normalised messages = %+v", msgs)
	}
}

func TestServer_Status(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	send := func(prompt string) *http.Response {
		return post(t, s.URL()+"/chat/completions", chat(true, nil, user(prompt)))
	}
	// 429 once, with retry-after 0 and an OpenAI error body, then the normal answer.
	resp := send("[[status:429]] [[say:after the limit]]")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "0" {
		t.Errorf("first: status %d retry-after %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	var e struct {
		Error struct{ Message, Type string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Errorf("error body: %+v, %v", e, err)
	}
	if cs := readChatStream(t, send("[[status:429]] [[say:after the limit]]")); cs.text != "after the limit" {
		t.Errorf("second: text %q", cs.text)
	}
	// 500 twice, counted per exact message: another message has its own count.
	for i, want := range []int{500, 500, 200} {
		if resp := send("[[status:500 x2]]"); resp.StatusCode != want {
			t.Errorf("x2 attempt %d: status %d, want %d", i, resp.StatusCode, want)
		}
	}
	if resp := send("[[status:500 x2]] other"); resp.StatusCode != 500 {
		t.Errorf("other message: status %d, want 500", resp.StatusCode)
	}
}

func TestServer_BadRequests(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	huge := bytes.Repeat([]byte("x"), 32<<20+1)
	tests := []struct {
		name, method, path string
		body               []byte
		want               int
	}{
		{"bad JSON", "POST", "/chat/completions", []byte(`{"messages":`), 400},
		{"not an object", "POST", "/chat/completions", []byte(`[1,2]`), 400},
		{"no messages", "POST", "/chat/completions", []byte(`{"model":"m","messages":[]}`), 400},
		{"bad content", "POST", "/chat/completions", []byte(`{"messages":[{"role":"user","content":42}]}`), 400},
		{"bad responses input", "POST", "/responses", []byte(`{"input":{"a":1}}`), 400},
		{"empty responses input", "POST", "/responses", []byte(`{"input":[]}`), 400},
		{"bad tool JSON", "POST", "/chat/completions", []byte(`{"messages":[{"role":"user","content":"[[tool:bash {oops}]]"}]}`), 400},
		{"bad duration", "POST", "/chat/completions", []byte(`{"messages":[{"role":"user","content":"[[slow:soon]]"}]}`), 400},
		{"bad status", "POST", "/chat/completions", []byte(`{"messages":[{"role":"user","content":"[[status:200]]"}]}`), 400},
		{"big too big", "POST", "/chat/completions", []byte(`{"messages":[{"role":"user","content":"[[big:99999999999]]"}]}`), 400},
		{"body too large", "POST", "/chat/completions", huge, 413},
		{"GET completions", "GET", "/chat/completions", nil, 405},
		{"POST models", "POST", "/models", nil, 405},
		{"unknown path", "GET", "/embeddings", nil, 404},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
			defer cancel()
			resp := do(t, ctx, tc.method, s.URL()+tc.path, tc.body)
			if resp.StatusCode != tc.want {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.want)
			}
			var e struct {
				Error struct{ Message string }
			}
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Error.Message == "" {
				t.Errorf("want a JSON error body: %+v, %v", e, err)
			}
		})
	}
	// The server is still healthy afterwards.
	if cs := readChatStream(t, post(t, s.URL()+"/chat/completions", chat(true, nil, user("still there?")))); cs.text != "ok: still there?" {
		t.Errorf("after bad requests: %q", cs.text)
	}
}

func TestServer_Models(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	resp := do(t, ctx, http.MethodGet, s.URL()+"/models", nil)
	var got struct {
		Object string
		Data   []struct{ ID string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || got.Object != "list" || len(got.Data) != 1 || got.Data[0].ID != "fake-model" {
		t.Errorf("status %d, %+v", resp.StatusCode, got)
	}
}

// TestServer_SlowCancel checks that a slow answer stops as soon as the client goes away: the
// handler's log line (written when it returns) arrives long before the hour-long pause ends.
func TestServer_SlowCancel(t *testing.T) {
	t.Parallel()
	logs := newLogRecorder()
	s := start(t, modelsim.Options{Logger: slog.New(logs)})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	body, _ := json.Marshal(chat(true, nil, user("[[slow:1h]] [[say:never finished]]")))
	resp := do(t, ctx, http.MethodPost, s.URL()+"/chat/completions", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// The first chunk is not delayed; read it, then hang up mid-stream.
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}
	cancel()
	logs.waitFor(t, "modelsim: request", "path=/v1/chat/completions", "status=200")
}

// TestServer_SlowChunks checks [[slow]] spaces chunks out: four text pieces and the closing
// chunks mean at least six pauses.
func TestServer_SlowChunks(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	begin := time.Now()
	cs := readChatStream(t, post(t, s.URL()+"/chat/completions", chat(true, nil, user("[[slow:20ms]] [[say:abcd]]"))))
	if cs.text != "abcd" {
		t.Errorf("text %q", cs.text)
	}
	if d := time.Since(begin); d < 6*20*time.Millisecond {
		t.Errorf("stream took %v, want ≥ %v", d, 6*20*time.Millisecond)
	}
}

// TestServer_CloseDuringSlowStream checks Close ends a stream in progress and returns.
func TestServer_CloseDuringSlowStream(t *testing.T) {
	t.Parallel()
	s := modelsim.New(modelsim.Options{ChunkDelay: time.Hour})
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	resp := post(t, s.URL()+"/chat/completions", chat(true, nil, user("hi")))
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Close did not return while a slow stream was open")
	}
	// A cut stream may end in EOF or an error; either way the read must return.
	_, _ = io.Copy(io.Discard, r)
}

func TestServer_RequestLog(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{MaxLog: 2})
	msgs := []map[string]any{
		{"role": "system", "content": "sys"},
		{"role": "user", "content": []any{map[string]any{"type": "text", "text": "part one"}, map[string]any{"type": "image_url"}, map[string]any{"type": "text", "text": "part two"}}},
	}
	msgs = append(msgs, toolTurn("hi\n")...)
	for _, p := range []string{"first", "second"} {
		readChatStream(t, post(t, s.URL()+"/chat/completions", chat(true, nil, user(p))))
	}
	readChatStream(t, post(t, s.URL()+"/chat/completions", chat(true, []string{"bash", "read"}, msgs...)))

	reqs := s.Requests()
	if len(reqs) != 2 {
		t.Fatalf("kept %d requests, want MaxLog=2", len(reqs))
	}
	if reqs[0].Messages[0].Content != "second" {
		t.Errorf("oldest kept = %+v, want the second request", reqs[0].Messages)
	}
	r := reqs[1]
	want := []modelsim.Message{
		{Role: "system", Content: "sys"},
		{Role: "user", Content: "part one\npart two"},
		{Role: "assistant", ToolCalls: []modelsim.ToolCall{{ID: "call_x", Name: "bash", Arguments: `{"command":"echo hi"}`}}},
		{Role: "tool", Content: "hi\n", ToolCallID: "call_x"},
	}
	if r.Path != "/v1/chat/completions" || r.Model != "fake-model" || len(r.Tools) != 2 || r.Tools[1] != "read" {
		t.Errorf("logged %+v", r)
	}
	if len(r.Messages) != len(want) {
		t.Fatalf("messages = %+v", r.Messages)
	}
	for i := range want {
		g, w := r.Messages[i], want[i]
		if g.Role != w.Role || g.Content != w.Content || g.ToolCallID != w.ToolCallID || len(g.ToolCalls) != len(w.ToolCalls) ||
			(len(w.ToolCalls) > 0 && g.ToolCalls[0] != w.ToolCalls[0]) {
			t.Errorf("message %d = %+v, want %+v", i, g, w)
		}
	}
	if !json.Valid(r.Raw) {
		t.Errorf("Raw is not the JSON body")
	}
	// The log is a copy.
	r.Messages[0].Content = "changed"
	if s.Requests()[1].Messages[0].Content != "sys" {
		t.Error("Requests shares memory with the server")
	}
}

func TestServer_RawCapped(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	cs := readChatStream(t, post(t, s.URL()+"/chat/completions", chat(true, nil, user(strings.Repeat("z", 2<<20)))))
	if cs.text != "ok: "+strings.Repeat("z", 40) {
		t.Errorf("text %q", cs.text)
	}
	if got := len(s.Requests()[0].Raw); got != 1<<20 {
		t.Errorf("Raw is %d bytes, want 1 MiB", got)
	}
}

func TestServer_NoLog(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{MaxLog: -1})
	readChatStream(t, post(t, s.URL()+"/chat/completions", chat(true, nil, user("x"))))
	if n := len(s.Requests()); n != 0 {
		t.Errorf("MaxLog -1 kept %d requests", n)
	}
}

// TestServer_LogsCarryNoPayload checks the slog lines name path, status and sizes but never the
// prompt or the answer.
func TestServer_LogsCarryNoPayload(t *testing.T) {
	t.Parallel()
	logs := newLogRecorder()
	s := start(t, modelsim.Options{Logger: slog.New(logs)})
	readChatStream(t, post(t, s.URL()+"/chat/completions", chat(true, nil, user("secret-prompt [[say:secret-answer]]"))))
	logs.waitFor(t, "path=/v1/chat/completions", "status=200", "bytes_in=", "bytes_out=")
	for _, l := range logs.all() {
		if strings.Contains(l, "secret") {
			t.Errorf("log line carries payload: %s", l)
		}
	}
}

// TestServer_RequestLogAtDebug checks the per-request line is at debug level, so a server's
// default (info) log stays quiet while agents talk to the built-in model.
func TestServer_RequestLogAtDebug(t *testing.T) {
	t.Parallel()
	logs := newLogRecorder()
	s := start(t, modelsim.Options{Logger: slog.New(logs)})
	readChatStream(t, post(t, s.URL()+"/chat/completions", chat(true, nil, user("hello"))))
	if rec := logs.waitFor(t, "modelsim: request", "status=200"); !strings.HasPrefix(rec, "DEBUG ") {
		t.Errorf("request line %q: want it at debug level", rec)
	}
}

func TestServer_Lifecycle(t *testing.T) {
	t.Parallel()
	s := modelsim.New(modelsim.Options{})
	if s.URL() != "" {
		t.Errorf("URL before Start = %q", s.URL())
	}
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	url := s.URL()
	if !strings.HasPrefix(url, "http://127.0.0.1:") || !strings.HasSuffix(url, "/v1") {
		t.Errorf("URL = %q", url)
	}
	if err := s.Start(t.Context()); err != nil || s.URL() != url {
		t.Errorf("second Start: %v, URL %q", err, s.URL())
	}
	for i := range 3 {
		if err := s.Close(); err != nil {
			t.Errorf("Close #%d: %v", i+1, err)
		}
	}
	if err := s.Start(t.Context()); !errors.Is(err, modelsim.ErrClosed) {
		t.Errorf("Start after Close: %v, want ErrClosed", err)
	}
	// Closing a server that never started is fine too.
	if err := modelsim.New(modelsim.Options{}).Close(); err != nil {
		t.Errorf("Close unstarted: %v", err)
	}
}

func TestServer_Addr(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:0", "localhost:0", "127.0.0.1:8080", "127.0.0.1:11434", "127.0.0.1:1234", "nonsense"} {
		s := modelsim.New(modelsim.Options{Addr: addr})
		if err := s.Start(t.Context()); !errors.Is(err, modelsim.ErrAddr) {
			t.Errorf("Addr %q: %v, want ErrAddr", addr, err)
		}
		_ = s.Close()
	}
}

// codex offers each MCP server's tools in a namespace; a call of one names the namespace and the
// tool's own name, and the directive names it NAMESPACE__NAME as Request.Tools lists it.
func TestServer_ResponsesNamespacedTool(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	for _, stream := range []bool{false, true} {
		body := map[string]any{
			"model": "fake-model", "stream": stream,
			"input": `[[tool:mcp__probe__echo_upper {"text":"hi"}]]`,
			"tools": []any{
				map[string]any{"type": "function", "name": "exec_command"},
				map[string]any{"type": "namespace", "name": "mcp__probe", "tools": []any{
					map[string]any{"type": "function", "name": "echo_upper"},
				}},
			},
		}
		resp := post(t, s.URL()+"/responses", body)
		var items []map[string]any
		if !stream {
			var got struct{ Output []map[string]any }
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
				t.Fatal(err)
			}
			items = got.Output
		} else {
			for _, ev := range readEvents(t, resp.Body) {
				if ev.name == "response.output_item.added" {
					var x struct{ Item map[string]any }
					if err := json.Unmarshal([]byte(ev.data), &x); err != nil {
						t.Fatal(err)
					}
					items = append(items, x.Item)
				}
			}
		}
		if len(items) != 1 || items[0]["type"] != "function_call" || items[0]["name"] != "echo_upper" || items[0]["namespace"] != "mcp__probe" {
			t.Errorf("stream %v: items %v, want one call of echo_upper in namespace mcp__probe", stream, items)
		}
	}
	if tools := s.Requests()[0].Tools; len(tools) != 2 || tools[1] != "mcp__probe__echo_upper" {
		t.Errorf("tools %v", tools)
	}
}
