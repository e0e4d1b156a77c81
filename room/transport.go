package room

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/record"
)

// Transport starts agents for rooms. The RPC client is its first
// implementation; an ACP one fits the same interface.
type Transport interface {
	// Start starts an agent for spec.Room. With spec.SessionID set it
	// resumes that session: it returns ErrSessionNotFound when the agent
	// has no such session, and otherwise an Agent whose SessionID the room
	// checks (an agent may silently start a new session instead).
	Start(ctx context.Context, spec AgentSpec) (Agent, error)
}

// ErrSessionNotFound is returned by Transport.Start when the session to
// resume does not exist (or cannot be loaded).
var ErrSessionNotFound = errors.New("room: agent session not found")

// ErrSelectionRefused is returned by Transport.Start when the agent
// refused the room's model or thinking level: the turn fails, and the
// room keeps both its session and its selection.
var ErrSelectionRefused = errors.New("room: model selection refused")

// ThinkingLeveler is a Transport that knows the thinking levels each
// agent kind it runs takes: a room's settings naming another are refused
// (SetSettings), since every turn would fail on it.
type ThinkingLeveler interface {
	// ThinkingLevels are the levels the agent kind takes (nil: not known
	// here; any is tried at the agent's start).
	ThinkingLevels(agent string) []string
}

// AgentSpec is what a room asks of its agent.
type AgentSpec struct {
	Room string
	// Workspace is the room's working directory; Home is the agent's own
	// home (configuration, sessions), never shared between rooms.
	Workspace, Home string
	// SessionID is the session to resume ("" for a new one).
	SessionID string
	Config    Config
	// ReadOnly are folders the agent may read beside its own (a git
	// workspace's shared objects), when it is confined.
	ReadOnly []string
	// Tools are the room's tools; MCP its MCP servers (resolved).
	Tools []Tool
	MCP   map[string]MCPServer
	// Handler receives the agent's events, approvals and questions.
	Handler Handler
}

// Agent is one running agent process with its session.
type Agent interface {
	// SessionID is the session the agent reports it is in.
	SessionID() string
	// Run runs one turn for text and returns when the agent settled, or
	// an error when the turn failed or ctx ended (the agent is then
	// retired by the room).
	Run(ctx context.Context, text string) (TurnResult, error)
	// Steer and FollowUp deliver text into the running turn.
	Steer(ctx context.Context, text string) error
	FollowUp(ctx context.Context, text string) error
	// Close ends the agent and everything it started, and returns the
	// custody receipt (JSON), if any.
	Close(ctx context.Context) (json.RawMessage, error)
	// Done is closed when the agent process is gone.
	Done() <-chan struct{}
}

// Attacher is a Transport whose agents can outlive the host (a process
// daemon keeps them running across a planned restart): the next host
// attaches to them instead of starting new ones.
type Attacher interface {
	Transport
	// Attach takes over the running agent at. It fails (the room then
	// recovers as after a crash) when the agent is gone.
	Attach(ctx context.Context, spec AgentSpec, at Attachment) (Detachable, error)
}

// Attachment is what a room recorded of an agent that outlives the host.
type Attachment struct {
	// Handle is the agent's Detachable.Handle.
	Handle string
	// Offset is the position in the agent's output past the last frame
	// whose effects the room committed (AgentEvent.Offset,
	// TurnResult.Offset): the attached agent reads on from there, so no
	// event is recorded twice or lost.
	Offset int64
	// RunOpen: the room had a turn running; Continue waits for its end.
	RunOpen bool
}

// Detachable is an Agent that can outlive the host.
type Detachable interface {
	Agent
	// Handle identifies the running agent for Attacher.Attach; "" when it
	// cannot be attached again. The room records it with agent.started.
	Handle() string
	// Detach lets go of the agent and leaves it running: reading stops,
	// nothing is sent, dialogs in progress are left unanswered. Idempotent.
	Detach() error
	// Continue waits for the run that was in progress when the agent was
	// attached (Attachment.RunOpen) to end, as Run does for its own.
	Continue(ctx context.Context) (TurnResult, error)
}

// Committer is a Detachable that wants to know what of its output the
// room has committed: the offset a new host would attach at (see
// Attachment.Offset), recorded in the same write as the events before
// it. Output before it is never read again, so its storage may be
// released. Committed is called after each such write; it must not
// block.
type Committer interface {
	Committed(offset int64)
}

// TurnResult is how a turn ended on the agent's side.
type TurnResult struct {
	// Offset is the position in the agent's output past the frames the
	// turn read (0 when the transport keeps no output): recorded with the
	// turn's end, see Attachment.Offset.
	Offset int64
	Text   string
	// Uncertain: the agent's state could not be confirmed after the turn
	// (the post-turn refresh failed); the turn still ended.
	Uncertain bool
	// Usage is what the turn cost, as the agent reported it. Run and
	// Continue return it with an error too: a turn that failed may still
	// have spent tokens.
	Usage record.Usage
}

// Handler is the room's side of a running agent. Its methods are called
// from the transport's goroutines.
type Handler interface {
	// Event reports agent activity (it also feeds the liveness watchdog).
	// It must not block.
	Event(AgentEvent)
	// Approve blocks until the tool call is allowed or denied (a person,
	// the policy, the deadline or a cancel decides).
	Approve(ctx context.Context, req ApprovalRequest) bool
	// Ask blocks until the question is answered (ok) or cancelled.
	Ask(ctx context.Context, req QuestionRequest) (answer string, ok bool)
}

// Kinds of AgentEvent.
const (
	KindText        = event.TypeTextDelta
	KindToolStarted = event.TypeToolStarted
	KindToolEnded   = event.TypeToolEnded
	// KindMalformed: the agent sent a line the transport dropped (Line,
	// Length, Reason; never the payload) or, with Suppressed > 0, that many
	// more it did not report one by one (the transport bounds a flood).
	KindMalformed = event.TypeAgentMalformed
	// KindActivity is any other frame: it only proves the agent is alive.
	KindActivity = "activity"
	// KindDialog is a request for an approval or an answer, reported in
	// order with the events (Approve and Ask follow on their own
	// goroutines): with Start, it keeps a new host reading from the
	// request until it is decided. Not recorded.
	KindDialog = "dialog"
)

// AgentEvent is a normalised agent event.
type AgentEvent struct {
	Kind    string
	Text    string // KindText
	Tool    string // KindTool*
	CallID  string
	Input   string // KindToolStarted, bounded by the transport
	Output  string // KindToolEnded, bounded by the transport
	IsError bool   // KindToolEnded
	// KindMalformed: the line's number on the agent's output and its
	// length in bytes, why it was dropped, or how many were not reported.
	Line, Length int64
	Reason       string
	Suppressed   int
	// Offset is the position in the agent's output past the frame this
	// event came from (0 when the transport keeps no output); recorded
	// with the event, see Attachment.Offset. Start is where that frame
	// begins (KindDialog).
	Start, Offset int64
}

// ApprovalRequest is an agent's request to run a tool.
type ApprovalRequest struct {
	Tool    string
	Input   string // redacted and bounded by the transport
	Options []string
	// Start and Offset are the request's position in the agent's output
	// (where its frame begins, and past it, as AgentEvent.Offset): until
	// it is decided a new host reads the agent's output again from Start,
	// so that the agent's request reaches it.
	Start, Offset int64
}

// QuestionRequest is an agent's question to people.
type QuestionRequest struct {
	Title   string
	Options []string
	Start   int64 // as ApprovalRequest's
	Offset  int64
}

// Pooled is an Agent that may have been started ahead of its room (a
// transport's warm pool) and bound to it when the room needed it:
// agent.started says so, with the bind's duration.
type Pooled interface {
	Pooled() (pooled bool, bind time.Duration)
}

// Confinement is what confines a room's agent and everything it starts
// (agent.started records it).
type Confinement = event.Confinement

// Confined is a Transport or an Agent that reports its confinement: a
// Transport the server-wide one its agents get (a room's state shows it
// while no agent runs; an agent may add ports of its own), an Agent its
// own (agent.started records it, and the room's state while it runs).
type Confined interface {
	Confinement() Confinement
}
