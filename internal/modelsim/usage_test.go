package modelsim_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/internal/modelsim"
)

// TestServer_Usage checks the documented usage formula on every API, streamed and not: the
// counts on the wire and in the request log are the ones computed by hand from the bytes of the
// conversation and of the answer.
func TestServer_Usage(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	// 40 bytes of system prompt and 488 of user text: P = 528, T = 132, CacheRead = 66. The
	// answer is 80 bytes of text: Output = 20.
	system := strings.Repeat("s", 40)
	prompt := strings.Repeat("x", 400) + "[[say:" + strings.Repeat("y", 80) + "]]"
	openai := modelsim.Usage{Input: 66, Output: 20, CacheRead: 66}
	// The Messages API also reports CacheWrite = T/4 = 33, and Input = 132-66-33.
	anthropic := modelsim.Usage{Input: 33, Output: 20, CacheRead: 66, CacheWrite: 33}
	// A tool call's name and arguments count as answer bytes: "bash" + {"command":"ls"} = 20
	// bytes, Output 5.
	toolPrompt := `[[tool:bash {"command":"ls"}]]`
	toolT := (40 + len(toolPrompt)) / 4
	tool := modelsim.Usage{Input: toolT - toolT/2, Output: 5, CacheRead: toolT / 2}
	toolAnthropic := modelsim.Usage{Input: toolT - toolT/2 - toolT/4, Output: 5, CacheRead: toolT / 2, CacheWrite: toolT / 4}

	chatBody := func(stream bool, text string) map[string]any {
		return chat(stream, []string{"bash"}, map[string]any{"role": "system", "content": system}, user(text))
	}
	respBody := func(stream bool, text string) map[string]any {
		return map[string]any{
			"model": "fake-model", "stream": stream, "instructions": system,
			"input": []any{map[string]any{"role": "user", "content": text}},
			"tools": []any{map[string]any{"type": "function", "name": "bash"}},
		}
	}
	msgBody := func(stream bool, text string) map[string]any {
		b := messagesBody(stream, []string{"bash"}, map[string]any{"role": "user", "content": text})
		b["system"] = system
		return b
	}
	cases := []struct {
		name string
		path string
		body func(stream bool, text string) map[string]any
		read func(t *testing.T, resp *http.Response, stream bool) modelsim.Usage
		text string
		want modelsim.Usage
	}{
		{"chat", "/chat/completions", chatBody, readChatUsage, prompt, openai},
		{"chat tool call", "/chat/completions", chatBody, readChatUsage, toolPrompt, tool},
		{"responses", "/responses", respBody, readResponsesUsage, prompt, openai},
		{"responses tool call", "/responses", respBody, readResponsesUsage, toolPrompt, tool},
		{"messages", "/messages", msgBody, readMessagesUsage, prompt, anthropic},
		{"messages tool call", "/messages", msgBody, readMessagesUsage, toolPrompt, toolAnthropic},
	}
	for _, c := range cases {
		for _, stream := range []bool{true, false} {
			name := c.name
			if stream {
				name += " stream"
			}
			t.Run(name, func(t *testing.T) {
				resp := post(t, s.URL()+c.path, c.body(stream, c.text))
				if resp.StatusCode != http.StatusOK {
					b, _ := io.ReadAll(resp.Body)
					t.Fatalf("status %d: %s", resp.StatusCode, b)
				}
				if got := c.read(t, resp, stream); got != c.want {
					t.Errorf("usage on the wire = %+v, want %+v", got, c.want)
				}
				if got := lastUsage(t, s, c.path, c.text); got != c.want {
					t.Errorf("Request.Usage = %+v, want %+v", got, c.want)
				}
			})
		}
	}
}

// lastUsage is the logged usage of the newest request on path whose last message is text.
func lastUsage(t *testing.T, s *modelsim.Server, path, text string) modelsim.Usage {
	t.Helper()
	reqs := s.Requests()
	for i := len(reqs) - 1; i >= 0; i-- {
		r := reqs[i]
		if r.Path == "/v1"+path && r.Messages[len(r.Messages)-1].Content == text {
			return r.Usage
		}
	}
	t.Fatalf("no request on %s in the log", path)
	return modelsim.Usage{}
}

// readChatUsage reads a chat completion's usage: prompt_tokens is the whole prompt, cached_tokens
// the part read from the cache.
func readChatUsage(t *testing.T, resp *http.Response, stream bool) modelsim.Usage {
	t.Helper()
	var u map[string]int
	if stream {
		cs := readChatStream(t, resp)
		if !cs.usageLast {
			t.Error("the usage chunk is not the last before [DONE]")
		}
		u = cs.usage
	} else {
		var got struct {
			Usage struct {
				PromptTokens        int            `json:"prompt_tokens"`
				CompletionTokens    int            `json:"completion_tokens"`
				TotalTokens         int            `json:"total_tokens"`
				PromptTokensDetails map[string]int `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
			t.Fatal(err)
		}
		u = map[string]int{"prompt_tokens": got.Usage.PromptTokens, "completion_tokens": got.Usage.CompletionTokens,
			"total_tokens": got.Usage.TotalTokens, "cached_tokens": got.Usage.PromptTokensDetails["cached_tokens"]}
	}
	if u["total_tokens"] != u["prompt_tokens"]+u["completion_tokens"] {
		t.Errorf("total_tokens %d is not prompt + completion in %v", u["total_tokens"], u)
	}
	return modelsim.Usage{Input: u["prompt_tokens"] - u["cached_tokens"], Output: u["completion_tokens"], CacheRead: u["cached_tokens"]}
}

// respUsage is the Responses API's usage object.
type respUsage struct {
	InputTokens        int            `json:"input_tokens"`
	InputTokensDetails map[string]int `json:"input_tokens_details"`
	OutputTokens       int            `json:"output_tokens"`
	TotalTokens        int            `json:"total_tokens"`
}

// readResponsesUsage reads a response's usage (from response.completed when streamed).
func readResponsesUsage(t *testing.T, resp *http.Response, stream bool) modelsim.Usage {
	t.Helper()
	var obj struct {
		Usage *respUsage `json:"usage"`
	}
	if stream {
		evs := readEvents(t, resp.Body)
		last := evs[len(evs)-1]
		if last.name != "response.completed" {
			t.Fatalf("last event %q, want response.completed", last.name)
		}
		var ev struct {
			Response json.RawMessage `json:"response"`
		}
		if err := json.Unmarshal([]byte(last.data), &ev); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(ev.Response, &obj); err != nil {
			t.Fatal(err)
		}
	} else if err := json.NewDecoder(resp.Body).Decode(&obj); err != nil {
		t.Fatal(err)
	}
	u := obj.Usage
	if u == nil {
		t.Fatal("no usage")
	}
	if u.TotalTokens != u.InputTokens+u.OutputTokens {
		t.Errorf("total_tokens %d is not input + output in %+v", u.TotalTokens, u)
	}
	cached := u.InputTokensDetails["cached_tokens"]
	return modelsim.Usage{Input: u.InputTokens - cached, Output: u.OutputTokens, CacheRead: cached}
}

// msgUsage is the Messages API's usage object.
type msgUsage struct {
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
}

// readMessagesUsage reads a message's usage: the input and cache counts from message_start and
// the output count from message_delta when streamed.
func readMessagesUsage(t *testing.T, resp *http.Response, stream bool) modelsim.Usage {
	t.Helper()
	var start, end msgUsage
	if stream {
		for _, e := range readEvents(t, resp.Body) {
			var ev struct {
				Message struct {
					Usage msgUsage `json:"usage"`
				} `json:"message"`
				Usage msgUsage `json:"usage"`
			}
			if err := json.Unmarshal([]byte(e.data), &ev); err != nil {
				t.Fatal(err)
			}
			switch e.name {
			case "message_start":
				start = ev.Message.Usage
				if start.OutputTokens != 1 {
					t.Errorf("message_start output_tokens = %d, want 1", start.OutputTokens)
				}
			case "message_delta":
				end = ev.Usage
			}
		}
	} else {
		var msg struct {
			Usage msgUsage `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&msg); err != nil {
			t.Fatal(err)
		}
		start, end = msg.Usage, msg.Usage
	}
	return modelsim.Usage{Input: start.InputTokens, Output: end.OutputTokens,
		CacheRead: start.CacheReadInputTokens, CacheWrite: start.CacheCreationInputTokens}
}

// TestServer_UsageOnErrors checks a refused request logs no usage.
func TestServer_UsageOnErrors(t *testing.T) {
	t.Parallel()
	s := start(t, modelsim.Options{})
	resp := post(t, s.URL()+"/chat/completions", chat(false, nil, user("[[status:503]]")))
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := lastUsage(t, s, "/chat/completions", "[[status:503]]"); got != (modelsim.Usage{}) {
		t.Errorf("a scripted error logged usage %+v", got)
	}
}
