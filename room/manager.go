// Package room hosts conversations ("rooms"): each room owns at most one
// resident agent (through a Transport), one agent session, one workspace
// and one agent home, runs one turn at a time in the order messages were
// accepted, and records every step in a durable, replayable event log.
//
// A message is accepted only once it is durably stored; its life is then
// visible as events (message.accepted, message.queued, turn.started,
// turn.ended), its turn ends with exactly one outcome (settled, failed,
// cancelled or timed_out), and every accepted message ends with exactly
// one message.ended event, whatever consumed it: its own turn, a turn it
// was steered into, a question it answered, a failure before its turn
// started, or the recovery after a crash. Approvals and questions are durable
// objects answered through the Manager; a deadline denies (never allows)
// an approval. A host that died is recovered at Start: queued messages run
// again in order, turns that were running end failed ("host restarted"),
// and pending approvals are denied.
package room

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agenthost/agenthost/internal/store"
)

// Turn outcomes.
const (
	OutcomeSettled   = "settled"
	OutcomeFailed    = "failed"
	OutcomeCancelled = "cancelled"
	OutcomeTimedOut  = "timed_out"
	// OutcomeAnswered ends a message taken as the answer to a pending
	// question (message.ended only; never a turn's outcome).
	OutcomeAnswered = "answered"
)

var (
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("room: manager closed")
	// ErrNotStarted is returned before Start.
	ErrNotStarted = errors.New("room: manager not started")
	// ErrQueueFull is returned by Submit when the room's queue is full.
	ErrQueueFull = errors.New("room: queue full")
	// ErrNoTurn is returned by Cancel when no turn runs.
	ErrNoTurn = errors.New("room: no turn running")
	// ErrBadMessage is returned for a message Submit cannot take.
	ErrBadMessage = errors.New("room: invalid message")
	// ErrNotFound and ErrConflict come from the store: an unknown
	// approval or question, or one already resolved.
	ErrNotFound = store.ErrNotFound
	ErrConflict = store.ErrConflict
)

// Why a turn's context ended, when the room ended it.
var (
	errCancelled = errors.New("cancelled")
	errShutdown  = errors.New("host shutting down")
	errDetached  = errors.New("host restarting; the agent goes on")
)

// Manager runs rooms. Create it with New, call Start, and Close it last.
type Manager struct {
	opts Options
	st   Store
	log  *slog.Logger

	ctx    context.Context // the manager's lifetime
	cancel context.CancelFunc
	wg     sync.WaitGroup // workers, janitor, clocks

	mu        sync.Mutex
	started   bool
	closing   bool
	detaching bool // Detach: agents that outlive the host are left running
	rooms     map[string]*roomState
	resident  int          // agent slots taken (see acquireSlot)
	slotQ     []*roomState // rooms whose turn waits for a slot, in line
	// slotWake is signalled when a slot frees or a room goes idle.
	slotWake wakeup
}

// roomState is a room's life in memory. Lock order: Manager.mu before
// roomState.mu.
type roomState struct {
	id, dir   string // dir holds the agent's home
	workspace string
	events    *eventLog // the agent's events, written in batches

	mu        sync.Mutex
	cfg       *Config   // filled and validated at first use
	queue     []queued  // in order of acceptance (see queued)
	cont      *contTurn // a turn an attached agent runs, continued first
	working   bool      // a worker goroutine serves the queue
	ending    bool      // a turn's end is being recorded (turn is nil)
	agent     Agent
	session   string
	lost      bool // the next prompt carries the transcript
	turn      *turnRun
	lastUsed  time.Time
	approvals map[string]chan bool
	// inheritedA are the approvals pending in a continued turn when the
	// previous host let go: the agent asks again (its request lies past
	// the recorded offset), and the asking takes the pending one over.
	inheritedA []store.Approval
	dropped    bool           // Drop: the host lost the room's lease
	worker     sync.WaitGroup // the goroutine serving the queue

	qmu        sync.Mutex // guards questions and questionQ (never under mu)
	questions  map[string]chan answer
	questionQ  []string         // pending question ids, oldest first
	inheritedQ []store.Question // as inheritedA
}

// contTurn is a turn the previous host started on an agent it left
// running, with the messages steered or followed up into it.
type contTurn struct {
	rec    store.Turn
	run    *turnRun // in place before the agent was attached
	joined []string
}

type turnRun struct {
	id, messageID string
	messageSeq    int64
	// stored: its start is recorded (turn.started); the worker's alone.
	stored bool
	ctx    context.Context
	cancel context.CancelCauseFunc
	clock  *clock
	joined []string // messages steered or followed up into it
	// prompted: the agent is about to get (or has) the prompt; before
	// that, deliveries join the prompt's text (early).
	prompted bool
	early    []string
}

type answer struct {
	text string
	ok   bool
}

// New checks opts and returns a Manager; Start recovers and starts it.
func New(opts Options) (*Manager, error) {
	if opts.Store == nil || opts.Transport == nil {
		return nil, errors.New("room: Options.Store and Options.Transport are required")
	}
	if opts.Root == "" {
		return nil, errors.New("room: Options.Root is required")
	}
	opts.fill()
	if err := validateTools(opts.Tools); err != nil {
		return nil, err
	}
	c := opts.Config
	c.fill()
	if err := c.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Manager{
		opts: opts, st: opts.Store, log: opts.Logger, ctx: ctx, cancel: cancel,
		rooms: map[string]*roomState{},
	}, nil
}

func newID(prefix string) string {
	var b [9]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// Start recovers what a previous host left (see the package doc) and
// starts serving rooms.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	if m.started || m.closing {
		m.mu.Unlock()
		return errors.New("room: Start called twice")
	}
	m.started = true
	m.mu.Unlock()
	for _, dir := range []string{m.opts.Root, m.opts.Workspaces} {
		if dir == "" {
			continue
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("room: root: %w", err)
		}
	}
	if m.opts.Cluster == nil {
		// With a Cluster, rooms are recovered as they are adopted.
		if err := m.recoverRooms(ctx, "", "host restarted", "restart"); err != nil {
			return err
		}
	}
	m.wg.Add(1)
	go m.janitor()
	return nil
}

// recoverRooms recovers room ("" for every room): turns that were running
// end failed (reason), pending approvals are denied and questions
// cancelled (by), and waiting messages queue again in order.
func (m *Manager) recoverRooms(ctx context.Context, room, reason, by string) error {
	turns, err := m.st.OpenTurns(ctx)
	if err != nil {
		return err
	}
	// Agents left running by the host before (the process daemon) are
	// attached at start; a room adopted from a cluster starts afresh.
	attached := map[string]string{}
	if room == "" {
		if attached, err = m.attach(ctx, turns); err != nil {
			return err
		}
	}
	msgs, err := m.st.OpenMessages(ctx)
	if err != nil {
		return err
	}
	inTurn := map[string][]string{} // turn -> its messages, the prompt's first
	for _, msg := range msgs {
		if msg.Status == store.MessageStarted && msg.TurnID != "" {
			inTurn[msg.TurnID] = append(inTurn[msg.TurnID], msg.ID)
		}
	}
	ended := map[string]bool{}
	for _, t := range openTurnsOf(turns, room) {
		if _, ok := attached[t.Room]; ok {
			continue // its agent runs on; the room's worker continues it
		}
		ids := []string{t.MessageID}
		for _, id := range inTurn[t.ID] {
			if id != t.MessageID {
				ids = append(ids, id)
			}
		}
		err := m.st.Write(ctx, func(tx Tx) error {
			if err := tx.EndTurn(t.ID, OutcomeFailed, reason, ""); err != nil {
				return err
			}
			if _, err := tx.Append(t.Room, "turn.ended", map[string]string{
				"turn_id": t.ID, "message_id": t.MessageID, "outcome": OutcomeFailed, "reason": reason, "text": "",
			}); err != nil {
				return err
			}
			return endMessages(tx, t.Room, ids, t.ID, OutcomeFailed, reason)
		})
		if err != nil {
			return err
		}
		for _, id := range ids {
			ended[id] = true
		}
	}
	aps, err := m.st.Approvals(ctx, room, true)
	if err != nil {
		return err
	}
	for _, a := range aps {
		if tid := attached[a.Room]; tid != "" && a.TurnID == tid {
			continue // the attached agent asks again (inherited)
		}
		if err := m.resolveApproval(ctx, a.Room, a.ID, false, by); err != nil && !errors.Is(err, ErrConflict) {
			return err
		}
	}
	qs, err := m.st.Questions(ctx, room, true)
	if err != nil {
		return err
	}
	for _, q := range qs {
		if tid := attached[q.Room]; tid != "" && q.TurnID == tid {
			continue
		}
		if err := m.answerQuestion(ctx, q.Room, q.ID, "", by, false); err != nil && !errors.Is(err, ErrConflict) {
			return err
		}
	}
	for _, msg := range msgs {
		if room != "" && msg.Room != room || ended[msg.ID] {
			continue
		}
		if tid := attached[msg.Room]; msg.Status == store.MessageStarted && tid != "" && msg.TurnID == tid {
			// In (or steered into) the turn the attached agent runs on.
			continue
		}
		if msg.Status == store.MessageStarted {
			// Steered into a turn that died with the host.
			err := m.st.Write(ctx, func(tx Tx) error {
				return endMessages(tx, msg.Room, []string{msg.ID}, msg.TurnID, OutcomeFailed, reason)
			})
			if err != nil {
				return err
			}
			continue
		}
		r, err := m.room(msg.Room)
		if err != nil {
			m.log.Error("room: stored message for an invalid room id", "err", err)
			continue
		}
		if msg.Status == store.MessageAccepted {
			err := m.st.Write(ctx, func(tx Tx) error {
				if err := tx.UpdateMessage(msg.ID, store.MessageQueued, "", "", ""); err != nil {
					return err
				}
				_, err := tx.Append(msg.Room, "message.queued", map[string]any{"message_id": msg.ID, "recovered": true})
				return err
			})
			if err != nil {
				return err
			}
		}
		r.mu.Lock()
		r.insertLocked(queued{id: msg.ID, text: msg.Text, seq: msg.Seq, place: true})
		m.ensureWorkerLocked(r)
		r.mu.Unlock()
	}
	return nil
}

// attachConcurrency bounds the agents attached at once at Start.
const attachConcurrency = 32

// attach re-attaches the agents a previous host left running (through an
// Attacher transport) and reports the rooms attached, each with the turn
// it continues ("" for none). A room whose agent cannot be attached
// forgets it and recovers as after a crash.
func (m *Manager) attach(ctx context.Context, turns []store.Turn) (map[string]string, error) {
	attached := map[string]string{}
	recs, err := m.st.AgentRooms(ctx)
	if err != nil || len(recs) == 0 {
		return attached, err
	}
	at, ok := m.opts.Transport.(Attacher)
	open := map[string]store.Turn{}
	for _, t := range turns {
		open[t.Room] = t
	}
	var joined map[string][]string // turn -> messages steered into it
	if ok {
		msgs, err := m.st.OpenMessages(ctx)
		if err != nil {
			return nil, err
		}
		joined = map[string][]string{}
		for _, msg := range msgs {
			if msg.Status == store.MessageStarted && msg.TurnID != "" {
				joined[msg.TurnID] = append(joined[msg.TurnID], msg.ID)
			}
		}
	}
	// Side by side: each attach waits on its agent's answers.
	type attachment struct {
		a      Detachable
		r      *roomState
		reason string
	}
	got := make([]attachment, len(recs))
	sem := make(chan struct{}, attachConcurrency)
	var wg sync.WaitGroup
	for i, rec := range recs {
		if !ok {
			got[i].reason = "the transport cannot attach agents"
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			got[i].a, got[i].r, got[i].reason = m.attachRoom(ctx, at, rec, open)
		}()
	}
	wg.Wait()
	for i, rec := range recs {
		a, r, reason := got[i].a, got[i].r, got[i].reason
		if a == nil {
			m.log.Warn("room: the agent left running could not be attached; the room recovers", "room", rec.ID, "reason", reason)
			err := m.st.Write(ctx, func(tx Tx) error {
				if err := tx.SetAgentProc(rec.ID, ""); err != nil {
					return err
				}
				_, err := tx.Append(rec.ID, "agent.released", map[string]any{"reason": "not attached at restart: " + reason})
				return err
			})
			if err != nil {
				return nil, err
			}
			continue
		}
		t, running := open[rec.ID]
		attached[rec.ID] = t.ID
		r.mu.Lock()
		if running {
			c := &contTurn{rec: t, run: r.turn}
			for _, id := range joined[t.ID] {
				if id != t.MessageID {
					c.joined = append(c.joined, id)
				}
			}
			r.cont = c
			m.ensureWorkerLocked(r)
		}
		r.mu.Unlock()
	}
	return attached, nil
}

// inherit keeps the approvals and questions pending in the turn the
// attached agent runs on, for the agent to ask again.
func (m *Manager) inherit(ctx context.Context, r *roomState, turnID string) error {
	aps, err := m.st.Approvals(ctx, r.id, true)
	if err != nil {
		return err
	}
	qs, err := m.st.Questions(ctx, r.id, true)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.inheritedA = slices.DeleteFunc(aps, func(a store.Approval) bool { return a.TurnID != turnID })
	r.mu.Unlock()
	r.qmu.Lock()
	r.inheritedQ = slices.DeleteFunc(qs, func(q store.Question) bool { return q.TurnID != turnID })
	for _, q := range r.inheritedQ {
		// The room's next message answers it, as before the restart.
		r.questionQ = append(r.questionQ, q.ID)
	}
	r.qmu.Unlock()
	return nil
}

// settleInherited denies (cancels) what a continued turn inherited and the
// agent did not ask again, so nothing stays pending past its turn.
func (m *Manager) settleInherited(r *roomState) {
	r.mu.Lock()
	aps := r.inheritedA
	r.inheritedA = nil
	r.mu.Unlock()
	r.qmu.Lock()
	qs := r.inheritedQ
	r.inheritedQ = nil
	r.questionQ = slices.DeleteFunc(r.questionQ, func(id string) bool {
		return slices.ContainsFunc(qs, func(q store.Question) bool { return q.ID == id })
	})
	r.qmu.Unlock()
	r.events.release(0, 0, true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, a := range aps {
		if err := m.resolveApproval(ctx, r.id, a.ID, false, "restart"); err != nil && !errors.Is(err, ErrConflict) {
			m.log.Error("room: denying an approval left from before the restart", "room", r.id, "err", err)
		}
	}
	for _, q := range qs {
		if err := m.answerQuestion(ctx, r.id, q.ID, "", "restart", false); err != nil && !errors.Is(err, ErrConflict) {
			m.log.Error("room: cancelling a question left from before the restart", "room", r.id, "err", err)
		}
	}
}

// dialogDone records that a dialog (its frame from start to end in the
// agent's output) was decided, so a later attach does not ask it again.
func (m *Manager) dialogDone(r *roomState, start, end int64) {
	if end <= 0 || m.isDetaching() {
		return
	}
	resume, handled := r.events.release(start, end, !r.hasInherited())
	if err := m.write(func(tx Tx) error { return tx.SetAgentOffset(r.id, resume, handled) }); err != nil {
		m.log.Error("room: recording the agent's output offset", "room", r.id, "err", err)
	}
}

// hasInherited reports dialogs left by the previous host not asked again.
func (r *roomState) hasInherited() bool {
	r.mu.Lock()
	a := len(r.inheritedA)
	r.mu.Unlock()
	r.qmu.Lock()
	defer r.qmu.Unlock()
	return a+len(r.inheritedQ) > 0
}

// attachRoom attaches one room's agent; nil and why when it cannot.
func (m *Manager) attachRoom(ctx context.Context, at Attacher, rec store.Room, open map[string]store.Turn) (Detachable, *roomState, string) {
	r, err := m.room(rec.ID)
	if err != nil {
		return nil, nil, err.Error()
	}
	r.mu.Lock()
	cfg, err := m.configLocked(r)
	r.mu.Unlock()
	if err != nil {
		return nil, nil, err.Error()
	}
	t, running := open[rec.ID]
	spec := AgentSpec{Room: r.id, Workspace: r.workspace, Home: filepath.Join(r.dir, "home"),
		SessionID: rec.SessionID, Config: cfg, Tools: m.roomTools(r), MCP: cfg.MCP, Handler: &handler{m: m, r: r}}
	// The agent reads on from the offset as soon as it is attached: the
	// turn it continues, and what it asked before, are in place first,
	// and agent.attached precedes what it reads.
	if running {
		if err := m.inherit(ctx, r, t.ID); err != nil {
			return nil, nil, err.Error()
		}
		tctx, cancel := context.WithCancelCause(m.ctx)
		run := &turnRun{id: t.ID, messageID: t.MessageID, ctx: tctx, cancel: cancel, clock: newClock(cfg.TurnTimeout, cfg.Liveness), prompted: true, stored: true}
		r.mu.Lock()
		r.turn = run
		r.mu.Unlock()
	}
	undo := func() {
		r.mu.Lock()
		if r.turn != nil {
			r.turn.cancel(nil)
		}
		r.turn, r.inheritedA = nil, nil
		r.mu.Unlock()
		r.qmu.Lock()
		r.inheritedQ, r.questionQ = nil, nil
		r.qmu.Unlock()
	}
	r.events.attached(rec.AgentOffset, rec.AgentSeen, r.hasInherited())
	err = m.st.Write(ctx, func(tx Tx) error {
		_, err := tx.Append(rec.ID, "agent.attached", map[string]any{"session_id": rec.SessionID, "offset": rec.AgentOffset, "turn_id": t.ID})
		return err
	})
	if err != nil {
		undo()
		return nil, nil, err.Error()
	}
	m.mu.Lock()
	m.resident++ // a slot, over MaxResident if it must: the agent runs already
	m.mu.Unlock()
	a, err := at.Attach(ctx, spec, Attachment{Handle: rec.AgentProc, Offset: rec.AgentOffset, RunOpen: running})
	if err != nil {
		undo()
		m.freeSlot()
		return nil, nil, err.Error()
	}
	r.mu.Lock()
	r.agent, r.session, r.lastUsed = a, a.SessionID(), time.Now()
	r.mu.Unlock()
	return a, r, ""
}

// room returns the room's state, creating it.
func (m *Manager) room(id string) (*roomState, error) {
	if err := ValidateID(id); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing {
		return nil, ErrClosed
	}
	if !m.started {
		return nil, ErrNotStarted
	}
	r := m.rooms[id]
	if r == nil {
		d := dirName(id)
		r = &roomState{id: id, dir: filepath.Join(m.opts.Root, d), workspace: filepath.Join(m.opts.Root, d, "workspace")}
		if m.opts.Workspaces != "" {
			r.workspace = filepath.Join(m.opts.Workspaces, d)
		}
		r.events = newEventLog(m, id)
		m.rooms[id] = r
	}
	return r, nil
}

// config returns the room's filled configuration.
func (m *Manager) configLocked(r *roomState) (Config, error) {
	if r.cfg == nil {
		c := m.opts.Config
		if m.opts.RoomConfig != nil {
			c = c.merge(m.opts.RoomConfig(r.id))
		}
		c.fill()
		if err := c.validate(); err != nil {
			return Config{}, err
		}
		r.cfg = &c
	}
	return *r.cfg, nil
}

// Message is what Submit takes.
type Message struct {
	Text   string
	Sender string
	// Delivery is DeliverQueue (default), DeliverSteer or DeliverFollowUp.
	Delivery string
}

// Accepted is a durably accepted message.
type Accepted struct {
	ID string `json:"id"`
	// Seq is the sequence number of its message.accepted event.
	Seq int64 `json:"seq"`
}

// Submit accepts a message into the room and returns once it is durably
// stored. A question pending in the room takes the message as its answer;
// otherwise it is queued (or, for steer and follow_up while a turn runs,
// delivered into that turn).
func (m *Manager) Submit(ctx context.Context, room string, msg Message) (Accepted, error) {
	return m.submit(ctx, room, newID("m"), msg, m.opts.Cluster != nil)
}

// submit accepts msg under id; forward hands it to the cluster's inbox
// (the holder accepts it from there).
func (m *Manager) submit(ctx context.Context, room, id string, msg Message, forward bool) (Accepted, error) {
	switch {
	case msg.Delivery == "":
		msg.Delivery = DeliverQueue
	case msg.Delivery != DeliverQueue && msg.Delivery != DeliverSteer && msg.Delivery != DeliverFollowUp:
		return Accepted{}, fmt.Errorf("%w: delivery %q", ErrBadMessage, msg.Delivery)
	}
	if msg.Text == "" || len(msg.Text) > MaxMessageBytes {
		return Accepted{}, fmt.Errorf("%w: text must be 1 to %d bytes", ErrBadMessage, MaxMessageBytes)
	}
	if forward {
		if err := ValidateID(room); err != nil {
			return Accepted{}, err
		}
		if qc, ok := m.opts.Cluster.(QueueCounter); ok {
			// Counted before the message goes in, so two front ends may
			// overfill by what they accept at the same moment; one that
			// cannot count forwards (the holder still takes no more than
			// the limit into the room's queue).
			n, running, asking, err := qc.Waiting(ctx, room)
			takesPlace := !asking && (msg.Delivery == DeliverQueue || !running)
			if err == nil && takesPlace && n >= m.opts.QueueLimit {
				return Accepted{}, fmt.Errorf("%w: room %q has %d waiting messages", ErrQueueFull, room, m.opts.QueueLimit)
			}
		}
		return m.opts.Cluster.Forward(ctx, room, id, msg)
	}
	r, err := m.room(room)
	if err != nil {
		return Accepted{}, err
	}
	var question string
	r.qmu.Lock()
	if len(r.questionQ) > 0 {
		question = r.questionQ[0]
	}
	r.qmu.Unlock()
	r.mu.Lock()
	if _, err := m.configLocked(r); err != nil {
		r.mu.Unlock()
		return Accepted{}, err
	}
	into := r.turn
	r.mu.Unlock()
	// Answers and deliveries into a turn take no queue place.
	direct := question != "" || msg.Delivery != DeliverQueue && into != nil

	now := time.Now()
	var acc Accepted
	status := store.MessageQueued
	if direct {
		status = store.MessageAccepted
	}
	err = m.st.Write(ctx, func(tx Tx) error {
		ev, err := tx.Append(room, "message.accepted", map[string]string{
			"message_id": id, "text": msg.Text, "sender": msg.Sender, "delivery": msg.Delivery,
		})
		if err != nil {
			return err
		}
		acc = Accepted{ID: id, Seq: ev.Seq}
		if err := tx.PutMessage(store.Message{ID: id, Room: room, Seq: ev.Seq, Sender: msg.Sender, Text: msg.Text,
			Delivery: msg.Delivery, Status: status, Accepted: now}); err != nil {
			return err
		}
		if status == store.MessageQueued {
			if _, err := tx.Append(room, "message.queued", map[string]any{"message_id": id}); err != nil {
				return err
			}
		}
		// The limit is checked and the message's place in the queue taken
		// in the write that records it (undone with it when refused),
		// in the order of the log: concurrent submits neither overfill
		// the queue nor line up out of the order of their sequence
		// numbers. r.mu is taken last and never held while waiting for
		// the store.
		r.mu.Lock()
		defer r.mu.Unlock()
		if !direct && r.placesLocked() >= m.opts.QueueLimit {
			return fmt.Errorf("%w: room %q has %d waiting messages", ErrQueueFull, room, m.opts.QueueLimit)
		}
		r.insertLocked(queued{id: id, text: msg.Text, seq: ev.Seq, pending: true, place: !direct})
		return nil
	})
	if err != nil {
		m.settle(r, id, false) // its place, if the write failed after taking it
		return Accepted{}, err
	}
	switch {
	case question != "":
		if err := m.answerByMessage(ctx, room, question, id, msg.Text); err == nil {
			m.settle(r, id, false)
			return acc, nil
		}
		// The question was answered meanwhile: the message runs as a turn.
	case direct:
		if m.deliver(ctx, r, into, id, msg) {
			m.settle(r, id, false)
			return acc, nil
		}
	default:
		m.settle(r, id, true)
		return acc, nil
	}
	// Fall back to the queue, in the place it took when accepted.
	err = m.st.Write(ctx, func(tx Tx) error {
		if err := tx.UpdateMessage(id, store.MessageQueued, "", "", ""); err != nil {
			return err
		}
		_, err := tx.Append(room, "message.queued", map[string]any{"message_id": id})
		return err
	})
	if err != nil {
		// It is accepted all the same: its turn records its start.
		m.log.Warn("room: recording that a message falls back to the queue failed", "room", room, "err", err)
	}
	m.settle(r, id, true)
	return acc, nil
}

// deliver steers or follows up a message into the running turn; false if
// that turn is over or the agent refused.
func (m *Manager) deliver(ctx context.Context, r *roomState, t *turnRun, id string, msg Message) bool {
	r.mu.Lock()
	a := r.agent
	live := r.turn == t
	if live {
		t.joined = append(t.joined, id)
		if !t.prompted {
			// The agent has not had the turn's prompt yet: the text
			// goes with it.
			t.early = append(t.early, msg.Text)
			a = nil
		}
	}
	r.mu.Unlock()
	if !live {
		return false
	}
	if a == nil {
		err := m.st.Write(ctx, func(tx Tx) error {
			if err := tx.UpdateMessage(id, store.MessageStarted, t.id, "", ""); err != nil {
				return err
			}
			_, err := tx.Append(r.id, "message.delivered", map[string]string{"message_id": id, "turn_id": t.id, "delivery": msg.Delivery, "with": "prompt"})
			return err
		})
		return err == nil
	}
	var err error
	if msg.Delivery == DeliverSteer {
		err = a.Steer(ctx, msg.Text)
	} else {
		err = a.FollowUp(ctx, msg.Text)
	}
	if err == nil {
		err = m.st.Write(ctx, func(tx Tx) error {
			if err := tx.UpdateMessage(id, store.MessageStarted, t.id, "", ""); err != nil {
				return err
			}
			_, err := tx.Append(r.id, "message.delivered", map[string]string{"message_id": id, "turn_id": t.id, "delivery": msg.Delivery})
			return err
		})
	}
	if err != nil {
		m.log.Warn("room: delivery into the running turn failed; queued instead", "room", r.id, "err", err)
		r.mu.Lock()
		for i, j := range t.joined {
			if j == id {
				t.joined = append(t.joined[:i], t.joined[i+1:]...)
				break
			}
		}
		r.mu.Unlock()
		return false
	}
	return true
}

// endMessages ends messages ids in tx: their records and, in the same
// order, their message.ended events. turnID names the turn that consumed
// them ("" for none); reason goes with an outcome other than settled and
// answered.
func endMessages(tx Tx, room string, ids []string, turnID, outcome, reason string) error {
	for _, id := range ids {
		if err := tx.UpdateMessage(id, store.MessageEnded, turnID, outcome, reason); err != nil {
			return err
		}
	}
	for _, id := range ids {
		d := map[string]string{"message_id": id, "outcome": outcome}
		if turnID != "" {
			d["turn_id"] = turnID
		}
		if outcome != OutcomeSettled && outcome != OutcomeAnswered {
			d["reason"] = reason
		}
		if _, err := tx.Append(room, "message.ended", d); err != nil {
			return err
		}
	}
	return nil
}

func (m *Manager) ensureWorkerLocked(r *roomState) {
	if r.working || r.dropped || m.ctx.Err() != nil {
		return
	}
	r.working = true
	m.wg.Add(1)
	r.worker.Add(1)
	go m.work(r)
}

// work serves the room's queue, one turn at a time, in order, until it is
// empty or its head is not settled yet (settle starts it again).
func (m *Manager) work(r *roomState) {
	defer m.wg.Done()
	defer r.worker.Done()
	r.mu.Lock()
	cont := r.cont
	r.cont = nil
	r.mu.Unlock()
	if cont != nil {
		m.continueTurn(r, *cont)
	}
	for {
		r.mu.Lock()
		if len(r.queue) == 0 || r.queue[0].pending || m.ctx.Err() != nil {
			r.working = false
			r.mu.Unlock()
			m.slotWake.signal() // the room may have gone idle
			return
		}
		q := r.queue[0]
		r.queue = r.queue[1:]
		// The turn is the room's from the moment its message leaves the
		// queue: the room is never idle (evictable) in between.
		t, cfg := m.newTurnLocked(r, q)
		r.mu.Unlock()
		m.runTurn(r, t, cfg, q)
	}
}

// write is a store write that must not be lost to a cancelled turn: it
// runs on its own bounded context.
func (m *Manager) write(fn func(tx Tx) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rec offsetTx
	err := m.st.Write(ctx, func(tx Tx) error {
		rec = offsetTx{Tx: tx}
		return fn(&rec)
	})
	if err == nil && rec.set {
		m.committed(rec.room, rec.offset)
	}
	return err
}

// offsetTx notes the agent offset a write records (SetAgentOffset), to
// tell the agent once it is committed (Committer).
type offsetTx struct {
	Tx
	set    bool
	room   string
	offset int64
}

func (o *offsetTx) SetAgentOffset(room string, offset, seen int64) error {
	if err := o.Tx.SetAgentOffset(room, offset, seen); err != nil {
		return err
	}
	o.set, o.room, o.offset = true, room, offset
	return nil
}

// committed tells the room's agent, if it is a Committer, the offset a
// new host would read its output from (no lock is held while it runs).
func (m *Manager) committed(room string, offset int64) {
	m.mu.Lock()
	r := m.rooms[room]
	m.mu.Unlock()
	if r == nil {
		return
	}
	r.mu.Lock()
	c, ok := r.agent.(Committer)
	r.mu.Unlock()
	if ok {
		c.Committed(offset)
	}
}

// newTurnLocked makes q's turn the room's running turn (r.mu held).
func (m *Manager) newTurnLocked(r *roomState, q queued) (*turnRun, Config) {
	cfg, _ := m.configLocked(r) // validated at Submit
	tctx, cancel := context.WithCancelCause(m.ctx)
	t := &turnRun{id: newID("t"), messageID: q.id, messageSeq: q.seq, ctx: tctx, cancel: cancel, clock: newClock(cfg.TurnTimeout, cfg.Liveness)}
	r.turn = t
	r.lastUsed = time.Now()
	return t, cfg
}

func (m *Manager) runTurn(r *roomState, t *turnRun, cfg Config, q queued) {
	tctx, cancel := t.ctx, t.cancel
	defer cancel(nil)

	err := m.write(func(tx Tx) error {
		if err := tx.PutTurn(store.Turn{ID: t.id, Room: r.id, MessageID: q.id, Started: time.Now()}); err != nil {
			return err
		}
		if err := tx.UpdateMessage(q.id, store.MessageStarted, t.id, "", ""); err != nil {
			return err
		}
		_, err := tx.Append(r.id, "turn.started", map[string]string{"turn_id": t.id, "message_id": q.id})
		return err
	})
	var res turnEnd
	if err != nil {
		// Nothing of the turn is recorded: its message ends failed (see
		// finishTurn) before the next one starts.
		res = turnEnd{outcome: OutcomeFailed, reason: "the store refused to record the turn's start: " + err.Error()}
	} else {
		t.stored = true
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			t.clock.watch(tctx, cancel)
		}()
		res = m.execute(r, t, cfg, q.text)
	}
	m.finishTurn(r, t, res)
}

// turnEnd is how a turn ended, as the room records it.
type turnEnd struct {
	outcome, reason, text string
	offset                int64 // TurnResult.Offset
}

// continueTurn runs on a turn the previous host started, on the agent it
// left running (attached at Start), to the turn's end.
func (m *Manager) continueTurn(r *roomState, c contTurn) {
	t := c.run
	tctx, cancel := t.ctx, t.cancel
	r.mu.Lock()
	t.joined = c.joined
	r.lastUsed = time.Now()
	a, _ := r.agent.(Detachable)
	r.mu.Unlock()
	defer cancel(nil)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t.clock.watch(tctx, cancel)
	}()
	var res TurnResult
	err := errors.New("the attached agent is gone")
	if a != nil {
		res, err = a.Continue(t.ctx)
	}
	m.finishTurn(r, t, m.judge(t, res, err))
}

// finishTurn records the turn's end and its messages' (message.ended,
// right after turn.ended), retiring the agent first when the turn did not
// settle. A turn whose start the store refused ends its messages only.
// The room's next turn starts only once this is recorded (see writeEnd),
// so that the log and a restart keep the order of acceptance. A turn cut
// short by Detach is left open: the next host continues it.
func (m *Manager) finishTurn(r *roomState, t *turnRun, res turnEnd) {
	if m.isDetaching() {
		r.mu.Lock()
		r.turn = nil
		prompted := t.prompted
		r.mu.Unlock()
		if !prompted && t.stored {
			// The agent never had it: the next host runs it again.
			m.requeue(r, t)
		}
		return
	}
	m.settleInherited(r)
	if res.outcome != OutcomeSettled && t.stored {
		// A turn that did not settle retires its agent before the next.
		m.release(r, "turn "+res.outcome)
	}
	r.events.flush() // the turn's events come before its end
	r.mu.Lock()
	r.turn = nil // deliveries go to the queue from here on
	r.ending = true
	r.lastUsed = time.Now()
	joined := t.joined
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.ending = false
		r.mu.Unlock()
		m.slotWake.signal() // the room may have gone idle
	}()
	resume, handled := r.events.release(0, res.offset, false)
	ids := append([]string{t.messageID}, joined...)
	turnID := ""
	if t.stored {
		turnID = t.id
	}
	m.writeEnd(r, func(tx Tx) error {
		if t.stored {
			if err := tx.EndTurn(t.id, res.outcome, res.reason, res.text); err != nil {
				return err
			}
			if _, err := tx.Append(r.id, "turn.ended", map[string]string{
				"turn_id": t.id, "message_id": t.messageID, "outcome": res.outcome, "reason": res.reason, "text": res.text,
			}); err != nil {
				return err
			}
		}
		if err := endMessages(tx, r.id, ids, turnID, res.outcome, res.reason); err != nil {
			return err
		}
		if res.offset > 0 {
			// The turn's frames, its end included, are not read again.
			return tx.SetAgentOffset(r.id, resume, handled)
		}
		return nil
	})
}

// Retries of a write that ends messages (writeEnd).
const (
	endRetryFirst = 100 * time.Millisecond
	endRetryMax   = 5 * time.Second
)

// writeEnd makes a write that ends accepted messages, retrying it with
// backoff while the store refuses it (a full disk, a store without a
// leader): an accepted message must end, and the room's queue waits
// meanwhile rather than running later messages first. It gives up when
// the room is no longer this host's, the store is closed, or the manager
// closes (its next Start recovers the messages, in order).
func (m *Manager) writeEnd(r *roomState, fn func(tx Tx) error) {
	delay := endRetryFirst
	for attempt := 1; ; attempt++ {
		err := m.write(fn)
		if err == nil {
			if attempt > 1 {
				m.log.Info("room: the store took the end of a turn it had refused", "room", r.id, "attempts", attempt)
			}
			return
		}
		r.mu.Lock()
		dropped := r.dropped
		r.mu.Unlock()
		if dropped || errors.Is(err, ErrNotHeld) || errors.Is(err, store.ErrClosed) ||
			errors.Is(err, ErrNotFound) || errors.Is(err, ErrConflict) {
			m.log.Error("room: recording a turn's end failed", "room", r.id, "err", err)
			return
		}
		if attempt == 1 || attempt%20 == 0 {
			m.log.Error("room: the store refused the end of a turn; retrying", "room", r.id, "attempt", attempt, "err", err)
		}
		timer := time.NewTimer(delay)
		select {
		case <-timer.C:
		case <-m.ctx.Done():
			timer.Stop()
			m.log.Error("room: closing with a turn's end not recorded; the next start recovers it", "room", r.id, "err", err)
			return
		}
		delay = min(2*delay, endRetryMax)
	}
}

// requeue ends a turn whose prompt never reached the agent and puts its
// messages back in the queue (in the store, for the next host).
func (m *Manager) requeue(r *roomState, t *turnRun) {
	err := m.write(func(tx Tx) error {
		if err := tx.EndTurn(t.id, OutcomeCancelled, errDetached.Error(), ""); err != nil {
			return err
		}
		if _, err := tx.Append(r.id, "turn.ended", map[string]string{
			"turn_id": t.id, "message_id": t.messageID, "outcome": OutcomeCancelled, "reason": errDetached.Error(), "text": "",
		}); err != nil {
			return err
		}
		for _, id := range append([]string{t.messageID}, t.joined...) {
			if err := tx.UpdateMessage(id, store.MessageQueued, "", "", ""); err != nil {
				return err
			}
			if _, err := tx.Append(r.id, "message.queued", map[string]any{"message_id": id, "recovered": true}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		m.log.Error("room: queueing a turn the agent never had again", "room", r.id, "err", err)
	}
}

func (m *Manager) isDetaching() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.detaching
}

// execute runs the turn on the room's agent and judges its outcome.
func (m *Manager) execute(r *roomState, t *turnRun, cfg Config, text string) turnEnd {
	a, err := m.ensureAgent(t.ctx, r, cfg)
	var res TurnResult
	if err == nil {
		r.mu.Lock()
		lost := r.lost
		r.lost = false
		r.mu.Unlock()
		if lost {
			text = m.transcript(r.id, t.messageSeq) + text
		}
		r.mu.Lock()
		for _, e := range t.early {
			text += "\n\n" + e
		}
		t.prompted = true
		r.mu.Unlock()
		res, err = a.Run(t.ctx, text)
	}
	return m.judge(t, res, err)
}

// judge is a turn's outcome from the agent's result and the turn's
// context.
func (m *Manager) judge(t *turnRun, res TurnResult, err error) turnEnd {
	if err == nil && t.ctx.Err() == nil {
		if res.Uncertain {
			return turnEnd{OutcomeSettled, "uncertain: the agent's state could not be confirmed after the turn", res.Text, res.Offset}
		}
		return turnEnd{OutcomeSettled, "", res.Text, res.Offset}
	}
	switch cause := context.Cause(t.ctx); {
	case errors.Is(cause, errCancelled):
		return turnEnd{outcome: OutcomeCancelled, reason: "cancelled"}
	case errors.Is(cause, errShutdown):
		return turnEnd{outcome: OutcomeCancelled, reason: errShutdown.Error()}
	case errors.Is(cause, errDropped):
		return turnEnd{outcome: OutcomeFailed, reason: cause.Error()}
	case errors.Is(cause, errTurnDeadline), errors.Is(cause, errStalled), errors.Is(cause, errNoSlot):
		return turnEnd{outcome: OutcomeTimedOut, reason: cause.Error()}
	case err != nil:
		return turnEnd{outcome: OutcomeFailed, reason: err.Error()}
	default:
		return turnEnd{outcome: OutcomeFailed, reason: cause.Error()}
	}
}

// ensureAgent returns the room's resident agent, starting it through the
// resume ladder: resume the recorded session and verify it; if it cannot
// be resumed, start fresh, say so (context.lost), and owe the agent the
// room's transcript.
func (m *Manager) ensureAgent(ctx context.Context, r *roomState, cfg Config) (Agent, error) {
	r.mu.Lock()
	a := r.agent
	r.mu.Unlock()
	if a != nil {
		select {
		case <-a.Done():
			m.release(r, "agent exited")
		default:
			return a, nil
		}
	}
	if err := m.acquireSlot(ctx, r); err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			m.freeSlot()
		}
	}()
	sess := r.sessionID(ctx, m.st)
	for _, d := range []string{r.workspace, filepath.Join(r.dir, "home")} {
		if err := mkdirNoLink(d); err != nil {
			return nil, err
		}
	}
	spec := AgentSpec{Room: r.id, Workspace: r.workspace, Home: filepath.Join(r.dir, "home"),
		SessionID: sess, Config: cfg, Tools: m.roomTools(r), MCP: cfg.MCP, Handler: &handler{m: m, r: r}}
	if m.opts.MCP != nil {
		servers, err := m.opts.MCP(ctx, r.id, spec.Workspace)
		if err == nil {
			err = validateMCP(servers)
		}
		if err != nil {
			return nil, fmt.Errorf("resolving the room's MCP servers: %w", err)
		}
		spec.MCP = servers
	}
	a, err := m.opts.Transport.Start(ctx, spec)
	lost := ""
	switch {
	case sess == "":
	case errors.Is(err, ErrSessionNotFound):
		lost = "the agent could not resume session " + sess
		spec.SessionID = ""
		a, err = m.opts.Transport.Start(ctx, spec)
	case err == nil && a.SessionID() != sess:
		lost = "the agent started session " + a.SessionID() + " instead of resuming " + sess
	}
	if err != nil {
		return nil, fmt.Errorf("starting the agent: %w", err)
	}
	started = true
	r.mu.Lock()
	r.agent, r.session = a, a.SessionID()
	if lost != "" {
		r.lost = true
	}
	r.mu.Unlock()
	handle := ""
	if d, ok := a.(Detachable); ok {
		handle = d.Handle()
	}
	err = m.write(func(tx Tx) error {
		if err := tx.SetSession(r.id, cfg.Agent, a.SessionID()); err != nil {
			return err
		}
		if handle != "" {
			// With agent.started: a host that restarts finds it.
			if err := tx.SetAgentProc(r.id, handle); err != nil {
				return err
			}
		}
		if _, err := tx.Append(r.id, "agent.started", map[string]any{
			"session_id": a.SessionID(), "resumed": sess != "" && lost == "",
		}); err != nil {
			return err
		}
		if lost != "" {
			_, err := tx.Append(r.id, "context.lost", map[string]string{"previous_session_id": sess, "reason": lost})
			return err
		}
		return nil
	})
	return a, err
}

// sessionID is the room's recorded session.
func (r *roomState) sessionID(ctx context.Context, st Store) string {
	r.mu.Lock()
	s := r.session
	r.mu.Unlock()
	if s != "" {
		return s
	}
	if rec, err := st.Room(ctx, r.id); err == nil {
		return rec.SessionID
	}
	return ""
}

// mkdirNoLink creates dir; an existing symlink there is refused, so a
// workspace cannot be pointed outside the root.
func mkdirNoLink(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return fmt.Errorf("room: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !os.IsExist(err) {
		return fmt.Errorf("room: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("room: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("room: %s is not a plain directory", filepath.Base(dir))
	}
	return nil
}

// transcript is the room's own record of the conversation before the
// message accepted at seq upTo, bounded by TranscriptBytes (the newest
// part kept).
func (m *Manager) transcript(room string, upTo int64) string {
	ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
	defer cancel()
	// Each exchange costs at least a few bytes: this many cover the budget.
	xs, err := m.st.Exchanges(ctx, room, upTo, m.opts.TranscriptBytes/16+1)
	if err != nil || len(xs) == 0 {
		return ""
	}
	var lines []string // newest first
	n := 0
	for _, x := range xs {
		entry := "user"
		if x.Sender != "" {
			entry += " (" + x.Sender + ")"
		}
		entry += ": " + x.Text + "\n"
		if x.Answer != "" {
			entry += "assistant: " + x.Answer + "\n"
		}
		if n+len(entry) > m.opts.TranscriptBytes {
			break
		}
		lines = append(lines, entry)
		n += len(entry)
	}
	if len(lines) == 0 {
		return ""
	}
	slices.Reverse(lines)
	return "[The previous agent session of this conversation was lost. The conversation so far, from the room's own record:]\n" +
		strings.Join(lines, "") + "[End of the earlier conversation. The new message follows.]\n\n"
}

// releaseIfIdle releases the room's agent unless a turn runs (checked as
// the agent is taken, so a turn starting meanwhile keeps it).
func (m *Manager) releaseIfIdle(r *roomState, reason string) {
	if a := r.takeAgent(func(r *roomState) bool { return r.turn == nil }); a != nil {
		m.closeAgent(r, a, reason, true)
	}
}

// release closes the room's agent, if resident, and records its receipt.
func (m *Manager) release(r *roomState, reason string) {
	if a := r.takeAgent(nil); a != nil {
		m.closeAgent(r, a, reason, true)
	}
}

// closeAgent closes a, taken from the room, and records its receipt; free
// gives its slot back (an eviction passes it on instead).
func (m *Manager) closeAgent(r *roomState, a Agent, reason string, free bool) {
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.ShutdownBudget)
	receipt, err := a.Close(ctx)
	cancel()
	if free {
		m.freeSlot()
	}
	data := map[string]any{"reason": reason}
	if len(receipt) > 0 {
		data["receipt"] = receipt
	}
	if err != nil {
		data["error"] = err.Error()
		m.log.Error("room: releasing the agent", "room", r.id, "err", err)
	}
	werr := m.write(func(tx Tx) error {
		if d, ok := a.(Detachable); ok && d.Handle() != "" {
			if err := tx.SetAgentProc(r.id, ""); err != nil {
				return err
			}
		}
		if len(receipt) > 0 {
			if _, err := tx.PutReceipt(r.id, receipt); err != nil {
				return err
			}
		}
		_, err := tx.Append(r.id, "agent.released", data)
		return err
	})
	if werr != nil {
		m.log.Error("room: recording a release failed", "room", r.id, "err", werr)
	}
}

// janitor releases rooms idle for IdleAfter.
func (m *Manager) janitor() {
	defer m.wg.Done()
	tick := time.NewTicker(min(m.opts.IdleAfter/4, 5*time.Second))
	defer tick.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-tick.C:
		}
		var idle []*roomState
		m.mu.Lock()
		for _, r := range m.rooms {
			r.mu.Lock()
			if r.idleLocked() && time.Since(r.lastUsed) >= m.opts.IdleAfter {
				idle = append(idle, r)
			}
			r.mu.Unlock()
		}
		m.mu.Unlock()
		for _, r := range idle {
			if a := r.takeAgent((*roomState).idleLocked); a != nil {
				m.closeAgent(r, a, "idle", true)
			}
		}
	}
}

// Cancel ends the room's running turn as cancelled.
func (m *Manager) Cancel(ctx context.Context, room string) error {
	if err := ValidateID(room); err != nil {
		return err
	}
	if ok, err := m.remote(ctx, room, ControlOp{Kind: ControlCancel}); ok {
		return err
	}
	return m.cancelLocal(room)
}

func (m *Manager) cancelLocal(room string) error {
	r, err := m.room(room)
	if err != nil {
		return err
	}
	r.mu.Lock()
	t := r.turn
	r.mu.Unlock()
	if t == nil {
		return ErrNoTurn
	}
	t.cancel(errCancelled)
	return nil
}

// Release releases the room's agent (not while a turn runs).
func (m *Manager) Release(ctx context.Context, room string) error {
	if err := ValidateID(room); err != nil {
		return err
	}
	if ok, err := m.remote(ctx, room, ControlOp{Kind: ControlRelease}); ok {
		return err
	}
	return m.releaseLocal(room)
}

func (m *Manager) releaseLocal(room string) error {
	r, err := m.room(room)
	if err != nil {
		return err
	}
	m.releaseIfIdle(r, "released on request")
	return nil
}

// Close stops accepting messages, cancels running turns ("host shutting
// down"; their queued successors stay queued in the store for the next
// start), and releases every agent within ShutdownBudget, recording each
// receipt.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closing {
		m.mu.Unlock()
		return ErrClosed
	}
	m.closing = true
	rooms := make([]*roomState, 0, len(m.rooms))
	for _, r := range m.rooms {
		rooms = append(rooms, r)
	}
	m.mu.Unlock()
	for _, r := range rooms {
		r.mu.Lock()
		if r.turn != nil {
			r.turn.cancel(errShutdown)
		}
		r.mu.Unlock()
	}
	m.cancel()
	err := m.waitWorkers()
	// Workers are done (or out of budget): release every agent left,
	// all at once.
	var wg sync.WaitGroup
	for _, r := range rooms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.release(r, "host shutting down")
		}()
	}
	wg.Wait()
	return err
}

// Detach ends the manager for a planned restart: like Close, except that
// agents that can outlive the host (Detachable, with a Handle) are let go
// of running, their turns left open in the store with the position their
// output was read to, their pending approvals and questions left pending;
// the next manager's Start attaches them (see Attacher) and continues
// those turns. Other agents are released as by Close.
func (m *Manager) Detach() error {
	m.mu.Lock()
	if m.closing {
		m.mu.Unlock()
		return ErrClosed
	}
	m.closing = true
	m.detaching = true
	rooms := make([]*roomState, 0, len(m.rooms))
	for _, r := range m.rooms {
		rooms = append(rooms, r)
	}
	m.mu.Unlock()
	// Let go of the agents first: their turns' Run and Continue return
	// with nothing sent to the agent, and finishTurn records nothing.
	m.detachAll(rooms)
	for _, r := range rooms {
		r.mu.Lock()
		if r.turn != nil {
			r.turn.cancel(errDetached)
		}
		r.mu.Unlock()
	}
	m.cancel()
	err := m.waitWorkers()
	// An agent started meanwhile is let go of too; the others released.
	m.detachAll(rooms)
	var wg sync.WaitGroup
	for _, r := range rooms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.release(r, "host shutting down")
		}()
	}
	wg.Wait()
	return err
}

// detachAll lets go of every detachable agent, leaving it running; the
// room forgets it (the store keeps its handle for the next host).
func (m *Manager) detachAll(rooms []*roomState) {
	var wg sync.WaitGroup
	for _, r := range rooms {
		r.mu.Lock()
		d, ok := r.agent.(Detachable)
		if ok && d.Handle() != "" {
			r.agent = nil
		}
		r.mu.Unlock()
		if !ok || d.Handle() == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := d.Detach(); err != nil {
				m.log.Warn("room: letting go of the agent", "room", r.id, "err", err)
			}
			m.freeSlot()
		}()
	}
	wg.Wait()
}

// waitWorkers waits for the workers within ShutdownBudget.
func (m *Manager) waitWorkers() error {
	done := make(chan struct{})
	go func() {
		m.wg.Wait()
		close(done)
	}()
	t := time.NewTimer(m.opts.ShutdownBudget)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		return errors.New("room: close: turns still running after the shutdown budget")
	}
}
