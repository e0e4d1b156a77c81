// A program outside agenthost's module that hosts a room on a store and a
// transport of its own: an in-memory store (room.Store over the public
// record types) and an agent that answers "ok: <text>". It prints the
// room's answer, then "ended: settled" and "events: N".
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/record"
	"github.com/agenthost/agenthost/room"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "outside:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "outside")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	st := newMemStore()
	m, err := room.New(room.Options{Store: st, Transport: echoTransport{}, Root: dir})
	if err != nil {
		return err
	}
	if err := m.Start(ctx); err != nil {
		return err
	}
	acc, err := m.Submit(ctx, "lobby", room.Message{Text: "hello", Sender: "ann"})
	if err != nil {
		return err
	}
	watch, stop := m.Watch("lobby")
	defer stop()
	for after := int64(0); ; {
		evs, err := m.Events(ctx, "lobby", after, 0)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			after = ev.Seq
			var end event.TurnEnded
			if ev.Type == event.TypeTurnEnded && json.Unmarshal(ev.Data, &end) == nil && end.MessageID == acc.ID {
				fmt.Println(end.Text)
				fmt.Println("ended:", end.Outcome)
				if err := m.Close(); err != nil {
					return err
				}
				if err := m.Wait(ctx); err != nil {
					return err
				}
				all, err := st.Events(ctx, "lobby", 0, 0)
				fmt.Println("events:", len(all) > 4, err)
				return nil
			}
		}
		select {
		case <-watch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// echoTransport starts agents that answer "ok: <text>".
type echoTransport struct{}

func (echoTransport) Start(ctx context.Context, spec room.AgentSpec) (room.Agent, error) {
	return &echoAgent{done: make(chan struct{})}, nil
}

type echoAgent struct {
	once sync.Once
	done chan struct{}
}

func (a *echoAgent) SessionID() string { return "echo-session" }
func (a *echoAgent) Run(ctx context.Context, text string) (room.TurnResult, error) {
	return room.TurnResult{Text: "ok: " + text}, nil
}
func (a *echoAgent) Steer(ctx context.Context, text string) error    { return nil }
func (a *echoAgent) FollowUp(ctx context.Context, text string) error { return nil }
func (a *echoAgent) Close(ctx context.Context) (json.RawMessage, error) {
	a.once.Do(func() { close(a.done) })
	return nil, nil
}
func (a *echoAgent) Done() <-chan struct{} { return a.done }

// memStore keeps every room in memory. A write works on a copy and
// replaces the state only when fn succeeds: writes are atomic.
type memStore struct {
	mu      sync.Mutex
	s       *state
	watches map[string][]chan struct{}
}

type state struct {
	rooms     map[string]*record.Room
	events    map[string][]record.Event
	msgs      []record.Message
	turns     []record.Turn
	approvals []record.Approval
	questions []record.Question
	receipts  int64
}

func newMemStore() *memStore {
	return &memStore{s: &state{rooms: map[string]*record.Room{}, events: map[string][]record.Event{}}, watches: map[string][]chan struct{}{}}
}

func (s *state) clone() *state {
	c := &state{rooms: map[string]*record.Room{}, events: map[string][]record.Event{}, msgs: slices.Clone(s.msgs),
		turns: slices.Clone(s.turns), approvals: slices.Clone(s.approvals), questions: slices.Clone(s.questions), receipts: s.receipts}
	for k, v := range s.rooms {
		r := *v
		c.rooms[k] = &r
	}
	for k, v := range s.events {
		c.events[k] = slices.Clone(v)
	}
	return c
}

func (m *memStore) Write(ctx context.Context, fn func(tx room.Tx) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	tx := &memTx{s: m.s.clone(), touched: map[string]bool{}}
	if err := fn(tx); err != nil {
		return err
	}
	m.s = tx.s
	for rm := range tx.touched {
		for _, ch := range m.watches[rm] {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
	return nil
}

func (m *memStore) Watch(rm string) (<-chan struct{}, func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ch := make(chan struct{}, 1)
	m.watches[rm] = append(m.watches[rm], ch)
	return ch, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.watches[rm] = slices.DeleteFunc(m.watches[rm], func(c chan struct{}) bool { return c == ch })
	}
}

func page(limit int) int {
	if limit <= 0 || limit > record.MaxPage {
		return record.MaxPage
	}
	return limit
}

func (m *memStore) Events(ctx context.Context, rm string, after int64, limit int) ([]record.Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []record.Event
	for _, e := range m.s.events[rm] {
		if e.Seq > after && len(out) < page(limit) {
			out = append(out, e)
		}
	}
	return out, nil
}

func (m *memStore) Room(ctx context.Context, rm string) (record.Room, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.s.rooms[rm]
	if !ok {
		return record.Room{}, fmt.Errorf("room %q: %w", rm, record.ErrNotFound)
	}
	return *r, nil
}

func (m *memStore) RoomIDs(ctx context.Context) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ids []string
	for id := range m.s.rooms {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

func (m *memStore) AgentRooms(ctx context.Context) ([]record.Room, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []record.Room
	for _, r := range m.s.rooms {
		if r.AgentProc != "" {
			out = append(out, *r)
		}
	}
	return out, nil
}

func (m *memStore) Messages(ctx context.Context, rm string, after int64, limit int) ([]record.Message, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []record.Message
	for _, x := range m.s.msgs {
		if x.Room == rm && x.Seq > after && len(out) < page(limit) {
			out = append(out, x)
		}
	}
	return out, nil
}

func (m *memStore) Exchanges(ctx context.Context, rm string, before int64, limit int) ([]record.Exchange, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []record.Exchange
	for _, x := range slices.Backward(m.s.msgs) {
		if x.Room != rm || x.Seq >= before || len(out) >= page(limit) {
			continue
		}
		ex := record.Exchange{Sender: x.Sender, Text: x.Text}
		for _, t := range m.s.turns {
			if t.ID == x.TurnID {
				ex.Answer = t.Text
			}
		}
		out = append(out, ex)
	}
	return out, nil
}

func (m *memStore) OpenMessages(ctx context.Context) ([]record.Message, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []record.Message
	for _, x := range m.s.msgs {
		if x.Status != record.MessageEnded {
			out = append(out, x)
		}
	}
	return out, nil
}

func (m *memStore) OpenTurns(ctx context.Context) ([]record.Turn, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []record.Turn
	for _, t := range m.s.turns {
		if t.Ended.IsZero() {
			out = append(out, t)
		}
	}
	return out, nil
}

func (m *memStore) Turns(ctx context.Context, rm string, after int64, limit int) ([]record.Turn, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	seq := map[string]int64{}
	for _, x := range m.s.msgs {
		seq[x.ID] = x.Seq
	}
	var out []record.Turn
	for _, t := range m.s.turns {
		if t.Room == rm && seq[t.MessageID] > after && len(out) < page(limit) {
			out = append(out, t)
		}
	}
	return out, nil
}

func (m *memStore) Approvals(ctx context.Context, rm string, pending bool) ([]record.Approval, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []record.Approval
	for _, a := range m.s.approvals {
		if a.Room == rm && (!pending || a.Decision == "") {
			out = append(out, a)
		}
	}
	return out, nil
}

func (m *memStore) Questions(ctx context.Context, rm string, pending bool) ([]record.Question, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []record.Question
	for _, q := range m.s.questions {
		if q.Room == rm && (!pending || q.By == "") {
			out = append(out, q)
		}
	}
	return out, nil
}

// memTx is one write, on a copy of the state.
type memTx struct {
	s       *state
	touched map[string]bool
}

func (t *memTx) room(rm string) *record.Room {
	r, ok := t.s.rooms[rm]
	if !ok {
		r = &record.Room{ID: rm, Created: time.Now()}
		t.s.rooms[rm] = r
	}
	return r
}

func (t *memTx) Append(rm, typ string, data any) (record.Event, error) {
	raw, err := json.Marshal(data)
	if err != nil {
		return record.Event{}, err
	}
	if data == nil {
		raw = []byte("{}")
	}
	r := t.room(rm)
	r.LastSeq++
	e := record.Event{Room: rm, Seq: r.LastSeq, Type: typ, Time: time.Now(), Data: raw}
	t.s.events[rm] = append(t.s.events[rm], e)
	t.touched[rm] = true
	return e, nil
}

func (t *memTx) SetSession(rm, agent, sessionID string) error {
	r := t.room(rm)
	r.Agent, r.SessionID = agent, sessionID
	return nil
}

func (t *memTx) SetAgentProc(rm, handle string) error {
	t.room(rm).AgentProc = handle
	return nil
}

func (t *memTx) SetAgentOffset(rm string, offset, seen int64) error {
	r := t.room(rm)
	r.AgentOffset, r.AgentSeen = offset, seen
	return nil
}

func (t *memTx) PutMessage(x record.Message) error {
	t.room(x.Room)
	t.s.msgs = append(t.s.msgs, x)
	return nil
}

func (t *memTx) UpdateMessage(id, status, turnID, outcome, reason string) error {
	for i := range t.s.msgs {
		x := &t.s.msgs[i]
		if x.ID != id {
			continue
		}
		x.Status = status
		switch status {
		case record.MessageStarted:
			x.TurnID, x.Started = turnID, time.Now()
		case record.MessageEnded:
			if turnID != "" {
				x.TurnID = turnID
			}
			x.Outcome, x.Reason, x.Ended = outcome, reason, time.Now()
		}
		return nil
	}
	return fmt.Errorf("message %q: %w", id, record.ErrNotFound)
}

func (t *memTx) PutTurn(tr record.Turn) error {
	t.s.turns = append(t.s.turns, tr)
	return nil
}

func (t *memTx) EndTurn(id, outcome, reason, text string, u record.Usage) error {
	for i := range t.s.turns {
		tr := &t.s.turns[i]
		if tr.ID == id {
			if !tr.Ended.IsZero() {
				return fmt.Errorf("turn %q: %w", id, record.ErrConflict)
			}
			tr.Outcome, tr.Reason, tr.Text, tr.Ended, tr.Usage = outcome, reason, text, time.Now(), u
			if r := t.s.rooms[tr.Room]; r != nil {
				// Totals only; this store keeps no split by sender.
				r.Turns++
				r.Usage = r.Usage.Add(u)
			}
			return nil
		}
	}
	return fmt.Errorf("turn %q: %w", id, record.ErrNotFound)
}

func (t *memTx) PutApproval(a record.Approval) error {
	t.s.approvals = append(t.s.approvals, a)
	return nil
}

func (t *memTx) ResolveApproval(rm, id, decision, by string) error {
	for i := range t.s.approvals {
		a := &t.s.approvals[i]
		if a.Room == rm && a.ID == id {
			if a.Decision != "" {
				return fmt.Errorf("approval %q: %w", id, record.ErrConflict)
			}
			a.Decision, a.By, a.Resolved = decision, by, time.Now()
			return nil
		}
	}
	return fmt.Errorf("approval %q: %w", id, record.ErrNotFound)
}

func (t *memTx) PutQuestion(q record.Question) error {
	t.s.questions = append(t.s.questions, q)
	return nil
}

func (t *memTx) AnswerQuestion(rm, id, answer, by string) error {
	for i := range t.s.questions {
		q := &t.s.questions[i]
		if q.Room == rm && q.ID == id {
			if q.By != "" {
				return fmt.Errorf("question %q: %w", id, record.ErrConflict)
			}
			q.Answer, q.By, q.Answered = answer, by, time.Now()
			return nil
		}
	}
	return fmt.Errorf("question %q: %w", id, record.ErrNotFound)
}

func (t *memTx) PutReceipt(rm string, receipt json.RawMessage) (int64, error) {
	if !json.Valid(receipt) {
		return 0, errors.New("receipt is not JSON")
	}
	t.s.receipts++
	return t.s.receipts, nil
}
