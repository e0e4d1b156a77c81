package natsroom

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/room"
)

// Defaults for Config.
const (
	DefaultLeaseTTL   = 3 * time.Second
	DefaultAcceptWait = 10 * time.Second
	DefaultCacheIdle  = 10 * time.Minute
	// leaseMargin is how long before the lease's end a holder stops
	// acting on its own (it may not hear that it lost the lease).
	leaseMargin = 500 * time.Millisecond
	// maxInboxEntry bounds one inbox message (a room message's text,
	// JSON-escaped, with room to spare).
	maxInboxEntry = 4*room.MaxMessageBytes + 4096
)

// Roles of a node.
const (
	RoleBoth     = "both"
	RoleFrontend = "frontend"
	RoleWorker   = "worker"
)

// Config configures a Cluster.
type Config struct {
	// Node names this host (unique in the cluster).
	Node string
	// Conn is the connection to JetStream; the Cluster does not close it.
	Conn *nats.Conn
	// Replicas of the streams and buckets (3 in a 3-node cluster).
	Replicas int
	// LeaseTTL is a room lease's life without a renewal (whole seconds,
	// at least 1 s; default 3 s).
	LeaseTTL time.Duration
	// Slots is how many rooms this worker takes before it reports no
	// free slot (placement prefers the worker with the most free slots).
	Slots int
	// Worker: this node runs rooms (false: a front end only).
	Worker bool
	// AcceptWait bounds how long Forward waits for the holder to accept
	// a message before it answers with Seq 0 (default 10 s).
	AcceptWait time.Duration
	// CacheIdle: a room's records this node read (it folds them from the
	// room's log) are dropped when nobody asked for them for this long and
	// the node does not hold the room (default 10 min).
	CacheIdle time.Duration
	// StoreHealth, if set, says why this node's JetStream cannot serve
	// now (nil: it can): its reason goes into the 503 a message gets
	// meanwhile (serve's embedded node: JetStream disabled by a full disk).
	StoreHealth func() error
	// HeldAgents says the Manager's agents are frozen at their room's
	// lease deadline by something that outlives this host (custody's
	// fuse: serve sets it when the fuse runs). A room whose lease this
	// host could not renew by its deadline (the lease bucket electing a
	// leader) is then kept, paused with its agent frozen, while renewals
	// are tried for up to LapsePatience, and goes on (its agent thawed)
	// when one lands: an election costs a held room a pause, not a turn.
	// Without it, such a room is dropped at its deadline (its agent killed:
	// nothing else would stop it).
	HeldAgents bool
	Logger     *slog.Logger
}

// Cluster is room.Cluster over JetStream. Create it with New, pass
// Store() and the Cluster to room.New, then Start with the Manager.
type Cluster struct {
	cfg   Config
	nc    *nats.Conn
	js    jetstream.JetStream
	st    *Store
	log   *slog.Logger
	m     room.Hosted
	lease jetstream.KeyValue
	load  jetstream.KeyValue
	work  jetstream.KeyValue

	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	started bool
	stopped bool // Stop: the Manager closes the rooms; none is taken or dropped
	closed  bool
	held    map[string]*held
	subs    []*nats.Subscription
	// retryWake: wake-ups the wake stream did not take yet.
	retryWake    map[string]bool
	droppedWakes int
	// loads: the workers' advertised free slots, kept by watchLoads.
	loads map[string]workerLoad
}

// held is a room this host holds.
type held struct {
	room     string
	rev      uint64 // the lease's KV revision (the epoch at acquire)
	epoch    uint64
	mu       sync.Mutex
	deadline time.Time // local, monotonic: stop acting after it
	since    time.Time // acquired
	wake     chan struct{}
	cancel   context.CancelFunc
	done     chan struct{}
	marked   bool // the room's work mark is put (inbox reader only)
	// lapsed is when this host saw the deadline pass without a renewal
	// (zero while renewed in time): the room is paused, its agent frozen,
	// until a renewal lands (Config.HeldAgents).
	lapsed time.Time
	// retaking: a goroutine is taking back the room's expired lease (see
	// retake); the renew rounds leave the room alone while its
	// compare-and-set is in flight, and renew it without moving its
	// deadline while it checks the room's log (verifying).
	retaking, verifying bool
	renewed             time.Time // the last renewal sent that landed while verifying
}

func (h *held) until() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.deadline
}

// writeUntil is how long the room's log writer may go on trying an
// append (a fenced append is safe whoever holds the lease: the log refuses
// it after a takeover): while the room is held here, its deadline, and
// the pause after it when the room is kept paused (Config.HeldAgents).
func (c *Cluster) writeUntil(h *held) func() time.Time {
	return func() time.Time { return h.until().Add(c.lapsePatience()) }
}

// lapsePatience is how long a room whose lease deadline passed is kept,
// paused, while renewals are tried (0: dropped at the deadline).
func (c *Cluster) lapsePatience() time.Duration {
	if !c.cfg.HeldAgents {
		return 0
	}
	return LapsePatience
}

// LapsePatience bounds how long a host keeps a room whose lease it could
// not renew by its deadline (with Config.HeldAgents), its agent frozen,
// while it tries to renew: the lease bucket's election after its leader
// died takes 4 to 9 s (NATS's election timeout), and more under load; a
// heal's takes 1 to 3 s. A room that another node took meanwhile is
// dropped as soon as a renewal is refused.
const LapsePatience = electionWait

// New checks cfg and returns a Cluster (nothing runs until Start).
func New(cfg Config) (*Cluster, error) {
	if cfg.Node == "" || cfg.Conn == nil {
		return nil, errors.New("natsroom: Config.Node and Config.Conn are required")
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.LeaseTTL < time.Second || cfg.LeaseTTL%time.Second != 0 {
		return nil, errors.New("natsroom: LeaseTTL must be whole seconds, at least 1 s (JetStream truncates TTLs)")
	}
	if cfg.Slots <= 0 {
		cfg.Slots = room.DefaultMaxResident
	}
	if cfg.AcceptWait <= 0 {
		cfg.AcceptWait = DefaultAcceptWait
	}
	if cfg.CacheIdle <= 0 {
		cfg.CacheIdle = DefaultCacheIdle
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	c := &Cluster{cfg: cfg, nc: cfg.Conn, js: js, log: cfg.Logger, ctx: ctx, cancel: cancel, held: map[string]*held{}, retryWake: map[string]bool{}, loads: map[string]workerLoad{}}
	c.st = newStore(cfg.Conn, js, cfg.Node)
	c.st.fence, c.st.logger = c.fenced, cfg.Logger
	return c, nil
}

// Store is the room.Store to give the Manager.
func (c *Cluster) Store() *Store { return c.st }

// ErrConfig is returned (wrapped, with what to change) by Setup for a
// JetStream that cannot serve the cluster as configured: retrying would
// not help.
var ErrConfig = errors.New("natsroom: JetStream cannot serve this configuration")

// Setup creates the streams, buckets and the dispatch consumer (or
// checks them), retrying until ctx ends while a new cluster elects its
// JetStream leader (waiting reports the error each try meets, so a node
// whose peers are late can say so); a configuration JetStream refuses
// (more replicas than servers) fails at once with ErrConfig.
func Setup(ctx context.Context, js jetstream.JetStream, replicas int, leaseTTL time.Duration, waiting func(error)) error {
	var last error
	for {
		last = setupOnce(ctx, js, replicas, leaseTTL)
		if last == nil {
			return nil
		}
		if errors.Is(last, ErrConfig) {
			return last
		}
		if waiting != nil {
			waiting(last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("natsroom: setting up JetStream: %w", last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// configErr turns JetStream's refusals of a configuration into ErrConfig
// with what to change.
func configErr(replicas int, err error) error {
	var ae *jetstream.APIError
	if !errors.As(err, &ae) {
		return err
	}
	switch ae.ErrorCode {
	case 10074: // replicas > 1 not supported in non-clustered mode
		return fmt.Errorf("%w: the NATS server is not clustered, so it keeps 1 replica, not %d: give --nats-replicas 1 (%v)", ErrConfig, replicas, err)
	case 10005: // no suitable peers: fewer servers than replicas (or too little storage on them)
		if strings.Contains(ae.Description, "insufficient resources") || strings.Contains(ae.Description, "no suitable peers") {
			return fmt.Errorf("natsroom: JetStream has no %d servers able to hold a replica yet (give --nats-replicas at most the number of servers): %w", replicas, err)
		}
	}
	return err
}

// Storage of the buckets and streams: the lease and load buckets and the
// wake-ups live only while their holders do (seconds), so they are kept
// in memory: a node whose disk filled up still renews the leases of the
// rooms it holds (and a restart of the whole cluster forgets them, as it
// should). The log, the inboxes and the work marks are on disk.
const ephemeral = jetstream.MemoryStorage

func setupOnce(ctx context.Context, js jetstream.JetStream, replicas int, leaseTTL time.Duration) error {
	// A JetStream request finds no meta leader before the cluster elects
	// one: ask briefly, and often.
	ictx, icancel := context.WithTimeout(ctx, time.Second)
	_, err := js.AccountInfo(ictx)
	icancel()
	if err != nil {
		return fmt.Errorf("account info: %w", err)
	}
	octx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := kvBucket(octx, js, jetstream.KeyValueConfig{
		Bucket: BucketLease, LimitMarkerTTL: leaseTTL, Replicas: replicas, Storage: ephemeral,
	}); err != nil {
		return fmt.Errorf("lease bucket: %w", configErr(replicas, err))
	}
	// Worker loads: each worker puts its free slots every second; the
	// bucket's age limit forgets a dead worker.
	if err := kvBucket(octx, js, jetstream.KeyValueConfig{
		Bucket: BucketLoad, TTL: 5 * time.Second, Replicas: replicas, Storage: ephemeral,
	}); err != nil {
		return fmt.Errorf("load bucket: %w", configErr(replicas, err))
	}
	// Work marks: a room is marked from its holder's first take until it
	// goes idle, so that rooms with work left are found again after the
	// whole cluster stopped (no lease, no watcher, no wake-up survives).
	if err := kvBucket(octx, js, jetstream.KeyValueConfig{
		Bucket: BucketWork, Replicas: replicas, LimitMarkerTTL: workMarkerTTL,
	}); err != nil {
		return fmt.Errorf("work bucket: %w", configErr(replicas, err))
	}
	if err := kvBucket(octx, js, jetstream.KeyValueConfig{Bucket: BucketSettings, Replicas: replicas}); err != nil {
		return fmt.Errorf("settings bucket: %w", configErr(replicas, err))
	}
	// Direct gets: any replica answers a read, so that a room's log
	// replays through any node while the stream elects a leader.
	if _, err := js.CreateOrUpdateStream(octx, jetstream.StreamConfig{
		Name: StreamRooms, Subjects: []string{"rooms.*.ev", "rooms.*.in"}, Replicas: replicas,
		Duplicates: 30 * time.Second, MaxMsgSize: maxBatchLen + 4096, AllowDirect: true,
	}); err != nil {
		return fmt.Errorf("rooms stream: %w", configErr(replicas, err))
	}
	st, err := stream(octx, js, jetstream.StreamConfig{
		Name: StreamWake, Subjects: []string{"wake.*"}, Retention: jetstream.WorkQueuePolicy,
		MaxMsgsPerSubject: 1, Discard: jetstream.DiscardNew, DiscardNewPerSubject: true, Replicas: replicas,
		Storage: ephemeral,
	})
	if err != nil {
		return fmt.Errorf("wake stream: %w", configErr(replicas, err))
	}
	_, err = st.CreateOrUpdateConsumer(octx, jetstream.ConsumerConfig{
		Durable: Dispatch, AckPolicy: jetstream.AckExplicitPolicy, AckWait: dispatchAckWait, MaxAckPending: 1000,
	})
	return err
}

// kvBucket creates or updates a bucket; one an older version made on disk
// stays there (a stream's storage cannot change).
func kvBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) error {
	_, err := js.CreateOrUpdateKeyValue(ctx, cfg)
	if err != nil && cfg.Storage == jetstream.MemoryStorage && storageChange(err) {
		cfg.Storage = jetstream.FileStorage
		_, err = js.CreateOrUpdateKeyValue(ctx, cfg)
	}
	return err
}

// stream is kvBucket for a stream.
func stream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	st, err := js.CreateOrUpdateStream(ctx, cfg)
	if err != nil && cfg.Storage == jetstream.MemoryStorage && storageChange(err) {
		cfg.Storage = jetstream.FileStorage
		st, err = js.CreateOrUpdateStream(ctx, cfg)
	}
	return st, err
}

func storageChange(err error) bool {
	return strings.Contains(strings.ToLower(err.Error()), "storage type")
}

// Start sets up JetStream (waiting for a cluster's leader within ctx) and
// starts the lease renewals, the control responder, the lease watcher
// and, on a worker, the dispatcher. m must have this Cluster as its
// Options.Cluster and Store() as its store.
func (c *Cluster) Start(ctx context.Context, m room.Hosted) error {
	c.mu.Lock()
	if c.started || c.closed {
		c.mu.Unlock()
		return errors.New("natsroom: Start called twice or after Close")
	}
	c.started, c.m = true, m
	c.mu.Unlock()
	var reported time.Time
	waiting := func(err error) {
		if time.Since(reported) >= 10*time.Second {
			reported = time.Now()
			c.log.Warn("natsroom: waiting for the cluster's JetStream (are the other nodes up, and reachable on their routes?)", "err", err)
		}
	}
	if err := Setup(ctx, c.js, c.cfg.Replicas, c.cfg.LeaseTTL, waiting); err != nil {
		return err
	}
	var err error
	if c.lease, err = c.js.KeyValue(ctx, BucketLease); err != nil {
		return err
	}
	if c.load, err = c.js.KeyValue(ctx, BucketLoad); err != nil {
		return err
	}
	if c.work, err = c.js.KeyValue(ctx, BucketWork); err != nil {
		return err
	}
	ctl, err := c.nc.Subscribe(ctlSubject(c.cfg.Node), c.serveControl)
	if err != nil {
		return err
	}
	in, err := c.nc.Subscribe("agenthost.in.*", c.inboxSignal)
	if err != nil {
		_ = ctl.Unsubscribe()
		return err
	}
	c.mu.Lock()
	c.subs = append(c.subs, ctl, in)
	c.mu.Unlock()
	c.goRun(c.renewLoop)
	c.goRun(c.deadlineLoop)
	c.goRun(c.watchLeases)
	c.goRun(c.wakeLoop)
	c.goRun(c.evictLoop)
	if c.cfg.Worker {
		c.goRun(c.watchLoads)
		c.goRun(c.dispatch)
	}
	return nil
}

func (c *Cluster) goRun(fn func()) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		fn()
	}()
}

// Stop stops taking rooms and reading inboxes; the held rooms' leases are
// kept (so the Manager can record its shutdown) until Close.
func (c *Cluster) Stop() {
	c.mu.Lock()
	c.stopped = true
	subs := c.subs
	c.subs = nil
	var hs []*held
	for _, h := range c.held {
		hs = append(hs, h)
	}
	c.mu.Unlock()
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
	for _, h := range hs {
		h.cancel()
		<-h.done
	}
}

// Close stops everything and gives up the held leases (after the Manager
// closed), so that their rooms move at once.
func (c *Cluster) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.mu.Unlock()
	c.Stop()
	c.cancel(errors.New("natsroom: cluster closed"))
	c.wg.Wait()
	c.mu.Lock()
	hs := c.held
	c.held = map[string]*held{}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, h := range hs {
		c.st.disown(h.room)
		if c.lease != nil {
			h.mu.Lock()
			rev := h.rev
			h.mu.Unlock()
			_ = c.lease.Delete(ctx, token(h.room), jetstream.LastRevision(rev))
			if c.needsWake(ctx, h.room) {
				c.tryWake(ctx, h.room)
			}
		}
	}
	if c.load != nil {
		_ = c.load.Delete(ctx, token(c.cfg.Node))
	}
}

// Owns implements room.Cluster.
func (c *Cluster) Owns(rm string) bool {
	c.mu.Lock()
	h := c.held[rm]
	c.mu.Unlock()
	return h != nil && time.Now().Before(h.until()) && c.st.holds(rm)
}

// Holder implements room.Cluster.
func (c *Cluster) Holder(ctx context.Context, rm string) string {
	if c.lease == nil {
		return ""
	}
	// Briefly: it informs (a replica that does not answer is a paused
	// node, and the room's state should not wait for it).
	ctx, cancel := context.WithTimeout(ctx, directWait)
	defer cancel()
	e, err := c.lease.Get(ctx, token(rm))
	if err != nil {
		return ""
	}
	return string(e.Value())
}

// Waiting implements room.QueueCounter from the room's log and inbox.
func (c *Cluster) Waiting(ctx context.Context, rm string) (waiting int, running, asking bool, err error) {
	var cursor uint64
	err = c.st.read(ctx, rm, func(f *fold) {
		running, waiting = f.running() != nil, f.queued()
		for _, q := range f.questions {
			asking = asking || q.Answered.IsZero()
		}
		cursor = f.inbox
	})
	if err != nil {
		return 0, false, false, err
	}
	n, err := c.st.inboxPending(ctx, rm, cursor)
	return waiting + n, running, asking, err
}

type inboxEntry struct {
	ID       string `json:"id"`
	Text     string `json:"text"`
	Sender   string `json:"sender,omitempty"`
	Delivery string `json:"delivery,omitempty"`
	// The sender's trace context: the holder's turn continues its trace.
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
	// Token is the room token that sent it (its message.accepted names it).
	Token *event.TokenRef `json:"token,omitempty"`
}

// Forward implements room.Cluster: the message goes into the room's
// inbox (durable in JetStream, R3 on 3 nodes, before this returns), a
// wake-up goes to the workers, and Forward waits (AcceptWait) for the
// holder to log it, to answer with its sequence.
//
// A message sent with an idempotency key has an id derived from the room
// and the key (room.Message.Key), and a repeat, through this node or
// another, is forwarded under the same id: JetStream stores the id once in
// the inbox within the stream's duplicate window (30 s), and the holder
// accepts an id once whenever it comes (Accept), so the room logs the
// message once and every repeat is answered its sequence. (A front end
// that finds the message in the log already answers without forwarding:
// room.Manager.Submit.)
func (c *Cluster) Forward(ctx context.Context, rm, id string, msg room.Message) (room.Accepted, error) {
	data, err := json.Marshal(inboxEntry{ID: id, Text: msg.Text, Sender: msg.Sender, Delivery: msg.Delivery,
		TraceParent: msg.TraceParent, TraceState: msg.TraceState, Token: msg.Token})
	if err != nil {
		return room.Accepted{}, err
	}
	watch, unwatch := c.st.Watch(rm)
	defer unwatch()
	if err := c.publishInbox(ctx, rm, id, data); err != nil {
		return room.Accepted{}, err
	}
	_ = c.nc.Publish(inSignal(rm), nil)
	c.wakeRoom(ctx, rm)
	acc := room.Accepted{ID: id}
	wctx, cancel := context.WithTimeout(ctx, c.cfg.AcceptWait)
	defer cancel()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		// One lookup by id in the room's records (folded once, then
		// only what the log gained).
		if m, err := c.st.Message(wctx, rm, id); err == nil {
			acc.Seq = m.Seq
			return acc, nil
		}
		select {
		case <-wctx.Done():
			return acc, nil // durable in the inbox; the holder logs it later
		case <-watch:
		case <-tick.C:
		}
	}
}

// publishInbox makes the entry durable in the room's inbox. An attempt
// not answered (the stream electing a leader), or answered that an attempt
// with the same id is still in flight (10158, after a partition heals), is
// sent again under the same id, which JetStream takes once, until one is
// answered or the attempts run out. Every failure is room.ErrUnavailable,
// saying whether the message may have been stored (an attempt went
// unanswered) or not: a sender told 500 would post again blindly.
func (c *Cluster) publishInbox(ctx context.Context, rm, id string, data []byte) error {
	var err error
	unclear := false // an attempt may have landed
	for attempt := 0; attempt < inboxAttempts; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, reqTimeout)
		_, err = c.js.PublishMsg(pctx, &nats.Msg{Subject: inSubject(rm), Data: data}, jetstream.WithMsgID(id))
		cancel()
		var ae *jetstream.APIError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &ae) && storageFull(ae) && !unclear:
			return fmt.Errorf("%w: the cluster's storage is full (%s); nothing was stored", room.ErrUnavailable, ae.Description)
		case errors.As(err, &ae) && ae.ErrorCode == jsErrDuplicateInProcess:
			unclear = true // an earlier attempt is in flight: it may land
		case errors.As(err, &ae):
			return c.inboxErr(unclear, err)
		case errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders):
			// Nobody took this attempt (no leader): it landed nowhere.
		default:
			unclear = true // a timeout: it may have landed
		}
		if ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
	return c.inboxErr(unclear, err)
}

// jsErrDuplicateInProcess is JetStream's answer to a publish whose message
// id an earlier attempt, not yet stored or refused, carries.
const jsErrDuplicateInProcess = 10158

// inboxErr is publishInbox's failure: room.ErrUnavailable with the reason
// (JetStream disabled on this node, if so) and whether the message may
// have been stored.
func (c *Cluster) inboxErr(unclear bool, err error) error {
	stored := "nothing was stored"
	if unclear {
		stored = "the message may have been stored"
	}
	if herr := c.storeHealth(); herr != nil {
		return fmt.Errorf("%w: %v; %s", room.ErrUnavailable, herr, stored)
	}
	return fmt.Errorf("%w: the cluster's log did not take the message (a leader election?); %s: %v", room.ErrUnavailable, stored, err)
}

// inboxAttempts bounds the attempts of publishInbox.
const inboxAttempts = 3

// wakeRoom asks the workers to place the room (coalesced: one wake per
// room waits at a time).
func (c *Cluster) wakeRoom(ctx context.Context, rm string) {
	if c.tryWake(ctx, rm) {
		return
	}
	// The wake stream has no leader (an election, a partition): retry
	// until it takes the wake-up, or the set is full.
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.retryWake) >= maxRetryWakes {
		c.droppedWakes++
		c.log.Error("natsroom: too many wake-ups to retry; dropping one (the room wakes with its next message)", "room", rm, "dropped", c.droppedWakes)
		return
	}
	c.retryWake[rm] = true
}

// maxRetryWakes bounds the wake-ups waiting for a retry.
const maxRetryWakes = 100000

func (c *Cluster) tryWake(ctx context.Context, rm string) bool {
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := c.js.Publish(wctx, wakeSubject(rm), nil)
	var ae *jetstream.APIError
	if err != nil && !(errors.As(err, &ae) && ae.ErrorCode == 10077) {
		c.log.Warn("natsroom: waking a room failed", "room", rm, "err", err)
		return false
	}
	return true
}

// wakeLoop retries failed wake-ups every second.
func (c *Cluster) wakeLoop() {
	c.every(time.Second, func() {
		c.mu.Lock()
		var rooms []string
		for rm := range c.retryWake {
			rooms = append(rooms, rm)
		}
		c.mu.Unlock()
		for _, rm := range rooms {
			if c.tryWake(c.ctx, rm) {
				c.mu.Lock()
				delete(c.retryWake, rm)
				c.mu.Unlock()
			}
		}
	})
}

func ctlSubject(node string) string { return "agenthost.ctl." + token(node) }

type ctlReq struct {
	Room string         `json:"room"`
	Op   room.ControlOp `json:"op"`
}

type ctlResp struct {
	Code  string `json:"code,omitempty"`
	Error string `json:"error,omitempty"`
}

var codes = []struct {
	code string
	err  error
}{
	{"not_found", room.ErrNotFound}, {"conflict", room.ErrConflict}, {"no_turn", room.ErrNoTurn},
	{"not_held", room.ErrNotHeld}, {"bad_message", room.ErrBadMessage}, {"closed", room.ErrClosed},
}

// Control implements room.Cluster: a request to the holder. When no node
// holds the room, or its holder does not answer (it died and its lease has
// not expired yet, or it is cut off), or says it no longer holds it, an
// approval or answer is settled from the room's log: an unknown id is
// room.ErrNotFound, a decided one room.ErrConflict, and one still pending
// (the room is moving: its next holder denies or cancels it) is
// room.ErrUnavailable, to try again.
func (c *Cluster) Control(ctx context.Context, rm string, op room.ControlOp) error {
	holder := c.Holder(ctx, rm)
	for attempt := 0; ; attempt++ {
		if holder == "" {
			return c.unheld(ctx, rm, op, nil)
		}
		why, err := c.control(ctx, holder, rm, op)
		if why == "" || ctx.Err() != nil {
			return err
		}
		// The holder named (by the nearest replica, which may lag: a node
		// just healed) does not run the room: ask the lease's leader.
		l, lerr := c.leaseEntry(ctx, rm)
		switch {
		case lerr != nil:
			return c.unheld(ctx, rm, op, errors.New(why))
		case !l.live:
			holder = ""
		case l.node != holder && attempt == 0:
			holder = l.node
		default:
			return c.unheld(ctx, rm, op, errors.New(why))
		}
	}
}

// control sends op to holder; why says, when the holder does not run the
// room, why not (it does not answer, or says it no longer holds it).
func (c *Cluster) control(ctx context.Context, holder, rm string, op room.ControlOp) (why string, err error) {
	data, _ := json.Marshal(ctlReq{Room: rm, Op: op})
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	reply, err := c.nc.RequestWithContext(rctx, ctlSubject(holder), data)
	if err != nil {
		return fmt.Sprintf("its holder %s does not answer: %v", holder, err), fmt.Errorf("natsroom: asking %s: %w", holder, err)
	}
	var r ctlResp
	if err := json.Unmarshal(reply.Data, &r); err != nil {
		return "", fmt.Errorf("natsroom: answer from %s: %w", holder, err)
	}
	if r.Code == "not_held" {
		return holder + " no longer holds it", fmt.Errorf("%w (on %s)", room.ErrNotHeld, holder)
	}
	for _, x := range codes {
		if r.Code == x.code {
			return "", fmt.Errorf("%w (on %s)", x.err, holder)
		}
	}
	if r.Error != "" {
		return "", fmt.Errorf("natsroom: on %s: %s", holder, r.Error)
	}
	return "", nil
}

// unheld answers op for a room no node runs now: nobody holds its lease
// (why is nil), or its holder cannot run op (why says so).
func (c *Cluster) unheld(ctx context.Context, rm string, op room.ControlOp, why error) error {
	moving := func() error {
		if why == nil {
			return fmt.Errorf("%w: no node holds room %q now (it is moving to another node); try again", room.ErrUnavailable, rm)
		}
		return fmt.Errorf("%w: room %q: %v (it is moving to another node); try again", room.ErrUnavailable, rm, why)
	}
	switch op.Kind {
	case room.ControlCancel:
		if why == nil {
			return room.ErrNoTurn
		}
		return moving()
	case room.ControlRelease:
		if why == nil {
			return nil // nothing resident
		}
		return moving()
	case room.ControlApprove:
		as, err := c.st.Approvals(ctx, rm, false)
		if err != nil {
			return fmt.Errorf("%w: room %q: reading its approvals: %v", room.ErrUnavailable, rm, err)
		}
		for _, a := range as {
			if a.ID != op.ID {
				continue
			}
			if a.Decision != "" {
				return fmt.Errorf("%w: approval %q", room.ErrConflict, op.ID)
			}
			return moving()
		}
		return fmt.Errorf("%w: approval %q", room.ErrNotFound, op.ID)
	case room.ControlAnswer:
		qs, err := c.st.Questions(ctx, rm, false)
		if err != nil {
			return fmt.Errorf("%w: room %q: reading its questions: %v", room.ErrUnavailable, rm, err)
		}
		for _, q := range qs {
			if q.ID != op.ID {
				continue
			}
			if q.By != "" {
				return fmt.Errorf("%w: question %q", room.ErrConflict, op.ID)
			}
			return moving()
		}
		return fmt.Errorf("%w: question %q", room.ErrNotFound, op.ID)
	}
	if why == nil {
		return fmt.Errorf("%w: %q", room.ErrNotHeld, rm)
	}
	return fmt.Errorf("%w: %q: %v", room.ErrNotHeld, rm, why)
}

func (c *Cluster) serveControl(msg *nats.Msg) {
	var req ctlReq
	var resp ctlResp
	if err := json.Unmarshal(msg.Data, &req); err != nil {
		resp.Error = "bad request"
	} else if !c.Owns(req.Room) {
		resp.Code = "not_held"
	} else {
		// Control ops are quick (they signal the room); run them here, off
		// the subscription's goroutine only if they could block.
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
			defer cancel()
			var resp ctlResp
			if err := c.m.Apply(ctx, req.Room, req.Op); err != nil {
				resp.Error = err.Error()
				for _, x := range codes {
					if errors.Is(err, x.err) {
						resp.Code = x.code
						break
					}
				}
			}
			b, _ := json.Marshal(resp)
			_ = msg.Respond(b)
		}()
		return
	}
	b, _ := json.Marshal(resp)
	_ = msg.Respond(b)
}

// inboxSignal wakes a held room's inbox reader (a lost signal is
// harmless: the reader polls too).
func (c *Cluster) inboxSignal(msg *nats.Msg) {
	tok := msg.Subject[len("agenthost.in."):]
	rm, ok := untoken(tok)
	if !ok {
		return
	}
	c.mu.Lock()
	h := c.held[rm]
	c.mu.Unlock()
	if h != nil {
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
}

// storeHealth is Config.StoreHealth's answer (nil without one).
func (c *Cluster) storeHealth() error {
	if c.cfg.StoreHealth == nil {
		return nil
	}
	return c.cfg.StoreHealth()
}

// heldCount is the number of rooms this host holds.
func (c *Cluster) heldCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.held)
}

// TakeoverWait is how long a new holder waits, after it took over the log
// of a room whose lease expired, before it runs the room: the old holder's
// agent is frozen by its fuse at the old holder's own deadline, LeaseTTL -
// 0.5 s after its last renewal, and the lease expires 0.5 s after that;
// this wait covers the fuse's own delay on a loaded machine.
const TakeoverWait = time.Second

// acquire takes the room's lease if it is free, takes the log over and
// adopts the room (after TakeoverWait when settle: the lease had expired).
// ok is false when another host holds it.
func (c *Cluster) acquire(ctx context.Context, rm string, settle bool) (bool, error) {
	c.mu.Lock()
	if c.held[rm] != nil || c.stopped {
		c.mu.Unlock()
		return c.held[rm] != nil, nil
	}
	c.mu.Unlock()
	sent := time.Now()
	// One request, bounded on its own: under a partition's elections an
	// unanswered Create held the whole placement (20 s) while a retry a
	// few seconds later was answered at once.
	cctx, ccancel := context.WithTimeout(ctx, reqTimeout)
	rev, err := c.lease.Create(cctx, token(rm), []byte(c.cfg.Node), jetstream.KeyTTL(c.cfg.LeaseTTL))
	ccancel()
	if errors.Is(err, jetstream.ErrKeyExists) || isWrongLastSeq(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("natsroom: acquiring the lease: %w", err)
	}
	hctx, cancel := context.WithCancel(c.ctx)
	h := &held{room: rm, rev: rev, epoch: rev, deadline: sent.Add(c.cfg.LeaseTTL - leaseMargin), since: sent,
		wake: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	c.mu.Lock()
	c.held[rm] = h
	c.mu.Unlock()
	if err := c.st.takeover(ctx, rm, h.epoch, c.writeUntil(h)); err != nil {
		close(h.done) // no inbox reader runs
		c.forget(h, "takeover failed")
		return false, err
	}
	// The room runs from here on its own goroutine: a wait below would
	// otherwise hold the dispatcher, and a dead node's rooms would move
	// one TakeoverWait after another.
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(h.done)
		if settle {
			// The log is fenced (the old holder's writes fail from now
			// on); its agent's side effects are not, until its fuse fires.
			select {
			case <-hctx.Done():
				return
			case <-time.After(TakeoverWait):
			}
		}
		actx, cancel := context.WithTimeout(hctx, adoptBudget)
		if err := c.m.Adopt(actx, rm, "worker lost"); err != nil {
			c.log.Error("natsroom: adopting a room", "room", rm, "err", err)
		}
		cancel()
		c.leaseRenewed(h)
		c.readInbox(hctx, h)
	}()
	return true, nil
}

// adoptBudget bounds recording a taken room's recovery (Adopt).
const adoptBudget = 30 * time.Second

// forget drops a held room: its turn ends, its agent is released, and
// the lease is left to expire (or deleted when still ours).
func (c *Cluster) forget(h *held, reason string) {
	c.mu.Lock()
	if c.held[h.room] != h {
		c.mu.Unlock()
		return
	}
	delete(c.held, h.room)
	stopped := c.stopped
	c.mu.Unlock()
	c.log.Info("natsroom: giving a room up", "room", h.room, "reason", reason)
	h.cancel()
	c.st.disown(h.room)
	// The inbox reader may be in an Accept: it ends on the cancel (its
	// write is refused, the room being disowned), before the Manager
	// forgets the room (an Accept after that would make it anew).
	<-h.done
	if c.m != nil && !stopped {
		// (After Stop the Manager is closing every room itself.)
		c.m.Drop(h.room, reason)
	}
	h.mu.Lock()
	rev := h.rev
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// Give the lease up at once when it is still ours, so the room moves
	// without waiting for the TTL; a stale revision is refused.
	_ = c.lease.Delete(ctx, token(h.room), jetstream.LastRevision(rev))
	if c.needsWake(ctx, h.room) {
		c.wakeRoom(ctx, h.room)
	}
}

// fenced is the store's report that the room's log refused a write.
func (c *Cluster) fenced(rm string, err error) {
	c.mu.Lock()
	h := c.held[rm]
	c.mu.Unlock()
	if h == nil {
		return
	}
	c.log.Warn("natsroom: log append fenced; releasing the room", "room", rm, "err", err)
	// Off the writer's goroutine: Drop waits for the room's turn, which
	// may be the writer.
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.forget(h, "lease lost: the room moved to another host")
	}()
}

// renewLoop renews every held lease with a CAS+TTL publish (kv.Update
// would drop the TTL and make the lease permanent), and drops a room
// whose lease is lost or whose local deadline passed.
func (c *Cluster) renewLoop() {
	c.every(c.cfg.LeaseTTL/3, func() {
		c.mu.Lock()
		var hs []*held
		for _, h := range c.held {
			hs = append(hs, h)
		}
		c.mu.Unlock()
		// All at once, bounded: one after another, a round of many
		// rooms on a slow stream outlasted the deadline of the last
		// ones (each waits up to TTL/3), and they moved without a fault.
		sem := make(chan struct{}, renewInFlight)
		var wg sync.WaitGroup
		for _, h := range hs {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				c.renew(h)
			}()
		}
		wg.Wait()
		c.releaseIdle(hs)
		c.advertise()
	})
}

// deadlineLoop drops a held room soon after its local deadline. The
// renew loop alone checked it once per renew round, and a round waits
// for each renewal (up to TTL/3 when the stream does not answer): a cut
// off holder then ran its agent past the lease's expiry, beside the new
// holder's agent (seen as an overlap in the partition test).
//
// With Config.HeldAgents the room is kept, paused, past its deadline (its
// agent frozen there by the fuse, whatever this host does) while renewals
// are tried, and dropped LapsePatience after it.
func (c *Cluster) deadlineLoop() {
	c.every(deadlineCheck, func() {
		now := time.Now()
		c.mu.Lock()
		var late, lapsing []*held
		for _, h := range c.held {
			switch until := h.until(); {
			case !now.Before(until.Add(c.lapsePatience())):
				late = append(late, h)
			case !now.Before(until):
				lapsing = append(lapsing, h)
			}
		}
		c.mu.Unlock()
		for _, h := range lapsing {
			h.mu.Lock()
			first := h.lapsed.IsZero()
			if first {
				h.lapsed = now
			}
			h.mu.Unlock()
			if first {
				c.log.Warn("natsroom: lease deadline passed without a renewal; the room's agent is frozen until a renewal lands (or the room moves)", "room", h.room)
			}
		}
		for _, h := range late {
			c.log.Warn("natsroom: lease deadline passed without a renewal; releasing the room", "room", h.room, "waited", c.lapsePatience())
			// Off this loop: Drop waits for the room's turn to end, and
			// the other rooms' deadlines must not wait for it.
			c.goRun(func() { c.forget(h, "lease lost: no renewal before its deadline") })
		}
	})
}

// every runs fn every d until the cluster closes.
func (c *Cluster) every(d time.Duration, fn func()) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-tick.C:
		}
		fn()
	}
}

// evictLoop drops the cached records of rooms nobody asked this node for
// within CacheIdle.
func (c *Cluster) evictLoop() {
	c.every(min(time.Minute, c.cfg.CacheIdle), func() {
		if n := c.st.evictIdle(c.cfg.CacheIdle); n > 0 {
			c.log.Debug("natsroom: dropped idle rooms' cached records", "rooms", n)
		}
	})
}

// renewInFlight bounds the renewals one round has in flight.
const renewInFlight = 64

// deadlineCheck is how often the local lease deadlines are checked: well
// inside leaseMargin, so a holder stops before the lease can expire.
const deadlineCheck = 100 * time.Millisecond

func (c *Cluster) renew(h *held) {
	if !time.Now().Before(h.until()) && !c.cfg.HeldAgents {
		c.log.Warn("natsroom: lease deadline passed without a renewal; releasing the room", "room", h.room)
		c.goRun(func() { c.forget(h, "lease lost: no renewal before its deadline") })
		return
	}
	// (With HeldAgents, past the deadline the room is paused, and the
	// renewals go on: deadlineLoop drops it after LapsePatience.)
	h.mu.Lock()
	rev, retaking := h.rev, h.retaking
	h.mu.Unlock()
	if retaking {
		return
	}
	sent := time.Now()
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.LeaseTTL/3)
	defer cancel()
	ack, err := c.publishLease(ctx, h.room, rev)
	if err != nil && isWrongLastSeq(err) {
		// A renewal that timed out may have landed after all (a stall
		// of the lease stream longer than its wait): the lease then
		// names this node at a later revision. Go on from it.
		l, rerr := c.leaseEntry(ctx, h.room)
		if rerr != nil {
			// The leader cannot be read (JetStream busy electing): a
			// replica's copy may show the renewal that landed (the
			// compare-and-set below checks it); anything else it shows
			// proves nothing.
			if e, gerr := c.lease.Get(ctx, token(h.room)); gerr == nil && e.Operation() == jetstream.KeyValuePut &&
				string(e.Value()) == c.cfg.Node && e.Revision() > rev {
				l, rerr = leaseState{rev: e.Revision(), node: c.cfg.Node, live: true}, nil
			}
		}
		switch {
		case rerr != nil:
			err = rerr // cannot tell: as a timeout, the deadline decides
		case l.live && l.node == c.cfg.Node && l.rev > rev:
			c.log.Debug("natsroom: a renewal whose answer was lost had landed", "room", h.room, "rev", l.rev)
			h.mu.Lock()
			h.rev = l.rev
			h.mu.Unlock()
			rev = l.rev
			sent = time.Now()
			ack, err = c.publishLease(ctx, h.room, rev)
		case !l.live && ae10071(err):
			// Expired (or its expiry's marker gone too), and taken by
			// nobody: the lease bucket's new leader expired it before
			// this host could renew it (an election longer than the
			// lease), or this host was paused. (A lease given up by
			// another holder is one the log shows: retake checks.)
			h.mu.Lock()
			verifying := h.verifying
			h.retaking = !verifying
			h.mu.Unlock()
			if !verifying { // (else the retake under way looks again)
				c.goRun(func() { c.retake(h, l.rev) })
			}
			return
		}
	}
	switch {
	case err == nil:
		h.mu.Lock()
		h.rev = ack.Sequence
		if h.verifying {
			// Taken back, and the log not checked yet: the lease is
			// kept, the agent stays frozen (retake moves the deadline).
			h.renewed = sent
			h.mu.Unlock()
			return
		}
		h.deadline = sent.Add(c.cfg.LeaseTTL - leaseMargin)
		lapsed := h.lapsed
		h.lapsed = time.Time{}
		h.mu.Unlock()
		if lapsed.IsZero() {
			c.log.Debug("natsroom: renewed", "room", h.room, "rev", ack.Sequence)
		} else {
			c.log.Info("natsroom: lease renewed after its deadline had passed; the room goes on", "room", h.room, "paused", time.Since(lapsed).Round(time.Millisecond))
		}
		c.leaseRenewed(h)
	case ae10071(err):
		// Not ours (above): it expired and was taken, or given up.
		c.goRun(func() { c.forget(h, "lease lost: it expired and was taken") })
	default:
		// A timeout, or 10164 (on R3, a renewal of ours still in
		// flight): keep acting until the local deadline.
		c.log.Debug("natsroom: renew failed", "room", h.room, "err", err)
	}
}

// ae10071: JetStream refused a publish because the subject's last
// sequence is not the one expected (the lease moved on).
func ae10071(err error) bool {
	var ae *jetstream.APIError
	return errors.As(err, &ae) && ae.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// retake takes back the lease of a room this host holds that expired with
// nobody taking it (marker: the expiry's sequence): the lease bucket's new
// leader expires, at once, every lease not renewed while it was being
// elected, and an election (4 to 9 s after a leader died) outlasts the
// lease (3 s). Other workers leave such a lease alone for leaderGrace
// after the election (see place), so its holder is first. The lease is
// published over the expiry (a compare-and-set: nobody took it since);
// then the room's log must still be this host's: its last entry of this
// host's epoch (a holder that took the room meanwhile appended its
// takeover, and may have given the lease up since). Only then does the
// room go on (its agent thawed: it was frozen at the deadline); otherwise
// it is dropped.
func (c *Cluster) retake(h *held, marker uint64) {
	defer func() {
		h.mu.Lock()
		h.retaking = false
		h.mu.Unlock()
	}()
	var ack *jetstream.PubAck
	var err error
	var sent time.Time // when the attempt that landed was sent
	for try := 0; ; try++ {
		sent = time.Now()
		ctx, cancel := context.WithTimeout(c.ctx, c.cfg.LeaseTTL/3)
		ack, err = c.publishLease(ctx, h.room, marker)
		if err == nil || !ae10071(err) || try == 2 {
			cancel()
			break
		}
		// The lease moved since it was read: its expiry marker expired
		// in turn (the key holds nothing now), or another worker took
		// it. Read it again.
		l, lerr := c.leaseEntry(ctx, h.room)
		cancel()
		if lerr != nil || l.live {
			break
		}
		marker = l.rev
	}
	if err != nil {
		c.log.Debug("natsroom: taking back an expired lease failed", "room", h.room, "err", err)
		if ae10071(err) {
			c.forget(h, "lease lost: it expired and was taken")
		}
		return // a timeout: the next renewal round looks again
	}
	h.mu.Lock()
	h.rev = ack.Sequence // ours now (forget gives it up by this revision)
	h.renewed = sent
	// Renewed meanwhile (the check below may wait out the log's own
	// election), without moving the deadline.
	h.retaking, h.verifying = false, true
	h.mu.Unlock()
	epoch := strconv.FormatUint(h.epoch, 10)
	var last *jetstream.RawStreamMsg
	began := time.Now()
	for {
		last, err = c.st.getLeader(c.ctx, msgGetReq{LastBySubj: evSubject(h.room)})
		if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) || c.ctx.Err() != nil || time.Since(began) >= electionWait {
			break
		}
		select { // the log electing a leader too (a heal): ask again
		case <-c.ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
	if err != nil || last.Header.Get(hdrEpoch) != epoch {
		c.log.Warn("natsroom: a room's lease expired and its log is no longer this host's; releasing the room", "room", h.room, "err", err)
		c.forget(h, "lease lost: it expired and was taken")
		return
	}
	h.mu.Lock()
	h.verifying = false
	h.deadline = h.renewed.Add(c.cfg.LeaseTTL - leaseMargin)
	lapsed := h.lapsed
	h.lapsed = time.Time{}
	h.mu.Unlock()
	c.log.Info("natsroom: a room's lease expired while the lease bucket could not renew it, and nobody took the room; taken back, the room goes on",
		"room", h.room, "rev", ack.Sequence, "paused", durSince(lapsed))
	c.leaseRenewed(h)
}

// durSince is the time since t, rounded (0 for a zero t).
func durSince(t time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return time.Since(t).Round(time.Millisecond)
}

// publishLease renews the room's lease over revision rev, with its TTL.
func (c *Cluster) publishLease(ctx context.Context, rm string, rev uint64) (*jetstream.PubAck, error) {
	return c.js.PublishMsg(ctx, &nats.Msg{Subject: "$KV." + BucketLease + "." + token(rm), Data: []byte(c.cfg.Node)},
		jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(c.cfg.LeaseTTL))
}

// leaseRenewed holds the room's agent (the one running, and any it
// starts) to the lease's new local deadline: past it, the agent is frozen
// even if this host is paused by then.
func (c *Cluster) leaseRenewed(h *held) {
	if c.m != nil {
		c.m.HoldUntil(h.room, h.until())
	}
}

// advertise puts this worker's free slots for placement.
func (c *Cluster) advertise() {
	if !c.cfg.Worker {
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, time.Second)
	defer cancel()
	free := max(0, c.cfg.Slots-c.heldCount())
	_, _ = c.load.Put(ctx, token(c.cfg.Node), []byte(strconv.Itoa(free)))
}

// bestFree is the most free slots another live worker advertised within
// loadFresh, as the load watcher heard it. It never asks the cluster: a
// listing under a partition's elections held a placement for its whole
// 20 s bound (the room then stayed unowned past the test's minute), and
// loads only advise.
func (c *Cluster) bestFree() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	best := 0
	for node, l := range c.loads {
		switch {
		case time.Since(l.at) >= loadFresh:
			delete(c.loads, node) // a worker gone quiet: heard again if it comes back
		case node != token(c.cfg.Node) && l.free > best:
			best = l.free
		}
	}
	return best
}

// loadFresh is how long an advertised load counts: a few advertisements
// (one per LeaseTTL/3), like the load bucket's age limit.
const loadFresh = 5 * time.Second

type workerLoad struct {
	free int
	at   time.Time // when this node heard it
}

// watchLoads keeps c.loads: the workers' advertised free slots, with when
// each was heard (a stalled watch ages them out, and placement then takes
// rooms itself). The watch is made again when it ends.
func (c *Cluster) watchLoads() {
	for c.ctx.Err() == nil {
		w, err := c.load.WatchAll(c.ctx)
		if err == nil {
			for e := range w.Updates() {
				if e == nil {
					continue
				}
				c.mu.Lock()
				if n, err := strconv.Atoi(string(e.Value())); err == nil && e.Operation() == jetstream.KeyValuePut {
					c.loads[e.Key()] = workerLoad{free: n, at: time.Now()}
				} else {
					delete(c.loads, e.Key())
				}
				c.mu.Unlock()
			}
			_ = w.Stop()
		}
		select {
		case <-c.ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// retry runs try every second until it succeeds (true) or the cluster
// closes (false): a setup request times out while the cluster elects a
// leader, and a loop that gave up on it then did nothing for its life.
func (c *Cluster) retry(what string, try func() error) bool {
	for {
		err := try()
		if err == nil {
			return true
		}
		c.log.Warn("natsroom: "+what+"; retrying", "err", err)
		select {
		case <-c.ctx.Done():
			return false
		case <-time.After(time.Second):
		}
	}
}

// watchLeases wakes a room whose lease expired or was deleted, so that a
// worker resumes it (its holder died or gave it up).
func (c *Cluster) watchLeases() {
	// The watch starts with every lease's last entry: a room whose lease
	// expired before this node watched (the whole cluster stopped, or
	// this node started late) is woken from that snapshot.
	var w jetstream.KeyWatcher
	if !c.retry("watching leases", func() (err error) {
		w, err = c.lease.WatchAll(c.ctx)
		return err
	}) {
		return
	}
	defer func() { _ = w.Stop() }()
	// (w may be replaced below: the deferred Stop reads it then.)
	// The watch's consumer may sit on a node a partition cut off, and
	// miss an expiry: a listing of the held leases every few seconds
	// wakes the rooms whose leases vanished since the last one.
	sweep := time.NewTicker(2 * c.cfg.LeaseTTL)
	defer sweep.Stop()
	// last: the leases the previous sweep listed, and those the watch saw
	// taken or renewed since (a lease taken and expired between two
	// sweeps, its expiry missed by a watch cut off, left its room unowned).
	last := map[string]bool{}
	updates := w.Updates()
	// Rooms with work left and no lease (the whole cluster stopped with
	// them mid-turn or queued): woken now, and on every sweep.
	last = c.sweepLeases(last)
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-sweep.C:
			c.ensureSetup()
			last = c.sweepLeases(last)
			if updates == nil {
				// Watch again (the sweep covered meanwhile).
				if nw, err := c.lease.WatchAll(c.ctx); err == nil {
					_ = w.Stop()
					w, updates = nw, nw.Updates()
				}
			}
		case e, ok := <-updates:
			if !ok {
				// The watch ended without a cancel (its subscription
				// closed, its stream gone): the sweep goes on waking
				// rooms, and the next one watches again.
				c.log.Warn("natsroom: the lease watch ended; sweeping until it is made again")
				updates = nil
				continue
			}
			if e == nil {
				continue
			}
			// Only expiry (a purge marker) wakes: a holder that gives a
			// lease up deletes it and wakes the room itself when it has
			// work left.
			switch e.Operation() {
			case jetstream.KeyValuePut:
				last[e.Key()] = true
				continue
			case jetstream.KeyValueDelete:
				delete(last, e.Key())
				continue
			}
			delete(last, e.Key())
			if rm, ok := untoken(e.Key()); ok {
				c.log.Debug("natsroom: lease gone; waking the room", "room", rm, "op", e.Operation().String())
				ctx, cancel := context.WithTimeout(c.ctx, 2*time.Second)
				c.wakeRoom(ctx, rm)
				cancel()
			}
		}
	}
}

// dispatch takes wake-ups and places rooms: a worker takes a room when
// its lease is free, unless another worker advertises clearly more free
// slots (then it defers the wake-up a little, a few times).
func (c *Cluster) dispatch() {
	// A dispatcher that gave up on the lookup placed nothing for the rest
	// of its life (its rooms stayed unowned after a partition).
	var cons jetstream.Consumer
	if !c.retry("finding the dispatch consumer", func() (err error) {
		cons, err = c.js.Consumer(c.ctx, StreamWake, Dispatch)
		return err
	}) {
		return
	}
	failures := 0
	for c.ctx.Err() == nil {
		if failures >= 8 {
			// The consumer may be gone with its stream (an external
			// server restarted: the wake stream lives in memory), and
			// made again: look it up again.
			if x, err := c.js.Consumer(c.ctx, StreamWake, Dispatch); err == nil {
				cons = x
			}
			failures = 0
		}
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			failures++
			select {
			case <-c.ctx.Done():
				return
			case <-time.After(250 * time.Millisecond):
			}
			continue
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			c.placeInProgress(msg)
		}
		if n == 0 && batch.Error() != nil {
			// No consumer leader (an election, a partition): back off.
			failures++
			select {
			case <-c.ctx.Done():
				return
			case <-time.After(250 * time.Millisecond):
			}
		} else {
			failures = 0
		}
	}
}

// ensureSetup makes the streams and buckets again when JetStream lost
// them: the ones kept in memory are gone after an external server's
// restart (or a whole cluster's).
func (c *Cluster) ensureSetup() {
	ctx, cancel := context.WithTimeout(c.ctx, reqTimeout)
	defer cancel()
	missing := false
	for _, name := range []string{"KV_" + BucketLease, "KV_" + BucketLoad, StreamWake} {
		if _, err := c.js.Stream(ctx, name); errors.Is(err, jetstream.ErrStreamNotFound) {
			missing = true
		}
	}
	if !missing {
		return
	}
	if err := setupOnce(ctx, c.js, c.cfg.Replicas, c.cfg.LeaseTTL); err != nil {
		c.log.Warn("natsroom: JetStream lost the cluster's in-memory buckets (a restart?); making them again failed", "err", err)
		return
	}
	c.log.Warn("natsroom: JetStream lost the cluster's in-memory buckets (a restart?); made them again")
}

// dispatchAckWait is how long a wake-up delivered to a worker stays its
// own without an answer. Short, because while it is pending the room
// takes no other wake-up (one per room): a worker cut off right after it
// took one (its ack lost) kept the room unowned for the whole wait (it
// was 30 s). A placement in progress says so every dispatchAckWait/3.
const dispatchAckWait = 5 * time.Second

// placeInProgress places the room of msg, telling the stream it is in
// progress until done.
func (c *Cluster) placeInProgress(msg jetstream.Msg) {
	done := make(chan struct{})
	defer close(done)
	c.goRun(func() {
		tick := time.NewTicker(dispatchAckWait / 3)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				_ = msg.InProgress()
			}
		}
	})
	c.place(msg)
}

func (c *Cluster) place(msg jetstream.Msg) {
	rm, ok := untoken(msg.Subject()[len("wake."):])
	if !ok {
		_ = msg.Term()
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, 20*time.Second)
	defer cancel()
	c.log.Debug("natsroom: wake", "room", rm)
	// Only the stream leader's answer may drop a wake-up: a direct get
	// (Holder, and kv.Create's check over a purge marker) can be served
	// by a replica that has not applied the expiry yet, and a wake-up
	// acked on such a stale "held" was the room's last one: after a
	// partition the room then stayed unowned.
	lease, err := c.leaseEntry(ctx, rm)
	if err != nil {
		_ = msg.NakWithDelay(time.Second)
		return
	}
	if lease.live {
		_ = msg.Ack() // its expiry wakes the room again
		return
	}
	if lease.expired {
		// Its holder may be alive and kept from renewing by the lease
		// bucket's election, whose new leader expired the lease at once:
		// the holder takes it back (retake) if it is given the time.
		if wait := c.leaseGraceLeft(ctx, lease.at); wait > 0 {
			c.log.Debug("natsroom: a lease expired just after the lease bucket's election; leaving it to its holder a moment", "room", rm, "wait", wait)
			_ = msg.NakWithDelay(wait)
			return
		}
	}
	free := max(0, c.cfg.Slots-c.heldCount())
	meta, _ := msg.Metadata()
	if meta != nil && meta.NumDelivered < 4 {
		if free == 0 || c.bestFree() >= free+2 {
			_ = msg.NakWithDelay(200 * time.Millisecond)
			return
		}
	}
	_ = msg.InProgress()
	// A lease that expired (not given up) may have a holder that is
	// paused, or cut off, with its agent still running until its fuse
	// stops it: the new holder lets that bound pass before it runs one.
	ok, err = c.acquire(ctx, rm, lease.expired)
	c.log.Debug("natsroom: acquire", "room", rm, "ok", ok, "err", err)
	if err != nil {
		c.log.Warn("natsroom: placing a room", "room", rm, "err", err)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	if !ok {
		if held, err := c.leaseHeld(ctx, rm); err != nil || !held {
			_ = msg.NakWithDelay(250 * time.Millisecond) // a stale read refused the lease: try again
			return
		}
	}
	_ = msg.Ack()
}

// leaderGrace is how long after its expiry a lease that expired soon after
// the lease bucket elected a leader (within electionExpiries of it) is left
// to its holder (see retake): a few of its renewal rounds (one every
// LeaseTTL/3).
func (c *Cluster) leaderGrace() time.Duration { return c.cfg.LeaseTTL }

// electionExpiries is how long after the lease bucket's election an expiry
// may be the election's doing: its new leader expires the leases not
// renewed while it was elected about a lease's life after it took office,
// and a renewal of those seconds may have landed without its answer (its
// holder then learns its revision late).
func (c *Cluster) electionExpiries() time.Duration { return 3 * c.cfg.LeaseTTL }

// leaseGraceLeft is how much of leaderGrace is left of a lease that
// expired at expiredAt (0 when it is past, when the expiry came long after
// the lease bucket's leader took office, or when the bucket is not
// replicated), as the leader itself tells (its own clock for all the
// times); a leader that cannot be asked leaves a second to wait.
func (c *Cluster) leaseGraceLeft(ctx context.Context, expiredAt time.Time) time.Duration {
	ictx, cancel := context.WithTimeout(ctx, reqTimeout)
	defer cancel()
	st, err := c.js.Stream(ictx, "KV_"+BucketLease)
	if err != nil {
		return time.Second
	}
	info := st.CachedInfo()
	switch {
	case info.Cluster == nil || c.cfg.Replicas <= 1:
		return 0
	case info.Cluster.Leader == "":
		return time.Second
	case info.Cluster.LeaderSince == nil || info.TimeStamp.IsZero() || expiredAt.IsZero():
		return 0 // a server that does not say: no grace
	case expiredAt.Sub(*info.Cluster.LeaderSince) > c.electionExpiries():
		return 0 // long after the election: its holder had its renewals
	}
	if left := expiredAt.Add(c.leaderGrace()).Sub(info.TimeStamp); left > 0 {
		return left + 100*time.Millisecond
	}
	return 0
}

// leaseHeld asks the lease stream's leader (not a direct get, which any
// replica may serve) whether the room's lease is live: its last entry is
// a value, not a delete, a purge or an expiry marker.
func (c *Cluster) leaseHeld(ctx context.Context, rm string) (bool, error) {
	l, err := c.leaseEntry(ctx, rm)
	return l.live, err
}

// leaseState is a room's lease as the lease stream's leader has it.
type leaseState struct {
	rev     uint64
	node    string // the holder a live lease names
	live    bool
	expired bool      // its last entry is an expiry: its holder did not give it up
	at      time.Time // its last entry's time (the leader's clock)
}

// leaseEntry reads the room's lease from the lease stream's leader.
func (c *Cluster) leaseEntry(ctx context.Context, rm string) (leaseState, error) {
	m, err := leaderGet(ctx, c.nc, "KV_"+BucketLease, msgGetReq{LastBySubj: "$KV." + BucketLease + "." + token(rm)})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return leaseState{}, nil
	}
	if err != nil {
		return leaseState{}, fmt.Errorf("natsroom: reading the lease: %w", err)
	}
	l := leaseState{rev: m.Sequence, at: m.Time}
	switch {
	case m.Header.Get("Nats-Marker-Reason") != "":
		l.expired = true
	case m.Header.Get("KV-Operation") == "":
		l.live, l.node = true, string(m.Data)
	}
	return l, nil
}

// readInbox moves the room's inbox into its log, in order: each entry is
// accepted (or refused with an outcome) by the Manager, with the inbox
// cursor recorded in the same fenced append; taken entries are deleted.
func (c *Cluster) readInbox(ctx context.Context, h *held) {
	subj := inSubject(h.room)
	poll := time.NewTicker(time.Second)
	defer poll.Stop()
	for ctx.Err() == nil {
		cur := c.st.inboxCursor(h.room)
		// From the leader: the nearest replica may not have an entry
		// whose front end signalled it yet.
		m, err := c.st.getLeader(ctx, msgGetReq{Seq: cur + 1, NextBySubj: subj})
		if err == nil && !h.marked {
			// Before the entry leaves the inbox, the room is marked as
			// having work: a stop of the whole cluster must find it.
			if err = c.markWork(ctx, h.room); err == nil {
				h.marked = true
			}
		}
		if err == nil {
			if !c.take(ctx, h, m) {
				select {
				case <-ctx.Done():
					return
				case <-poll.C: // a store error: try again
				}
			}
			continue
		}
		if !errors.Is(err, jetstream.ErrMsgNotFound) && ctx.Err() == nil {
			c.log.Warn("natsroom: reading the inbox", "room", h.room, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-h.wake:
		case <-poll.C:
		}
	}
}

// take moves one inbox entry into the room's log: the write that accepts
// it, or refuses it with an outcome, carries the cursor past it; until one
// lands the entry stays next.
func (c *Cluster) take(ctx context.Context, h *held, m *jetstream.RawStreamMsg) bool {
	var e inboxEntry
	if len(m.Data) > maxInboxEntry || json.Unmarshal(m.Data, &e) != nil || e.ID == "" {
		// Not a front end's entry (each has an id, within the size):
		// nobody was answered for it.
		c.log.Error("natsroom: skipping an unreadable inbox entry", "room", h.room, "seq", m.Sequence)
		return c.recordCursor(ctx, h.room, m.Sequence)
	}
	wctx := withInbox(ctx, h.room, m.Sequence)
	msg := room.Message{Text: e.Text, Sender: e.Sender, Delivery: e.Delivery, TraceParent: e.TraceParent, TraceState: e.TraceState, Token: e.Token}
	_, err := c.m.Accept(wctx, h.room, e.ID, msg)
	if errors.Is(err, room.ErrQueueFull) || errors.Is(err, room.ErrBadMessage) || errors.Is(err, room.ErrBudgetExhausted) {
		// Answered 202 by a front end already: the sender gets an
		// outcome, not silence.
		c.log.Warn("natsroom: refusing an inbox entry", "room", h.room, "message_id", e.ID, "err", err)
		reason := "refused by the room's holder: " + strings.TrimPrefix(err.Error(), "room: ")
		_, err = c.m.Refuse(wctx, h.room, e.ID, msg, reason)
	}
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("natsroom: taking an inbox entry failed; retrying", "room", h.room, "seq", m.Sequence, "err", err)
		}
		return false
	}
	// A message accepted before (an entry read twice across a takeover)
	// wrote nothing: its cursor goes alone.
	if !c.recordCursor(ctx, h.room, m.Sequence) {
		return false
	}
	if st, err := c.st.roomsStream(ctx); err == nil {
		// One entry deleted, not the subject purged: see dropTaken.
		dctx, cancel := context.WithTimeout(ctx, reqTimeout)
		_ = st.DeleteMsg(dctx, m.Sequence)
		cancel()
	}
	return true
}

// maxDropTaken bounds how many left-over entries one dropTaken deletes
// (the rest go at the room's next give-up, which its sweep brings).
const maxDropTaken = 256

// dropTaken deletes the room's inbox entries at or before cursor (taken,
// but left by a delete that failed), one message at a time. Never a purge
// of the subject: nats-server (2.15.2, still in 2.15.3) deadlocks a
// stream's file store for good when a purge's tombstone cannot be written
// (its flush, on a write error, rebuilds the store under the lock the
// purge holds), and the node's server then never finishes its shutdown,
// so a node whose disk filled could not come back. A single delete writes
// its tombstone on a path that rebuilds without that lock.
func (c *Cluster) dropTaken(ctx context.Context, rm string, cursor uint64) {
	st, err := c.st.roomsStream(ctx)
	if err != nil {
		return
	}
	seq := uint64(1)
	for range maxDropTaken {
		m, err := c.st.getMsg(ctx, msgGetReq{Seq: seq, NextBySubj: inSubject(rm)})
		if err != nil || m.Sequence > cursor {
			return
		}
		dctx, cancel := context.WithTimeout(ctx, reqTimeout)
		err = st.DeleteMsg(dctx, m.Sequence)
		cancel()
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return
		}
		seq = m.Sequence + 1
	}
}

// recordCursor writes the inbox cursor seq when no write carried it (an
// entry accepted before, or unreadable).
func (c *Cluster) recordCursor(ctx context.Context, rm string, seq uint64) bool {
	l := c.st.log(rm)
	l.mu.Lock()
	defer l.mu.Unlock()
	if seq <= l.f.inbox {
		return true
	}
	err := c.st.appendLocked(ctx, rm, l, &batch{Epoch: l.epoch, Node: c.cfg.Node, Ops: []op{{K: opInboxCur, Inbox: seq}}})
	if err != nil && !l.owned {
		// Fenced, or not answered in time: as a Write's, the room is
		// given up (it stayed held, its log no longer written, and
		// every inbox entry after failed).
		c.fenced(rm, err)
	}
	return err == nil
}

// releaseIdle gives up the leases of held rooms with nothing to do (no
// turn, nothing queued, no agent resident), so that an idle room costs
// no renewals and frees its slot; its next message wakes it anywhere.
//
// A room found idle leaves the held set here (no round renews it again),
// and is given up off the renew loop: the give-up waits for the room's
// goroutine and its Drop, then writes to the streams (seconds on a busy
// host or during an election), and the next renew round must not wait for
// it: every other lease of the node lapsed meanwhile, and a healthy room
// moved mid-turn (seen in make chaos). Its lease is deleted last, so no
// host takes the room before it is given up.
func (c *Cluster) releaseIdle(hs []*held) {
	for _, h := range hs {
		if c.ctx.Err() != nil {
			return
		}
		l := c.st.log(h.room)
		// A room whose log is being written is not idle, and its write
		// may wait out the log's election: the renew loop that runs this
		// must not wait for it (every lease would lapse meanwhile).
		if !l.mu.TryLock() {
			continue
		}
		idle := l.owned && !l.f.resident && l.f.idle()
		l.mu.Unlock()
		if !idle || time.Since(h.since) < c.cfg.LeaseTTL {
			continue
		}
		c.mu.Lock()
		if c.held[h.room] != h {
			c.mu.Unlock()
			continue
		}
		delete(c.held, h.room)
		c.mu.Unlock()
		c.goRun(func() { c.giveUpIdle(h) })
	}
}

// giveUpIdle gives up the lease of h, an idle room taken out of the held
// set (see releaseIdle).
func (c *Cluster) giveUpIdle(h *held) {
	h.cancel()
	<-h.done
	c.st.disown(h.room)
	c.m.Drop(h.room, "idle: lease given up")

	h.mu.Lock()
	rev := h.rev
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Second)
	defer cancel()
	// Taken entries whose delete failed go now (the cursor is past
	// them), then the work mark: the room has nothing left to do.
	c.dropTaken(ctx, h.room, c.st.inboxCursor(h.room))
	if err := c.unmarkWork(ctx, h.room); err != nil {
		c.log.Debug("natsroom: taking an idle room's work mark away failed (its next sweep wakes it)", "room", h.room, "err", err)
	}
	_ = c.lease.Delete(ctx, token(h.room), jetstream.LastRevision(rev))
	// A message that came in while the lease was given up found the
	// room held and its wake-up was dropped: wake the room again.
	if c.needsWake(ctx, h.room) {
		c.wakeRoom(ctx, h.room)
	}
	c.log.Debug("natsroom: idle room's lease given up", "room", h.room)
}

// needsWake reports whether a room this host gave up has work left: a
// message not ended in its log (the inbox reader may have taken one
// before it stopped), or an entry in its inbox.
func (c *Cluster) needsWake(ctx context.Context, rm string) bool {
	l := c.st.log(rm)
	l.mu.Lock()
	cursor, open := l.f.inbox, l.f.nOpen > 0
	l.mu.Unlock()
	if open {
		return true
	}
	_, err := c.st.getMsg(ctx, msgGetReq{Seq: cursor + 1, NextBySubj: inSubject(rm)})
	// An error other than not-found cannot tell: a spare wake-up costs
	// one placement check.
	return !errors.Is(err, jetstream.ErrMsgNotFound)
}

// sweepLeases lists the held leases and wakes the rooms whose lease was
// in the previous listing and is gone now; it returns the new listing
// (the previous one again when the listing failed).
func (c *Cluster) sweepLeases(prev map[string]bool) map[string]bool {
	ctx, cancel := context.WithTimeout(c.ctx, reqTimeout)
	defer cancel()
	keys, err := c.lease.ListKeys(ctx)
	if err != nil {
		c.log.Debug("natsroom: listing the leases failed", "err", err)
		return prev
	}
	now := map[string]bool{}
	for k := range keys.Keys() {
		now[k] = true
	}
	if ctx.Err() != nil {
		return prev // a partial listing proves nothing
	}
	for k := range prev {
		if now[k] {
			continue
		}
		if rm, ok := untoken(k); ok {
			c.log.Debug("natsroom: lease gone (sweep); waking the room", "room", rm)
			c.wakeRoom(ctx, rm)
		}
	}
	c.sweepWork(ctx, now)
	return now
}

// sweepWork wakes the rooms that have work left and no live lease (held:
// the live leases' keys): those with a work mark, and those whose inbox
// holds entries. Only a whole cluster's stop leaves such rooms: a holder
// that dies leaves a lease whose expiry wakes its rooms.
func (c *Cluster) sweepWork(ctx context.Context, held map[string]bool) {
	wake := map[string]bool{}
	if keys, err := c.work.ListKeys(ctx); err == nil {
		for k := range keys.Keys() {
			wake[k] = true
		}
	} else if !errors.Is(err, jetstream.ErrNoKeysFound) {
		c.log.Debug("natsroom: listing the work marks failed", "err", err)
	}
	if st, err := c.st.roomsStream(ctx); err == nil {
		if info, err := st.Info(ctx, jetstream.WithSubjectFilter("rooms.*.in")); err == nil {
			for subj, n := range info.State.Subjects {
				if n > 0 && len(subj) > len("rooms.")+len(".in") {
					wake[subj[len("rooms."):len(subj)-len(".in")]] = true
				}
			}
		}
	}
	for k := range wake {
		if held[k] {
			continue
		}
		if rm, ok := untoken(k); ok {
			c.log.Debug("natsroom: room with work left and no lease; waking it", "room", rm)
			c.wakeRoom(ctx, rm)
		}
	}
}

// markWork puts the room's work mark (see Setup).
func (c *Cluster) markWork(ctx context.Context, rm string) error {
	ctx, cancel := context.WithTimeout(ctx, reqTimeout)
	defer cancel()
	_, err := c.work.Put(ctx, token(rm), []byte(c.cfg.Node))
	return err
}

// unmarkWork takes an idle room's work mark away. A delete, not a purge
// (a rollup purges the subject: see dropTaken); the delete marker stays,
// one per room, as the mark's history of one.
func (c *Cluster) unmarkWork(ctx context.Context, rm string) error {
	ctx, cancel := context.WithTimeout(ctx, reqTimeout)
	defer cancel()
	return c.work.Delete(ctx, token(rm))
}

// workMarkerTTL is the work bucket's marker TTL (no longer used by
// unmarkWork, kept: a bucket made with message TTLs cannot drop them).
const workMarkerTTL = time.Minute
