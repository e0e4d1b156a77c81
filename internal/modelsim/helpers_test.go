package modelsim_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/modelsim"
)

// testTimeout bounds every request a test makes.
const testTimeout = 20 * time.Second

// start returns a started server that is closed when the test ends.
func start(t *testing.T, opts modelsim.Options) *modelsim.Server {
	t.Helper()
	s := modelsim.New(opts)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// client makes one-shot connections so no idle keep-alive goroutines outlive a test.
func client(t *testing.T) *http.Client {
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// do sends a request and returns the response; the body is closed when the test ends.
func do(t *testing.T, ctx context.Context, method, url string, body []byte) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client(t).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// post sends v (or a []byte as is) as JSON and returns the response.
func post(t *testing.T, url string, v any) *http.Response {
	t.Helper()
	body, ok := v.([]byte)
	if !ok {
		var err error
		if body, err = json.Marshal(v); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return do(t, ctx, http.MethodPost, url, body)
}

// event is one server-sent event.
type event struct {
	name string // the "event:" line, "" if none
	data string
}

// readEvents reads a whole SSE stream.
func readEvents(t *testing.T, r io.Reader) []event {
	t.Helper()
	var out []event
	var cur event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.data != "" || cur.name != "" {
				out = append(out, cur)
			}
			cur = event{}
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = strings.TrimPrefix(line, "data: ")
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading SSE: %v", err)
	}
	return out
}

// chat builds a chat completions request body.
func chat(stream bool, tools []string, msgs ...map[string]any) map[string]any {
	body := map[string]any{"model": "fake-model", "stream": stream, "messages": msgs}
	if len(tools) > 0 {
		var ts []any
		for _, name := range tools {
			ts = append(ts, map[string]any{"type": "function", "function": map[string]any{"name": name, "parameters": map[string]any{"type": "object"}}})
		}
		body["tools"] = ts
	}
	return body
}

func user(text string) map[string]any { return map[string]any{"role": "user", "content": text} }

// toolTurn is an assistant call of bash followed by its result.
func toolTurn(result string) []map[string]any {
	return []map[string]any{
		{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{
			"id": "call_x", "type": "function", "function": map[string]any{"name": "bash", "arguments": `{"command":"echo hi"}`},
		}}},
		{"role": "tool", "tool_call_id": "call_x", "content": result},
	}
}

// chatStream is a chat completion stream put back together.
type chatStream struct {
	roleFirst    bool
	textPieces   []string
	text         string
	calls        map[int]*reassembled
	finishReason string
	usage        map[string]int // the usage chunk's counts; prompt_tokens_details' as "cached_tokens"
	done         bool           // [DONE] was the last event
	usageLast    bool           // the usage chunk came right before [DONE] and had no choices
}

type reassembled struct {
	id, name  string
	argPieces []string
}

func (c *reassembled) args() string { return strings.Join(c.argPieces, "") }

// readChatStream parses and reassembles a chat completions stream, checking its framing.
func readChatStream(t *testing.T, resp *http.Response) chatStream {
	t.Helper()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type = %q", ct)
	}
	evs := readEvents(t, resp.Body)
	cs := chatStream{calls: map[int]*reassembled{}}
	for i, ev := range evs {
		if ev.data == "[DONE]" {
			cs.done = i == len(evs)-1
			continue
		}
		var chunk struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Role      string  `json:"role"`
					Content   *string `json:"content"`
					ToolCalls []struct {
						Index    int    `json:"index"`
						ID       string `json:"id"`
						Function struct {
							Name      string `json:"name"`
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens        int            `json:"prompt_tokens"`
				CompletionTokens    int            `json:"completion_tokens"`
				TotalTokens         int            `json:"total_tokens"`
				PromptTokensDetails map[string]int `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev.data), &chunk); err != nil {
			t.Fatalf("chunk %d: %v: %s", i, err, ev.data)
		}
		if chunk.Object != "chat.completion.chunk" {
			t.Errorf("chunk %d object = %q", i, chunk.Object)
		}
		if chunk.Usage != nil {
			u := chunk.Usage
			cs.usage = map[string]int{"prompt_tokens": u.PromptTokens, "completion_tokens": u.CompletionTokens,
				"total_tokens": u.TotalTokens, "cached_tokens": u.PromptTokensDetails["cached_tokens"]}
			cs.usageLast = len(chunk.Choices) == 0 && i == len(evs)-2
		}
		for _, ch := range chunk.Choices {
			if i == 0 && ch.Delta.Role == "assistant" {
				cs.roleFirst = true
			}
			if ch.Delta.Content != nil && *ch.Delta.Content != "" {
				cs.textPieces = append(cs.textPieces, *ch.Delta.Content)
			}
			for _, tc := range ch.Delta.ToolCalls {
				c := cs.calls[tc.Index]
				if c == nil {
					c = &reassembled{}
					cs.calls[tc.Index] = c
				}
				if tc.ID != "" {
					c.id = tc.ID
				}
				if tc.Function.Name != "" {
					c.name = tc.Function.Name
				}
				if tc.Function.Arguments != "" {
					c.argPieces = append(c.argPieces, tc.Function.Arguments)
				}
			}
			if ch.FinishReason != nil {
				cs.finishReason = *ch.FinishReason
			}
		}
	}
	cs.text = strings.Join(cs.textPieces, "")
	return cs
}

// logRecorder is a slog handler that keeps every record, so tests can wait for the line a
// handler writes when it returns and check what logs contain.
type logRecorder struct {
	mu      sync.Mutex
	records []string // message plus attributes, as text
	notify  chan struct{}
}

func newLogRecorder() *logRecorder { return &logRecorder{notify: make(chan struct{}, 1)} }

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.Key + "=" + a.Value.String())
		return true
	})
	l.mu.Lock()
	l.records = append(l.records, b.String())
	l.mu.Unlock()
	select {
	case l.notify <- struct{}{}:
	default:
	}
	return nil
}

func (l *logRecorder) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.records...)
}

// waitFor waits until some record contains all of parts, or fails the test at the deadline.
func (l *logRecorder) waitFor(t *testing.T, parts ...string) string {
	t.Helper()
	deadline := time.NewTimer(testTimeout)
	defer deadline.Stop()
	for {
		for _, rec := range l.all() {
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(rec, p)
			}
			if ok {
				return rec
			}
		}
		select {
		case <-l.notify:
		case <-deadline.C:
			t.Fatalf("no log record with %q; have %q", parts, l.all())
		}
	}
}
