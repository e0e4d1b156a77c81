package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/agenthost/agenthost/record"
)

// The records are record's (a public package, so that a store outside
// this module can serve rooms); these names keep the store's own code
// and its callers as they were.
type (
	Event    = record.Event
	Message  = record.Message
	Turn     = record.Turn
	Room     = record.Room
	Approval = record.Approval
	Question = record.Question
	Receipt  = record.Receipt
	Exchange = record.Exchange
	Usage    = record.Usage
	Compute  = record.Compute
	// SenderUsage is one sender's share of a room's usage.
	SenderUsage = record.SenderUsage
)

// Message statuses (see record).
const (
	MessageAccepted = record.MessageAccepted
	MessageQueued   = record.MessageQueued
	MessageStarted  = record.MessageStarted
	MessageEnded    = record.MessageEnded
)

// encodeData marshals an event's data, which must be a JSON object.
func encodeData(data any) ([]byte, error) {
	var raw []byte
	switch d := data.(type) {
	case nil:
		return []byte("{}"), nil
	case json.RawMessage:
		raw = d
	case []byte:
		raw = d
	default:
		var err error
		if raw, err = json.Marshal(data); err != nil {
			return nil, fmt.Errorf("store: event data: %w", err)
		}
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) < 2 || raw[0] != '{' || !json.Valid(raw) {
		return nil, errors.New("store: event data is not a JSON object")
	}
	return raw, nil
}

func ns(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.Unix(0, v)
}
