// Package roomtest hosts rooms on a real transport for the transports'
// tests: a room manager over SQLite in the test's folder, the scripted
// model, custody, and helpers that submit messages and wait for events.
// Only tests import it.
package roomtest

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// Host is a room manager on the transport under test.
type Host struct {
	T    *testing.T
	Sim  *modelsim.Server
	DB   *store.DB
	Cust *custody.Custodian
	M    *room.Manager
	Root string
}

// Transport makes the transport under test from the host's custodian,
// the installed agents and the scripted model's URL.
type Transport func(cust *custody.Custodian, in *agents.Install, modelURL string) (room.Transport, error)

// Start runs a room manager on tr in dir (a fresh folder if ""), on sim
// (a fresh scripted model if nil), closed when the test ends. The real
// agents must be installed (make setup): the test fails, never skips,
// without them.
func Start(t *testing.T, dir string, sim *modelsim.Server, opts room.Options, tr Transport) *Host {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	// Starting resumes or re-attaches rooms, slow on a loaded machine.
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	if sim == nil {
		sim = StartSim(t)
	}
	in, err := agents.Find()
	if err != nil {
		t.Fatalf("the real agents are needed (run make setup): %v", err)
	}
	db, err := store.Open(ctx, filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cust, err := custody.New(custody.Options{})
	if err != nil {
		t.Fatal(err)
	}
	transport, err := tr(cust, in, sim.URL())
	if err != nil {
		t.Fatal(err)
	}
	opts.Store, opts.Transport, opts.Root = room.SQLite(db), transport, filepath.Join(dir, "rooms")
	m, err := room.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	h := &Host{T: t, Sim: sim, DB: db, Cust: cust, M: m, Root: opts.Root}
	t.Cleanup(h.Close)
	return h
}

// StartSim starts the scripted model, closed when the test ends.
func StartSim(t *testing.T) *modelsim.Server {
	t.Helper()
	sim := modelsim.New(modelsim.Options{})
	if err := sim.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}

// Close closes the rooms (their agents end), custody and the store.
// Idempotent.
func (h *Host) Close() {
	if h.M == nil {
		return
	}
	if err := h.M.Close(); err != nil && !errors.Is(err, room.ErrClosed) {
		h.T.Errorf("closing the rooms: %v", err)
	}
	h.closeRest()
}

// Detach ends the host as a planned restart does: its agents run on.
func (h *Host) Detach() {
	h.T.Helper()
	if err := h.M.Detach(); err != nil {
		h.T.Fatalf("detaching the rooms: %v", err)
	}
	h.closeRest()
}

func (h *Host) closeRest() {
	if err := h.Cust.Close(); err != nil {
		h.T.Errorf("closing custody: %v", err)
	}
	_ = h.DB.Close()
	h.M = nil
}

// Submit queues text in the room, from "ann".
func (h *Host) Submit(roomID, text string) room.Accepted {
	h.T.Helper()
	return h.SubmitAs(roomID, text, room.DeliverQueue)
}

// SubmitAs submits text in the room, from "ann", with the delivery given.
func (h *Host) SubmitAs(roomID, text, delivery string) room.Accepted {
	h.T.Helper()
	acc, err := h.M.Submit(h.T.Context(), roomID, room.Message{Text: text, Sender: "ann", Delivery: delivery})
	if err != nil {
		h.T.Fatalf("submit to %q: %v", roomID, err)
	}
	return acc
}

// Wait returns the room's first event of type typ after seq after that
// match accepts (nil: any), failing the test after 120 s.
func (h *Host) Wait(roomID string, after int64, typ string, match func(map[string]any) bool) (store.Event, map[string]any) {
	h.T.Helper()
	watch, stop := h.DB.Watch(roomID)
	defer stop()
	deadline := time.NewTimer(120 * time.Second)
	defer deadline.Stop()
	for {
		evs, err := h.DB.Events(h.T.Context(), roomID, after, 0)
		if err != nil {
			h.T.Fatal(err)
		}
		for _, ev := range evs {
			after = ev.Seq
			if ev.Type != typ {
				continue
			}
			var d map[string]any
			_ = json.Unmarshal(ev.Data, &d)
			if match == nil || match(d) {
				return ev, d
			}
		}
		select {
		case <-watch:
		case <-deadline.C:
			h.T.Fatalf("room %q: no %s event after seq %d", roomID, typ, after)
		}
	}
}

// Ended waits for acc's turn.ended and returns its data.
func (h *Host) Ended(roomID string, acc room.Accepted) map[string]any {
	h.T.Helper()
	_, d := h.Wait(roomID, acc.Seq, "turn.ended", func(d map[string]any) bool { return d["message_id"] == acc.ID })
	return d
}

// Settled waits for acc's turn to end settled and returns its text.
func (h *Host) Settled(roomID string, acc room.Accepted) string {
	h.T.Helper()
	d := h.Ended(roomID, acc)
	if d["outcome"] != room.OutcomeSettled {
		h.T.Fatalf("room %q: turn ended %v", roomID, d)
	}
	return d["text"].(string)
}

// Events is the room's whole log.
func (h *Host) Events(roomID string) []store.Event {
	h.T.Helper()
	evs, err := h.DB.Events(h.T.Context(), roomID, 0, 0)
	if err != nil {
		h.T.Fatal(err)
	}
	return evs
}

// Count is how many events of type typ the room's log holds.
func (h *Host) Count(roomID, typ string) int {
	h.T.Helper()
	n := 0
	for _, ev := range h.Events(roomID) {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

// CheckTurnEvents fails the test when a text or tool event in the room's
// log names no turn, or another turn than the one running.
func (h *Host) CheckTurnEvents(roomID string) {
	h.T.Helper()
	running := ""
	for _, ev := range h.Events(roomID) {
		id := Field(ev.Data, "turn_id")
		switch ev.Type {
		case "turn.started":
			running = id
		case "turn.ended":
			running = ""
		case room.KindText, room.KindToolStarted, room.KindToolEnded:
			if id == "" || id != running {
				h.T.Fatalf("room %q: %s at seq %d for turn %q while turn %q runs", roomID, ev.Type, ev.Seq, id, running)
			}
		}
	}
}

// ModelSaw reports whether some request to the model carried s.
func (h *Host) ModelSaw(s string) bool {
	for _, r := range h.Sim.Requests() {
		for _, m := range r.Messages {
			if strings.Contains(m.Content, s) {
				return true
			}
		}
	}
	return false
}

// Field is the string at key in a JSON object ("" when absent).
func Field(raw json.RawMessage, key string) string {
	var d map[string]any
	_ = json.Unmarshal(raw, &d)
	s, _ := d[key].(string)
	return s
}

// BashCall is the scripted model's directive for a bash tool call.
func BashCall(cmd string) string {
	b, _ := json.Marshal(map[string]string{"command": cmd})
	return "[[tool:bash " + string(b) + "]]"
}
