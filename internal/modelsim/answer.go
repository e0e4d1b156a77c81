package modelsim

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"time"
)

// handleChat serves POST /v1/chat/completions.
func (s *Server) handleChat(w *statusWriter, r *http.Request) int64 {
	return s.serveAPI(w, r, parseChat, s.writeChat, writeError, false)
}

// handleResponses serves POST /v1/responses.
func (s *Server) handleResponses(w *statusWriter, r *http.Request) int64 {
	return s.serveAPI(w, r, parseResponses, s.writeResponses, writeError, false)
}

// errorWriter writes an error in one API's shape.
type errorWriter func(w http.ResponseWriter, code int, typ, msg string)

// serveAPI is the flow shared by every API: read, parse, decide, log, answer. fail writes errors
// in the API's own shape; cacheWrite says whether the API reports cache writes (see [Usage]). It
// returns the body size for the log line.
func (s *Server) serveAPI(w *statusWriter, r *http.Request,
	parse func([]byte) (Request, bool, error),
	answer func(ctx context.Context, w http.ResponseWriter, req Request, p plan, stream bool),
	fail errorWriter, cacheWrite bool,
) int64 {
	body, ok := readBody(w, r)
	if !ok {
		return int64(len(body))
	}
	req, stream, err := parse(body)
	req.Path, req.Raw = r.URL.Path, capRaw(body)
	if err != nil {
		s.record(req)
		fail(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return int64(len(body))
	}
	p, err := s.decide(req)
	if err != nil {
		s.record(req)
		fail(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return int64(len(body))
	}
	if p.status != 0 {
		s.record(req)
		writeStatus(w, p.status, fail)
		return int64(len(body))
	}
	req.Usage = answerUsage(req, p, cacheWrite)
	s.record(req)
	answer(r.Context(), w, req, p, stream)
	return int64(len(body))
}

// sse writes server-sent events, pausing between them, until the client goes away or the
// server closes. It lives for one request, so it keeps that request's context.
type sse struct {
	w     http.ResponseWriter
	rc    *http.ResponseController
	ctx   context.Context
	quit  <-chan struct{}
	delay time.Duration
	sent  int
	err   error
}

func (s *Server) newSSE(ctx context.Context, w http.ResponseWriter, delay time.Duration) *sse {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &sse{w: w, rc: http.NewResponseController(w), ctx: ctx, quit: s.quit, delay: delay}
}

// send writes one event (an "event:" line only when event is not ""). It reports false once the
// stream is dead; later calls do nothing.
func (e *sse) send(event string, v any) bool {
	data, err := json.Marshal(v)
	if err != nil {
		e.err = fmt.Errorf("modelsim: encoding event: %w", err)
		return false
	}
	return e.sendRaw(event, data)
}

func (e *sse) sendRaw(event string, data []byte) bool {
	if e.err != nil {
		return false
	}
	if e.sent > 0 && e.delay > 0 {
		t := time.NewTimer(e.delay)
		select {
		case <-t.C:
		case <-e.ctx.Done():
			t.Stop()
			e.err = e.ctx.Err()
			return false
		case <-e.quit:
			t.Stop()
			e.err = ErrClosed
			return false
		}
	}
	buf := make([]byte, 0, len(data)+len(event)+16)
	if event != "" {
		buf = append(buf, "event: "...)
		buf = append(buf, event...)
		buf = append(buf, '\n')
	}
	buf = append(buf, "data: "...)
	buf = append(buf, data...)
	buf = append(buf, "\n\n"...)
	if _, err := e.w.Write(buf); err != nil {
		e.err = err
		return false
	}
	if err := e.rc.Flush(); err != nil {
		e.err = err
		return false
	}
	e.sent++
	return true
}

// Chat completions wire types.
type (
	chatChunk struct {
		ID      string       `json:"id"`
		Object  string       `json:"object"`
		Created int64        `json:"created"`
		Model   string       `json:"model"`
		Choices []chatChoice `json:"choices"`
		Usage   *chatUsage   `json:"usage,omitempty"`
	}
	chatChoice struct {
		Index        int          `json:"index"`
		Delta        *chatDelta   `json:"delta,omitempty"`
		Message      *chatMessage `json:"message,omitempty"`
		FinishReason *string      `json:"finish_reason"`
	}
	chatDelta struct {
		Role      string         `json:"role,omitempty"`
		Content   *string        `json:"content,omitempty"`
		ToolCalls []chatToolCall `json:"tool_calls,omitempty"`
	}
	chatMessage struct {
		Role      string         `json:"role"`
		Content   *string        `json:"content"`
		ToolCalls []chatToolCall `json:"tool_calls,omitempty"`
	}
	chatToolCall struct {
		Index    *int         `json:"index,omitempty"`
		ID       string       `json:"id,omitempty"`
		Type     string       `json:"type,omitempty"`
		Function chatFunction `json:"function"`
	}
	chatFunction struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	}
	chatUsage struct {
		PromptTokens        int            `json:"prompt_tokens"`
		CompletionTokens    int            `json:"completion_tokens"`
		TotalTokens         int            `json:"total_tokens"`
		PromptTokensDetails map[string]int `json:"prompt_tokens_details"`
	}
)

// writeChat answers a chat completions request. A stream is: a role chunk, text deltas, tool
// call deltas (id and name first, then the arguments in pieces), a finish_reason chunk, a
// usage chunk with no choices, and [DONE].
func (s *Server) writeChat(ctx context.Context, w http.ResponseWriter, req Request, p plan, stream bool) {
	seq := s.nextID()
	id := fmt.Sprintf("chatcmpl-%d", seq)
	model := cmp.Or(req.Model, modelName)
	created := time.Now().Unix()
	finish := "stop"
	if len(p.calls) > 0 {
		finish = "tool_calls"
	}
	u := req.Usage
	cu := &chatUsage{PromptTokens: u.Prompt(), CompletionTokens: u.Output, TotalTokens: u.Prompt() + u.Output,
		PromptTokensDetails: map[string]int{"cached_tokens": u.CacheRead}}
	callID := func(i int) string { return fmt.Sprintf("call_%d_%d", seq, i) }

	if !stream {
		msg := &chatMessage{Role: "assistant"}
		if p.text != "" || len(p.calls) == 0 {
			msg.Content = &p.text
		}
		for i, c := range p.calls {
			msg.ToolCalls = append(msg.ToolCalls, chatToolCall{
				ID: callID(i), Type: "function", Function: chatFunction{Name: c.name, Arguments: c.args},
			})
		}
		writeJSON(w, http.StatusOK, chatChunk{
			ID: id, Object: "chat.completion", Created: created, Model: model,
			Choices: []chatChoice{{Message: msg, FinishReason: &finish}}, Usage: cu,
		})
		return
	}

	ev := s.newSSE(ctx, w, p.delay)
	chunk := func(d chatDelta, fin *string) bool {
		return ev.send("", chatChunk{
			ID: id, Object: "chat.completion.chunk", Created: created, Model: model,
			Choices: []chatChoice{{Delta: &d, FinishReason: fin}},
		})
	}
	empty := ""
	if !chunk(chatDelta{Role: "assistant", Content: &empty}, nil) {
		return
	}
	for _, piece := range split(p.text) {
		if !chunk(chatDelta{Content: &piece}, nil) {
			return
		}
	}
	for i, c := range p.calls {
		idx := i
		if !chunk(chatDelta{ToolCalls: []chatToolCall{{
			Index: &idx, ID: callID(i), Type: "function", Function: chatFunction{Name: c.name},
		}}}, nil) {
			return
		}
		for _, piece := range split(c.args) {
			if !chunk(chatDelta{ToolCalls: []chatToolCall{{Index: &idx, Function: chatFunction{Arguments: piece}}}}, nil) {
				return
			}
		}
	}
	if !chunk(chatDelta{}, &finish) {
		return
	}
	if !ev.send("", chatChunk{
		ID: id, Object: "chat.completion.chunk", Created: created, Model: model,
		Choices: []chatChoice{}, Usage: cu,
	}) {
		return
	}
	ev.sendRaw("", []byte("[DONE]"))
}

// Responses API wire types. Items are maps because their shape depends on their type.
type (
	respObject struct {
		ID        string     `json:"id"`
		Object    string     `json:"object"`
		CreatedAt int64      `json:"created_at"`
		Status    string     `json:"status"`
		Model     string     `json:"model"`
		Output    []any      `json:"output"`
		Usage     *respUsage `json:"usage"`
	}
	respUsage struct {
		InputTokens         int            `json:"input_tokens"`
		InputTokensDetails  map[string]int `json:"input_tokens_details"`
		OutputTokens        int            `json:"output_tokens"`
		OutputTokensDetails map[string]int `json:"output_tokens_details"`
		TotalTokens         int            `json:"total_tokens"`
	}
)

// writeResponses answers a Responses API request. A stream is: response.created,
// response.in_progress, then per output item output_item.added, its content_part / text or
// argument deltas and .done events, output_item.done, and finally response.completed carrying
// the whole response with usage. Every event has a sequence_number.
func (s *Server) writeResponses(ctx context.Context, w http.ResponseWriter, req Request, p plan, stream bool) {
	seq := s.nextID()
	u := req.Usage
	resp := respObject{
		ID: fmt.Sprintf("resp_%d", seq), Object: "response", CreatedAt: time.Now().Unix(),
		Status: "in_progress", Model: cmp.Or(req.Model, modelName), Output: []any{},
	}
	msgID := fmt.Sprintf("msg_%d", seq)
	textPart := func(text string) map[string]any {
		return map[string]any{"type": "output_text", "text": text, "annotations": []any{}}
	}
	message := func(status string, content []any) map[string]any {
		return map[string]any{"id": msgID, "type": "message", "status": status, "role": "assistant", "content": content}
	}
	call := func(i int, status, args string) map[string]any {
		c := p.calls[i]
		item := map[string]any{
			"id": fmt.Sprintf("fc_%d_%d", seq, i), "type": "function_call", "status": status,
			"call_id": fmt.Sprintf("call_%d_%d", seq, i), "name": c.name, "arguments": args,
		}
		// A namespaced tool is called by its own name within its namespace.
		if ns, ok := req.namespaced[c.name]; ok {
			item["namespace"], item["name"] = ns[0], ns[1]
		}
		return item
	}
	var final []any
	if p.text != "" || len(p.calls) == 0 {
		final = append(final, message("completed", []any{textPart(p.text)}))
	}
	for i, c := range p.calls {
		final = append(final, call(i, "completed", c.args))
	}
	completed := resp
	completed.Status = "completed"
	completed.Output = final
	completed.Usage = &respUsage{
		InputTokens: u.Prompt(), InputTokensDetails: map[string]int{"cached_tokens": u.CacheRead},
		OutputTokens: u.Output, OutputTokensDetails: map[string]int{"reasoning_tokens": 0},
		TotalTokens: u.Prompt() + u.Output,
	}
	if !stream {
		writeJSON(w, http.StatusOK, completed)
		return
	}

	ev := s.newSSE(ctx, w, p.delay)
	n := 0
	emit := func(typ string, fields map[string]any) bool {
		fields["type"] = typ
		fields["sequence_number"] = n
		n++
		return ev.send(typ, fields)
	}
	if !emit("response.created", map[string]any{"response": resp}) ||
		!emit("response.in_progress", map[string]any{"response": resp}) {
		return
	}
	out := 0
	if p.text != "" || len(p.calls) == 0 {
		with := func(extra map[string]any) map[string]any {
			m := map[string]any{"item_id": msgID, "output_index": out, "content_index": 0}
			maps.Copy(m, extra)
			return m
		}
		if !emit("response.output_item.added", map[string]any{"output_index": out, "item": message("in_progress", []any{})}) ||
			!emit("response.content_part.added", with(map[string]any{"part": textPart("")})) {
			return
		}
		for _, piece := range split(p.text) {
			if !emit("response.output_text.delta", with(map[string]any{"delta": piece, "logprobs": []any{}})) {
				return
			}
		}
		if !emit("response.output_text.done", with(map[string]any{"text": p.text, "logprobs": []any{}})) ||
			!emit("response.content_part.done", with(map[string]any{"part": textPart(p.text)})) ||
			!emit("response.output_item.done", map[string]any{"output_index": out, "item": final[out]}) {
			return
		}
		out++
	}
	for i, c := range p.calls {
		itemID := fmt.Sprintf("fc_%d_%d", seq, i)
		if !emit("response.output_item.added", map[string]any{"output_index": out, "item": call(i, "in_progress", "")}) {
			return
		}
		for _, piece := range split(c.args) {
			if !emit("response.function_call_arguments.delta", map[string]any{"item_id": itemID, "output_index": out, "delta": piece}) {
				return
			}
		}
		if !emit("response.function_call_arguments.done", map[string]any{"item_id": itemID, "output_index": out, "arguments": c.args}) ||
			!emit("response.output_item.done", map[string]any{"output_index": out, "item": final[out]}) {
			return
		}
		out++
	}
	emit("response.completed", map[string]any{"response": completed})
}

// writeStatus answers with a scripted HTTP error in the shape fail writes.
func writeStatus(w http.ResponseWriter, code int, fail errorWriter) {
	typ := "invalid_request_error"
	switch {
	case code == http.StatusTooManyRequests:
		typ = "rate_limit_exceeded"
		// Zero tells SDK clients to retry at once, so tests of retries stay fast.
		w.Header().Set("Retry-After", "0")
	case code >= 500:
		typ = "server_error"
	}
	fail(w, code, typ, "modelsim: scripted status "+strconv.Itoa(code))
}

// writeError writes {"error":{"message","type","param","code"}}.
func writeError(w http.ResponseWriter, code int, typ, msg string) {
	writeJSON(w, code, map[string]any{"error": map[string]any{
		"message": msg, "type": typ, "param": nil, "code": typ,
	}})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		// Only the server's own types reach here; failing to encode them is a bug.
		code = http.StatusInternalServerError
		data = []byte(`{"error":{"message":"modelsim: encoding failed","type":"server_error","param":null,"code":null}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(data, '\n'))
}
