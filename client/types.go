package client

import (
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/record"
)

// The API's requests and answers (the server's OpenAPI document,
// GET /v1/openapi.json, describes the same shapes).

// Health is GET /healthz.
type Health struct {
	Status string `json:"status"`
	// Version is the server's build (module version and VCS revision).
	Version string `json:"version"`
}

// Deliveries of a message (NewMessage.Delivery).
const (
	// DeliverQueue runs the message as its own turn, after the ones
	// before it (the default).
	DeliverQueue = "queue"
	// DeliverSteer gives the message to the running turn's agent at once
	// (or runs it as a turn when none runs).
	DeliverSteer = "steer"
	// DeliverFollowUp gives it to the running turn's agent after its
	// current step.
	DeliverFollowUp = "follow_up"
)

// NewMessage is a message to send.
type NewMessage struct {
	Text   string `json:"text"`
	Sender string `json:"sender,omitempty"`
	// Delivery is DeliverQueue (default), DeliverSteer or DeliverFollowUp.
	Delivery string `json:"delivery,omitempty"`
	// IdempotencyKey, if set, is the message's idempotency key (1 to 255
	// printable ASCII characters), sent in the Idempotency-Key header:
	// the room accepts one message per key (per incarnation), and answers
	// the same message sent again with its first acceptance. Send makes
	// one up when it is empty; set it to send the message again after
	// the program itself restarted.
	IdempotencyKey string `json:"-"`
}

// Accepted is a message the server durably accepted.
type Accepted struct {
	ID string `json:"id"`
	// Seq is the room's sequence number of its message.accepted event.
	Seq int64 `json:"seq"`
	// Incarnation is the incarnation of the room the message is in (see
	// Room.Incarnation; "" from a server that does not say): Wait gives
	// up on a message whose room was deleted meanwhile.
	Incarnation string `json:"incarnation,omitempty"`
}

// TurnRef names a running turn and the message it runs.
type TurnRef struct {
	ID        string `json:"id"`
	MessageID string `json:"message_id"`
}

// Room is a room's state.
type Room struct {
	ID string `json:"id"`
	// Incarnation names this life of the room: a room deleted (Purge)
	// and created again under its id is another incarnation, whose events
	// start at 1 again.
	Incarnation string `json:"incarnation,omitempty"`
	// Resident: its agent is running.
	Resident  bool   `json:"resident"`
	SessionID string `json:"session_id,omitempty"`
	// Turn is the running turn, nil when none runs.
	Turn    *TurnRef `json:"turn"`
	Queued  int      `json:"queued"`
	LastSeq int64    `json:"last_seq"`
	// Approvals and Questions are the pending ones.
	Approvals []Approval `json:"approvals"`
	Questions []Question `json:"questions"`
	// Node holds the room's lease in a cluster ("" on one machine).
	Node string `json:"node"`
	// Confinement is what confines the room's agent (nil when the
	// server's transport does not say).
	Confinement *Confinement `json:"confinement,omitempty"`
	// Turns is how many of the room's turns ended, Usage what they cost
	// together, and UsageBySender that by the sender of each turn's first
	// message ("" for messages sent without one).
	Turns         int64                  `json:"turns"`
	Usage         Usage                  `json:"usage"`
	UsageBySender map[string]SenderUsage `json:"usage_by_sender"`
	// Resources are the limits of the room's processes and how they
	// hold (nil when the server does not say); Compute what its
	// processes used in its turns together.
	Resources *Resources `json:"resources,omitempty"`
	Compute   Compute    `json:"compute"`
}

// Confinement is what confines a room's agent and everything it starts.
type Confinement = event.Confinement

// Resources are the limits of a room's processes and how they hold.
type Resources = event.Resources

// Compute is what a room's processes used, measured by its groups.
type Compute = record.Compute

// Usage is tokens and cost as the agents reported them. InputTokens
// counts only the prompt tokens neither read from nor written to the
// provider's cache; CostUSD is 0 when the agent reports no cost.
type Usage = record.Usage

// SenderUsage is one sender's turns in a room and what they cost.
type SenderUsage struct {
	Turns int64 `json:"turns"`
	Usage
}

// Approval is a pending approval of a tool call.
type Approval struct {
	ID       string    `json:"id"`
	TurnID   string    `json:"turn_id,omitempty"`
	Tool     string    `json:"tool"`
	Input    string    `json:"input,omitempty"`
	Options  []string  `json:"options"`
	Created  time.Time `json:"created"`
	Deadline time.Time `json:"deadline"`
}

// Question is a pending question of an agent.
type Question struct {
	ID       string    `json:"id"`
	TurnID   string    `json:"turn_id,omitempty"`
	Title    string    `json:"title"`
	Options  []string  `json:"options"`
	Created  time.Time `json:"created"`
	Deadline time.Time `json:"deadline"`
}

// Message statuses and outcomes (Message, MessageEnded, TurnEnded).
const (
	StatusAccepted = "accepted"
	StatusQueued   = "queued"
	StatusStarted  = "started"
	StatusEnded    = "ended"

	OutcomeSettled   = "settled"
	OutcomeFailed    = "failed"
	OutcomeCancelled = "cancelled"
	OutcomeTimedOut  = "timed_out"
	// OutcomeAnswered: the message answered a pending question.
	OutcomeAnswered = "answered"
)

// Message is a room's message with its status and outcome.
type Message struct {
	ID       string     `json:"id"`
	Seq      int64      `json:"seq"`
	Sender   string     `json:"sender,omitempty"`
	Text     string     `json:"text"`
	Delivery string     `json:"delivery,omitempty"`
	Status   string     `json:"status"`
	Outcome  string     `json:"outcome,omitempty"`
	Reason   string     `json:"reason,omitempty"`
	TurnID   string     `json:"turn_id,omitempty"`
	Accepted time.Time  `json:"accepted"`
	Started  *time.Time `json:"started,omitempty"`
	Ended    *time.Time `json:"ended,omitempty"`
}

// Turn is one of a room's turns (GET /v1/rooms/{room}/turns): its outcome,
// final text and usage once it ended.
type Turn struct {
	ID string `json:"id"`
	// MessageID is the message the turn consumed first.
	MessageID string `json:"message_id"`
	// Outcome is OutcomeSettled, OutcomeFailed, OutcomeCancelled or
	// OutcomeTimedOut; "" while the turn runs.
	Outcome string `json:"outcome,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Text is the turn's final text ("" while it runs).
	Text    string     `json:"text"`
	Started time.Time  `json:"started"`
	Ended   *time.Time `json:"ended,omitempty"`
	// Usage is what the turn cost (nil while it runs).
	Usage *Usage `json:"usage,omitempty"`
}

// Cancelled is the answer to Cancel.
type Cancelled struct {
	Cancelled bool   `json:"cancelled"`
	TurnID    string `json:"turn_id,omitempty"`
}

// Released is the answer to Release.
type Released struct {
	// Released is false when no agent was running.
	Released bool `json:"released"`
	// Seq is the room's sequence number of the agent.released event.
	Seq    int64  `json:"seq,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Receipt is the agent's custody receipt (nil when none was taken).
	Receipt *custody.Receipt `json:"receipt,omitempty"`
	Error   string           `json:"error,omitempty"`
}

// Purged is the answer to a Purge.
type Purged struct {
	Purged bool `json:"purged"`
	// Released says an agent was running; Receipt is its custody receipt.
	Released bool             `json:"released"`
	Receipt  *custody.Receipt `json:"receipt,omitempty"`
}

// Approval decisions.
const (
	DecisionAllow = "allow"
	DecisionDeny  = "deny"
)

// Decision is the answer to Approve.
type Decision struct {
	ID       string `json:"id"`
	Decision string `json:"decision"`
}

// Answered is the answer to Answer.
type Answered struct {
	ID     string `json:"id"`
	Answer string `json:"answer"`
}

// Changes count what a turn changed in the room's workspace; Skipped
// counts the paths the turn's closing snapshot left out
// (TurnDiff.Skipped lists them).
type Changes = event.Changes

// SkippedPath is one path a snapshot left out: Reason is "ignored" (a
// wholly ignored folder once, with a trailing slash), "too_large" (Size
// set), "repository", "unreadable" or "special".
type SkippedPath struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
	Size   int64  `json:"size,omitempty"`
}

// File statuses in a TurnDiff.
const (
	FileAdded    = "added"
	FileModified = "modified"
	FileDeleted  = "deleted"
)

// ChangedFile is one file a turn changed.
type ChangedFile struct {
	// Path is relative to the workspace, with forward slashes.
	Path string `json:"path"`
	// Status is FileAdded, FileModified or FileDeleted.
	Status     string `json:"status"`
	Insertions int    `json:"insertions"`
	Deletions  int    `json:"deletions"`
	// Binary: named in the patch, not inlined; lines not counted.
	Binary bool `json:"binary,omitempty"`
}

// TurnDiff is GET /v1/rooms/{room}/turns/{turn}/diff: what a turn changed.
type TurnDiff struct {
	Files []ChangedFile `json:"files"`
	// FilesOmitted counts the changed files beyond those listed.
	FilesOmitted int     `json:"files_omitted,omitempty"`
	Changes      Changes `json:"changes"`
	// Patch is the unified diff, bounded; Truncated says it was cut.
	Patch     string `json:"patch"`
	Truncated bool   `json:"truncated"`
	// Skipped lists what the turn's closing snapshot left out (not in
	// the diff, left alone by a revert); SkippedOmitted counts the rest.
	Skipped        []SkippedPath `json:"skipped,omitempty"`
	SkippedOmitted int           `json:"skipped_omitted,omitempty"`
}

// Reverted is POST /v1/rooms/{room}/turns/{turn}/revert.
type Reverted struct {
	Reverted bool   `json:"reverted"`
	TurnID   string `json:"turn_id"`
	// Files are the paths removed or written back.
	Files []string `json:"files"`
	// Kept are paths left alone because something snapshots never touch
	// (a file over the size bound, a nested repository, a folder that is
	// not empty) occupies them; an ignored file or link there is replaced.
	Kept []string `json:"kept"`
}

// RoomConfig is a room's settings. Durations are Go durations as strings
// ("90s", "5m"); an empty field takes the server's default.
type RoomConfig struct {
	Agent        string `json:"agent,omitempty"`
	Model        string `json:"model,omitempty"`
	Thinking     string `json:"thinking,omitempty"`
	Instructions string `json:"instructions,omitempty"`
	// ApprovalMode is "always-ask" or "yolo".
	ApprovalMode    string               `json:"approval_mode,omitempty"`
	TurnTimeout     string               `json:"turn_timeout,omitempty"`
	ApprovalTimeout string               `json:"approval_timeout,omitempty"`
	QuestionTimeout string               `json:"question_timeout,omitempty"`
	IdleAfter       string               `json:"idle_after,omitempty"`
	MCP             map[string]MCPServer `json:"mcp,omitempty"`
	// Workspace, if set, is the git repository and ref the room's
	// workspace holds (checked out before its first turn).
	Workspace *Workspace `json:"workspace,omitempty"`
	// Budget, if set, is the room's own budget, each of its limits
	// replacing the server's default (--room-budget-tokens, -usd), 0 being
	// no limit; nil keeps the server's default budget. In an answer it is
	// the effective budget (0: no limit).
	Budget *Budget `json:"budget,omitempty"`
	// Resources lower the server's limits of the room's processes (never
	// above them; 0: the server's).
	Resources Limits `json:"resources,omitzero"`
	// NextStart, in an answer, names the settings the room's running
	// agent does not have yet: they take effect at its next start.
	NextStart []string `json:"next_start,omitempty"`
}

// Limits bound a room's processes together: Memory in bytes, Pids in
// tasks, CPU in cores (0: the server's).
type Limits struct {
	Memory int64   `json:"memory"`
	Pids   int64   `json:"pids"`
	CPU    float64 `json:"cpu"`
}

// Workspace is a room's workspace from git: file://, https or ssh URL, and
// a branch, tag or commit. Credentials come from the server's own git
// configuration.
type Workspace struct {
	Git string `json:"git"`
	Ref string `json:"ref"`
}

// MCPServer is an MCP server of a room: exactly one of Command (stdio) or
// URL (HTTP).
type MCPServer struct {
	Command []string          `json:"command,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// Budget bounds what a room may spend (0: no limit): past it new
// messages get ErrBudgetExhausted until it is raised (see
// RoomConfig.Budget).
type Budget = event.Budget

// The permissions of a room token (NewToken.Can).
const (
	CanRead      = "read"      // the room, its messages, turns, events, diffs and settings
	CanSend      = "send"      // send messages, cancel the turn
	CanApprove   = "approve"   // decide approvals, answer questions
	CanConfigure = "configure" // set the room's settings, revert a turn
	CanRelease   = "release"   // release the room's agent
	CanPurge     = "purge"     // delete the room for good
)

// NewToken is a room token to create (Client.CreateToken).
type NewToken struct {
	// Rooms are room ids, or "prefix*" patterns reaching every room whose
	// id starts with prefix.
	Rooms []string
	// Can are the permissions (CanRead...).
	Can []string
	// ExpiresIn is the token's life (0: the server's default, 24h).
	ExpiresIn time.Duration
	// Label names the token's holder; events it causes carry it.
	Label string
}

// Token is a room token as the server lists it.
type Token struct {
	ID      string     `json:"id"`
	Label   string     `json:"label"`
	Rooms   []string   `json:"rooms"`
	Can     []string   `json:"can"`
	Created time.Time  `json:"created"`
	Expires time.Time  `json:"expires"`
	Revoked *time.Time `json:"revoked,omitempty"`
	// Secret is the token itself: set only in CreateToken's answer.
	Secret string `json:"token,omitempty"`
}
