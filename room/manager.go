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
//
// A steer or follow_up is delivered into the running turn and ends with
// it, or, when the turn ends meanwhile or the agent refuses it, queued
// for a turn of its own: never both (a turn's end waits for the
// deliveries in flight into it). From the moment Close or Detach begins,
// no turn, agent or delivery starts: waiting messages stay queued in the
// store for the next host, which runs them in order. Detach lets go of
// the agents of running turns, which the next host continues; a turn
// whose run ended before its agent was let go of is recorded as it ended,
// and one whose agent never had the prompt is queued again.
//
// # One door
//
// Every operation that reads or changes a room's durable state from
// outside the room passes the room's door, one per room in memory
// (door.go): Submit and Accept, SetSettings, Purge, TurnDiff, Revert,
// Release, Cancel, Approve and Answer, and the janitor's and a slot's
// release of an idle agent. A purge passes alone; the others pass beside
// each other, and those that must not overlap one of their kind take a
// lock of the room's inside the door: SetSettings its settings lock,
// Revert its revert lock. So none sees another half done, and the room is
// always in a state some serial order of them explains:
//
//   - Concurrent SetSettings store and apply their settings one at a
//     time: the last one stored is the one in force (and the one
//     GET /config shows).
//   - A purge waits for the operations inside and holds back those that
//     come after it; when it is done, the room's state in memory is
//     retired and those that waited act on the id's new room (a new
//     incarnation, see Manager.Incarnation): a diff, revert or approval
//     of the old room is then not found, a message or settings create the
//     new room. Nothing touches a room's files (its shadow snapshot
//     repository included) before its existence is checked inside the
//     door, so a purged room's folders are never made again.
//   - A revert waits for another to end, then runs; messages sent
//     meanwhile are accepted and wait for it.
//
// The room's worker runs turns outside the door (a turn may run for
// minutes, while diffs, approvals and cancels go on); the operations that
// must not overlap a turn say so by its state (a turn running is ErrBusy
// for Revert and Purge), and a purge waits for the worker to wind down.
// Reads of the store (State, Events, Messages, Turns, GET /config) take
// no door: a purge deletes a room's records in one write.
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
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/record"
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
	ErrNotFound = record.ErrNotFound
	ErrConflict = record.ErrConflict
)

// Why a turn's context ended, when the room ended it.
var (
	errCancelled = errors.New("cancelled")
	errShutdown  = errors.New("host shutting down")
	errDetached  = errors.New("host restarting; the agent goes on")
	// errRequeued is the reason of a turn whose agent never had its
	// prompt when the host began a planned restart: its messages wait
	// in the queue for the next host (errDetached would say the agent
	// goes on with it, which it does not).
	errRequeued = errors.New("host restarting before the agent had the prompt; queued again for the next host")
)

// Manager runs rooms. Create it with New, call Start, end it with Close
// (or Detach) and join that with Wait.
//
// A program hosting rooms calls Submit, Cancel, Release, Purge, Approve,
// Answer, the settings, state and event reads, TurnDiff and Revert. The
// methods of Hosted (Accept, Adopt, Apply, Drop, HoldUntil, Refuse) are a
// Cluster's alone, which is given the Manager as a Hosted and needs
// nothing else of it; TapEvents is the HTTP API's (its metrics).
//
// Its code, by responsibility:
//
//	manager.go    the Manager and a room's state in memory, New, Start
//	admission.go  accepting a message: queue it, steer it into the running
//	              turn, or refuse it (queue limit)
//	turns.go      a room's worker: one turn at a time, its end recorded once
//	residency.go  a room's agent: started on demand, released when idle,
//	              slots (slots.go) shared by all rooms
//	recovery.go   at Start: turns a dead host left end, queued messages run
//	              again, agents a previous host left running are attached
//	handler.go    the agent's requests to people: approvals and questions
//	cluster.go    the seam to a cluster (Options.Cluster): forward, adopt,
//	              drop a room
//	lifecycle.go  Cancel, Release, Close, Detach, Wait
//	door.go       the door every outside operation on a room passes
//	purge.go      Purge: a room deleted for good
//	settings.go   a room's own settings and budget
//	snapshots.go  TurnDiff and Revert over Options.Snapshots
//	idempotent.go a message sent twice with one idempotency key
//
// Locks, in the only order they are taken: a room's door (door.go; one
// goroutine passes one room's door at a time, never two, except by
// tryEnter, which never waits), then its settings or revert lock (doors
// used alone), then Manager.mu, then roomState.mu. roomState.qmu (a room's questions) is never taken
// with roomState.mu held. The rest are leaves, taken under any of those
// and holding none while held: door.mu, Manager.wgMu, eventLog.mu,
// clock.mu and wakeup.mu.
type Manager struct {
	opts Options
	st   Store
	log  *slog.Logger
	// exclusive: only this Manager changes the store's settings (see
	// ExclusiveStore).
	exclusive bool

	ctx    context.Context // the manager's lifetime
	cancel context.CancelFunc
	wg     sync.WaitGroup // workers, janitor, clocks
	// wgMu orders a new worker's wg.Add against shutdown's cancel and
	// Wait (an Add from zero may not run beside a Wait). A leaf lock.
	wgMu sync.Mutex

	// released is closed once the shutdown Close or Detach began has
	// released the agents, with shutErr set; joined once every goroutine
	// of the manager has ended too (Wait).
	released, joined chan struct{}
	shutErr          error

	// stopping: Close or Detach began (set with closing, and readable
	// under any lock): no turn, agent or delivery starts any more; what
	// waits in the queues stays in the store for the next host.
	stopping atomic.Bool

	mu        sync.Mutex
	started   bool
	closing   bool // Close or Detach began
	detaching bool // Detach: agents that outlive the host are left running
	rooms     map[string]*roomState
	resident  int          // agent slots taken (see acquireSlot)
	slotQ     []*roomState // rooms whose turn waits for a slot, in line
	// slotWake is signalled when a slot frees or a room goes idle.
	slotWake wakeup

	// Tests' hooks (nil otherwise; set before the first turn):
	// onTurnClosing runs as a turn's end begins, before the deliveries in
	// flight into it are waited for; onAwaitDeliveries as finishTurn or
	// Detach begins to wait for one.
	onTurnClosing, onAwaitDeliveries func(room string)
	// onTurnEndWritten runs once a turn's end is written, while the room
	// is still ending; onReleaseWaits as a Release waits for that end.
	onTurnEndWritten, onReleaseWaits func(room string)
}

// roomState is a room's life in memory. Lock order: Manager.mu before
// roomState.mu.
type roomState struct {
	// door, and inside it settingsLock and revertLock: see the package
	// doc ("One door").
	door, settingsLock, revertLock door
	id, dir                        string // dir holds the agent's home
	workspace                      string
	events                         *eventLog // the agent's events, written in batches

	mu  sync.Mutex
	cfg *Config // filled and validated at first use
	// settings are the room's own (SettingsStore), as last read
	// (settingsRaw, settingsRead); settingsGen counts SetSettings' writes
	// (a read begun before one is not applied); startedCfg the config its
	// resident agent was started with; budgetNoted: budget.exhausted is
	// written for the settings in force.
	settings     Settings
	settingsRaw  string
	settingsRead bool
	settingsGen  uint64
	startedCfg   *Config
	budgetNoted  bool
	// wsReady is the workspace prepared from the settings (URL, ref and
	// commit; "": none yet here), wsShared what its agent may read beside.
	wsReady  string
	wsShared []string
	// retired: Purge is done with this state (the room was deleted, or
	// its purge failed half-way): an operation that waited at its door
	// enters the id's new state instead (Manager.enter).
	retired bool
	// incarnation is the room's incarnation as the store said (""
	// until read; see Manager.Incarnation).
	incarnation string
	// keys are the idempotency keys of messages being submitted (see
	// idempotent.go): a second submit of one waits for the first.
	keys    map[string]chan struct{}
	queue   []queued  // in order of acceptance (see queued)
	cont    *contTurn // a turn an attached agent runs, continued first
	working bool      // a worker goroutine serves the queue
	// workerDone is closed when the worker that working announces is gone.
	workerDone chan struct{}
	ending     bool          // a turn's end is being recorded (turn is nil)
	endDone    chan struct{} // closed when ending is cleared
	agent      Agent
	session    string
	lost       bool // the next prompt carries the transcript
	turn       *turnRun
	lastUsed   time.Time
	approvals  map[string]chan bool
	// inheritedA are the approvals pending in a continued turn when the
	// previous host let go: the agent asks again (its request lies past
	// the recorded offset), and the asking takes the pending one over.
	inheritedA []record.Approval
	dropped    bool           // Drop: the host lost the room's lease
	reverting  bool           // Revert works: no turn starts
	revertedTo string         // the next prompt says the workspace was reverted to before this turn
	holdUntil  time.Time      // the agent stops here (a cluster's lease; see HoldUntil)
	worker     sync.WaitGroup // the goroutine serving the queue

	qmu        sync.Mutex // guards questions and questionQ (never under mu)
	questions  map[string]chan answer
	questionQ  []string          // pending question ids, oldest first
	inheritedQ []record.Question // as inheritedA
	// limitSeen is what of the agent's limit counts is recorded
	// (room.limit; see turnMeter), under mu.
	limitSeen limitSeen
}

// contTurn is a turn the previous host started on an agent it left
// running, with the messages steered or followed up into it.
type contTurn struct {
	rec    record.Turn
	run    *turnRun // in place before the agent was attached
	joined []string
}

type turnRun struct {
	id, messageID string
	messageSeq    int64
	// stored: its start is recorded (turn.started); the worker's alone.
	stored bool
	// accepting: begun in the write accepting its message (begunTurn),
	// which has not committed yet; nothing is delivered into it.
	accepting bool
	ctx       context.Context
	cancel    context.CancelCauseFunc
	clock     *clock
	joined    []string // messages steered or followed up into it
	// prompted: the agent is about to get (or has) the prompt; before
	// that, deliveries join the prompt's text (early).
	prompted bool
	early    []string
	// The fields below, like those above, are guarded by roomState.mu.
	// closed: the turn's end is being recorded (finishTurn): no delivery
	// joins it any more. delivering counts deliveries in flight into it
	// (a message joined, its agent call or record not done yet);
	// delivered is closed when that count drops to zero. finishTurn
	// waits for them before it takes the turn's messages, so that a
	// message is either joined (and ends with the turn) or refused (and
	// queued), never both.
	closed     bool
	delivering int
	delivered  chan struct{}
	// returned: its Run (or Continue) returned, so its outcome is the
	// agent's; letGo: its agent was let go of running before that
	// (Detach), so the next host continues it.
	returned, letGo bool
	// snapErr says why the snapshot before the turn failed ("" when it
	// did not, or snapshots are off).
	snapErr string
	// meter measures the turn on a Metered agent (nil: none), under the
	// room's mu.
	meter *turnMeter
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
	// Agents run in other working folders (their workspaces, the tools
	// folder): a relative path would name another folder for them.
	for _, p := range []*string{&opts.Root, &opts.Workspaces} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return nil, fmt.Errorf("room: %w", err)
		}
		*p = abs
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
	if err := c.Limits.check(); err != nil {
		return nil, fmt.Errorf("room: Options.Config.Limits: %w", err)
	}
	es, ok := opts.Store.(ExclusiveStore)
	ctx, cancel := context.WithCancel(context.Background())
	return &Manager{
		opts: opts, st: opts.Store, log: opts.Logger, exclusive: ok && es.Exclusive(), ctx: ctx, cancel: cancel,
		rooms:    map[string]*roomState{},
		released: make(chan struct{}), joined: make(chan struct{}),
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
		r = &roomState{id: id, dir: filepath.Join(m.opts.Root, dirName(id)), workspace: m.workspaceDir(id)}
		r.events = newEventLog(m, id)
		m.rooms[id] = r
	}
	return r, nil
}

// workspaceDir is the folder of the room's workspace.
func (m *Manager) workspaceDir(id string) string {
	if m.opts.Workspaces != "" {
		return filepath.Join(m.opts.Workspaces, dirName(id))
	}
	return filepath.Join(m.opts.Root, dirName(id), "workspace")
}

// config returns the room's filled configuration.
func (m *Manager) configLocked(r *roomState) (Config, error) {
	if r.cfg == nil {
		c := m.opts.Config
		if m.opts.RoomConfig != nil {
			c = c.merge(m.opts.RoomConfig(r.id))
		}
		c = c.merge(r.settings.config())
		c.fill()
		if err := c.validate(); err != nil {
			return Config{}, err
		}
		// Never above the ceilings (settings stored under higher ones, or
		// by a host of a cluster with other ones).
		c.Limits = c.Limits.within(m.opts.Config.Limits)
		r.cfg = &c
	}
	return *r.cfg, nil
}

// write is a store write that must not be lost to a cancelled turn: it
// runs on its own bounded context.
func (m *Manager) write(fn func(tx Tx) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rec offsetTx
	err := m.stWrite(ctx, func(tx Tx) error {
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

func (m *Manager) isDetaching() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.detaching
}
