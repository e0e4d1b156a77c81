package natsroom

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// frozenLog is testdata/log-format1.jsonl's entries: a room's log as
// format 1 wrote it (before the version field), frozen. Nothing may
// change it: it is what nodes already have on disk.
func frozenLog(t *testing.T) [][]byte {
	t.Helper()
	f, err := os.Open("testdata/log-format1.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, bytes.Clone(sc.Bytes()))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// TestLogFormat_FrozenLogDecodesAndEncodesTheSame: every entry of the
// frozen log decodes, and encodes back byte for byte (a renamed field
// name would show here), and the folded records are the room's.
func TestLogFormat_FrozenLogDecodesAndEncodesTheSame(t *testing.T) {
	f := newFold("frozen")
	for i, line := range frozenLog(t) {
		b, err := decode(&jetstream.RawStreamMsg{Sequence: uint64(i + 1), Data: line})
		if err != nil {
			t.Fatalf("entry %d: %v", i+1, err)
		}
		again, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, line) {
			t.Fatalf("entry %d encodes otherwise than stored:\nstored  %s\nencoded %s", i+1, line, again)
		}
		f.add(b)
	}
	checkFrozenRoom(t, f.room, f.msgs, f.turns, f.approvals, f.questions)
	if f.receipts != 1 || f.inbox != 57 || f.resident {
		t.Fatalf("receipts %d, inbox cursor %d, resident %v; want 1, 57, false", f.receipts, f.inbox, f.resident)
	}
}

// checkFrozenRoom checks the records of the frozen log's room.
func checkFrozenRoom(t *testing.T, rm store.Room, msgs []store.Message, turns []store.Turn, appr []store.Approval, qs []store.Question) {
	t.Helper()
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	if rm.Agent != "omp" || rm.SessionID != "sess-1" || rm.LastSeq != 13 || !rm.Created.Equal(t0) {
		t.Fatalf("room %+v", rm)
	}
	if len(msgs) != 2 {
		t.Fatalf("messages %+v", msgs)
	}
	m1, m2 := msgs[0], msgs[1]
	if m1.ID != "m_1" || m1.Seq != 2 || m1.Sender != "ann" || m1.Text != "hello" || m1.Status != store.MessageEnded ||
		m1.Outcome != "settled" || m1.TurnID != "t_1" || !m1.Accepted.Equal(at(1)) || !m1.Started.Equal(at(3)) || !m1.Ended.Equal(at(8)) {
		t.Fatalf("message 1 %+v", m1)
	}
	if m2.ID != "m_2" || m2.Seq != 12 || m2.Delivery != "steer" || m2.Status != store.MessageQueued || !m2.Ended.IsZero() {
		t.Fatalf("message 2 %+v", m2)
	}
	if len(turns) != 1 || turns[0].ID != "t_1" || turns[0].MessageID != "m_1" || turns[0].Outcome != "settled" ||
		turns[0].Text != "done" || !turns[0].Started.Equal(at(3)) || !turns[0].Ended.Equal(at(8)) {
		t.Fatalf("turns %+v", turns)
	}
	if len(appr) != 1 || appr[0].ID != "a_1" || appr[0].Tool != "bash" || appr[0].Input != "ls" || strings.Join(appr[0].Options, ",") != "allow,deny" ||
		appr[0].Decision != "allow" || appr[0].By != "ann" || !appr[0].Deadline.Equal(at(64)) || !appr[0].Resolved.Equal(at(5)) {
		t.Fatalf("approvals %+v", appr)
	}
	if len(qs) != 1 || qs[0].ID != "q_1" || qs[0].Title != "which?" || strings.Join(qs[0].Options, ",") != "a,b" ||
		qs[0].Answer != "b" || qs[0].By != "ann" || !qs[0].Answered.Equal(at(7)) {
		t.Fatalf("questions %+v", qs)
	}
}

// TestLogFormat_NewerFormatRefused: an entry of a format this build does
// not know is an error that says so, not a misread room.
func TestLogFormat_NewerFormatRefused(t *testing.T) {
	line := frozenLog(t)[1]
	newer := append([]byte(`{"v":2,`), line[1:]...)
	_, err := decode(&jetstream.RawStreamMsg{Sequence: 2, Data: newer})
	if !errors.Is(err, ErrLogFormat) || !strings.Contains(err.Error(), "format 2") {
		t.Fatalf("decode of a format 2 entry: %v, want ErrLogFormat naming format 2", err)
	}
}

// TestLogFormat_StoreReadsTheFrozenLogAndWritesItsFormat: a node reads a
// room whose log an older build wrote (the frozen one, published as is)
// through the store's own reads, and what it writes itself says its
// format.
func TestLogFormat_StoreReadsTheFrozenLogAndWritesItsFormat(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, js := singleNode(t, ctx)
	rm := "frozen"
	for _, line := range frozenLog(t) {
		if _, err := js.Publish(ctx, evSubject(rm), line); err != nil {
			t.Fatal(err)
		}
	}
	s := newStore(nc, js, "n3")
	r, err := s.Room(ctx, rm)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := s.Messages(ctx, rm, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	turns, err := s.Turns(ctx, rm, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	appr, err := s.Approvals(ctx, rm, false)
	if err != nil {
		t.Fatal(err)
	}
	qs, err := s.Questions(ctx, rm, false)
	if err != nil {
		t.Fatal(err)
	}
	checkFrozenRoom(t, r, msgs, turns, appr, qs)
	evs, err := s.Events(ctx, rm, 0, 0)
	if err != nil || len(evs) != 13 || evs[12].Type != "agent.released" {
		t.Fatalf("events: %d, %v", len(evs), err)
	}

	// A new holder goes on from it, and its entries carry the format.
	forever := func() time.Time { return time.Now().Add(time.Hour) }
	if err := s.takeover(ctx, rm, 10, forever); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, func(tx room.Tx) error { return tx.UpdateMessage("m_2", store.MessageEnded, "", "failed", "test") }); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, StreamRooms)
	if err != nil {
		t.Fatal(err)
	}
	last, err := st.GetLastMsgForSubject(ctx, evSubject(rm))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(last.Data, []byte(`{"v":1,`)) {
		t.Fatalf("a new entry does not say its format: %.80s", last.Data)
	}
	m, err := s.Message(ctx, rm, "m_2")
	if err != nil || m.Status != store.MessageEnded || m.Outcome != "failed" {
		t.Fatalf("message m_2 after the write: %+v, %v", m, err)
	}
}
