package store

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain lets the test binary play a host that writes to a store until
// it is killed (see TestKilledHostLosesNoAcknowledgedWrite).
func TestMain(m *testing.M) {
	if path := os.Getenv("STORE_TEST_WRITER"); path != "" {
		os.Exit(writerHelper(path))
	}
	goleak.VerifyTestMain(m)
}

func writerHelper(path string) int {
	ctx := context.Background()
	db, err := Open(ctx, path, Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				id := fmt.Sprintf("m-%d-%d", g, i)
				err := db.Write(ctx, func(w *Writer) error {
					ev, err := w.Append("r", "message.accepted", map[string]string{"message_id": id})
					if err != nil {
						return err
					}
					return w.PutMessage(Message{ID: id, Room: "r", Seq: ev.Seq, Text: "x", Delivery: "queue", Status: MessageAccepted, Accepted: ev.Time})
				})
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				mu.Lock()
				fmt.Fprintln(out, id)
				out.Flush()
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return 0
}

func openTest(t *testing.T, opts Options) *DB {
	t.Helper()
	db, err := Open(t.Context(), filepath.Join(t.TempDir(), "agenthost.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func appendOne(ctx context.Context, db *DB, room, typ string, data any) (Event, error) {
	var ev Event
	err := db.Write(ctx, func(w *Writer) error {
		var err error
		ev, err = w.Append(room, typ, data)
		return err
	})
	return ev, err
}

func TestSequenceIsContiguousUnderConcurrentWriters(t *testing.T) {
	db := openTest(t, Options{})
	ctx := t.Context()
	rooms := []string{"a", "b", "c"}
	const writers, each = 8, 150
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				room := rooms[(g+i)%len(rooms)]
				if _, err := appendOne(ctx, db, room, "test", map[string]int{"g": g, "i": i}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := 0
	for _, room := range rooms {
		evs, err := db.Events(ctx, room, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		last := map[int]int{}
		for i, ev := range evs {
			if ev.Seq != int64(i+1) {
				t.Fatalf("room %s: event %d has seq %d", room, i, ev.Seq)
			}
			var d struct{ G, I int }
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatal(err)
			}
			// One writer's events keep its order.
			if prev, ok := last[d.G]; ok && d.I <= prev {
				t.Fatalf("room %s: writer %d's event %d after %d", room, d.G, d.I, prev)
			}
			last[d.G] = d.I
		}
		if s, _ := db.LastSeq(ctx, room); s != int64(len(evs)) {
			t.Fatalf("room %s: LastSeq %d, %d events", room, s, len(evs))
		}
		total += len(evs)
	}
	if total != writers*each {
		t.Fatalf("%d events stored, want %d", total, writers*each)
	}
}

func TestReplayWhileWritingSeesExactSequence(t *testing.T) {
	db := openTest(t, Options{})
	ctx := t.Context()
	const n = 1000
	watch, stop := db.Watch("r")
	defer stop()
	go func() {
		for i := range n {
			if _, err := appendOne(ctx, db, "r", "tick", map[string]int{"i": i}); err != nil {
				return
			}
		}
	}()
	var after int64
	deadline := time.After(60 * time.Second)
	for after < n {
		evs, err := db.Events(ctx, "r", after, 137) // pages cut across commits
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Seq != after+1 {
				t.Fatalf("gap or duplicate: seq %d after %d", ev.Seq, after)
			}
			var d struct{ I int64 }
			_ = json.Unmarshal(ev.Data, &d)
			if d.I != ev.Seq-1 {
				t.Fatalf("seq %d holds event %d", ev.Seq, d.I)
			}
			after = ev.Seq
		}
		if len(evs) > 0 {
			continue
		}
		select {
		case <-watch:
		case <-deadline:
			t.Fatalf("replay stuck at %d of %d", after, n)
		}
	}
}

func TestFailedWriteUndoesOnlyItself(t *testing.T) {
	db := openTest(t, Options{})
	ctx := t.Context()
	// Hold the writer so that the next writes share one batch.
	hold, held := make(chan struct{}), make(chan struct{})
	go func() {
		_ = db.Write(ctx, func(w *Writer) error {
			close(held)
			<-hold
			return nil
		})
	}()
	<-held
	boom := errors.New("boom")
	var wg sync.WaitGroup
	results := make([]error, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = db.Write(ctx, func(w *Writer) error {
				if _, err := w.Append("r", "x", map[string]int{"i": i}); err != nil {
					return err
				}
				if i == 1 {
					return boom
				}
				return nil
			})
		}()
	}
	waitQueued(t, db, 3)
	close(hold)
	wg.Wait()
	if !errors.Is(results[1], boom) || results[0] != nil || results[2] != nil {
		t.Fatalf("results %v", results)
	}
	evs, err := db.Events(ctx, "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].Seq != 1 || evs[1].Seq != 2 {
		t.Fatalf("events %+v", evs)
	}
	// The failed write's sequence number was given back.
	ev, err := appendOne(ctx, db, "r", "x", nil)
	if err != nil || ev.Seq != 3 {
		t.Fatalf("next append: seq %d, %v", ev.Seq, err)
	}
}

// waitQueued waits until n writes wait for the writer.
func waitQueued(t *testing.T, db *DB, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(db.reqs) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d writes queued, want %d", len(db.reqs), n)
		}
		time.Sleep(time.Millisecond) // polling a queue length: no event exists for it
	}
}

func TestWriteAbandonedBeforeTakenWritesNothing(t *testing.T) {
	db := openTest(t, Options{})
	hold, held := make(chan struct{}), make(chan struct{})
	go func() {
		_ = db.Write(t.Context(), func(w *Writer) error {
			close(held)
			<-hold
			return nil
		})
	}()
	<-held
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := appendOne(ctx, db, "r", "x", nil)
		done <- err
	}()
	waitQueued(t, db, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned write: %v", err)
	}
	close(hold)
	if _, err := appendOne(t.Context(), db, "other", "x", nil); err != nil {
		t.Fatal(err)
	}
	if evs, _ := db.Events(t.Context(), "r", 0, 0); len(evs) != 0 {
		t.Fatalf("abandoned write landed: %+v", evs)
	}
}

func TestPanickingWriteIsAnError(t *testing.T) {
	db := openTest(t, Options{})
	err := db.Write(t.Context(), func(w *Writer) error {
		_, _ = w.Append("r", "x", nil)
		panic("bad")
	})
	if err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("err %v", err)
	}
	if ev, err := appendOne(t.Context(), db, "r", "x", nil); err != nil || ev.Seq != 1 {
		t.Fatalf("after panic: seq %d, %v", ev.Seq, err)
	}
}

func TestEventDataMustBeAnObject(t *testing.T) {
	db := openTest(t, Options{})
	for _, bad := range []any{json.RawMessage(`[1]`), json.RawMessage(`{"a":`), 42, "s"} {
		if _, err := appendOne(t.Context(), db, "r", "x", bad); err == nil {
			t.Errorf("data %v accepted", bad)
		}
	}
}

func TestEventJSONIsFlat(t *testing.T) {
	at := time.Date(2026, 12, 1, 2, 3, 4, 5, time.UTC)
	for _, tc := range []struct {
		data json.RawMessage
		want string
	}{
		{json.RawMessage(`{"text":"hi"}`), `{"seq":7,"type":"text.delta","room":"r\"1","time":"2026-12-01T02:03:04.000000005Z","text":"hi"}`},
		{json.RawMessage(`{}`), `{"seq":7,"type":"text.delta","room":"r\"1","time":"2026-12-01T02:03:04.000000005Z"}`},
	} {
		b, err := json.Marshal(Event{Room: `r"1`, Seq: 7, Type: "text.delta", Time: at, Data: tc.data})
		if err != nil || string(b) != tc.want {
			t.Fatalf("got %s (%v), want %s", b, err, tc.want)
		}
	}
}

func TestSecondOpenIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agenthost.db")
	db, err := Open(t.Context(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(t.Context(), path, Options{}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
	if err := db.Write(t.Context(), func(*Writer) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
	db2, err := Open(t.Context(), path, Options{})
	if err != nil {
		t.Fatalf("open after close: %v", err)
	}
	_ = db2.Close()
}

func TestNewerSchemaIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agenthost.db")
	db, err := Open(t.Context(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec(fmt.Sprintf("PRAGMA user_version = %d", SchemaVersion+1)); err != nil {
		t.Fatal(err)
	}
	_ = raw.Close()
	if _, err := Open(t.Context(), path, Options{}); !errors.Is(err, ErrNewerSchema) {
		t.Fatalf("open: %v", err)
	}
}

func TestRecordsRoundTrip(t *testing.T) {
	db := openTest(t, Options{})
	ctx := t.Context()
	now := time.Now()
	err := db.Write(ctx, func(w *Writer) error {
		ev, err := w.Append("r", "message.accepted", map[string]string{"message_id": "m1"})
		if err != nil {
			return err
		}
		if err := w.PutMessage(Message{ID: "m1", Room: "r", Seq: ev.Seq, Sender: "ann", Text: "hi", Delivery: "queue", Status: MessageAccepted, Accepted: ev.Time}); err != nil {
			return err
		}
		if err := w.PutMessage(Message{ID: "m2", Room: "r", Seq: ev.Seq + 1, Text: "later", Delivery: "queue", Status: MessageQueued, Accepted: now}); err != nil {
			return err
		}
		if err := w.PutTurn(Turn{ID: "t1", Room: "r", MessageID: "m1", Started: now}); err != nil {
			return err
		}
		if err := w.UpdateMessage("m1", MessageStarted, "t1", "", ""); err != nil {
			return err
		}
		if err := w.SetSession("r", "omp", "sess-1"); err != nil {
			return err
		}
		if err := w.PutApproval(Approval{ID: "a1", Room: "r", TurnID: "t1", Tool: "bash", Input: "ls", Options: []string{"Approve", "Deny"}, Created: now, Deadline: now.Add(time.Minute)}); err != nil {
			return err
		}
		return w.PutQuestion(Question{ID: "q1", Room: "r", TurnID: "t1", Title: "which?", Options: []string{"a", "b"}, Created: now, Deadline: now.Add(time.Minute)})
	})
	if err != nil {
		t.Fatal(err)
	}
	room, err := db.Room(ctx, "r")
	if err != nil || room.SessionID != "sess-1" || room.Agent != "omp" || room.LastSeq != 1 {
		t.Fatalf("room %+v, %v", room, err)
	}
	if _, err := db.Room(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown room: %v", err)
	}
	open, err := db.OpenMessages(ctx)
	if err != nil || len(open) != 2 || open[0].ID != "m1" || open[0].Status != MessageStarted || open[0].TurnID != "t1" {
		t.Fatalf("open messages %+v, %v", open, err)
	}
	turns, err := db.OpenTurns(ctx)
	if err != nil || len(turns) != 1 || turns[0].ID != "t1" {
		t.Fatalf("open turns %+v, %v", turns, err)
	}
	if ap, err := db.Approvals(ctx, "r", true); err != nil || len(ap) != 1 || ap[0].Options[1] != "Deny" {
		t.Fatalf("approvals %+v, %v", ap, err)
	}

	// Guarded transitions: each happens once.
	resolve := func(id string) error {
		return db.Write(ctx, func(w *Writer) error { return w.ResolveApproval("r", id, "allow", "person") })
	}
	if err := resolve("a1"); err != nil {
		t.Fatal(err)
	}
	if err := resolve("a1"); !errors.Is(err, ErrConflict) {
		t.Fatalf("resolve twice: %v", err)
	}
	if err := resolve("zz"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("resolve unknown: %v", err)
	}
	if err := db.Write(ctx, func(w *Writer) error { return w.ResolveApproval("other", "a1", "deny", "person") }); !errors.Is(err, ErrNotFound) {
		t.Fatalf("resolve in another room: %v", err)
	}
	answer := func() error {
		return db.Write(ctx, func(w *Writer) error { return w.AnswerQuestion("r", "q1", "a", "person") })
	}
	if err := answer(); err != nil {
		t.Fatal(err)
	}
	if err := answer(); !errors.Is(err, ErrConflict) {
		t.Fatalf("answer twice: %v", err)
	}
	end := func() error {
		return db.Write(ctx, func(w *Writer) error {
			if err := w.EndTurn("t1", "settled", "", "done", Usage{}); err != nil {
				return err
			}
			return w.UpdateMessage("m1", MessageEnded, "", "settled", "")
		})
	}
	if err := end(); err != nil {
		t.Fatal(err)
	}
	if err := end(); !errors.Is(err, ErrConflict) {
		t.Fatalf("end twice: %v", err)
	}
	m, err := db.Message(ctx, "r", "m1")
	if err != nil || m.Status != MessageEnded || m.Outcome != "settled" || m.TurnID != "t1" || m.Ended.IsZero() {
		t.Fatalf("message %+v, %v", m, err)
	}
	if err := db.Write(ctx, func(w *Writer) error { return w.UpdateMessage("nope", MessageQueued, "", "", "") }); !errors.Is(err, ErrNotFound) {
		t.Fatalf("update unknown message: %v", err)
	}
	if _, err := putReceipt(ctx, db, "r"); err != nil {
		t.Fatal(err)
	}
	rs, err := db.Receipts(ctx, "r")
	if err != nil || len(rs) != 1 || string(rs[0].Receipt) != `{"ok":true}` {
		t.Fatalf("receipts %+v, %v", rs, err)
	}
}

func putReceipt(ctx context.Context, db *DB, room string) (int64, error) {
	var id int64
	err := db.Write(ctx, func(w *Writer) error {
		var err error
		id, err = w.PutReceipt(room, json.RawMessage(`{"ok":true}`))
		return err
	})
	return id, err
}

// A host killed with SIGKILL loses no write it acknowledged: a helper
// process writes as fast as it can and prints each id once Write returned;
// every printed id is in the store after the kill.
func TestKilledHostLosesNoAcknowledgedWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agenthost.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "STORE_TEST_WRITER="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var acked []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		acked = append(acked, sc.Text())
		if len(acked) == 2000 {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			break
		}
	}
	for sc.Scan() {
		acked = append(acked, sc.Text()) // printed before the kill landed
	}
	_ = cmd.Wait()
	if len(acked) < 2000 {
		t.Fatalf("helper acknowledged %d writes: %s", len(acked), stderr.String())
	}
	db, err := Open(t.Context(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, id := range acked {
		if _, err := db.Message(t.Context(), "r", id); err != nil {
			t.Fatalf("acknowledged message %s lost: %v", id, err)
		}
	}
	evs, err := db.Events(t.Context(), "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range evs {
		if ev.Seq != int64(i+1) {
			t.Fatalf("seq %d at %d after recovery", ev.Seq, i)
		}
	}
	// Writes go on from the recovered sequence.
	ev, err := appendOne(t.Context(), db, "r", "x", nil)
	if err != nil || ev.Seq != int64(len(evs)+1) {
		t.Fatalf("append after recovery: seq %d (%d events), %v", ev.Seq, len(evs), err)
	}
}

// Writes racing Close either land (nil, and are stored) or fail with
// ErrClosed; none hangs.
func TestWritesRacingCloseEndCleanly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agenthost.db")
	db, err := Open(t.Context(), path, Options{Queue: 8})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	landed := 0
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				_, err := appendOne(ctx, db, "r", "x", map[string]int{"g": g, "i": i})
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				landed++
				mu.Unlock()
			}
		}()
	}
	waitQueued(t, db, 4)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	db, err = Open(t.Context(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if s, _ := db.LastSeq(t.Context(), "r"); s != int64(landed) {
		t.Fatalf("%d writes acknowledged, %d stored", landed, s)
	}
}

// A room's agent handle and output offset: set together with events,
// the offset never moving back, a new handle starting from 0, and only
// rooms with a handle listed.
func TestAgentProcAndOffset(t *testing.T) {
	db := openTest(t, Options{})
	ctx := t.Context()
	err := db.Write(ctx, func(w *Writer) error {
		if _, err := w.Append("a", "agent.started", nil); err != nil {
			return err
		}
		if _, err := w.Append("b", "agent.started", nil); err != nil {
			return err
		}
		return w.SetAgentProc("a", `{"id":"p1"}`)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{120, 80} {
		err := db.Write(ctx, func(w *Writer) error {
			if _, err := w.Append("a", "text.delta", nil); err != nil {
				return err
			}
			return w.SetAgentOffset("a", off, off+1)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	rs, err := db.AgentRooms(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].ID != "a" || rs[0].AgentProc != `{"id":"p1"}` || rs[0].AgentOffset != 120 || rs[0].AgentSeen != 121 {
		t.Fatalf("agent rooms: %+v", rs)
	}
	if err := db.Write(ctx, func(w *Writer) error { return w.SetAgentProc("a", `{"id":"p2"}`) }); err != nil {
		t.Fatal(err)
	}
	r, err := db.Room(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if r.AgentProc != `{"id":"p2"}` || r.AgentOffset != 0 || r.AgentSeen != 0 {
		t.Fatalf("room after a new handle: %+v", r)
	}
	if err := db.Write(ctx, func(w *Writer) error { return w.SetAgentProc("a", "") }); err != nil {
		t.Fatal(err)
	}
	if rs, err := db.AgentRooms(ctx); err != nil || len(rs) != 0 {
		t.Fatalf("agent rooms after clearing: %+v %v", rs, err)
	}
}

// Turns lists a room's turns in order of the message each consumed, with
// their final text, from a given message on: what the page shows instead
// of replaying the log.
func TestTurnsInOrderOfTheirMessages(t *testing.T) {
	db := openTest(t, Options{})
	ctx := t.Context()
	now := time.Now()
	var seqs []int64
	err := db.Write(ctx, func(w *Writer) error {
		for i, room := range []string{"r", "r", "r", "other"} {
			id := fmt.Sprintf("m%d", i)
			ev, err := w.Append(room, "message.accepted", map[string]string{"message_id": id})
			if err != nil {
				return err
			}
			seqs = append(seqs, ev.Seq)
			if err := w.PutMessage(Message{ID: id, Room: room, Seq: ev.Seq, Text: id, Status: MessageQueued, Accepted: now}); err != nil {
				return err
			}
			// Later messages' turns start earlier: the order is the messages'.
			if err := w.PutTurn(Turn{ID: fmt.Sprintf("t%d", i), Room: room, MessageID: id, Started: now.Add(-time.Duration(i) * time.Second)}); err != nil {
				return err
			}
		}
		return w.EndTurn("t0", "settled", "", "answer 0", Usage{InputTokens: 7, CostUSD: 0.5})
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := func(after int64, limit int) string {
		ts, err := db.Turns(ctx, "r", after, limit)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tr := range ts {
			out = append(out, tr.ID+":"+tr.Outcome+":"+tr.Text)
		}
		return strings.Join(out, " ")
	}
	if got := ids(0, 0); got != "t0:settled:answer 0 t1:: t2::" {
		t.Fatalf("turns: %s", got)
	}
	if got := ids(seqs[0], 1); got != "t1::" {
		t.Fatalf("turns after the first message, one: %s", got)
	}
	if got := ids(seqs[2], 0); got != "" {
		t.Fatalf("turns after the last message: %s", got)
	}
}

// TestMigrate_FromEveryEarlierVersion: a database an older agenthost left
// at each earlier schema version, with a room mid-turn in it, opens,
// migrates to the current version, and reads and writes as before.
func TestMigrate_FromEveryEarlierVersion(t *testing.T) {
	ctx := t.Context()
	for v := 1; v < SchemaVersion; v++ {
		t.Run(fmt.Sprintf("from%d", v), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agenthost.db")
			raw, err := sql.Open("sqlite", path)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range migrations[:v] {
				if _, err := raw.Exec(m); err != nil {
					t.Fatal(err)
				}
			}
			// Rows as version 1 wrote them (every later migration only
			// adds columns with defaults, or indexes).
			for _, q := range []string{
				fmt.Sprintf("PRAGMA user_version = %d", v),
				`INSERT INTO rooms (id, created_ns, agent, session_id) VALUES ('r', 1, 'omp', 's1')`,
				`INSERT INTO events (room, seq, type, time_ns, data) VALUES ('r', 1, 'message.accepted', 2, '{}'), ('r', 2, 'turn.started', 3, '{}')`,
				`INSERT INTO messages (id, room, seq, sender, text, delivery, status, turn_id, accepted_ns, started_ns) VALUES ('m1', 'r', 1, 'ann', 'hi', 'queue', 'started', 't1', 2, 3)`,
				`INSERT INTO turns (id, room, message_id, started_ns) VALUES ('t1', 'r', 'm1', 3)`,
				// An earlier turn, ended before usage was kept: it counts, with nothing spent.
				`INSERT INTO messages (id, room, seq, sender, text, delivery, status, turn_id, accepted_ns, started_ns, ended_ns, outcome) VALUES ('m0', 'r', 0, 'bob', 'yo', 'queue', 'ended', 't0', 1, 1, 2, 'settled')`,
				`INSERT INTO turns (id, room, message_id, outcome, started_ns, ended_ns) VALUES ('t0', 'r', 'm0', 'settled', 1, 2)`,
				`INSERT INTO approvals (id, room, turn_id, tool, input, options, created_ns, deadline_ns) VALUES ('a1', 'r', 't1', 'bash', 'ls', '["allow","deny"]', 4, 5)`,
				`INSERT INTO questions (id, room, turn_id, title, options, created_ns, deadline_ns) VALUES ('q1', 'r', 't1', 'which?', '["a","b"]', 4, 5)`,
			} {
				if _, err := raw.Exec(q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			if v >= 4 {
				// From version 4 on, the turn ended was counted as it ended.
				if _, err := raw.Exec(`INSERT INTO room_usage (room, sender, turns) VALUES ('r', 'bob', 1)`); err != nil {
					t.Fatal(err)
				}
			}
			_ = raw.Close()

			db, err := Open(ctx, path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			r, err := db.Room(ctx, "r")
			if err != nil || r.Agent != "omp" || r.SessionID != "s1" || r.LastSeq != 2 || r.AgentProc != "" ||
				r.Turns != 1 || !r.Usage.IsZero() || r.UsageBySender["bob"].Turns != 1 {
				t.Fatalf("room %+v, %v", r, err)
			}
			open, err := db.OpenTurns(ctx)
			if err != nil || len(open) != 1 || open[0].ID != "t1" {
				t.Fatalf("open turns %+v, %v", open, err)
			}
			appr, err := db.Approvals(ctx, "r", true)
			if err != nil || len(appr) != 1 || appr[0].Tool != "bash" || len(appr[0].Options) != 2 {
				t.Fatalf("pending approvals %+v, %v", appr, err)
			}
			qs, err := db.Questions(ctx, "r", true)
			if err != nil || len(qs) != 1 || qs[0].Title != "which?" {
				t.Fatalf("pending questions %+v, %v", qs, err)
			}
			err = db.Write(ctx, func(w *Writer) error {
				if err := w.SetAgentProc("r", "procd:1"); err != nil {
					return err
				}
				if err := w.ResolveApproval("r", "a1", "allow", "ann"); err != nil {
					return err
				}
				if err := w.EndTurn("t1", "settled", "", "ok", Usage{OutputTokens: 3, CostUSD: 0.25}); err != nil {
					return err
				}
				_, err := w.Append("r", "approval.resolved", nil)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if appr, err = db.Approvals(ctx, "r", true); err != nil || len(appr) != 0 {
				t.Fatalf("pending approvals after the decision %+v, %v", appr, err)
			}
			if err := db.Write(ctx, func(w *Writer) error { return w.AddCompute("r", Compute{CPUSeconds: 1, Processes: 1}) }); err != nil {
				t.Fatal(err)
			}
			if r, err = db.Room(ctx, "r"); err != nil || r.AgentProc != "procd:1" || r.LastSeq != 3 ||
				r.Turns != 2 || r.Usage != (Usage{OutputTokens: 3, CostUSD: 0.25}) || r.UsageBySender["ann"].Usage.OutputTokens != 3 ||
				r.Compute != (Compute{CPUSeconds: 1, Processes: 1}) {
				t.Fatalf("room after a write %+v, %v", r, err)
			}
			var got int
			if err := db.wdb.QueryRowContext(ctx, "PRAGMA user_version").Scan(&got); err != nil || got != SchemaVersion {
				t.Fatalf("schema version %d, %v; want %d", got, err, SchemaVersion)
			}
		})
	}
}

// A room's totals count every ended turn and what it cost, split by the
// sender of the turn's first message, in Room and in a page of rooms; a
// turn's own usage is on it.
func TestEndTurn_CountsUsageBySender(t *testing.T) {
	db := openTest(t, Options{})
	ctx := t.Context()
	now := time.Now()
	spend := []struct {
		room, sender string
		u            Usage
	}{
		{"a", "ann", Usage{InputTokens: 10, OutputTokens: 2, CacheReadTokens: 5, CacheWriteTokens: 1, CostUSD: 0.5}},
		{"a", "bob", Usage{InputTokens: 1, OutputTokens: 1, CostUSD: 0.25}},
		{"a", "ann", Usage{InputTokens: 3, CostUSD: 0.125}},
		{"a", "", Usage{}},
		{"b", "ann", Usage{OutputTokens: 7}},
	}
	err := db.Write(ctx, func(w *Writer) error {
		for i, s := range spend {
			id := fmt.Sprintf("m%d", i)
			ev, err := w.Append(s.room, "message.accepted", map[string]string{"message_id": id})
			if err != nil {
				return err
			}
			if err := w.PutMessage(Message{ID: id, Room: s.room, Seq: ev.Seq, Sender: s.sender, Text: "hi", Status: MessageQueued, Accepted: now}); err != nil {
				return err
			}
			tid := fmt.Sprintf("t%d", i)
			if err := w.PutTurn(Turn{ID: tid, Room: s.room, MessageID: id, Started: now}); err != nil {
				return err
			}
			if err := w.EndTurn(tid, "settled", "", "ok", s.u); err != nil {
				return err
			}
			if err := w.AddCompute(s.room, Compute{CPUSeconds: 1.5, PeakMemoryBytes: int64(100 * (i + 1)), Processes: 2}); err != nil {
				return err
			}
		}
		// A room with no turn ended.
		_, err := w.Append("c", "message.accepted", map[string]string{"message_id": "x"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]SenderUsage{
		"ann": {Turns: 2, Usage: Usage{InputTokens: 13, OutputTokens: 2, CacheReadTokens: 5, CacheWriteTokens: 1, CostUSD: 0.625}},
		"bob": {Turns: 1, Usage: Usage{InputTokens: 1, OutputTokens: 1, CostUSD: 0.25}},
		"":    {Turns: 1},
	}
	total := Usage{InputTokens: 14, OutputTokens: 3, CacheReadTokens: 5, CacheWriteTokens: 1, CostUSD: 0.875}
	check := func(what string, r Room) {
		t.Helper()
		// Compute: CPU and processes summed, the highest peak.
		if r.ID != "a" || r.Turns != 4 || r.Usage != total || !maps.Equal(r.UsageBySender, want) ||
			r.Compute != (Compute{CPUSeconds: 6, PeakMemoryBytes: 400, Processes: 8}) {
			t.Fatalf("%s: %+v, want 4 turns, %+v, %+v", what, r, total, want)
		}
	}
	r, err := db.Room(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	check("room", r)
	page, err := db.RoomPage(ctx, "", 10)
	if err != nil || len(page) != 3 {
		t.Fatalf("page %+v, %v", page, err)
	}
	check("page", page[0])
	if b := page[1]; b.Turns != 1 || b.Usage != (Usage{OutputTokens: 7}) || len(b.UsageBySender) != 1 {
		t.Fatalf("room b %+v", b)
	}
	if c := page[2]; c.Turns != 0 || !c.Usage.IsZero() || len(c.UsageBySender) != 0 || c.Compute != (Compute{}) {
		t.Fatalf("room c %+v", c)
	}
	ts, err := db.Turns(ctx, "a", 0, 0)
	if err != nil || len(ts) != 4 || ts[0].Usage != spend[0].u {
		t.Fatalf("turns %+v, %v", ts, err)
	}
}

// The writer prepares a statement once, after the first batch that ran
// it, and later batches reuse it; readers prepare theirs once too.
func TestStatementsPreparedOnce(t *testing.T) {
	db := openTest(t, Options{})
	ctx := t.Context()
	write1 := func(i int) {
		t.Helper()
		if err := db.Write(ctx, func(w *Writer) error {
			_, err := w.Append("r", "text.delta", map[string]string{"text": strconv.Itoa(i)})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	write1(0)
	// The writer prepared what the first batch ran once its transaction
	// ended; it runs nothing else until the next write.
	write1(1)
	var prepared int
	// A write's function runs on the writer goroutine, which owns wstmts.
	if err := db.Write(ctx, func(w *Writer) error { prepared = len(db.wstmts); return nil }); err != nil {
		t.Fatal(err)
	}
	if prepared == 0 {
		t.Fatal("no writer statement prepared")
	}
	for i := 2; i < 20; i++ {
		write1(i)
	}
	grown := -1
	if err := db.Write(ctx, func(w *Writer) error { grown = len(db.wstmts) - prepared; return nil }); err != nil {
		t.Fatal(err)
	}
	if grown != 0 {
		t.Errorf("%d more statements prepared for the same writes", grown)
	}
	// (LastSeq: Events would be answered from the recent events.)
	for range 3 {
		if last, err := db.LastSeq(ctx, "r"); err != nil || last != 20 {
			t.Fatalf("last seq %d, %v", last, err)
		}
	}
	db.smu.Lock()
	n := len(db.rstmts)
	db.smu.Unlock()
	if n != 1 {
		t.Errorf("%d reader statements for one query", n)
	}
}

// TestCheckpointerMovesTheWAL: commits leave the WAL to the checkpointer
// (SQLite would otherwise checkpoint inside the commit that takes the WAL
// past 1000 pages, and every write behind it would wait). One commit of
// well over 1000 pages is moved into the database file by the
// checkpointer, all of it; the writer's own threshold is the fallback's.
func TestCheckpointerMovesTheWAL(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agenthost.db")
	db, err := Open(t.Context(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	type ckpt struct{ frames, moved int }
	seen := make(chan ckpt, 16)
	db.onCheckpoint = func(frames, moved int) {
		select {
		case seen <- ckpt{frames, moved}:
		default:
		}
	}
	big := strings.Repeat("x", 4000)
	const events = 2000
	err = db.Write(t.Context(), func(w *Writer) error {
		var auto int
		if err := w.queryRow("PRAGMA wal_autocheckpoint").Scan(&auto); err != nil {
			return err
		}
		if auto != walFallbackPages {
			return fmt.Errorf("the writer checkpoints past %d pages, want %d", auto, walFallbackPages)
		}
		for i := range events {
			if _, err := w.Append("r", "x", map[string]any{"i": i, "pad": big}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.After(30 * time.Second)
	for {
		select {
		case c := <-seen:
			if c.frames < events/2 || c.moved != c.frames {
				t.Logf("a checkpoint moved %d of %d frames", c.moved, c.frames)
				continue
			}
		case <-deadline:
			t.Fatal("no checkpoint moved the commit's WAL")
		}
		break
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = Open(t.Context(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	evs, err := db.Events(t.Context(), "r", 0, 0)
	if err != nil || len(evs) != events {
		t.Fatalf("after reopening: %d events, %v", len(evs), err)
	}
}

// A room's state is one snapshot (issue 47 item 4): while writers end
// turns, every Room and RoomPage read counts exactly the turns whose
// turn.ended is at or before its LastSeq, and their usage. (Read in two
// queries, a state counted a turn that ended after its LastSeq, and the
// page, which adds every turn.ended after LastSeq, counted it twice.)
func TestRoomStateIsOneSnapshot(t *testing.T) {
	db := openTest(t, Options{})
	ctx := t.Context()
	const writers, turns = 3, 120
	type sample struct {
		seq, turns, out int64
	}
	var (
		mu      sync.Mutex
		samples []sample
		wg      sync.WaitGroup
		readers sync.WaitGroup
	)
	done := make(chan struct{})
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range turns {
				tid := fmt.Sprintf("t%d-%d", w, i)
				err := db.Write(ctx, func(wr *Writer) error {
					if err := wr.PutTurn(Turn{ID: tid, Room: "s", MessageID: "m" + tid, Started: time.Now()}); err != nil {
						return err
					}
					_, err := wr.Append("s", "turn.started", map[string]string{"turn_id": tid})
					return err
				})
				if err == nil {
					err = db.Write(ctx, func(wr *Writer) error {
						if err := wr.EndTurn(tid, "settled", "", "ok", Usage{OutputTokens: 1}); err != nil {
							return err
						}
						_, err := wr.Append("s", "turn.ended", map[string]string{"turn_id": tid})
						return err
					})
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	read := func(page bool) {
		defer readers.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			var r Room
			if page {
				rs, err := db.RoomPage(ctx, "", 0)
				if err != nil || len(rs) > 1 {
					t.Errorf("page %+v: %v", rs, err)
					return
				}
				if len(rs) == 0 {
					continue
				}
				r = rs[0]
			} else {
				var err error
				if r, err = db.Room(ctx, "s"); errors.Is(err, ErrNotFound) {
					continue
				} else if err != nil {
					t.Error(err)
					return
				}
			}
			mu.Lock()
			samples = append(samples, sample{r.LastSeq, r.Turns, r.Usage.OutputTokens})
			mu.Unlock()
		}
	}
	readers.Add(4)
	go read(false)
	go read(false)
	go read(true)
	go read(true)
	wg.Wait()
	close(done)
	readers.Wait()
	// The turn.ended events' sequence numbers, in order.
	var ended []int64
	for after := int64(0); ; {
		evs, err := db.Events(ctx, "s", after, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Type == "turn.ended" {
				ended = append(ended, ev.Seq)
			}
			after = ev.Seq
		}
		if len(evs) < MaxEventsPage {
			break
		}
	}
	if len(ended) != writers*turns {
		t.Fatalf("%d turn.ended events, want %d", len(ended), writers*turns)
	}
	bad := 0
	for _, s := range samples {
		want, _ := slices.BinarySearch(ended, s.seq+1)
		if s.turns != int64(want) || s.out != int64(want) {
			if bad++; bad <= 5 {
				t.Errorf("a state at last_seq %d counts %d turns (usage %d): %d turn.ended events are at or before it", s.seq, s.turns, s.out, want)
			}
		}
	}
	if bad > 0 || len(samples) == 0 {
		t.Fatalf("%d of %d states disagree with the log at their last_seq", bad, len(samples))
	}
	t.Logf("%d states read, each agreeing with the log at its last_seq", len(samples))
}
