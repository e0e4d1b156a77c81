package room

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/record"
)

// fakeTransport starts fakeAgents. Its agents act on the prompt text:
//
//	hang          wait until the turn's context ends
//	fail          the turn fails
//	approve:TOOL  ask for approval, answer "allowed" or "denied"
//	ask:TITLE     ask a question, answer "answer: <text>" or "no answer"
//	anything else answered "ok: <text>", with one text delta
type fakeTransport struct {
	mu       sync.Mutex
	starts   []AgentSpec
	sessions map[string]bool // sessions that can be resumed
	// forget makes resumes fail (ErrSessionNotFound); silent makes them
	// quietly start a new session, as pi and omp do for a missing path.
	forget, silent bool
	prompts        []string
	live           map[*fakeAgent]bool
	n              int
	// closeGate, if set, holds every agent's Close until it is closed;
	// closing receives a value as a Close begins to wait (a purge or a
	// release then holds its room).
	closeGate chan struct{}
	closing   chan struct{}
}

func newFakeTransport() *fakeTransport {
	return &fakeTransport{sessions: map[string]bool{}, live: map[*fakeAgent]bool{}}
}

func (f *fakeTransport) Start(ctx context.Context, spec AgentSpec) (Agent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts = append(f.starts, spec)
	sess := spec.SessionID
	if sess != "" && (f.forget || f.silent || !f.sessions[sess]) {
		if !f.silent {
			return nil, fmt.Errorf("%w: %s", ErrSessionNotFound, sess)
		}
		sess = ""
	}
	if sess == "" {
		f.n++
		sess = fmt.Sprintf("sess-%d", f.n)
		f.sessions[sess] = true
	}
	a := &fakeAgent{f: f, spec: spec, session: sess, done: make(chan struct{})}
	f.live[a] = true
	return a, nil
}

func (f *fakeTransport) resident() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live)
}

func (f *fakeTransport) lastPrompt() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.prompts) == 0 {
		return ""
	}
	return f.prompts[len(f.prompts)-1]
}

type fakeAgent struct {
	f       *fakeTransport
	spec    AgentSpec
	session string
	once    sync.Once
	done    chan struct{}
	mu      sync.Mutex
	steered []string
}

func (a *fakeAgent) SessionID() string { return a.session }

func (a *fakeAgent) Run(ctx context.Context, text string) (TurnResult, error) {
	a.f.mu.Lock()
	a.f.prompts = append(a.f.prompts, text)
	a.f.mu.Unlock()
	h := a.spec.Handler
	h.Event(AgentEvent{Kind: KindActivity})
	switch {
	case text == "hang":
		select {
		case <-ctx.Done():
			return TurnResult{}, ctx.Err()
		case <-a.done:
			return TurnResult{}, errors.New("agent closed")
		}
	case text == "fail":
		return TurnResult{}, errors.New("the model failed")
	case text == "spend":
		return TurnResult{Text: "spent", Usage: spendUsage}, nil
	case text == "approve-spend":
		// A turn that spends once a person allowed its tool.
		ok := h.Approve(ctx, ApprovalRequest{Tool: "bash", Input: "ls", Options: []string{"Approve", "Deny"}})
		if ctx.Err() != nil || !ok {
			return TurnResult{}, errors.New("not allowed")
		}
		return TurnResult{Text: "spent", Usage: spendUsage}, nil
	case text == "spend-fail":
		// A turn that failed after the model answered: it still cost.
		return TurnResult{Usage: spendFailUsage}, errors.New("the model failed")
	case strings.HasPrefix(text, "approve:"):
		tool := strings.TrimPrefix(text, "approve:")
		h.Event(AgentEvent{Kind: KindToolStarted, Tool: tool, CallID: "c1", Input: "ls"})
		ok := h.Approve(ctx, ApprovalRequest{Tool: tool, Input: "ls", Options: []string{"Approve", "Deny"}})
		if ctx.Err() != nil {
			return TurnResult{}, ctx.Err()
		}
		if ok {
			return TurnResult{Text: "allowed"}, nil
		}
		return TurnResult{Text: "denied"}, nil
	case strings.HasPrefix(text, "ask:"):
		ans, ok := h.Ask(ctx, QuestionRequest{Title: strings.TrimPrefix(text, "ask:"), Options: []string{"red", "blue"}})
		if ctx.Err() != nil {
			return TurnResult{}, ctx.Err()
		}
		if !ok {
			return TurnResult{Text: "no answer"}, nil
		}
		return TurnResult{Text: "answer: " + ans}, nil
	}
	h.Event(AgentEvent{Kind: KindText, Text: "ok: "})
	a.mu.Lock()
	steered := strings.Join(a.steered, "+")
	a.mu.Unlock()
	if steered != "" {
		return TurnResult{Text: "ok: " + text + " +" + steered}, nil
	}
	return TurnResult{Text: "ok: " + text}, nil
}

// What the fake agent reports its "spend" and "spend-fail" turns cost.
var (
	spendUsage     = record.Usage{InputTokens: 10, OutputTokens: 2, CacheReadTokens: 4, CacheWriteTokens: 1, CostUSD: 0.5}
	spendFailUsage = record.Usage{InputTokens: 3, CostUSD: 0.25}
)

func (a *fakeAgent) Steer(ctx context.Context, text string) error {
	a.mu.Lock()
	a.steered = append(a.steered, text)
	a.mu.Unlock()
	return nil
}

func (a *fakeAgent) FollowUp(ctx context.Context, text string) error { return a.Steer(ctx, text) }

func (a *fakeAgent) Close(ctx context.Context) (json.RawMessage, error) {
	a.f.mu.Lock()
	gate, closing := a.f.closeGate, a.f.closing
	a.f.mu.Unlock()
	if gate != nil {
		if closing != nil {
			closing <- struct{}{}
		}
		<-gate
	}
	a.once.Do(func() { close(a.done) })
	a.f.mu.Lock()
	delete(a.f.live, a)
	a.f.mu.Unlock()
	return json.RawMessage(`{"processes":[]}`), nil
}

func (a *fakeAgent) Done() <-chan struct{} { return a.done }

// harness is a manager on a fresh store with a fake transport.
type harness struct {
	t    *testing.T
	db   *store.DB
	f    *fakeTransport
	m    *Manager
	root string
}

func newHarness(t *testing.T, opts Options) *harness {
	t.Helper()
	return newHarnessWith(t, opts, nil)
}

// newHarnessWith is newHarness with the store wrapped by wrap (nil: as
// is).
func newHarnessWith(t *testing.T, opts Options, wrap func(Store) Store) *harness {
	t.Helper()
	dir := t.TempDir()
	db, err := store.Open(t.Context(), filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, db: db, f: newFakeTransport(), root: filepath.Join(dir, "rooms")}
	var st Store = SQLite(db)
	if wrap != nil {
		st = wrap(st)
	}
	if opts.Transport == nil {
		opts.Transport = h.f
	}
	opts.Store, opts.Root = st, h.root
	h.m, err = New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = shut(h.m)
		checkEventTypes(t, SQLite(db))
		_ = db.Close()
	})
	return h
}

// checkEventTypes checks every event of every room in st: each is
// exactly what its type in package event says. Every harness runs it at
// its end.
func checkEventTypes(t *testing.T, st Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rooms, err := st.RoomIDs(ctx)
	if err != nil {
		t.Errorf("the rooms: %v", err)
		return
	}
	for _, rm := range rooms {
		for after := int64(0); ; {
			evs, err := st.Events(ctx, rm, after, 0)
			if err != nil {
				t.Errorf("room %s: %v", rm, err)
				return
			}
			for _, ev := range evs {
				if err := event.Validate(ev.Type, ev.Data); err != nil {
					t.Errorf("room %s, event %d: %v", rm, ev.Seq, err)
				}
				after = ev.Seq
			}
			if len(evs) < record.MaxPage {
				break
			}
		}
	}
}

// shut closes m and waits for its shutdown (Close only begins it).
func shut(m *Manager) error {
	if err := m.Close(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return m.Wait(ctx)
}

// detach detaches m and waits for it to have let go of its agents.
func detach(m *Manager) error {
	if err := m.Detach(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return m.Wait(ctx)
}

// restart starts a new manager on the harness's store (the old one
// closed), as a host started again does.
func (h *harness) restart(opts Options) {
	h.t.Helper()
	opts.Store, opts.Transport, opts.Root = SQLite(h.db), h.f, h.root
	m, err := New(opts)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := m.Start(h.t.Context()); err != nil {
		h.t.Fatal(err)
	}
	h.m = m
	h.t.Cleanup(func() { _ = shut(m) })
}

func (h *harness) submit(room, text string) Accepted {
	h.t.Helper()
	return h.submitAs(room, text, DeliverQueue)
}

func (h *harness) submitAs(room, text, delivery string) Accepted {
	h.t.Helper()
	acc, err := h.m.Submit(h.t.Context(), room, Message{Text: text, Sender: "ann", Delivery: delivery})
	if err != nil {
		h.t.Fatalf("submit %q to %q: %v", text, room, err)
	}
	return acc
}

// waitEvent waits for the room's first event after seq after of type typ
// that match accepts (nil: any), and returns it.
func (h *harness) waitEvent(room string, after int64, typ string, match func(map[string]any) bool) store.Event {
	h.t.Helper()
	watch, stop := h.db.Watch(room)
	defer stop()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		evs, err := h.db.Events(h.t.Context(), room, after, 0)
		if err != nil {
			h.t.Fatal(err)
		}
		for _, ev := range evs {
			after = ev.Seq
			if ev.Type != typ {
				continue
			}
			var d map[string]any
			_ = json.Unmarshal(ev.Data, &d)
			if match == nil || match(d) {
				return ev
			}
		}
		select {
		case <-watch:
		case <-deadline.C:
			h.t.Fatalf("room %q: no %s event after seq %d", room, typ, after)
		}
	}
}

// turnEnded waits for the end of the turn of message id and returns its
// data.
func (h *harness) turnEnded(room string, acc Accepted) map[string]any {
	h.t.Helper()
	ev := h.waitEvent(room, acc.Seq, "turn.ended", func(d map[string]any) bool { return d["message_id"] == acc.ID })
	var d map[string]any
	_ = json.Unmarshal(ev.Data, &d)
	return d
}

func field(ev store.Event, key string) string {
	var d map[string]any
	_ = json.Unmarshal(ev.Data, &d)
	s, _ := d[key].(string)
	return s
}

// SQLite is internal/roomsqlite's adapter, for this package's own tests
// (which cannot import it: it imports room).
func SQLite(db *store.DB) Store { return sqliteStore{db} }

type sqliteStore struct{ *store.DB }

func (s sqliteStore) Write(ctx context.Context, fn func(tx Tx) error) error {
	return s.DB.Write(ctx, func(w *store.Writer) error { return fn(w) })
}

func (s sqliteStore) RoomSettings(ctx context.Context, id string) (json.RawMessage, error) {
	return s.DB.RoomConfig(ctx, id)
}

func (s sqliteStore) PutRoomSettings(ctx context.Context, id string, settings json.RawMessage) error {
	return s.DB.Write(ctx, func(w *store.Writer) error { return w.SetConfig(id, settings) })
}

func (s sqliteStore) PurgeRoom(ctx context.Context, id string) error {
	return s.DB.Write(ctx, func(w *store.Writer) error { return w.DeleteRoom(id) })
}
