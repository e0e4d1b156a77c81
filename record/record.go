// Package record holds the records a room's store keeps: its events,
// messages, turns, approvals, questions and custody receipts. They are
// plain data, shared by room (whose Store interface is written in them),
// the SQLite store and the NATS store, so that a program outside this
// module can implement room.Store with its own engine.
package record

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"time"
)

// Errors a Store returns, which rooms tell apart with errors.Is.
var (
	ErrNotFound = errors.New("store: not found")
	ErrConflict = errors.New("store: conflict")
	ErrClosed   = errors.New("store: closed")
)

// MaxPage is the most records one listing returns (a limit of 0, or
// above it, means MaxPage).
const MaxPage = 10000

// Event is one entry of a room's event log.
type Event struct {
	Room string
	// Seq is the room's sequence number: 1 for the first event, up by
	// exactly one per event.
	Seq  int64
	Type string
	Time time.Time
	// Data is the event's own fields: a JSON object.
	Data json.RawMessage
}

// MarshalJSON writes the event as one flat object: seq, type, room and
// time, then Data's fields.
func (e Event) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"seq":`)
	b.WriteString(strconv.FormatInt(e.Seq, 10))
	b.WriteString(`,"type":`)
	t, _ := json.Marshal(e.Type)
	b.Write(t)
	b.WriteString(`,"room":`)
	r, _ := json.Marshal(e.Room)
	b.Write(r)
	b.WriteString(`,"time":"`)
	b.WriteString(e.Time.UTC().Format(time.RFC3339Nano))
	b.WriteByte('"')
	d := bytes.TrimSpace(e.Data)
	if len(d) > 2 { // more than "{}"
		b.WriteByte(',')
		b.Write(d[1:]) // the object's fields and its closing brace
	} else {
		b.WriteByte('}')
	}
	return b.Bytes(), nil
}

// Message statuses: a message is accepted (durably stored), queued (in
// line for its room's agent), started (its turn runs) and ended (its turn
// has an outcome).
const (
	MessageAccepted = "accepted"
	MessageQueued   = "queued"
	MessageStarted  = "started"
	MessageEnded    = "ended"
)

// Message is a message submitted to a room.
type Message struct {
	ID       string
	Room     string
	Seq      int64 // of its message.accepted event
	Sender   string
	Text     string
	Delivery string
	Status   string
	Outcome  string
	Reason   string
	TurnID   string
	Accepted time.Time
	Started  time.Time
	Ended    time.Time
}

// Turn is one agent turn of a room.
type Turn struct {
	ID        string
	Room      string
	MessageID string
	Outcome   string // "" while it runs
	Reason    string
	Text      string
	Started   time.Time
	Ended     time.Time
	// Usage is what the turn cost, as its agent reported it (zero while
	// it runs, and for an agent that reports nothing).
	Usage Usage
}

// Usage is the tokens and cost of a turn, or a sum of turns. InputTokens
// counts only the prompt tokens neither read from nor written to the
// provider's cache, so the whole prompt is InputTokens + CacheReadTokens
// + CacheWriteTokens. CostUSD is in dollars, 0 when the agent reported no
// cost. Its JSON names are the API's (turn.ended's usage).
type Usage struct {
	InputTokens      int64   `json:"input_tokens"`
	OutputTokens     int64   `json:"output_tokens"`
	CacheReadTokens  int64   `json:"cache_read_tokens"`
	CacheWriteTokens int64   `json:"cache_write_tokens"`
	CostUSD          float64 `json:"cost_usd"`
}

// Add returns u + o.
func (u Usage) Add(o Usage) Usage {
	return Usage{
		InputTokens: u.InputTokens + o.InputTokens, OutputTokens: u.OutputTokens + o.OutputTokens,
		CacheReadTokens: u.CacheReadTokens + o.CacheReadTokens, CacheWriteTokens: u.CacheWriteTokens + o.CacheWriteTokens,
		CostUSD: u.CostUSD + o.CostUSD,
	}
}

// Tokens is every token counted: input, output, cache reads and cache
// writes.
func (u Usage) Tokens() int64 {
	return u.InputTokens + u.OutputTokens + u.CacheReadTokens + u.CacheWriteTokens
}

// IsZero reports whether u counts nothing.
func (u Usage) IsZero() bool { return u == Usage{} }

// Compute is what a room's processes used: CPU time, the most memory they
// held at once, and the processes started; of a turn, or a room's turns
// together (the CPU and processes summed, the peak the highest). Its JSON
// names are the API's (turn.ended's compute).
type Compute struct {
	CPUSeconds      float64 `json:"cpu_seconds"`
	PeakMemoryBytes int64   `json:"peak_memory_bytes"`
	Processes       int64   `json:"processes"`
}

// Add returns c and o together.
func (c Compute) Add(o Compute) Compute {
	return Compute{CPUSeconds: c.CPUSeconds + o.CPUSeconds, PeakMemoryBytes: max(c.PeakMemoryBytes, o.PeakMemoryBytes),
		Processes: c.Processes + o.Processes}
}

// Room is a room's stored state.
type Room struct {
	ID        string
	Created   time.Time
	Agent     string
	SessionID string
	Config    json.RawMessage
	LastSeq   int64
	// AgentProc is the transport's handle to the room's agent when that
	// agent outlives the host ("" for none); AgentOffset the position in
	// its output from which a new host reads on (every frame before it is
	// handled), AgentSeen the position past the last frame whose events
	// are recorded (frames up to it are not recorded again).
	AgentProc   string
	AgentOffset int64
	AgentSeen   int64
	// Turns is how many of the room's turns ended; Usage what they cost
	// together, and UsageBySender that split by the sender of each turn's
	// first message ("" for messages without one). A store that keeps no
	// usage leaves them zero.
	Turns         int64
	Usage         Usage
	UsageBySender map[string]SenderUsage
	// Compute is what the room's turns used together, as measured (see
	// Compute); zero where nothing was, and for a store that keeps none.
	Compute Compute
}

// SenderUsage is what one sender's turns in a room cost.
type SenderUsage struct {
	Turns int64
	Usage Usage
}

// Approval is a durable request for a person's (or a policy's) decision
// on a tool call.
type Approval struct {
	ID       string
	Room     string
	TurnID   string
	Tool     string
	Input    string // redacted and bounded by the caller
	Options  []string
	Created  time.Time
	Deadline time.Time
	Decision string // "" while pending
	By       string
	Resolved time.Time
}

// Question is an agent's question to people.
type Question struct {
	ID       string
	Room     string
	TurnID   string
	Title    string
	Options  []string
	Created  time.Time
	Deadline time.Time
	Answer   string
	By       string // "" while pending
	Answered time.Time
}

// Receipt is a custody receipt recorded for a room's released agent.
type Receipt struct {
	ID      int64
	Room    string
	Time    time.Time
	Receipt json.RawMessage
}

// Exchange is one message of a room with its turn's final text (a lost
// session's transcript is made of them).
type Exchange struct {
	Sender, Text, Answer string
}
