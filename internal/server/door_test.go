package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/room"
)

// The door (room's package doc): every pair of the operations that read
// or change a room's durable state, run at once against one room, many
// rounds; after each, the room is in a state some serial order of the two
// explains, and each answer agrees with it.

// doorAnswer is an operation's HTTP answer.
type doorAnswer struct {
	op     string
	k      int // which of two of a kind
	status int
	body   map[string]any
	err    error // the request failed (no answer)
}

// doorRound is one round's room and what it holds before the pair runs.
type doorRound struct {
	h        *harness
	rm       string
	turn     string // a settled turn that wrote f.txt
	inc      string // the room's incarnation
	approval string // a pending approval of a running turn ("": none)
	question string // a pending question of a running turn
	running  bool   // a turn ran as the pair began
	accepted []room.Accepted
	real     bool   // the room's agent is omp on the scripted model
	base     string // the server's URL, when not h.ts's
}

// write is a message whose turn writes name in the workspace.
func (x *doorRound) write(name string) string {
	if x.real {
		return "Run it: " + bashCall("echo hello > "+name)
	}
	return "write:" + name
}

// call sends a request; safe from any goroutine (no t.Fatal).
func (x *doorRound) call(method, path string, body any, headers ...string) (int, map[string]any, http.Header, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, cmpOr(x.base, x.h.ts.URL)+path, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, nil, nil, err
	}
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return res.StatusCode, m, res.Header, nil
}

func (x *doorRound) path(rest string) string { return "/v1/rooms/" + x.rm + rest }

// The settings two PUTs race with: X's budget (1 turn) the room's totals
// reach (it refuses messages), Y none.
var (
	putX = map[string]any{"instructions": "x", "budget": map[string]any{"turns": 1}}
	putY = map[string]any{"instructions": "y"}
)

// doorOps are the operations of the table.
var doorOps = []struct {
	name string
	run  func(x *doorRound, k int) doorAnswer
}{
	{"submit", func(x *doorRound, k int) doorAnswer {
		st, b, _, err := x.call("POST", x.path("/messages"), map[string]string{"text": x.write(fmt.Sprintf("g%d.txt", k))})
		return doorAnswer{status: st, body: b, err: err}
	}},
	{"put", func(x *doorRound, k int) doorAnswer {
		body := putX
		if k == 1 {
			body = putY
		}
		st, b, _, err := x.call("PUT", x.path("/config"), body)
		return doorAnswer{status: st, body: b, err: err}
	}},
	{"purge", func(x *doorRound, k int) doorAnswer {
		st, b, _, err := x.call("DELETE", x.path("?purge=true"), nil)
		return doorAnswer{status: st, body: b, err: err}
	}},
	{"diff", func(x *doorRound, k int) doorAnswer {
		st, b, _, err := x.call("GET", x.path("/turns/"+x.turn+"/diff"), nil)
		return doorAnswer{status: st, body: b, err: err}
	}},
	{"revert", func(x *doorRound, k int) doorAnswer {
		st, b, _, err := x.call("POST", x.path("/turns/"+x.turn+"/revert"), nil)
		return doorAnswer{status: st, body: b, err: err}
	}},
	{"release", func(x *doorRound, k int) doorAnswer {
		st, b, _, err := x.call("DELETE", x.path(""), nil)
		return doorAnswer{status: st, body: b, err: err}
	}},
	{"cancel", func(x *doorRound, k int) doorAnswer {
		st, b, _, err := x.call("POST", x.path("/cancel"), nil)
		return doorAnswer{status: st, body: b, err: err}
	}},
	{"approve", func(x *doorRound, k int) doorAnswer {
		id := cmpOr(x.approval, "a_none")
		st, b, _, err := x.call("POST", x.path("/approvals/"+id), map[string]string{"decision": "allow"})
		return doorAnswer{status: st, body: b, err: err}
	}},
	{"answer", func(x *doorRound, k int) doorAnswer {
		id := cmpOr(x.question, "q_none")
		st, b, _, err := x.call("POST", x.path("/questions/"+id), map[string]string{"answer": "red"})
		return doorAnswer{status: st, body: b, err: err}
	}},
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// setup makes the round's room: settings, a settled turn that wrote
// f.txt, and, for a pair that needs one, a running turn waiting on an
// approval or a question, or hanging.
func (x *doorRound) setup(t *testing.T, pair [2]string) {
	h := x.h
	if r := h.do("PUT", x.path("/config"), map[string]string{"instructions": "base"}); r.status != http.StatusOK {
		t.Fatalf("PUT base: %d %s", r.status, r.body)
	}
	acc := h.post(x.rm, x.write("f.txt"))
	x.accepted = append(x.accepted, acc)
	d := h.endedWithin(x.rm, acc, 2*time.Minute)
	x.turn, _ = d["turn_id"].(string)
	has := func(op string) bool { return slices.Contains(pair[:], op) }
	switch {
	case has("approve"):
		x.running = true
		acc := h.post(x.rm, "approve:bash")
		x.accepted = append(x.accepted, acc)
		ev := h.until(x.rm, acc.Seq, func(ev sse) bool { return ev.typ == "approval.requested" })
		x.approval, _ = ev.data["approval_id"].(string)
	case has("answer"):
		x.running = true
		acc := h.post(x.rm, "ask:colour")
		x.accepted = append(x.accepted, acc)
		ev := h.until(x.rm, acc.Seq, func(ev sse) bool { return ev.typ == "question.asked" })
		x.question, _ = ev.data["question_id"].(string)
	case has("cancel"):
		x.running = true
		acc := h.post(x.rm, "hang")
		x.accepted = append(x.accepted, acc)
		h.until(x.rm, acc.Seq, func(ev sse) bool { return ev.typ == "turn.started" })
	}
	st := h.do("GET", x.path(""), nil).json(t)
	x.inc, _ = st["incarnation"].(string)
	if x.inc == "" {
		t.Fatalf("room %s has no incarnation: %v", x.rm, st)
	}
}

// roomNow is the room's state (nil: 404).
func (x *doorRound) roomNow(t *testing.T) map[string]any {
	st, b, _, err := x.call("GET", x.path(""), nil)
	switch {
	case err != nil:
		t.Fatal(err)
	case st == http.StatusNotFound:
		return nil
	case st != http.StatusOK:
		t.Fatalf("GET room: %d %v", st, b)
	}
	return b
}

// settle ends what runs in the room (a turn left waiting is cancelled)
// and waits for every message accepted in its present incarnation to end.
func (x *doorRound) settle(t *testing.T, answers []doorAnswer) map[string]any {
	st := x.roomNow(t)
	if st == nil {
		return nil
	}
	if st["turn"] != nil {
		_, _, _, _ = x.call("POST", x.path("/cancel"), nil)
	}
	var accs []room.Accepted
	for _, a := range answers {
		if a.op == "submit" && a.status == http.StatusAccepted {
			accs = append(accs, room.Accepted{ID: a.body["id"].(string), Seq: int64(a.body["seq"].(float64)),
				Incarnation: a.body["incarnation"].(string)})
		}
	}
	inc, _ := st["incarnation"].(string)
	if inc == x.inc {
		for _, acc := range x.accepted {
			acc.Incarnation = x.inc
			accs = append(accs, acc)
		}
	}
	for _, acc := range accs {
		if acc.Incarnation != inc {
			continue
		}
		x.h.untilWithin(x.rm, acc.Seq, 2*time.Minute, func(ev sse) bool {
			return ev.typ == "message.ended" && ev.data["message_id"] == acc.ID
		})
	}
	return x.roomNow(t)
}

// log is the room's whole log, decoded.
func (x *doorRound) log(t *testing.T) []map[string]any {
	evs, err := x.h.m.Events(t.Context(), x.rm, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]map[string]any, len(evs))
	for i, ev := range evs {
		_ = json.Unmarshal(ev.Data, &out[i])
		out[i]["type"] = ev.Type
	}
	return out
}

// folders are the room's folders under the rooms' root (its home,
// workspace, snapshots).
func (x *doorRound) folders(t *testing.T) []string {
	m, err := filepath.Glob(filepath.Join(x.h.root, x.rm+"-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// check says whether the room after the pair is one some serial order of
// the two explains, each answer agreeing with it.
func (x *doorRound) check(t *testing.T, answers []doorAnswer) {
	by := map[string][]doorAnswer{}
	for _, a := range answers {
		if a.err != nil {
			t.Fatalf("%s: %s %d: no answer: %v", x.rm, a.op, a.k, a.err)
		}
		if a.status >= 500 {
			t.Fatalf("%s: %s %d answered %d %v", x.rm, a.op, a.k, a.status, a.body)
		}
		by[a.op] = append(by[a.op], a)
	}
	purged := false
	for _, a := range by["purge"] {
		switch a.status {
		case http.StatusOK:
			purged = true
		case http.StatusConflict:
			msg, _ := a.body["error"].(string)
			if !strings.Contains(msg, "turn is running") && !strings.Contains(msg, "messages wait") {
				t.Fatalf("%s: purge 409 %q", x.rm, msg)
			}
		case http.StatusNotFound:
			// Another purge of the pair deleted it first.
			if len(by["purge"]) != 2 {
				t.Fatalf("%s: purge 404 with no other purge", x.rm)
			}
		default:
			t.Fatalf("%s: purge %d %v", x.rm, a.status, a.body)
		}
	}
	st := x.settle(t, answers)
	if st == nil {
		// Gone: nothing of it is left on disk, and only a purge explains it.
		if !purged {
			t.Fatalf("%s: the room is gone, and no purge answered 200: %+v", x.rm, answers)
		}
		if f := x.folders(t); len(f) != 0 {
			t.Fatalf("%s: purged, but its folders are there: %v", x.rm, f)
		}
		for _, a := range by["submit"] {
			// Accepted before the purge: no room came after it.
			if a.status == http.StatusAccepted && a.body["incarnation"] != x.inc {
				t.Fatalf("%s: a message accepted in incarnation %v, and the room is gone", x.rm, a.body["incarnation"])
			}
		}
		return
	}
	inc, _ := st["incarnation"].(string)
	log := x.log(t)
	checkMessageEnds(t, x.h, x.rm)
	if inc != x.inc {
		// A new room: made by an operation after a purge, and holding
		// nothing of the old one (no half of each).
		if !purged {
			t.Fatalf("%s: a new incarnation %q (was %q) with no purge", x.rm, inc, x.inc)
		}
		turns := false
		for _, ev := range log {
			if ev["turn_id"] == x.turn || slices.ContainsFunc(x.accepted, func(a room.Accepted) bool { return ev["message_id"] == a.ID }) {
				t.Fatalf("%s: the new room's log holds the old room's %v", x.rm, ev)
			}
			turns = turns || ev["type"] == "turn.started"
		}
		snaps, _ := filepath.Glob(filepath.Join(x.h.root, x.rm+"-*", "snapshots"))
		if !turns && len(snaps) != 0 {
			t.Fatalf("%s: the new room ran no turn, and has snapshots %v (made again by a diff or revert)", x.rm, snaps)
		}
		for _, a := range by["diff"] {
			if a.status != http.StatusOK && a.status != http.StatusNotFound {
				t.Fatalf("%s: diff %d %v", x.rm, a.status, a.body)
			}
		}
		cfg := x.h.do("GET", x.path("/config"), nil).json(t)
		ok := cfg["instructions"] == ""
		for _, a := range by["put"] {
			ok = ok || a.status == http.StatusOK && cfg["instructions"] == a.body["instructions"]
		}
		if !ok {
			t.Fatalf("%s: the new room's settings %v are no PUT's", x.rm, cfg)
		}
		x.checkInForce(t, cfg)
		return
	}
	// The same room: no purge deleted it.
	if purged {
		t.Fatalf("%s: a purge answered 200, and the room is still incarnation %s", x.rm, inc)
	}
	has := func(match func(ev map[string]any) bool) bool { return slices.ContainsFunc(log, match) }
	for _, a := range by["diff"] {
		if a.status != http.StatusOK {
			t.Fatalf("%s: diff of an ended turn: %d %v", x.rm, a.status, a.body)
		}
	}
	// A turn ran during the pair: the fixture's, or a message's the pair
	// sent.
	turnRan := x.running || slices.ContainsFunc(by["submit"], func(a doorAnswer) bool { return a.status == http.StatusAccepted })
	for _, a := range by["revert"] {
		if a.status == http.StatusConflict && turnRan && strings.Contains(fmt.Sprint(a.body["error"]), "turn is running") {
			continue
		}
		if a.status != http.StatusOK {
			t.Fatalf("%s: revert: %d %v", x.rm, a.status, a.body)
		}
		if !has(func(ev map[string]any) bool { return ev["type"] == "workspace.reverted" && ev["turn_id"] == x.turn }) {
			t.Fatalf("%s: revert answered 200, and no workspace.reverted", x.rm)
		}
		ws, _ := filepath.Glob(filepath.Join(x.h.root, x.rm+"-*", "workspace", "f.txt"))
		if len(ws) != 0 {
			t.Fatalf("%s: reverted to before the turn that wrote f.txt, and it is there", x.rm)
		}
	}
	// A decision or an answer: one at most is taken (200), the log says
	// it was, the others are 409.
	decided := func(op, id, typ, key string, extra func(ev map[string]any) bool) {
		ok := 0
		for _, a := range by[op] {
			switch {
			case id == "" && a.status != http.StatusNotFound:
				t.Fatalf("%s: %s of none: %d", x.rm, op, a.status)
			case id != "" && a.status == http.StatusOK:
				ok++
			case id != "" && a.status != http.StatusConflict:
				t.Fatalf("%s: %s %d %v", x.rm, op, a.status, a.body)
			}
		}
		if id == "" || len(by[op]) == 0 {
			return
		}
		taken := has(func(ev map[string]any) bool {
			return ev["type"] == typ && ev[key] == id && ev["by"] == "person" && extra(ev)
		})
		if ok > 1 || (ok == 1) != taken {
			t.Fatalf("%s: %d of %d %s answered 200, and the log says taken %v", x.rm, ok, len(by[op]), op, taken)
		}
	}
	decided("approve", x.approval, "approval.resolved", "approval_id", func(ev map[string]any) bool { return ev["decision"] == "allow" })
	decided("answer", x.question, "question.answered", "question_id", func(map[string]any) bool { return true })
	for _, a := range by["release"] {
		if a.status == http.StatusOK && a.body["released"] == true &&
			!has(func(ev map[string]any) bool { return ev["type"] == "agent.released" }) {
			t.Fatalf("%s: released, and no agent.released", x.rm)
		}
		if a.status != http.StatusOK && a.status != http.StatusConflict {
			t.Fatalf("%s: release %d %v", x.rm, a.status, a.body)
		}
	}
	for _, a := range by["cancel"] {
		if a.status != http.StatusAccepted && a.status != http.StatusConflict {
			t.Fatalf("%s: cancel %d %v", x.rm, a.status, a.body)
		}
	}
	for _, a := range by["submit"] {
		if a.status != http.StatusAccepted && a.status != http.StatusTooManyRequests {
			t.Fatalf("%s: submit %d %v", x.rm, a.status, a.body)
		}
	}
	cfg := x.h.do("GET", x.path("/config"), nil).json(t)
	if len(by["put"]) > 0 {
		ok := false
		for _, a := range by["put"] {
			if a.status != http.StatusOK {
				t.Fatalf("%s: put %d %v", x.rm, a.status, a.body)
			}
			ok = ok || cfg["instructions"] == a.body["instructions"]
		}
		if !ok {
			t.Fatalf("%s: GET config %v is no PUT's", x.rm, cfg)
		}
	}
	x.checkInForce(t, cfg)
}

// checkInForce: the room applies the settings GET /config shows: under
// X's budget (1 turn, reached) a message is refused, under the others it
// is taken.
func (x *doorRound) checkInForce(t *testing.T, cfg map[string]any) {
	b, _ := cfg["budget"].(map[string]any)
	st := x.roomNow(t)
	turns := int64(0)
	if st != nil {
		turns = int64(st["turns"].(float64))
	}
	status, body, _, err := x.call("POST", x.path("/messages"), map[string]string{"text": "probe"})
	if err != nil {
		t.Fatal(err)
	}
	over := b != nil && b["turns"] == 1.0 && turns >= 1
	switch {
	case over && (status != http.StatusTooManyRequests || !strings.Contains(fmt.Sprint(body["error"]), "budget")):
		t.Fatalf("%s: GET /config says budget %v (turns run %d), and the room took a message: %d %v", x.rm, b, turns, status, body)
	case !over && status != http.StatusAccepted:
		t.Fatalf("%s: GET /config says budget %v (turns run %d), and the room refused a message: %d %v", x.rm, b, turns, status, body)
	case !over:
		x.h.until(x.rm, int64(body["seq"].(float64)), func(ev sse) bool {
			return ev.typ == "message.ended" && ev.data["message_id"] == body["id"]
		})
	}
}

// runDoorTable runs each pair of ops rounds times on h (real: its agent
// is omp on the scripted model).
func runDoorTable(t *testing.T, h *harness, pairs [][2]string, rounds int, real bool) {
	for _, pair := range pairs {
		for round := range rounds {
			x := &doorRound{h: h, rm: fmt.Sprintf("%s-%s-%d", pair[0], pair[1], round), real: real}
			x.setup(t, pair)
			answers := make([]doorAnswer, 2)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i, name := range pair {
				k := 0
				if i == 1 && pair[0] == pair[1] {
					k = 1
				}
				j := slices.IndexFunc(doorOps, func(o struct {
					name string
					run  func(x *doorRound, k int) doorAnswer
				}) bool {
					return o.name == name
				})
				wg.Go(func() {
					<-start
					a := doorOps[j].run(x, k)
					a.op, a.k = name, k
					answers[i] = a
				})
			}
			close(start)
			wg.Wait()
			x.check(t, answers)
		}
	}
}

// allPairs are the pairs of ops, each with itself too.
func allPairs(ops []string) [][2]string {
	var out [][2]string
	for i := range ops {
		for j := i; j < len(ops); j++ {
			out = append(out, [2]string{ops[i], ops[j]})
		}
	}
	return out
}

// doorRounds is the rounds per pair: DOOR_ROUNDS, else 3 (1 with -short).
func doorRounds(t *testing.T, def int) int {
	if v := os.Getenv("DOOR_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("DOOR_ROUNDS=%q", v)
		}
		return n
	}
	if testing.Short() {
		return 1
	}
	return def
}

// TestDoorTable: every pair of submit, settings, purge, diff, revert,
// release, cancel, approve and answer at once against one room, on the
// fake agent and the real snapshots.
func TestDoorTable(t *testing.T) {
	h := newHarness(t, room.Options{Snapshots: snapshots(t)}, Options{})
	var ops []string
	for _, o := range doorOps {
		ops = append(ops, o.name)
	}
	runDoorTable(t, h, allPairs(ops), doorRounds(t, 3), false)
}

// TestDoorTableRealAgent: the pairs about a room's files and settings on
// omp (the built-in scripted model), one round each: the end-to-end shape.
func TestDoorTableRealAgent(t *testing.T) {
	h := newRealHarnessWith(t, room.Options{Config: room.Config{Agent: "omp", ApprovalMode: room.ApprovalYolo},
		Snapshots: snapshots(t)})
	runDoorTable(t, h, [][2]string{{"purge", "diff"}, {"purge", "revert"}, {"purge", "put"}, {"put", "put"},
		{"purge", "submit"}, {"revert", "revert"}}, 1, true)
}

// idempotentSubmit: a message sent twice with one Idempotency-Key is
// answered the same 202 and accepted once; the key with another message
// is 422 naming the first; a malformed key, or two, is 400.
func idempotentSubmit(t *testing.T, h *harness) {
	body := map[string]string{"text": "once", "sender": "ann"}
	first := h.do("POST", "/v1/rooms/idem/messages", body, "Idempotency-Key", "key-1")
	if first.status != http.StatusAccepted {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	acc := first.json(t)
	if acc["incarnation"] == nil || acc["incarnation"] == "" {
		t.Fatalf("202 without the room's incarnation: %s", first.body)
	}
	again := h.do("POST", "/v1/rooms/idem/messages", body, "Idempotency-Key", "key-1")
	if again.status != http.StatusAccepted || !bytes.Equal(again.body, first.body) {
		t.Fatalf("sent again: %d %s, first %s", again.status, again.body, first.body)
	}
	h.ended("idem", room.Accepted{ID: acc["id"].(string), Seq: int64(acc["seq"].(float64))})
	other := h.do("POST", "/v1/rooms/idem/messages", map[string]string{"text": "another"}, "Idempotency-Key", "key-1")
	if msg := fmt.Sprint(other.json(t)["error"]); other.status != http.StatusUnprocessableEntity || !strings.Contains(msg, acc["id"].(string)) {
		t.Fatalf("the key with another message: %d %s", other.status, other.body)
	}
	if r := h.do("POST", "/v1/rooms/idem/messages", body, "Idempotency-Key", strings.Repeat("k", 256)); r.status != http.StatusBadRequest {
		t.Fatalf("a 256-byte key: %d %s", r.status, r.body)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", h.ts.URL+"/v1/rooms/idem/messages", strings.NewReader(`{"text":"x"}`))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Add("Idempotency-Key", "a")
	req.Header.Add("Idempotency-Key", "b")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Fatalf("two keys: %d", res.StatusCode)
	}
	n := 0
	evs, err := h.m.Events(t.Context(), "idem", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Type == "message.accepted" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d messages accepted, want 1", n)
	}
}

func TestIdempotentSubmit(t *testing.T) {
	idempotentSubmit(t, newHarness(t, room.Options{}, Options{}))
}

// readAll reads a stream's events until its end (follow=0).
func readAll(t *testing.T, s *stream) []sse {
	t.Helper()
	var out []sse
	for {
		ev, err := s.next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
}

// 03_stale_last_event_id and purge_follow_cli (review-outside 3,
// review-api F7): a Last-Event-ID or after past the log's end, or another
// incarnation, gets a reset (id 0, with the room's incarnation) and then
// the log from 1; the stream names its incarnation; the right incarnation
// and a position in the log get no reset.
func TestStreamResetsAStalePosition(t *testing.T) {
	h := newHarness(t, room.Options{}, Options{})
	acc := h.post("s", "hello")
	h.ended("s", acc)
	st := h.do("GET", "/v1/rooms/s", nil).json(t)
	inc, last := st["incarnation"].(string), int64(st["last_seq"].(float64))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, c := range []struct {
		query  string
		lastID int64
		reset  bool
	}{
		{"?follow=0&after=" + strconv.FormatInt(last+50, 10), 0, true},
		{"?follow=0", last + 1, true},
		{"?follow=0&incarnation=other", 2, true},
		{"?follow=0&incarnation=" + inc, 2, false},
		{"?follow=0", last, false},
	} {
		s, err := h.open(ctx, "s", c.query, c.lastID)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.res.Header.Get("Room-Incarnation"); got != inc {
			t.Fatalf("%s: Room-Incarnation %q, want %q", c.query, got, inc)
		}
		evs := readAll(t, s)
		s.close()
		from := max(c.lastID, 0)
		if c.reset {
			if len(evs) == 0 || evs[0].typ != "reset" || evs[0].id != 0 || evs[0].data["incarnation"] != inc ||
				evs[0].data["seq"] != 0.0 || evs[0].data["reason"] == "" {
				t.Fatalf("%s (Last-Event-ID %d): no reset first: %+v", c.query, c.lastID, evs)
			}
			evs, from = evs[1:], 0
		}
		for i, ev := range evs {
			checkEvent(t, "s", ev, from+int64(i)+1)
		}
		if want := last - from; int64(len(evs)) != want {
			t.Fatalf("%s (Last-Event-ID %d): %d events after the reset, want %d", c.query, c.lastID, len(evs), want)
		}
	}
}

// A follower across a purge and the id's new room: its stream ends with
// a reset naming no incarnation (the room is gone); resumed with the old
// room's incarnation and last id once the new room has more events than
// the old, it gets a reset naming the new incarnation and every event of
// the new room once, from 1.
func TestStreamAcrossPurgeAndRecreate(t *testing.T) {
	h := newHarness(t, room.Options{}, Options{})
	h.ended("f", h.post("f", "old"))
	st := h.do("GET", "/v1/rooms/f", nil).json(t)
	oldInc, oldLast := st["incarnation"].(string), int64(st["last_seq"].(float64))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// The id of the old room's last event, as an EventSource keeps it.
	s0, err := h.open(ctx, "f", "?follow=0", 0)
	if err != nil {
		t.Fatal(err)
	}
	old := readAll(t, s0)
	s0.close()
	oldID := old[len(old)-1].rawID
	if want := fmt.Sprintf("%d.%s", oldLast, oldInc); oldID != want {
		t.Fatalf("the old room's last event's id is %q, want %q (SEQ.INCARNATION)", oldID, want)
	}
	s, err := h.open(ctx, "f", "?incarnation="+oldInc, oldLast)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if r := h.do("DELETE", "/v1/rooms/f?purge=true", nil); r.status != http.StatusOK {
		t.Fatalf("purge: %d %s", r.status, r.body)
	}
	evs := readAll(t, s)
	if len(evs) != 1 || evs[0].typ != "reset" || evs[0].data["incarnation"] != "" || evs[0].data["after"] != float64(oldLast) {
		t.Fatalf("the purged room's follower got %+v, want one reset naming no incarnation", evs)
	}
	// The new room outgrows the old one before the follower comes back.
	var accs []room.Accepted
	for i := range 3 {
		accs = append(accs, h.post("f", fmt.Sprintf("new %d", i)))
	}
	h.ended("f", accs[2])
	st = h.do("GET", "/v1/rooms/f", nil).json(t)
	newInc, newLast := st["incarnation"].(string), int64(st["last_seq"].(float64))
	if newInc == oldInc || newLast <= oldLast {
		t.Fatalf("the new room: incarnation %q (old %q), last %d (old %d)", newInc, oldInc, newLast, oldLast)
	}
	s2, err := h.open(ctx, "f", "?follow=0&incarnation="+oldInc, oldLast)
	if err != nil {
		t.Fatal(err)
	}
	evs = readAll(t, s2)
	s2.close()
	if len(evs) == 0 || evs[0].typ != "reset" || evs[0].data["incarnation"] != newInc {
		t.Fatalf("resumed with the old room's position: %+v", evs)
	}
	for i, ev := range evs[1:] {
		checkEvent(t, "f", ev, int64(i)+1)
	}
	if int64(len(evs)-1) != newLast {
		t.Fatalf("%d of the new room's %d events", len(evs)-1, newLast)
	}
	// A plain SSE client (purge.sh step 2) sends back only the last id it
	// saw, with no ?incarnation: the id names the old room, so it gets the
	// same reset and the new room's every event once, each id naming the
	// new incarnation.
	s3, err := h.openID(ctx, "f", "?follow=0", oldID)
	if err != nil {
		t.Fatal(err)
	}
	evs = readAll(t, s3)
	s3.close()
	if len(evs) == 0 || evs[0].typ != "reset" || evs[0].data["incarnation"] != newInc || evs[0].data["after"] != float64(oldLast) {
		t.Fatalf("resumed with the old room's last id %q alone: %+v", oldID, evs)
	}
	for i, ev := range evs[1:] {
		checkEvent(t, "f", ev, int64(i)+1)
		if want := fmt.Sprintf("%d.%s", i+1, newInc); ev.rawID != want {
			t.Fatalf("event id %q, want %q", ev.rawID, want)
		}
	}
	if int64(len(evs)-1) != newLast {
		t.Fatalf("resumed with the old id alone: %d of the new room's %d events", len(evs)-1, newLast)
	}
	// The new room's own id resumes where it says, with no reset.
	s4, err := h.openID(ctx, "f", "?follow=0", fmt.Sprintf("2.%s", newInc))
	if err != nil {
		t.Fatal(err)
	}
	evs = readAll(t, s4)
	s4.close()
	if len(evs) == 0 || evs[0].typ == "reset" || evs[0].id != 3 || int64(len(evs)) != newLast-2 {
		t.Fatalf("resumed with the new room's id 2: %+v", evs)
	}
}

// purge_snapshot_race (review-api F2): diffs hammering a room's turn
// while it is purged: the purge deletes it (200), each diff answers 200
// or 404, never 500, and nothing of the room is left or made again.
func TestPurgeRacingDiffsLeavesNothing(t *testing.T) {
	h := newHarness(t, room.Options{Snapshots: snapshots(t)}, Options{})
	for round := range 3 {
		rm := fmt.Sprintf("q%d", round)
		turn := h.ended(rm, h.post(rm, "write:old.txt"))["turn_id"].(string)
		x := &doorRound{h: h, rm: rm}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		codes := map[int]int{}
		for range 3 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					st, _, _, err := x.call("GET", x.path("/turns/"+turn+"/diff"), nil)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					codes[st]++
					mu.Unlock()
				}
			})
		}
		// Some diffs before the purge, some during, some after.
		waitUntil(t, "diffs answered", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return codes[http.StatusOK] >= 5
		})
		r := h.do("DELETE", x.path("?purge=true"), nil)
		waitUntil(t, "diffs after the purge", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return codes[http.StatusNotFound] >= 5
		})
		close(stop)
		wg.Wait()
		if r.status != http.StatusOK {
			t.Fatalf("round %d: purge %d %s", round, r.status, r.body)
		}
		for st := range codes {
			if st != http.StatusOK && st != http.StatusNotFound {
				t.Fatalf("round %d: diffs answered %v", round, codes)
			}
		}
		if x.roomNow(t) != nil {
			t.Fatalf("round %d: the room is there after its purge", round)
		}
		if f := x.folders(t); len(f) != 0 {
			t.Fatalf("round %d: the purged room's folders: %v", round, f)
		}
	}
}

// waitUntil polls cond (state the server's goroutines change, with no event
// to wait on) until it holds, failing after a minute.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		time.Sleep(time.Millisecond) // polling state of other goroutines
	}
}

// purge_put_race, purge_revert_race, purge.sh step 6 (review-api F8,
// F11): a PUT, a message and a revert sent while a purge works wait for
// it: the PUT and the message make the new room (nothing acknowledged is
// lost), the revert of the old room's turn is 404.
func TestOperationsDuringAPurgeActOnTheNewRoom(t *testing.T) {
	h := newHarness(t, room.Options{Snapshots: snapshots(t)}, Options{})
	turn := h.ended("pp", h.post("pp", "write:old.txt"))["turn_id"].(string)
	gate, closing := make(chan struct{}), make(chan struct{}, 1)
	h.f.mu.Lock()
	h.f.closeGate, h.f.closing = gate, closing
	h.f.mu.Unlock()
	x := &doorRound{h: h, rm: "pp"}
	purged := make(chan doorAnswer, 1)
	go func() {
		st, b, _, err := x.call("DELETE", x.path("?purge=true"), nil)
		purged <- doorAnswer{status: st, body: b, err: err}
	}()
	<-closing // the purge is inside, releasing the agent
	// The three requests go through a server that says when each began.
	began := make(chan struct{}, 3)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		began <- struct{}{}
		h.s.ServeHTTP(w, r)
	}))
	defer ts.Close()
	x.base = ts.URL
	answers := make(chan doorAnswer, 3)
	go func() {
		st, b, _, err := x.call("PUT", x.path("/config"), map[string]string{"instructions": "SURVIVOR"})
		answers <- doorAnswer{op: "put", status: st, body: b, err: err}
	}()
	go func() {
		st, b, _, err := x.call("POST", x.path("/turns/"+turn+"/revert"), nil)
		answers <- doorAnswer{op: "revert", status: st, body: b, err: err}
	}()
	go func() {
		st, b, _, err := x.call("POST", x.path("/messages"), map[string]string{"text": "new"})
		answers <- doorAnswer{op: "submit", status: st, body: b, err: err}
	}()
	// They began during the purge: each waits for it (at the room's door)
	// or comes to the door after it.
	for range 3 {
		<-began
	}
	select {
	case a := <-answers:
		t.Fatalf("%s answered during the purge: %d %v", a.op, a.status, a.body)
	default:
	}
	h.f.mu.Lock()
	h.f.closeGate, h.f.closing = nil, nil
	h.f.mu.Unlock()
	close(gate)
	if a := <-purged; a.err != nil || a.status != http.StatusOK {
		t.Fatalf("purge: %d %v %v", a.status, a.body, a.err)
	}
	var submitted map[string]any
	for range 3 {
		a := <-answers
		switch {
		case a.err != nil:
			t.Fatal(a.err)
		case a.op == "put" && a.status != http.StatusOK, a.op == "submit" && a.status != http.StatusAccepted:
			t.Fatalf("%s during the purge: %d %v", a.op, a.status, a.body)
		case a.op == "revert" && a.status != http.StatusNotFound:
			t.Fatalf("revert of the purged room's turn: %d %v", a.status, a.body)
		case a.op == "submit":
			submitted = a.body
		}
	}
	if cfg := h.do("GET", x.path("/config"), nil).json(t); cfg["instructions"] != "SURVIVOR" {
		t.Fatalf("the PUT acknowledged during the purge is lost: %v", cfg)
	}
	// The new room's log starts again: its first event is the message,
	// or the PUT's settings.changed when the PUT came first.
	if seq := submitted["seq"]; seq != 1.0 && seq != 2.0 {
		t.Fatalf("the message during the purge is not the new room's: %v", submitted)
	}
	h.ended("pp", room.Accepted{ID: submitted["id"].(string), Seq: int64(submitted["seq"].(float64))})
}

// settings_effects, settings_fuzz (review-api F9): PUT refuses, with the
// reason (400), settings with which every turn would fail.
func TestConfigRefusesWhatFailsEveryTurn(t *testing.T) {
	h := newHarness(t, room.Options{}, Options{})
	for _, c := range []struct {
		body string
		want string
	}{
		{`{"instructions":"a\u0000b"}`, "NUL"},
		{`{"mcp":{"m":{"command":[""]}}}`, "names no program"},
		{`{"mcp":{"m":{"command":["true"],"env":{"A=B":"c"}}}}`, "environment variable"},
	} {
		r := h.do("PUT", "/v1/rooms/fx/config", c.body)
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), c.want) {
			t.Errorf("%s: %d %s, want 400 naming %q", c.body, r.status, r.body, c.want)
		}
	}
	if r := h.do("GET", "/v1/rooms/fx/config", nil); r.status != http.StatusNotFound {
		t.Fatalf("refused PUTs made the room: %d %s", r.status, r.body)
	}
}

// diff_revert, purge.sh (review-api F11): a path with . or .. segments is
// 400 with the reason, not a redirect answered "no such route".
func TestUncleanPathsAreRefused(t *testing.T) {
	h := newHarness(t, room.Options{}, Options{})
	for _, c := range []struct{ method, path string }{
		{"DELETE", "/v1/rooms/..?purge=true"},
		{"POST", "/v1/rooms/r/turns/../revert"},
	} {
		r := h.do(c.method, c.path, nil)
		if r.status != http.StatusBadRequest || r.header.Get("Location") != "" || !strings.Contains(string(r.body), "clean form") {
			t.Errorf("%s %s: %d %v %s", c.method, c.path, r.status, r.header, r.body)
		}
	}
}
