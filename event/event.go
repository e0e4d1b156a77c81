// Package event defines the events of a room's log: one Go type per event
// type, with the JSON fields the log and the HTTP API carry. Rooms write
// them, the server's OpenAPI document is checked against them, the page
// takes their names from them, and the Go client decodes them.
//
// On the wire an event is one flat JSON object: seq (the room's sequence
// number, 1 for the first event and up by exactly one per event), type,
// room and time, then the type's own fields. Every accepted message ends
// with exactly one message.ended. A program reading a log should skip
// types it does not know (Decode says ErrUnknownType): new ones may come.
package event

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/agenthost/agenthost/record"
)

// Payload is the type's own fields of one event.
type Payload interface {
	// EventType is the event's type, as in the log ("message.ended").
	EventType() string
}

// The event types, in about the order a room's log shows them.
const (
	TypeMessageAccepted   = "message.accepted"
	TypeMessageQueued     = "message.queued"
	TypeMessageDelivered  = "message.delivered"
	TypeMessageEnded      = "message.ended"
	TypeTurnWaiting       = "turn.waiting"
	TypeWorkspaceReady    = "workspace.ready"
	TypeTurnStarted       = "turn.started"
	TypeTextDelta         = "text.delta"
	TypeToolStarted       = "tool.started"
	TypeToolEnded         = "tool.ended"
	TypeAgentMalformed    = "agent.malformed"
	TypeApprovalRequested = "approval.requested"
	TypeApprovalResolved  = "approval.resolved"
	TypeQuestionAsked     = "question.asked"
	TypeQuestionAnswered  = "question.answered"
	TypeTurnEnded         = "turn.ended"
	TypeRoomLimit         = "room.limit"
	TypeBudgetExhausted   = "budget.exhausted"
	TypeWorkspaceReverted = "workspace.reverted"
	TypeSettingsChanged   = "settings.changed"
	TypeRoomPost          = "room.post"
	TypeContextLost       = "context.lost"
	TypeAgentStarted      = "agent.started"
	TypeAgentAttached     = "agent.attached"
	TypeAgentReleased     = "agent.released"
	TypeEventsDropped     = "events.dropped"
)

// Types returns a zero value of every event type, in the order of the
// Type constants.
func Types() []Payload {
	return []Payload{
		MessageAccepted{}, MessageQueued{}, MessageDelivered{}, MessageEnded{}, TurnWaiting{}, WorkspaceReady{},
		TurnStarted{}, TextDelta{}, ToolStarted{}, ToolEnded{}, AgentMalformed{}, ApprovalRequested{},
		ApprovalResolved{}, QuestionAsked{}, QuestionAnswered{}, TurnEnded{}, RoomLimit{}, BudgetExhausted{},
		WorkspaceReverted{}, SettingsChanged{}, RoomPost{}, ContextLost{}, AgentStarted{}, AgentAttached{}, AgentReleased{},
		EventsDropped{},
	}
}

// ErrUnknownType: Decode was given a type this package does not define
// (a newer server's, say).
var ErrUnknownType = errors.New("event: unknown type")

// Decode reads an event's fields (the whole flat event, or only its own
// fields) as the payload of type typ, and returns it as a value (a
// MessageEnded, not a *MessageEnded).
func Decode(typ string, data []byte) (Payload, error) {
	p := newPayload(typ)
	if p == nil {
		return nil, fmt.Errorf("%w %q", ErrUnknownType, typ)
	}
	if err := json.Unmarshal(data, p); err != nil {
		return nil, fmt.Errorf("event: %s: %w", typ, err)
	}
	return reflect.ValueOf(p).Elem().Interface().(Payload), nil
}

// Validate reports whether data (an event's own fields, or the whole flat
// event) is exactly what type typ has: every field it always carries,
// none it lacks. Rooms write nothing else; a store's tests can check
// that what they give back is still so.
func Validate(typ string, data []byte) error {
	p, err := Decode(typ, data)
	if err != nil {
		return err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return fmt.Errorf("event: %s: %w", typ, err)
	}
	for _, k := range []string{"seq", "type", "room", "time"} {
		delete(fields, k) // the envelope's, when data is the flat event
	}
	rt := reflect.TypeOf(p)
	for i := range rt.NumField() {
		name, opts, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
		if _, ok := fields[name]; !ok && !strings.Contains(opts, "omitempty") {
			return fmt.Errorf("event: %s lacks %s", typ, name)
		}
		delete(fields, name)
	}
	if len(fields) > 0 {
		return fmt.Errorf("event: %s has fields its type lacks: %s", typ, strings.Join(slices.Sorted(maps.Keys(fields)), ", "))
	}
	return nil
}

// newPayload returns a pointer to a new zero payload of type typ; nil
// for a type not defined here. TestTypes keeps it and Types the same.
func newPayload(typ string) Payload {
	switch typ {
	case TypeMessageAccepted:
		return &MessageAccepted{}
	case TypeMessageQueued:
		return &MessageQueued{}
	case TypeMessageDelivered:
		return &MessageDelivered{}
	case TypeMessageEnded:
		return &MessageEnded{}
	case TypeTurnWaiting:
		return &TurnWaiting{}
	case TypeWorkspaceReady:
		return &WorkspaceReady{}
	case TypeTurnStarted:
		return &TurnStarted{}
	case TypeTextDelta:
		return &TextDelta{}
	case TypeToolStarted:
		return &ToolStarted{}
	case TypeToolEnded:
		return &ToolEnded{}
	case TypeAgentMalformed:
		return &AgentMalformed{}
	case TypeApprovalRequested:
		return &ApprovalRequested{}
	case TypeApprovalResolved:
		return &ApprovalResolved{}
	case TypeQuestionAsked:
		return &QuestionAsked{}
	case TypeQuestionAnswered:
		return &QuestionAnswered{}
	case TypeTurnEnded:
		return &TurnEnded{}
	case TypeRoomLimit:
		return &RoomLimit{}
	case TypeBudgetExhausted:
		return &BudgetExhausted{}
	case TypeWorkspaceReverted:
		return &WorkspaceReverted{}
	case TypeSettingsChanged:
		return &SettingsChanged{}
	case TypeRoomPost:
		return &RoomPost{}
	case TypeContextLost:
		return &ContextLost{}
	case TypeAgentStarted:
		return &AgentStarted{}
	case TypeAgentAttached:
		return &AgentAttached{}
	case TypeAgentReleased:
		return &AgentReleased{}
	case TypeEventsDropped:
		return &EventsDropped{}
	}
	return nil
}

// Fields are declared in the order of their JSON names: the log has
// always written them so (they were maps once), and a stored event's
// bytes stay what they were.

// MessageAccepted: a message was accepted (durably stored) for the room.
type MessageAccepted struct {
	// Delivery is how it joins the room's work: queue (a turn of its
	// own), steer or follow_up (into the running turn).
	Delivery  string `json:"delivery"`
	MessageID string `json:"message_id"`
	Sender    string `json:"sender"`
	Text      string `json:"text"`
	// Token is the room token that did it through the API (absent when
	// the admin token did, or a program through the room package).
	Token *TokenRef `json:"token,omitempty"`
}

// MessageQueued: the message waits in the room's queue for a turn.
type MessageQueued struct {
	MessageID string `json:"message_id"`
	// Recovered: it was queued again, after a restart or a lost agent
	// took its turn away before it ran.
	Recovered bool `json:"recovered,omitempty"`
}

// MessageDelivered: a steer or follow-up reached the running turn's agent.
type MessageDelivered struct {
	Delivery  string `json:"delivery"`
	MessageID string `json:"message_id"`
	TurnID    string `json:"turn_id"`
	// With is "prompt" when the message went with the turn's prompt (it
	// came before the agent had started).
	With string `json:"with,omitempty"`
}

// MessageEnded ends every accepted message, exactly once, whatever
// consumed it: right after its turn's turn.ended, or right after
// question.answered when it answered a pending question.
type MessageEnded struct {
	MessageID string `json:"message_id"`
	// Outcome is settled, failed, cancelled, timed_out or answered.
	Outcome string `json:"outcome"`
	// Reason says why, when the outcome is not settled or answered.
	Reason string `json:"reason,omitempty"`
	// TurnID names the turn that consumed it (steered and followed-up
	// messages included); absent when none did.
	TurnID string `json:"turn_id,omitempty"`
}

// TurnWaiting: the turn waits for an agent slot. The wait counts against
// neither of the turn's clocks.
type TurnWaiting struct {
	MessageID string `json:"message_id"`
	// Resident is how many agents run now.
	Resident int `json:"resident"`
	// Slots is the most agents that run at once.
	Slots  int    `json:"slots"`
	TurnID string `json:"turn_id"`
}

// WorkspaceReady: the room's workspace was checked out from git (its
// settings' workspace), before the turn that needed it.
type WorkspaceReady struct {
	Commit string `json:"commit"`
	// Kind is branch, tag or commit: what Ref names.
	Kind string `json:"kind"`
	Ref  string `json:"ref"`
	URL  string `json:"url"`
}

// TurnStarted: the message's turn runs.
type TurnStarted struct {
	MessageID string `json:"message_id"`
	TurnID    string `json:"turn_id"`
}

// TextDelta is a piece of the turn's answer.
type TextDelta struct {
	Text   string `json:"text"`
	TurnID string `json:"turn_id"`
}

// ToolStarted: the agent called a tool.
type ToolStarted struct {
	CallID string `json:"call_id"`
	// Input is the call's arguments, redacted and bounded.
	Input  string `json:"input"`
	Tool   string `json:"tool"`
	TurnID string `json:"turn_id"`
}

// ToolEnded: a tool call ended.
type ToolEnded struct {
	CallID  string `json:"call_id"`
	IsError bool   `json:"is_error"`
	// Output is the call's result, redacted and bounded.
	Output string `json:"output"`
	Tool   string `json:"tool"`
	TurnID string `json:"turn_id"`
}

// AgentMalformed: the agent sent a line its transport dropped (never its
// payload: where it was, how long, why), or, with suppressed, that many
// more it did not report one by one.
type AgentMalformed struct {
	// Length is the line's length in bytes.
	Length int64 `json:"length,omitempty"`
	// Line is the line's number on the agent's output.
	Line   int64  `json:"line,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Suppressed counts dropped lines not reported one by one (a flood).
	Suppressed int    `json:"suppressed,omitempty"`
	TurnID     string `json:"turn_id"`
}

// ApprovalRequested: a tool call waits for a decision (POST
// .../approvals/{id}).
type ApprovalRequested struct {
	ApprovalID string `json:"approval_id"`
	// Deadline is when the call is denied if nobody decides.
	Deadline time.Time `json:"deadline"`
	// Input is the call's arguments, redacted and bounded.
	Input   string   `json:"input"`
	Options []string `json:"options"`
	Tool    string   `json:"tool"`
	TurnID  string   `json:"turn_id"`
}

// ApprovalResolved: an approval was decided.
type ApprovalResolved struct {
	ApprovalID string `json:"approval_id"`
	// By is who decided: person, policy, deadline (nobody decided in
	// time), cancel (the turn ended first) or restart.
	By string `json:"by"`
	// Decision is allow or deny.
	Decision string `json:"decision"`
	// Token is the room token that did it through the API (absent when
	// the admin token did, or a program through the room package).
	Token *TokenRef `json:"token,omitempty"`
}

// QuestionAsked: the agent asks people (POST .../questions/{id}, or a
// message while the question is pending).
type QuestionAsked struct {
	// Deadline is when the question is cancelled if nobody answers.
	Deadline   time.Time `json:"deadline"`
	Options    []string  `json:"options"`
	QuestionID string    `json:"question_id"`
	Title      string    `json:"title"`
	TurnID     string    `json:"turn_id"`
}

// QuestionAnswered: a question was answered, or cancelled unanswered.
type QuestionAnswered struct {
	Answer string `json:"answer"`
	By     string `json:"by"`
	// Cancelled: it ended unanswered (deadline, cancel, the turn's end).
	Cancelled bool `json:"cancelled"`
	// MessageID names the message that answered it, if one did.
	MessageID  string `json:"message_id,omitempty"`
	QuestionID string `json:"question_id"`
	// Token is the room token that did it through the API (absent when
	// the admin token did, or a program through the room package).
	Token *TokenRef `json:"token,omitempty"`
}

// TurnEnded: the turn ended; Text is its answer.
type TurnEnded struct {
	// Changes is what the turn changed in the workspace. Absent when the
	// server takes no snapshots; null, with ChangesError saying why, when
	// a snapshot failed or timed out.
	Changes      *Changes `json:"changes,omitempty"`
	ChangesError string   `json:"changes_error,omitempty"`
	// Compute is what the room's processes used during the turn, read
	// from the room's groups; absent where the server measures nothing
	// (no cgroups) and for a turn that had no agent.
	Compute   *record.Compute `json:"compute,omitempty"`
	MessageID string          `json:"message_id"`
	// Outcome is settled, failed, cancelled or timed_out.
	Outcome string `json:"outcome"`
	Reason  string `json:"reason"`
	Text    string `json:"text"`
	TurnID  string `json:"turn_id"`
	// Usage is what the turn cost, as its agent reported it (zeros for an
	// agent that reports nothing, and for a turn whose agent was lost).
	Usage record.Usage `json:"usage"`
}

// MarshalJSON writes changes as null when a snapshot failed
// (ChangesError set), and leaves it out when there are no snapshots.
func (e TurnEnded) MarshalJSON() ([]byte, error) {
	type plain TurnEnded // without this method
	if e.Changes != nil || e.ChangesError == "" {
		return json.Marshal(plain(e))
	}
	return json.Marshal(struct {
		Changes *Changes `json:"changes"`
		plain
	}{nil, plain(e)})
}

// RoomLimit: the room's processes reached one of its limits (its
// settings' resources): the kernel killed processes at the memory limit,
// or refused forks at the pids limit. The tool call that hit it ends with
// the error its process got; written at the next tool's end, or the
// turn's.
type RoomLimit struct {
	// AgentKilled: the agent itself was killed (its turn ends failed, and
	// the room goes on with a new agent).
	AgentKilled bool `json:"agent_killed,omitempty"`
	// Count is the kills or refused forks since the room's last
	// room.limit of this limit.
	Count int64 `json:"count"`
	// Limit is memory or pids.
	Limit  string `json:"limit"`
	TurnID string `json:"turn_id,omitempty"`
	// Value is the limit in force: bytes (memory) or tasks (pids).
	Value int64 `json:"value"`
}

// Limits of RoomLimit.
const (
	LimitMemory = "memory"
	LimitPids   = "pids"
)

// Resources are the limits a room's processes run under and how they
// hold (a room's state, agent.started).
type Resources struct {
	// Enforced: every limit holds for the room as a whole, by cgroups.
	Enforced bool `json:"enforced"`
	// Why says what does not hold, and why (absent when all does).
	Why string `json:"why,omitempty"`
	// Memory is in bytes, Pids in tasks, CPU in cores; 0 is no limit.
	Memory int64   `json:"memory"`
	Pids   int64   `json:"pids"`
	CPU    float64 `json:"cpu"`
	// By says how each holds: cgroup-v2, cgroup-v1, rlimit (each process
	// on its own) or none.
	By ResourcesBy `json:"by"`
}

// ResourcesBy names how each limit of Resources holds.
type ResourcesBy struct {
	Memory string `json:"memory"`
	Pids   string `json:"pids"`
	CPU    string `json:"cpu"`
}

// BudgetExhausted: the room's totals reached its budget; written once per
// exhaustion. New messages are refused until the budget is raised.
type BudgetExhausted struct {
	Budget Budget `json:"budget"`
	// Limit names the limit reached: tokens, cost_usd or turns.
	Limit string       `json:"limit"`
	Turns int64        `json:"turns"`
	Usage record.Usage `json:"usage"`
}

// WorkspaceReverted: the workspace was restored to its state before
// TurnID (POST .../turns/{turn}/revert).
type WorkspaceReverted struct {
	// Count is every path restored; Files lists up to 1,000 of them.
	Count int      `json:"count"`
	Files []string `json:"files"`
	// FilesOmitted counts the paths restored but not listed.
	FilesOmitted int `json:"files_omitted,omitempty"`
	// Kept lists paths the revert left alone, because something
	// snapshots never touch (a file over the size bound, a nested
	// repository, a folder that is not empty) occupies them; an ignored
	// file or link there is replaced.
	Kept []string `json:"kept,omitempty"`
	// Token is the room token that did it through the API (absent when
	// the admin token did, or a program through the room package).
	Token  *TokenRef `json:"token,omitempty"`
	TurnID string    `json:"turn_id"`
}

// RoomPost: the agent posted to the room (its room_post tool).
type RoomPost struct {
	Text   string `json:"text"`
	TurnID string `json:"turn_id"`
}

// ContextLost: the room's session could not be resumed; a new one
// started (from the room's transcript, when the agent takes one).
type ContextLost struct {
	PreviousSessionID string `json:"previous_session_id"`
	Reason            string `json:"reason"`
}

// AgentStarted: the room's agent process started.
type AgentStarted struct {
	// BindMS is how long binding a pool agent to the room took (Pooled).
	BindMS int64 `json:"bind_ms,omitempty"`
	// Confinement is what confines the agent, when its transport says.
	Confinement *Confinement `json:"confinement,omitempty"`
	// Pooled: the agent was started ahead of the room (serve --pool) and
	// bound to it in BindMS milliseconds.
	Pooled bool `json:"pooled,omitempty"`
	// Resources are the limits it runs under, when its transport says.
	Resources *Resources `json:"resources,omitempty"`
	// Resumed: it continues the room's session.
	Resumed   bool   `json:"resumed"`
	SessionID string `json:"session_id"`
}

// AgentAttached: a new host took over the room's running agent (a planned
// restart), reading its output on from Offset.
type AgentAttached struct {
	Offset    int64  `json:"offset"`
	SessionID string `json:"session_id"`
	TurnID    string `json:"turn_id"`
}

// AgentReleased: the room's agent was stopped, with custody's receipt.
type AgentReleased struct {
	// Error says why the release failed, if it did.
	Error  string `json:"error,omitempty"`
	Reason string `json:"reason"`
	// Receipt is custody's receipt: every process the agent started and
	// how it ended.
	Receipt json.RawMessage `json:"receipt,omitempty"`
	// Token is the room token that did it through the API (absent when
	// the admin token did, or a program through the room package).
	Token *TokenRef `json:"token,omitempty"`
}

// SettingsChanged: the room's settings were set (PUT config), changing
// the fields named. Their values are in the room's config, not here (its
// instructions or MCP servers may be long, or private to whoever set
// them): the log answers who changed what, and when.
type SettingsChanged struct {
	// Fields are the names of the settings whose value changed
	// ("model", "budget"), sorted; empty when the same settings were
	// set again.
	Fields []string `json:"fields"`
	// Token is the room token that did it through the API (absent when
	// the admin token did, or a program through the room package).
	Token *TokenRef `json:"token,omitempty"`
}

// TokenRef names the room token (POST /v1/tokens) that caused an event
// through the HTTP API: its id and label, never its secret.
type TokenRef struct {
	ID    string `json:"id"`
	Label string `json:"label"`
}

// Changes count what a turn changed in the workspace.
type Changes struct {
	Files      int `json:"files"`
	Insertions int `json:"insertions"`
	Deletions  int `json:"deletions"`
	// Skipped counts the paths the turn's closing snapshot left out
	// (ignored by the workspace's .gitignore, over the size bound,
	// unreadable, nested repositories); the turn's diff lists them.
	Skipped int `json:"skipped,omitempty"`
}

// Confinement is what confines a room's agent and everything it starts:
// {"mode": "landlock"|"none", "abi": N, "signals": bool, "net": "any"|[ports]}.
type Confinement struct {
	// Mode is "landlock" or "none".
	Mode string
	// ABI is the Landlock ABI whose rules are in force (landlock), or the
	// highest the kernel would allow (none; 0 without Landlock).
	ABI int
	// Signals: signals and abstract unix sockets reach only the room's
	// own processes.
	Signals bool
	// Net is nil for any network, else the TCP ports the agent may
	// connect to.
	Net []uint16
}

// MarshalJSON writes the shape above.
func (c Confinement) MarshalJSON() ([]byte, error) {
	var net any = "any"
	if c.Net != nil {
		net = c.Net
	}
	return json.Marshal(struct {
		Mode    string `json:"mode"`
		ABI     int    `json:"abi"`
		Signals bool   `json:"signals"`
		Net     any    `json:"net"`
	}{c.Mode, c.ABI, c.Signals, net})
}

// UnmarshalJSON reads the shape MarshalJSON writes.
func (c *Confinement) UnmarshalJSON(b []byte) error {
	var v struct {
		Mode    string          `json:"mode"`
		ABI     int             `json:"abi"`
		Signals bool            `json:"signals"`
		Net     json.RawMessage `json:"net"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*c = Confinement{Mode: v.Mode, ABI: v.ABI, Signals: v.Signals}
	var s string
	if json.Unmarshal(v.Net, &s) == nil || len(v.Net) == 0 || string(v.Net) == "null" {
		return nil
	}
	return json.Unmarshal(v.Net, &c.Net)
}

// Budget is a room's budget as budget.exhausted shows it: a limit of 0
// is none.
type Budget struct {
	Tokens  int64   `json:"tokens"`
	CostUSD float64 `json:"cost_usd"`
	Turns   int64   `json:"turns"`
}

// EventsDropped: agent events were dropped because the room's pending
// events were over their bound (text is never dropped).
type EventsDropped struct {
	Count int `json:"count"`
}

func (MessageAccepted) EventType() string   { return TypeMessageAccepted }
func (MessageQueued) EventType() string     { return TypeMessageQueued }
func (MessageDelivered) EventType() string  { return TypeMessageDelivered }
func (MessageEnded) EventType() string      { return TypeMessageEnded }
func (TurnWaiting) EventType() string       { return TypeTurnWaiting }
func (WorkspaceReady) EventType() string    { return TypeWorkspaceReady }
func (TurnStarted) EventType() string       { return TypeTurnStarted }
func (TextDelta) EventType() string         { return TypeTextDelta }
func (ToolStarted) EventType() string       { return TypeToolStarted }
func (ToolEnded) EventType() string         { return TypeToolEnded }
func (AgentMalformed) EventType() string    { return TypeAgentMalformed }
func (ApprovalRequested) EventType() string { return TypeApprovalRequested }
func (ApprovalResolved) EventType() string  { return TypeApprovalResolved }
func (QuestionAsked) EventType() string     { return TypeQuestionAsked }
func (QuestionAnswered) EventType() string  { return TypeQuestionAnswered }
func (TurnEnded) EventType() string         { return TypeTurnEnded }
func (RoomLimit) EventType() string         { return TypeRoomLimit }
func (BudgetExhausted) EventType() string   { return TypeBudgetExhausted }
func (WorkspaceReverted) EventType() string { return TypeWorkspaceReverted }
func (SettingsChanged) EventType() string   { return TypeSettingsChanged }
func (RoomPost) EventType() string          { return TypeRoomPost }
func (ContextLost) EventType() string       { return TypeContextLost }
func (AgentStarted) EventType() string      { return TypeAgentStarted }
func (AgentAttached) EventType() string     { return TypeAgentAttached }
func (AgentReleased) EventType() string     { return TypeAgentReleased }
func (EventsDropped) EventType() string     { return TypeEventsDropped }
