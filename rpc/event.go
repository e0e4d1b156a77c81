package rpc

import (
	"encoding/json"
)

// Event is one frame from the agent that is not a response: an agent event,
// a host-tool or UI request, or a frame type this client does not know.
// Unknown types are delivered like any other, never as errors.
//
// An Event is immutable: Raw returns a copy, Decode fills a fresh value, so
// a listener cannot change what other listeners or a retained Turn see.
//
// To avoid a copy per frame, an Event shares the buffer it was read into
// (up to 64 KiB with its neighbours, 128 KiB while the agent floods):
// keeping a few Events for a long time keeps those buffers alive. Store
// Raw() for long-term keeping instead.
type Event struct {
	Type       string
	raw        []byte
	start, end int64
}

// End is the position in the agent's stdout just past this frame (past
// the last chunk of a reassembled protocol v2 frame), counted from
// Options.Adopt's Offset (0 for a client that read from the start). A host
// that keeps the agent's output in a file records it to read on from
// there after a restart (see Adopt). 0 for an event built by NewEvent.
func (e Event) End() int64 { return e.end }

// Start is where the frame begins in the agent's stdout (its first
// chunk's line for a reassembled frame), counted as End is.
func (e Event) Start() int64 { return e.start }

// IsDialog reports whether the event is an extension UI request that
// waits for an answer (select, confirm, input, editor).
func (e Event) IsDialog() bool {
	if e.Type != EventExtensionUIRequest {
		return false
	}
	var r struct {
		Method string `json:"method"`
	}
	return e.Decode(&r) == nil && dialogMethods[r.Method]
}

// NewEvent builds an Event from one JSON frame (for tests and fakes). The
// frame is copied.
func NewEvent(typ string, frame []byte) Event {
	return Event{Type: typ, raw: append([]byte(nil), frame...)}
}

// Raw returns a copy of the event's JSON frame.
func (e Event) Raw() json.RawMessage { return append(json.RawMessage(nil), e.raw...) }

// Len is the size of the event's JSON frame in bytes.
func (e Event) Len() int { return len(e.raw) }

// Decode unmarshals the frame into v, typically one of the *Event structs.
func (e Event) Decode(v any) error { return json.Unmarshal(e.raw, v) }

// MarshalJSON writes the frame itself.
func (e Event) MarshalJSON() ([]byte, error) {
	if len(e.raw) == 0 {
		return []byte("null"), nil
	}
	return e.raw, nil
}

// knownTypes interns frame types so the hot path allocates no string for
// them. Unknown types are allocated once per frame.
var knownTypes = selfMap(
	"response", "ready", "rpc_chunk", "prompt_result",
	"agent_start", "agent_end", "turn_start", "turn_end",
	"message_start", "message_update", "message_end",
	"tool_execution_start", "tool_execution_update", "tool_execution_end",
	"auto_retry_start", "auto_retry_end", "extension_error", "extension_ui_request",
	"auto_compaction_start", "auto_compaction_end", "compaction_start", "compaction_end",
	"notice", "model_changed", "thinking_level_changed", "queue_update", "session_info_changed",
	"host_tool_call", "host_tool_cancel", "host_uri_request", "host_uri_cancel",
	"available_commands_update", "advisor_cost_changed", "todo_reminder", "todo_auto_clear",
	"retry_fallback_applied", "retry_fallback_succeeded", "ttsr_triggered",
	"tool_stream_update", "command_output", "rpc_frame_error", "session_info_update",
	"config_update", "advisor_yielded", "config_warnings_changed", "irc_message", "goal_updated",
	"subagent_lifecycle", "subagent_progress", "subagent_event",
)

// selfMap maps each string to itself: a lookup by a []byte conversion
// returns the interned string without allocating.
func selfMap(ss ...string) map[string]string {
	m := make(map[string]string, len(ss))
	for _, s := range ss {
		m[s] = s
	}
	return m
}

func internType(b []byte) string {
	if s, ok := knownTypes[string(b)]; ok {
		return s
	}
	return string(b)
}

// deferredTypes are the frequent frame types the reader neither acts on nor
// tracks turns by. Their validation moves to the dispatcher.
// Each maps to itself, so one lookup both checks and interns the type.
var deferredTypes = selfMap(
	"message_update", "message_start", "turn_start", "turn_end",
	"tool_execution_start", "tool_execution_update", "tool_execution_end",
	"tool_stream_update", "notice", "queue_update", "advisor_cost_changed",
)

// fastType reads the type of a frame that starts with {"type":"<name>",
// as both agents write their events, when name is a deferred type. It does
// not validate the frame.
func fastType(line []byte) (string, bool) {
	const prefix = `{"type":"`
	if len(line) < len(prefix)+2 || string(line[:len(prefix)]) != prefix {
		return "", false
	}
	rest := line[len(prefix):]
	end := 0
	for end < len(rest) && end < 32 && (rest[end] >= 'a' && rest[end] <= 'z' || rest[end] == '_') {
		end++
	}
	if end == 0 || end >= len(rest) || rest[end] != '"' || end+1 >= len(rest) || (rest[end+1] != ',' && rest[end+1] != '}') {
		return "", false
	}
	t, ok := deferredTypes[string(rest[:end])]
	return t, ok
}
