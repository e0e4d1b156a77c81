package rpc

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The golden files in testdata/golden are frames the real agents wrote
// (omp 18.2.3, pi 0.73.1, driven offline against a scripted model server),
// named <kind>.<type or command>.<agent>[.<variant>].json. Files whose
// variant starts with "doc" were written from the agents' documentation and
// TypeScript types, for frames the capture did not produce. Long lists and
// prompts in a few captured frames were shortened; nothing else was edited.

// ignoredKeys are fields the typed structs deliberately leave out: agent
// internals and rarely needed details. Anywhere they occur, the round-trip
// check does not require them back.
var ignoredKeys = map[string]bool{
	// omp tool-call streaming internals on toolCall blocks.
	"partialArgs": true,
	"streamIndex": true,
	// omp model capability fields beyond what a host needs (Model keeps
	// thinking and compat raw).
	"identity":                  true,
	"requiresGlyphTokenization": true,
	"supportsComputerUse":       true,
}

// ignoredMessageKeys are message fields (keys of objects with a "role")
// that Message leaves out: omp's provider bookkeeping.
var ignoredMessageKeys = map[string]bool{
	"contextSnapshot": true,
	"errorId":         true,
}

// responseData maps a command to a fresh value its response data decodes
// into, shaped like the commands_client.go wrappers decode it.
func responseData(command string) (any, bool) {
	switch command {
	case CommandGetState:
		return &State{}, true
	case CommandGetMessages:
		return &struct {
			Messages []Message `json:"messages"`
		}{}, true
	case CommandGetMessagesPage:
		return &MessagesPage{}, true
	case CommandSetModel:
		return &Model{}, true
	case CommandCycleModel:
		return &CycleModelResult{}, true
	case CommandGetAvailableModels:
		return &struct {
			Models []Model `json:"models"`
		}{}, true
	case CommandCycleThinkingLevel:
		return &struct {
			Level string `json:"level"`
		}{}, true
	case CommandSetFastMode:
		return &FastModeResult{}, true
	case CommandSetTodos:
		return &struct {
			TodoPhases []TodoPhase `json:"todoPhases"`
		}{}, true
	case CommandSetHostTools:
		return &struct {
			ToolNames []string `json:"toolNames"`
		}{}, true
	case CommandSetHostURISchemes:
		return &struct {
			Schemes []string `json:"schemes"`
		}{}, true
	case CommandSetSubagentSubscription:
		return &struct {
			Level string `json:"level"`
		}{}, true
	case CommandGetSubagents:
		return &struct {
			Subagents []SubagentSnapshot `json:"subagents"`
		}{}, true
	case CommandGetSubagentMessages:
		return &SubagentMessages{}, true
	case CommandGetLoginProviders:
		return &struct {
			Providers []LoginProvider `json:"providers"`
		}{}, true
	case CommandLogin:
		return &struct {
			ProviderID string `json:"providerId"`
		}{}, true
	case CommandBash:
		return &BashResult{}, true
	case CommandGetSessionStats:
		return &SessionStats{}, true
	case CommandExportHTML:
		return &struct {
			Path string `json:"path"`
		}{}, true
	case CommandGetBranchMessages, CommandGetForkMessages:
		return &struct {
			Messages []BranchMessage `json:"messages"`
		}{}, true
	case CommandGetLastAssistantText:
		return &struct {
			Text *string `json:"text"`
		}{}, true
	case CommandCompact:
		return &CompactionResult{}, true
	case CommandNegotiateProtocol:
		return &struct {
			ProtocolVersion int `json:"protocolVersion"`
		}{}, true
	case CommandNewSession, CommandSwitchSession, CommandClone:
		return &struct {
			Cancelled bool `json:"cancelled"`
		}{}, true
	case CommandBranch, CommandFork:
		return &BranchResult{}, true
	case CommandHandoff:
		return &HandoffResult{}, true
	case CommandGetAvailableCommands, CommandGetCommands:
		return &struct {
			Commands []CommandInfo `json:"commands"`
		}{}, true
	case CommandPrompt:
		return &struct {
			AgentInvoked bool `json:"agentInvoked"`
		}{}, true
	}
	return nil, false
}

func goldenFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "golden", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	return files
}

func readGolden(t *testing.T, path string) ([]byte, map[string]any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%s: not a JSON object: %v", path, err)
	}
	return raw, m
}

// TestGolden_RoundTrip decodes every golden frame into its typed struct,
// encodes it again and checks that every field of the original comes back
// with its value (except ignoredKeys), and that the encoding invents no
// non-zero field.
func TestGolden_RoundTrip(t *testing.T) {
	for _, path := range goldenFiles(t) {
		name := strings.TrimSuffix(filepath.Base(path), ".json")
		t.Run(name, func(t *testing.T) {
			raw, frame := readGolden(t, path)
			typ, _ := frame["type"].(string)
			kind := strings.SplitN(name, ".", 2)[0]
			var orig any
			var target any
			switch kind {
			case "event":
				if typ == "" || typ == EventResponse {
					t.Fatalf("event golden with type %q", typ)
				}
				ev, ok := NewTypedEvent(typ)
				if !ok {
					t.Fatalf("no struct for event type %q", typ)
				}
				if ev.EventType() != typ {
					t.Fatalf("EventType() = %q, frame type %q", ev.EventType(), typ)
				}
				if err := json.Unmarshal(raw, ev); err != nil {
					t.Fatalf("decode: %v", err)
				}
				delete(frame, "type") // carried by Event.Type, not the struct
				orig, target = frame, ev
			case "response":
				if typ != EventResponse {
					t.Fatalf("response golden with type %q", typ)
				}
				var resp Response
				if err := json.Unmarshal(raw, &resp); err != nil {
					t.Fatalf("decode response: %v", err)
				}
				if !resp.Success {
					if resp.Error == "" || resp.Command == "" {
						t.Fatalf("failed response without command or error: %+v", resp)
					}
					return
				}
				data, present := frame["data"]
				if !present {
					return // an acknowledgement without data
				}
				v, ok := responseData(resp.Command)
				if !ok {
					t.Fatalf("no data type for command %q", resp.Command)
				}
				if data == nil {
					// null data (cycle_model, handoff, cycle_thinking_level):
					// the wrappers decode into a nil pointer.
					pp := reflect.New(reflect.TypeOf(v))
					if err := json.Unmarshal(resp.Data, pp.Interface()); err != nil || !pp.Elem().IsNil() {
						t.Fatalf("null data: err %v, value %v", err, pp.Elem())
					}
					return
				}
				if err := json.Unmarshal(resp.Data, v); err != nil {
					t.Fatalf("decode data: %v", err)
				}
				orig, target = data, v
			default:
				t.Fatalf("golden file name must start with event. or response.")
			}
			enc, err := json.Marshal(target)
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			var got any
			if err := json.Unmarshal(enc, &got); err != nil {
				t.Fatal(err)
			}
			want := normalize(orig)
			got = normalize(got)
			var invented []string
			got = project(want, got, "", &invented)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("round trip lost or changed fields (-golden +re-encoded):\n%s", diff)
			}
			if len(invented) > 0 {
				t.Errorf("re-encoding added non-zero fields: %s", strings.Join(invented, ", "))
			}
		})
	}
}

// normalize drops null-valued keys (null and absent mean the same to the
// agents) and the ignored keys.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		_, isMessage := x["role"]
		out := make(map[string]any, len(x))
		for k, e := range x {
			if e == nil || ignoredKeys[k] || isMessage && ignoredMessageKeys[k] {
				continue
			}
			out[k] = normalize(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalize(e)
		}
		return out
	}
	return v
}

// project returns got restricted to the keys present in want, recording in
// invented the paths of dropped keys whose value is not a zero value.
func project(want, got any, path string, invented *[]string) any {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return got
		}
		out := make(map[string]any, len(w))
		keys := make([]string, 0, len(g))
		for k := range g {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if _, keep := w[k]; keep {
				out[k] = project(w[k], g[k], path+"."+k, invented)
			} else if !isZero(g[k]) {
				*invented = append(*invented, fmt.Sprintf("%s.%s=%v", path, k, g[k]))
			}
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return got
		}
		out := make([]any, len(g))
		for i := range g {
			out[i] = project(w[i], g[i], fmt.Sprintf("%s[%d]", path, i), invented)
		}
		return out
	}
	return got
}

func isZero(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case float64:
		return x == 0
	case string:
		return x == ""
	case []any:
		return len(x) == 0
	case map[string]any:
		return len(x) == 0
	}
	return false
}

// goldenEvent decodes the named golden event file into v.
func goldenEvent(t *testing.T, name string, v TypedEvent) {
	t.Helper()
	raw, frame := readGolden(t, filepath.Join("testdata", "golden", name+".json"))
	if frame["type"] != v.EventType() {
		t.Fatalf("%s: type %v, want %s", name, frame["type"], v.EventType())
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// goldenData decodes the named golden response's data into v.
func goldenData(t *testing.T, name string, v any) {
	t.Helper()
	raw, _ := readGolden(t, filepath.Join("testdata", "golden", name+".json"))
	var r Response
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(r.Data, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// TestGolden_Accessors checks the helpers on real frames.
func TestGolden_Accessors(t *testing.T) {
	t.Run("State.Queued", func(t *testing.T) {
		for name, want := range map[string]int{
			"response.get_state.omp.streaming": 2, // queuedMessageCount
			"response.get_state.pi.streaming":  2, // pendingMessageCount
			"response.get_state.pi":            0,
		} {
			var s State
			goldenData(t, name, &s)
			if s.Queued() != want {
				t.Errorf("%s: Queued() = %d, want %d", name, s.Queued(), want)
			}
		}
		var s State
		goldenData(t, "response.get_state.omp", &s)
		if s.ThinkingLevel != "" || s.InterruptMode != InterruptImmediate || s.Model == nil || s.Model.ID != "fake-model" || s.TokensPerSecond != nil {
			t.Errorf("omp state: %+v", s)
		}
		goldenData(t, "response.get_state.omp.streaming", &s)
		if !s.IsStreaming || s.TokensPerSecond == nil || s.ContextUsage == nil || s.ContextUsage.Tokens == nil {
			t.Errorf("omp streaming state: %+v", s)
		}
	})
	t.Run("ThinkingLevelChanged.Current", func(t *testing.T) {
		for name, want := range map[string]string{
			"event.thinking_level_changed.omp":       ThinkingHigh,
			"event.thinking_level_changed.omp.unset": "",
			"event.thinking_level_changed.pi":        ThinkingMedium,
		} {
			var e ThinkingLevelChangedEvent
			goldenEvent(t, name, &e)
			if e.Current() != want {
				t.Errorf("%s: Current() = %q, want %q", name, e.Current(), want)
			}
		}
	})
	t.Run("AgentEnd.Terminal", func(t *testing.T) {
		for name, want := range map[string]bool{
			"event.agent_end.omp":              true,
			"event.agent_end.omp.not_terminal": false,
			"event.agent_end.pi":               true,
		} {
			var e AgentEndEvent
			goldenEvent(t, name, &e)
			if e.Terminal() != want || len(e.Messages) == 0 {
				t.Errorf("%s: Terminal() = %v with %d messages", name, e.Terminal(), len(e.Messages))
			}
		}
		var e AgentEndEvent
		goldenEvent(t, "event.agent_end.omp.doc_compacted", &e)
		if e.MessageCount == nil || *e.MessageCount != 42 || len(e.Messages) != 0 {
			t.Errorf("compacted agent_end: %+v", e)
		}
	})
	t.Run("Message", func(t *testing.T) {
		var e MessageEndEvent
		goldenEvent(t, "event.message_end.pi.assistant", &e)
		m := e.Message
		if m.Role != RoleAssistant || m.Text() != "Running it." || m.StopReason != StopReasonToolUse ||
			m.Usage == nil || m.Usage.TotalTokens != 132 || len(m.ToolCalls()) != 1 || m.ToolCalls()[0].Name != "bash" {
			t.Errorf("assistant message: %+v", m)
		}
		if got := string(m.ToolCalls()[0].Arguments); got != `{"command":"echo hello"}` {
			t.Errorf("tool call arguments %s", got)
		}
		goldenEvent(t, "event.message_end.omp.tool_result", &e)
		if e.Message.Role != RoleToolResult || e.Message.ToolCallID != "call_1" || e.Message.IsError || !strings.HasPrefix(e.Message.Text(), "hello") {
			t.Errorf("tool result: %+v", e.Message)
		}
		goldenEvent(t, "event.message_end.omp.custom", &e)
		if e.Message.CustomType != "async-result" || !strings.Contains(e.Message.Text(), "bg_1") {
			t.Errorf("custom message: %+v", e.Message)
		}
		goldenEvent(t, "event.message_end.pi.error", &e)
		if e.Message.StopReason != StopReasonError || e.Message.ErrorMessage == "" {
			t.Errorf("error message: %+v", e.Message)
		}
		var u Usage
		u.add(&Usage{Input: 1, Output: 2, TotalTokens: 3, Cost: UsageCost{Total: 0.5}})
		u.add(&Usage{Input: 1, Output: 2, TotalTokens: 3, Cost: UsageCost{Total: 0.25}})
		u.add(nil)
		if u.Input != 2 || u.Output != 4 || u.TotalTokens != 6 || u.Cost.Total != 0.75 {
			t.Errorf("Usage.add: %+v", u)
		}
	})
	t.Run("MessageUpdate.Update", func(t *testing.T) {
		var e MessageUpdateEvent
		goldenEvent(t, "event.message_update.omp.text_delta", &e)
		d, err := e.Update()
		if err != nil || d.Type != DeltaTextDelta || d.Delta == "" || d.ContentIndex == nil {
			t.Errorf("text delta: %+v, %v", d, err)
		}
		goldenEvent(t, "event.message_update.omp.toolcall_end", &e)
		if d, err = e.Update(); err != nil || d.ToolCall == nil || d.ToolCall.Name != "bash" {
			t.Errorf("toolcall_end: %+v, %v", d, err)
		}
		goldenEvent(t, "event.message_update.pi.text_end", &e)
		if d, err = e.Update(); err != nil || d.Type != DeltaTextEnd || string(d.Content) == "" {
			t.Errorf("text_end: %+v, %v", d, err)
		}
	})
	t.Run("ToolExecution", func(t *testing.T) {
		var end ToolExecutionEndEvent
		goldenEvent(t, "event.tool_execution_end.pi", &end)
		r, err := end.DecodeResult()
		if err != nil || r.Text() != "hello\n" || end.IsError {
			t.Errorf("tool_execution_end: %+v %v", r, err)
		}
		var up ToolExecutionUpdateEvent
		goldenEvent(t, "event.tool_execution_update.pi.empty", &up)
		if r, err := up.DecodePartial(); err != nil || len(r.Content) != 0 {
			t.Errorf("empty partial: %+v %v", r, err)
		}
		var any ToolExecutionEvent
		raw, _ := readGolden(t, filepath.Join("testdata", "golden", "event.tool_execution_end.omp.error.json"))
		if err := json.Unmarshal(raw, &any); err != nil || !any.IsError || any.ToolName != "echo_host" {
			t.Errorf("ToolExecutionEvent: %+v %v", any, err)
		}
	})
	t.Run("ExtensionUIRequest", func(t *testing.T) {
		var e ExtensionUIRequestEvent
		goldenEvent(t, "event.extension_ui_request.pi.select", &e)
		if e.Method != UIMethodSelect || e.Timeout != 10000 || !slices.Equal(e.Options, []string{"Allow", "Block"}) {
			t.Errorf("select: %+v", e)
		}
		e = ExtensionUIRequestEvent{}
		goldenEvent(t, "event.extension_ui_request.omp.setStatus", &e)
		if e.StatusText == nil || *e.StatusText != "Turn 3 running..." {
			t.Errorf("setStatus: %+v", e)
		}
		e = ExtensionUIRequestEvent{}
		goldenEvent(t, "event.extension_ui_request.omp.setStatus_clear", &e)
		if e.StatusText != nil {
			t.Errorf("setStatus clear: %+v", e)
		}
	})
	t.Run("HostFrames", func(t *testing.T) {
		var call HostToolCallEvent
		goldenEvent(t, "event.host_tool_call.omp", &call)
		if call.ID == "" || call.ToolName != "echo_host" || string(call.Arguments) != `{"message":"hi"}` {
			t.Errorf("host_tool_call: %+v", call)
		}
		var cancel HostToolCancelEvent
		goldenEvent(t, "event.host_tool_cancel.omp", &cancel)
		if cancel.TargetID == "" || cancel.TargetID == cancel.ID {
			t.Errorf("host_tool_cancel: %+v", cancel)
		}
		var uri HostURIRequestEvent
		goldenEvent(t, "event.host_uri_request.omp", &uri)
		if uri.Operation != "read" || uri.URL != "db://users/42" || uri.Content != nil {
			t.Errorf("host_uri_request: %+v", uri)
		}
	})
	t.Run("LastAssistantText", func(t *testing.T) {
		var d struct {
			Text *string `json:"text"`
		}
		goldenData(t, "response.get_last_assistant_text.omp.none", &d)
		if d.Text != nil {
			t.Errorf("no text: %v", *d.Text)
		}
		goldenData(t, "response.get_last_assistant_text.pi", &d)
		if d.Text == nil || *d.Text != "Just text." {
			t.Errorf("text: %v", d.Text)
		}
	})
}

// TestGolden_EveryEventType checks that every event type with a struct has
// at least one golden frame.
func TestGolden_EveryEventType(t *testing.T) {
	have := map[string]bool{}
	for _, path := range goldenFiles(t) {
		_, frame := readGolden(t, path)
		if typ, _ := frame["type"].(string); typ != EventResponse {
			have[typ] = true
		}
	}
	for _, typ := range allEventTypes {
		if _, ok := NewTypedEvent(typ); !ok {
			t.Errorf("%s: no struct", typ)
		}
		if !have[typ] {
			t.Errorf("%s: no golden frame", typ)
		}
	}
	if _, ok := NewTypedEvent("no_such_event"); ok {
		t.Error("NewTypedEvent accepted an unknown type")
	}
}

var allEventTypes = []string{
	"agent_start", "agent_end", "turn_start", "turn_end", "message_start", "message_update", "message_end",
	"tool_execution_start", "tool_execution_update", "tool_execution_end", "auto_retry_start", "auto_retry_end",
	"extension_error", "extension_ui_request", "thinking_level_changed",
	"ready", "rpc_frame_error", "prompt_result", "auto_compaction_start", "auto_compaction_end", "notice",
	"model_changed", "retry_fallback_applied", "retry_fallback_succeeded", "ttsr_triggered", "todo_reminder",
	"todo_auto_clear", "available_commands_update", "advisor_cost_changed", "advisor_yielded",
	"config_warnings_changed", "irc_message", "goal_updated", "tool_stream_update", "host_tool_call",
	"host_tool_cancel", "host_uri_request", "host_uri_cancel", "subagent_lifecycle", "subagent_progress",
	"subagent_event", "command_output", "session_info_update", "config_update",
	"queue_update", "compaction_start", "compaction_end", "session_info_changed",
}

// TestWire_DecodeIgnoresUnknown checks that unknown fields, block types and
// roles decode without error.
func TestWire_DecodeIgnoresUnknown(t *testing.T) {
	frame := `{"type":"message_end","future":{"x":[1,2]},"message":{"role":"hookMessage","brandNew":true,` +
		`"content":[{"type":"fallback","from":{"model":"a"},"to":{"model":"b"}},{"type":"text","text":"hi","extra":1}],"timestamp":1}}`
	var e MessageEndEvent
	if err := json.Unmarshal([]byte(frame), &e); err != nil {
		t.Fatal(err)
	}
	if e.Message.Role != "hookMessage" || len(e.Message.Content) != 2 || e.Message.Content[0].Type != "fallback" || e.Message.Text() != "hi" {
		t.Errorf("decoded %+v", e.Message)
	}
	var s State
	if err := json.Unmarshal([]byte(`{"sessionId":"s","newField":{"deep":[null]},"model":{"id":"m","unknown":1}}`), &s); err != nil || s.Model.ID != "m" {
		t.Errorf("state: %+v %v", s, err)
	}
}

// TestWire_ContentEncoding checks the exact encodings hosts send and the
// string form of message content.
func TestWire_ContentEncoding(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want string
	}{
		{ContentBlock{Type: "text", Text: ""}, `{"type":"text","text":""}`},
		{ContentBlock{Type: "text", Text: "hi"}, `{"type":"text","text":"hi"}`},
		{ContentBlock{Type: "thinking", Thinking: "hm"}, `{"type":"thinking","thinking":"hm"}`},
		{ContentBlock{Type: "image", Data: "AA==", MimeType: "image/png"}, `{"type":"image","data":"AA==","mimeType":"image/png"}`},
		{ContentBlock{Type: "toolCall", ID: "c1", Name: "bash"}, `{"type":"toolCall","id":"c1","name":"bash","arguments":{}}`},
		{ImageContent{Data: "AA==", MimeType: "image/png"}, `{"type":"image","data":"AA==","mimeType":"image/png"}`},
		{NewImage("image/png", []byte{0}), `{"type":"image","data":"AA==","mimeType":"image/png"}`},
		{ToolResult{Content: []ContentBlock{{Type: "text", Text: "ok"}}}, `{"content":[{"type":"text","text":"ok"}]}`},
		{Message{Role: "toolResult", ToolCallID: "c1", ToolName: "bash", Content: []ContentBlock{}}, `{"role":"toolResult","toolCallId":"c1","toolName":"bash","content":[],"isError":false}`},
		{Message{Role: "bashExecution", Command: "true", ExitCode: new(0)}, `{"role":"bashExecution","exitCode":0,"command":"true","output":"","cancelled":false,"truncated":false}`},
	} {
		b, err := json.Marshal(tc.v)
		if err != nil || string(b) != tc.want {
			t.Errorf("%T: got %s (%v), want %s", tc.v, b, err, tc.want)
		}
	}
	var m Message
	in := `{"role":"user","content":"plain","timestamp":5}`
	if err := json.Unmarshal([]byte(in), &m); err != nil || m.Text() != "plain" {
		t.Fatalf("string content: %+v %v", m, err)
	}
	if b, _ := json.Marshal(m); string(b) != `{"role":"user","timestamp":5,"content":"plain"}` {
		t.Errorf("string content re-encoded as %s", b)
	}
}

// TestCommands_Wire checks every command's type and its exact encoding:
// the documented field names, no "id" or "type", and required booleans
// present when false.
func TestCommands_Wire(t *testing.T) {
	img := []ImageContent{{Type: "image", Data: "AA==", MimeType: "image/png"}}
	from := int64(7)
	for _, tc := range []struct {
		cmd  Command
		typ  string
		want string
	}{
		{PromptCommand{Message: "hi"}, "prompt", `{"message":"hi"}`},
		{PromptCommand{Message: "hi", Images: img, StreamingBehavior: StreamingFollowUp}, "prompt", `{"message":"hi","images":[{"type":"image","data":"AA==","mimeType":"image/png"}],"streamingBehavior":"followUp"}`},
		{SteerCommand{Message: "s"}, "steer", `{"message":"s"}`},
		{FollowUpCommand{Message: "f", Images: img}, "follow_up", `{"message":"f","images":[{"type":"image","data":"AA==","mimeType":"image/png"}]}`},
		{AbortCommand{}, "abort", `{}`},
		{AbortAndPromptCommand{Message: "m"}, "abort_and_prompt", `{"message":"m"}`},
		{NewSessionCommand{}, "new_session", `{}`},
		{NewSessionCommand{ParentSession: "/p.jsonl"}, "new_session", `{"parentSession":"/p.jsonl"}`},
		{GetStateCommand{}, "get_state", `{}`},
		{GetMessagesCommand{}, "get_messages", `{}`},
		{SetModelCommand{Provider: "fake", ModelID: "fake-model"}, "set_model", `{"provider":"fake","modelId":"fake-model"}`},
		{CycleModelCommand{}, "cycle_model", `{}`},
		{GetAvailableModelsCommand{}, "get_available_models", `{}`},
		{SetThinkingLevelCommand{Level: ThinkingHigh}, "set_thinking_level", `{"level":"high"}`},
		{CycleThinkingLevelCommand{}, "cycle_thinking_level", `{}`},
		{SetSteeringModeCommand{Mode: QueueModeAll}, "set_steering_mode", `{"mode":"all"}`},
		{SetFollowUpModeCommand{Mode: QueueModeOneAtATime}, "set_follow_up_mode", `{"mode":"one-at-a-time"}`},
		{SetInterruptModeCommand{Mode: InterruptWait}, "set_interrupt_mode", `{"mode":"wait"}`},
		{CompactCommand{}, "compact", `{}`},
		{CompactCommand{CustomInstructions: "short"}, "compact", `{"customInstructions":"short"}`},
		{SetAutoCompactionCommand{}, "set_auto_compaction", `{"enabled":false}`},
		{SetAutoRetryCommand{Enabled: true}, "set_auto_retry", `{"enabled":true}`},
		{AbortRetryCommand{}, "abort_retry", `{}`},
		{BashCommand{Command: "ls"}, "bash", `{"command":"ls"}`},
		{AbortBashCommand{}, "abort_bash", `{}`},
		{GetSessionStatsCommand{}, "get_session_stats", `{}`},
		{ExportHTMLCommand{OutputPath: "/tmp/x.html"}, "export_html", `{"outputPath":"/tmp/x.html"}`},
		{SwitchSessionCommand{SessionPath: "/s.jsonl"}, "switch_session", `{"sessionPath":"/s.jsonl"}`},
		{GetLastAssistantTextCommand{}, "get_last_assistant_text", `{}`},
		{SetSessionNameCommand{Name: "n"}, "set_session_name", `{"name":"n"}`},
		{NegotiateProtocolCommand{ProtocolVersion: 2}, "negotiate_protocol", `{"protocolVersion":2}`},
		{BranchCommand{EntryID: "e1"}, "branch", `{"entryId":"e1"}`},
		{GetBranchMessagesCommand{}, "get_branch_messages", `{}`},
		{GetMessagesPageCommand{}, "get_messages_page", `{}`},
		{GetMessagesPageCommand{Cursor: "c", Limit: 2}, "get_messages_page", `{"cursor":"c","limit":2}`},
		{SetTodosCommand{Phases: []TodoPhase{{Name: "P", Tasks: []TodoItem{{Content: "t", Status: TodoPending}}}}}, "set_todos", `{"phases":[{"name":"P","tasks":[{"content":"t","status":"pending"}]}]}`},
		{SetHostToolsCommand{Tools: []HostToolDefinition{{Name: "echo", Description: "d", Parameters: json.RawMessage(`{"type":"object"}`), LoadMode: LoadModeEssential}}}, "set_host_tools", `{"tools":[{"name":"echo","description":"d","parameters":{"type":"object"},"loadMode":"essential"}]}`},
		{SetHostURISchemesCommand{Schemes: []HostURIScheme{{Scheme: "db", Writable: true}}}, "set_host_uri_schemes", `{"schemes":[{"scheme":"db","writable":true}]}`},
		{HandoffCommand{}, "handoff", `{}`},
		{GetAvailableCommandsCommand{}, "get_available_commands", `{}`},
		{SetFastModeCommand{}, "set_fast_mode", `{"enabled":false}`},
		{SetSubagentSubscriptionCommand{Level: SubagentEvents}, "set_subagent_subscription", `{"level":"events"}`},
		{GetSubagentsCommand{}, "get_subagents", `{}`},
		{GetSubagentMessagesCommand{SubagentID: "0-Explore", FromByte: &from}, "get_subagent_messages", `{"subagentId":"0-Explore","fromByte":7}`},
		{GetLoginProvidersCommand{}, "get_login_providers", `{}`},
		{LoginCommand{ProviderID: "anthropic"}, "login", `{"providerId":"anthropic"}`},
		{ForkCommand{EntryID: "e1"}, "fork", `{"entryId":"e1"}`},
		{CloneCommand{}, "clone", `{}`},
		{GetForkMessagesCommand{}, "get_fork_messages", `{}`},
		{GetCommandsCommand{}, "get_commands", `{}`},
	} {
		if tc.cmd.CommandType() != tc.typ {
			t.Errorf("%T: CommandType() = %q, want %q", tc.cmd, tc.cmd.CommandType(), tc.typ)
		}
		b, err := json.Marshal(tc.cmd)
		if err != nil {
			t.Errorf("%T: %v", tc.cmd, err)
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Errorf("%T: not an object: %s", tc.cmd, b)
			continue
		}
		if _, ok := m["id"]; ok {
			t.Errorf("%T: encodes an id: %s", tc.cmd, b)
		}
		if _, ok := m["type"]; ok {
			t.Errorf("%T: encodes a type: %s", tc.cmd, b)
		}
		if string(b) != tc.want {
			t.Errorf("%T: got %s, want %s", tc.cmd, b, tc.want)
		}
	}
}

// TestCommands_Complete checks that every command both agents document has
// a Command type: the lists are omp's RpcCommand union (rpc-types.ts,
// 18.2.3) and pi's (rpc-types.d.ts, 0.73.1).
func TestCommands_Complete(t *testing.T) {
	omp := []string{
		"negotiate_protocol", "prompt", "steer", "follow_up", "abort", "abort_and_prompt", "new_session",
		"get_state", "set_fast_mode", "get_available_commands", "set_todos", "set_host_tools",
		"set_host_uri_schemes", "set_subagent_subscription", "get_subagents", "get_subagent_messages",
		"set_model", "cycle_model", "get_available_models", "set_thinking_level", "cycle_thinking_level",
		"set_steering_mode", "set_follow_up_mode", "set_interrupt_mode", "compact", "set_auto_compaction",
		"set_auto_retry", "abort_retry", "bash", "abort_bash", "get_session_stats", "export_html",
		"switch_session", "branch", "get_branch_messages", "get_last_assistant_text", "set_session_name",
		"handoff", "get_messages", "get_messages_page", "get_login_providers", "login",
	}
	pi := []string{
		"prompt", "steer", "follow_up", "abort", "new_session", "get_state", "set_model", "cycle_model",
		"get_available_models", "set_thinking_level", "cycle_thinking_level", "set_steering_mode",
		"set_follow_up_mode", "compact", "set_auto_compaction", "set_auto_retry", "abort_retry", "bash",
		"abort_bash", "get_session_stats", "export_html", "switch_session", "fork", "clone",
		"get_fork_messages", "get_last_assistant_text", "set_session_name", "get_messages", "get_commands",
	}
	cmds := []Command{
		PromptCommand{}, SteerCommand{}, FollowUpCommand{}, AbortCommand{}, AbortAndPromptCommand{},
		NewSessionCommand{}, GetStateCommand{}, GetMessagesCommand{}, SetModelCommand{}, CycleModelCommand{},
		GetAvailableModelsCommand{}, SetThinkingLevelCommand{}, CycleThinkingLevelCommand{},
		SetSteeringModeCommand{}, SetFollowUpModeCommand{}, SetInterruptModeCommand{}, CompactCommand{},
		SetAutoCompactionCommand{}, SetAutoRetryCommand{}, AbortRetryCommand{}, BashCommand{},
		AbortBashCommand{}, GetSessionStatsCommand{}, ExportHTMLCommand{}, SwitchSessionCommand{},
		GetLastAssistantTextCommand{}, SetSessionNameCommand{}, NegotiateProtocolCommand{}, BranchCommand{},
		GetBranchMessagesCommand{}, GetMessagesPageCommand{}, SetTodosCommand{}, SetHostToolsCommand{},
		SetHostURISchemesCommand{}, HandoffCommand{}, GetAvailableCommandsCommand{}, SetFastModeCommand{},
		SetSubagentSubscriptionCommand{}, GetSubagentsCommand{}, GetSubagentMessagesCommand{},
		GetLoginProvidersCommand{}, LoginCommand{}, ForkCommand{}, CloneCommand{}, GetForkMessagesCommand{},
		GetCommandsCommand{},
	}
	have := map[string]bool{}
	for _, c := range cmds {
		if have[c.CommandType()] {
			t.Errorf("%s: two Command types", c.CommandType())
		}
		have[c.CommandType()] = true
	}
	for _, typ := range append(omp, pi...) {
		if !have[typ] {
			t.Errorf("%s: no Command type", typ)
		}
	}
	if len(have) != len(unique(append(omp, pi...))) {
		t.Errorf("%d Command types for %d documented commands", len(have), len(unique(append(omp, pi...))))
	}
}

func unique(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}
