package natsroom

import (
	"errors"
	"fmt"
	"time"

	"github.com/agenthost/agenthost/internal/store"
)

// The log's stored format. A room's log (rooms.<id>.ev) is a sequence of
// batches (fold.go), each a JSON object whose every field name is written
// out below and in fold.go: a Go rename must not change what is stored,
// and testdata/log-format1.jsonl (a frozen log) is decoded by a test to
// keep it so.
//
// Compatibility rule: a reader takes every format up to logFormat; a new
// field may be added (older readers ignore it) without a new format; a
// change that an older reader would misread (a field renamed, removed or
// given another meaning) needs logFormat+1, and older nodes then refuse
// those entries (ErrLogFormat) rather than fold them wrong. Entries
// written before the version field existed are format 1.
const logFormat = 1

// ErrLogFormat is a log entry written in a format newer than this build
// reads: the node must be upgraded to read the room.
var ErrLogFormat = errors.New("natsroom: log entry in a newer format")

// checkFormat refuses a batch this build cannot read.
func checkFormat(b *batch, seq uint64) error {
	if b.V > logFormat {
		return fmt.Errorf("%w: entry %d is format %d, this build reads formats up to %d (upgrade this node)", ErrLogFormat, seq, b.V, logFormat)
	}
	return nil
}

// msgRec is a message as the log stores it.
type msgRec struct {
	ID       string    `json:"ID"`
	Room     string    `json:"Room"`
	Seq      int64     `json:"Seq"`
	Sender   string    `json:"Sender"`
	Text     string    `json:"Text"`
	Delivery string    `json:"Delivery"`
	Status   string    `json:"Status"`
	Outcome  string    `json:"Outcome"`
	Reason   string    `json:"Reason"`
	TurnID   string    `json:"TurnID"`
	Accepted time.Time `json:"Accepted"`
	Started  time.Time `json:"Started"`
	Ended    time.Time `json:"Ended"`
}

func toMsgRec(m store.Message) *msgRec {
	r := msgRec(m)
	return &r
}

func (r *msgRec) record() store.Message { return store.Message(*r) }

// turnRec is a turn as the log stores it.
type turnRec struct {
	ID        string    `json:"ID"`
	Room      string    `json:"Room"`
	MessageID string    `json:"MessageID"`
	Outcome   string    `json:"Outcome"`
	Reason    string    `json:"Reason"`
	Text      string    `json:"Text"`
	Started   time.Time `json:"Started"`
	Ended     time.Time `json:"Ended"`
	// Usage was added without a new format (older readers ignore it;
	// older entries have none: zero).
	Usage *usageRec `json:"Usage,omitempty"`
}

func toTurnRec(t store.Turn) *turnRec {
	return &turnRec{ID: t.ID, Room: t.Room, MessageID: t.MessageID, Outcome: t.Outcome, Reason: t.Reason, Text: t.Text,
		Started: t.Started, Ended: t.Ended, Usage: toUsageRec(t.Usage)}
}

func (r *turnRec) record() store.Turn {
	return store.Turn{ID: r.ID, Room: r.Room, MessageID: r.MessageID, Outcome: r.Outcome, Reason: r.Reason, Text: r.Text,
		Started: r.Started, Ended: r.Ended, Usage: r.Usage.record()}
}

// usageRec is what a turn cost, as the log stores it (nil: nothing).
type usageRec struct {
	Input      int64   `json:"input"`
	Output     int64   `json:"output"`
	CacheRead  int64   `json:"cache_read"`
	CacheWrite int64   `json:"cache_write"`
	CostUSD    float64 `json:"cost_usd"`
}

func toUsageRec(u store.Usage) *usageRec {
	if u.IsZero() {
		return nil
	}
	return &usageRec{Input: u.InputTokens, Output: u.OutputTokens, CacheRead: u.CacheReadTokens, CacheWrite: u.CacheWriteTokens,
		CostUSD: u.CostUSD}
}

func (r *usageRec) record() store.Usage {
	if r == nil {
		return store.Usage{}
	}
	return store.Usage{InputTokens: r.Input, OutputTokens: r.Output, CacheReadTokens: r.CacheRead, CacheWriteTokens: r.CacheWrite,
		CostUSD: r.CostUSD}
}

// approvalRec is an approval request as the log stores it.
type approvalRec struct {
	ID       string    `json:"ID"`
	Room     string    `json:"Room"`
	TurnID   string    `json:"TurnID"`
	Tool     string    `json:"Tool"`
	Input    string    `json:"Input"`
	Options  []string  `json:"Options"`
	Created  time.Time `json:"Created"`
	Deadline time.Time `json:"Deadline"`
	Decision string    `json:"Decision"`
	By       string    `json:"By"`
	Resolved time.Time `json:"Resolved"`
}

func toApprovalRec(a store.Approval) *approvalRec {
	r := approvalRec(a)
	return &r
}

func (r *approvalRec) record() store.Approval { return store.Approval(*r) }

// questionRec is a question as the log stores it.
type questionRec struct {
	ID       string    `json:"ID"`
	Room     string    `json:"Room"`
	TurnID   string    `json:"TurnID"`
	Title    string    `json:"Title"`
	Options  []string  `json:"Options"`
	Created  time.Time `json:"Created"`
	Deadline time.Time `json:"Deadline"`
	Answer   string    `json:"Answer"`
	By       string    `json:"By"`
	Answered time.Time `json:"Answered"`
}

func toQuestionRec(q store.Question) *questionRec {
	r := questionRec(q)
	return &r
}

func (r *questionRec) record() store.Question { return store.Question(*r) }
