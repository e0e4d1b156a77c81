package room

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/event"
)

// A room's settings, set through SetSettings, replace the defaults for
// that room only: effective at once for what a turn reads, at the agent's
// next start for what the agent takes (NextStart says which are pending).
func TestSettingsReplaceDefaultsForTheirRoom(t *testing.T) {
	h := newHarness(t, Options{Config: Config{Model: "default-model", TurnTimeout: time.Minute}, Agents: []string{"omp", "pi"}})
	ctx := t.Context()
	if _, err := h.m.EffectiveSettings(ctx, "r"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("settings of an unknown room: %v", err)
	}
	// Before any message: the room is created by its settings.
	e, err := h.m.SetSettings(ctx, "r", Settings{Model: "room-model", Instructions: "Say marker-R.", IdleAfter: Duration(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if e.Model != "room-model" || e.Instructions != "Say marker-R." || e.ApprovalMode != ApprovalAsk ||
		time.Duration(e.TurnTimeout) != time.Minute || time.Duration(e.IdleAfter) != time.Hour || len(e.NextStart) != 0 {
		t.Fatalf("effective %+v", e)
	}
	if got, err := h.m.EffectiveSettings(ctx, "r"); err != nil || got.Model != "room-model" {
		t.Fatalf("read back %+v, %v", got, err)
	}
	acc := h.submit("r", "hello")
	h.turnEnded("r", acc)
	acc = h.submit("other", "hello")
	h.turnEnded("other", acc)
	h.f.mu.Lock()
	models := map[string]string{}
	for _, s := range h.f.starts {
		models[s.Room] = s.Config.Model + "|" + s.Config.Instructions
	}
	h.f.mu.Unlock()
	if models["r"] != "room-model|Say marker-R." || models["other"] != "default-model|" {
		t.Fatalf("agents started with %v", models)
	}
	// A change while the agent runs waits for its next start.
	if e, err = h.m.SetSettings(ctx, "r", Settings{Model: "newer-model"}); err != nil || !slices.Equal(e.NextStart, []string{"model", "instructions"}) {
		t.Fatalf("while resident: %+v, %v", e, err)
	}
	if err := h.m.Release(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	if e, err = h.m.EffectiveSettings(ctx, "r"); err != nil || len(e.NextStart) != 0 {
		t.Fatalf("after the release: %+v, %v", e, err)
	}
	acc = h.submit("r", "again")
	h.turnEnded("r", acc)
	h.f.mu.Lock()
	last := h.f.starts[len(h.f.starts)-1]
	h.f.mu.Unlock()
	if last.Room != "r" || last.Config.Model != "newer-model" || last.Config.Instructions != "" {
		t.Fatalf("next start %+v", last.Config)
	}
}

// Settings a room must not have are refused with the reason, and change
// nothing.
func TestBadSettingsAreRefused(t *testing.T) {
	h := newHarness(t, Options{Agents: []string{"omp", "pi"}})
	for body, want := range map[string]string{
		`{"model":"m","colour":"red"}`:             "unknown field",
		`{"approval_mode":"sometimes"}`:            "approval_mode",
		`{"turn_timeout":"-5s"}`:                   "turn_timeout",
		`{"turn_timeout":"soon"}`:                  "duration",
		`{"turn_timeout":5}`:                       "duration",
		`{"idle_after":"9000h"}`:                   "idle_after",
		`{"mcp":{"agenthost":{"url":"http://x"}}}`: "reserved",
		`{"mcp":{"x":{}}}`:                         "exactly one",
		`{"budget":{"tokens":-1}}`:                 "budget",
		`{"model":"two words"}`:                    "model",
		`[]`:                                       "JSON object",
		`null`:                                     "JSON object",
	} {
		if _, err := ParseSettings([]byte(body)); !errors.Is(err, ErrBadSettings) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want ErrBadSettings naming %q", body, err, want)
		}
	}
	if _, err := h.m.SetSettings(t.Context(), "r", Settings{Agent: "nope"}); !errors.Is(err, ErrBadSettings) || !strings.Contains(err.Error(), "omp, pi") {
		t.Errorf("unknown agent: %v", err)
	}
	if _, err := h.m.EffectiveSettings(t.Context(), "r"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a refused PUT created the room: %v", err)
	}
	// What GET answers may be sent back as it is.
	e := h.m.effective("r", Settings{})
	b, _ := json.Marshal(e)
	if _, err := ParseSettings(b, "next_start"); err != nil {
		t.Errorf("the effective settings sent back: %v", err)
	}
}

// When a room's totals reach its budget the running turn finishes, one
// budget.exhausted is written, queued messages end failed saying why, and
// new ones are refused naming the limit; raising the budget reopens the
// room at once.
func TestBudgetStopsTheRoomUntilRaised(t *testing.T) {
	h := newHarness(t, Options{})
	ctx := t.Context()
	if _, err := h.m.SetSettings(ctx, "r", Settings{Budget: Budget{Tokens: 10}}); err != nil {
		t.Fatal(err)
	}
	first := h.submit("r", "approve-spend")
	req := h.waitEvent("r", first.Seq, "approval.requested", nil)
	queued := h.submit("r", "hello")
	if err := h.m.Approve(ctx, "r", field(req, "approval_id"), true); err != nil {
		t.Fatal(err)
	}
	if d := h.turnEnded("r", first); d["outcome"] != OutcomeSettled {
		t.Fatalf("the running turn: %v", d)
	}
	ex := h.waitEvent("r", first.Seq, "budget.exhausted", nil)
	if !strings.Contains(field(ex, "limit"), "17 of 10 tokens") {
		t.Fatalf("budget.exhausted %s", ex.Data)
	}
	end := h.waitEvent("r", first.Seq, "message.ended", func(d map[string]any) bool { return d["message_id"] == queued.ID })
	if field(end, "outcome") != OutcomeFailed || !strings.Contains(field(end, "reason"), "room budget exhausted: 17 of 10 tokens used") {
		t.Fatalf("the queued message: %s", end.Data)
	}
	_, err := h.m.Submit(ctx, "r", Message{Text: "more", Sender: "ann"})
	if !errors.Is(err, ErrBudgetExhausted) || !strings.Contains(err.Error(), "tokens") {
		t.Fatalf("a message over the budget: %v", err)
	}
	// Another room is not affected.
	if d := h.turnEnded("s", h.submit("s", "spend")); d["outcome"] != OutcomeSettled {
		t.Fatalf("room s: %v", d)
	}
	if _, err := h.m.SetSettings(ctx, "r", Settings{Budget: Budget{Tokens: 100, Turns: 2}}); err != nil {
		t.Fatal(err)
	}
	acc := h.submit("r", "hello")
	if d := h.turnEnded("r", acc); d["outcome"] != OutcomeSettled {
		t.Fatalf("after raising the budget: %v", d)
	}
	// Two turns now: the turns limit.
	h.waitEvent("r", acc.Seq, "budget.exhausted", nil)
	if _, err := h.m.Submit(ctx, "r", Message{Text: "more"}); !errors.Is(err, ErrBudgetExhausted) || !strings.Contains(err.Error(), "2 of 2 turns") {
		t.Fatalf("over the turns limit: %v", err)
	}
	evs, err := h.db.Events(ctx, "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range evs {
		if ev.Type == "budget.exhausted" {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d budget.exhausted events, want one per exhaustion (2)", n)
	}
}

// A server-wide budget applies to every room without one of its own.
func TestServerBudgetIsTheDefault(t *testing.T) {
	h := newHarness(t, Options{Budget: Budget{Turns: 1}})
	h.turnEnded("r", h.submit("r", "hello"))
	if _, err := h.m.Submit(t.Context(), "r", Message{Text: "more"}); !errors.Is(err, ErrBudgetExhausted) {
		t.Fatalf("past the server's budget: %v", err)
	}
	e, err := h.m.SetSettings(t.Context(), "r", Settings{Budget: Budget{Turns: 5}})
	if err != nil || e.Budget.Turns != 5 {
		t.Fatalf("%+v, %v", e, err)
	}
	h.turnEnded("r", h.submit("r", "more"))
}

// Purge deletes a room for good: its agent (with its receipt), its
// folders, its records, log and settings; the id then starts a new room.
// A room with a running turn is not purged.
func TestPurgeDeletesTheRoomForGood(t *testing.T) {
	h := newHarness(t, Options{})
	ctx := t.Context()
	if _, err := h.m.SetSettings(ctx, "r", Settings{Model: "m", Budget: Budget{Turns: 1}}); err != nil {
		t.Fatal(err)
	}
	acc := h.submit("r", "write-nothing")
	h.turnEnded("r", acc)
	r, err := h.m.room("r")
	if err != nil {
		t.Fatal(err)
	}
	home, ws := filepath.Join(r.dir, "home"), r.workspace
	for _, d := range []string{home, ws} {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("before the purge: %v", err)
		}
	}
	hung := h.submit("other", "hang")
	h.waitEvent("other", hung.Seq, "turn.started", nil)
	if _, err := h.m.Purge(ctx, "other"); !errors.Is(err, ErrBusy) {
		t.Fatalf("purging a room with a running turn: %v", err)
	}
	if err := h.m.Cancel(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	receipt, err := h.m.Purge(ctx, "r")
	if err != nil || len(receipt) == 0 {
		t.Fatalf("purge: %s, %v", receipt, err)
	}
	h.f.mu.Lock()
	for a := range h.f.live {
		if a.spec.Room == "r" {
			t.Errorf("the purged room's agent still runs")
		}
	}
	h.f.mu.Unlock()
	for _, d := range []string{home, ws, r.dir} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Fatalf("%s after the purge: %v", d, err)
		}
	}
	if _, err := h.m.State(ctx, "r"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("state after the purge: %v", err)
	}
	if _, err := h.m.EffectiveSettings(ctx, "r"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("settings after the purge: %v", err)
	}
	if _, err := h.m.Purge(ctx, "r"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("purging it again: %v", err)
	}
	// The id is a new room: its log starts at 1, without the old budget.
	acc = h.submit("r", "hello")
	if acc.Seq != 1 {
		t.Fatalf("the new room's first event is %d", acc.Seq)
	}
	h.turnEnded("r", acc)
	h.turnEnded("r", h.submit("r", "again"))
	st, err := h.m.State(ctx, "r")
	if err != nil || st.Turns != 2 {
		t.Fatalf("the new room: %+v, %v", st, err)
	}
}

// A room's settings and its totals are stored: after a restart the room
// is still over its budget, with its settings.
func TestBudgetHoldsAcrossARestart(t *testing.T) {
	h := newHarness(t, Options{})
	ctx := t.Context()
	if _, err := h.m.SetSettings(ctx, "r", Settings{Instructions: "kept", Budget: Budget{Tokens: 5}}); err != nil {
		t.Fatal(err)
	}
	h.turnEnded("r", h.submit("r", "spend"))
	if err := shut(h.m); err != nil {
		t.Fatal(err)
	}
	h.restart(Options{})
	if _, err := h.m.Submit(ctx, "r", Message{Text: "more"}); !errors.Is(err, ErrBudgetExhausted) || !strings.Contains(err.Error(), "17 of 5 tokens") {
		t.Fatalf("after a restart: %v", err)
	}
	if e, err := h.m.EffectiveSettings(ctx, "r"); err != nil || e.Instructions != "kept" || e.Budget.Tokens != 5 {
		t.Fatalf("settings after a restart: %+v, %v", e, err)
	}
}

// exclusiveStore is the SQLite store saying it is this Manager's alone
// (as internal/roomsqlite's does), counting its settings reads.
type exclusiveStore struct {
	sqliteStore
	reads atomic.Int64
}

func (s *exclusiveStore) Exclusive() bool { return true }

func (s *exclusiveStore) RoomSettings(ctx context.Context, id string) (json.RawMessage, error) {
	s.reads.Add(1)
	return s.sqliteStore.RoomSettings(ctx, id)
}

// With a store only this Manager changes, a room's settings are read
// once, not before every message and turn, and a change still takes
// effect as with any store.
func TestExclusiveStoreReadsSettingsOnce(t *testing.T) {
	var st *exclusiveStore
	h := newHarnessWith(t, Options{Config: Config{Model: "default-model"}}, func(s Store) Store {
		st = &exclusiveStore{sqliteStore: s.(sqliteStore)}
		return st
	})
	if _, err := h.m.SetSettings(t.Context(), "r", Settings{Model: "room-model"}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		h.turnEnded("r", h.submit("r", fmt.Sprint("hello ", i)))
	}
	if n := st.reads.Load(); n > 1 {
		t.Fatalf("settings read %d times for 5 messages", n)
	}
	if _, err := h.m.SetSettings(t.Context(), "r", Settings{Model: "newer-model"}); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Release(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	h.turnEnded("r", h.submit("r", "again"))
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	if first, last := h.f.starts[0], h.f.starts[len(h.f.starts)-1]; first.Config.Model != "room-model" || last.Config.Model != "newer-model" {
		t.Fatalf("agents started with %q, then %q", first.Config.Model, last.Config.Model)
	}
}

// A room's limit of 0 given over the API (ParseSettings) is no limit even
// where the Manager has a default budget; one left out is the Manager's;
// settings stored before, whose zeros meant the default, still mean it.
func TestBudgetZeroIsNoLimit(t *testing.T) {
	h := newHarness(t, Options{Budget: Budget{Tokens: 1000, CostUSD: 2, Turns: 3}})
	ctx := t.Context()
	set := func(raw string) Budget {
		t.Helper()
		s, err := ParseSettings([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		e, err := h.m.SetSettings(ctx, "r", s)
		if err != nil {
			t.Fatal(err)
		}
		got, err := h.m.EffectiveSettings(ctx, "r")
		if err != nil || got.Budget != e.Budget {
			t.Fatalf("GET %+v %v, PUT answered %+v", got.Budget, err, e.Budget)
		}
		return e.Budget
	}
	if b := set(`{"budget":{"tokens":0,"cost_usd":0,"turns":0}}`); b != (Budget{}) {
		t.Errorf("zeros: %+v, want no limit", b)
	}
	if b := set(`{"budget":{"turns":0}}`); b != (Budget{Tokens: 1000, CostUSD: 2}) {
		t.Errorf("turns 0: %+v", b)
	}
	if b := set(`{"budget":{"tokens":5}}`); b != (Budget{Tokens: 5, CostUSD: 2, Turns: 3}) {
		t.Errorf("tokens 5: %+v", b)
	}
	if b := set(`{}`); b != (Budget{Tokens: 1000, CostUSD: 2, Turns: 3}) {
		t.Errorf("no budget: %+v", b)
	}
	if _, err := ParseSettings([]byte(`{"budget":{"tokens":-1}}`)); !errors.Is(err, ErrBadSettings) {
		t.Errorf("a negative limit: %v", err)
	}
	// Settings as a version before this one stored them: every limit
	// written, 0 for the default.
	ss := h.m.opts.Store.(SettingsStore)
	if err := ss.PutRoomSettings(ctx, "old", json.RawMessage(`{"budget":{"tokens":0,"cost_usd":0,"turns":0}}`)); err != nil {
		t.Fatal(err)
	}
	if e, err := h.m.EffectiveSettings(ctx, "old"); err != nil || e.Budget != (Budget{Tokens: 1000, CostUSD: 2, Turns: 3}) {
		t.Errorf("settings stored before: %+v %v, want the default", e.Budget, err)
	}
}

// Each settings change is in the room's log as settings.changed, naming
// the fields whose value changed (never their values) and the token that
// made it: the log answers who changed what.
func TestSettingsChangesAreRecorded(t *testing.T) {
	h := newHarness(t, Options{Agents: []string{"omp", "pi"}})
	ctx := t.Context()
	if _, err := h.m.SetSettings(ctx, "r", Settings{Model: "m1", Instructions: "secret-instructions"}); err != nil {
		t.Fatal(err)
	}
	bob := event.TokenRef{ID: "tok_1", Label: "ops bob"}
	if _, err := h.m.SetSettings(WithToken(ctx, bob), "r", Settings{Model: "m2", Instructions: "secret-instructions",
		Budget: Budget{Turns: 3}}); err != nil {
		t.Fatal(err)
	}
	// The same settings again: recorded, changing nothing.
	if _, err := h.m.SetSettings(ctx, "r", Settings{Model: "m2", Instructions: "secret-instructions", Budget: Budget{Turns: 3}}); err != nil {
		t.Fatal(err)
	}
	// Back to none: what was set is named.
	if _, err := h.m.SetSettings(ctx, "r", Settings{}); err != nil {
		t.Fatal(err)
	}
	got := eventsOf[event.SettingsChanged](t, h, "r", event.TypeSettingsChanged)
	want := [][]string{{"instructions", "model"}, {"budget", "model"}, {}, {"budget", "instructions", "model"}}
	if len(got) != len(want) {
		t.Fatalf("%d settings.changed events, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if !slices.Equal(got[i].Fields, want[i]) {
			t.Fatalf("event %d: fields %v, want %v", i, got[i].Fields, want[i])
		}
	}
	if got[0].Token != nil || got[1].Token == nil || *got[1].Token != bob {
		t.Fatalf("tokens: %+v, %+v", got[0].Token, got[1].Token)
	}
	evs, err := h.db.Events(ctx, "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if strings.Contains(string(ev.Data), "secret-instructions") || strings.Contains(string(ev.Data), "m2") {
			t.Fatalf("a settings value reached the log: %s", ev.Data)
		}
	}
}
