package rpc

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for Options.
const (
	DefaultBacklog             = 256
	DefaultBacklogBytes        = 64 << 20
	DefaultStallTimeout        = 2 * time.Second
	DefaultHostToolConcurrency = 32
	DefaultRetainedTurnBytes   = 64 << 20
	DefaultKeptErrors          = 64
	DefaultStderrTail          = 64 << 10

	// abandonedKept bounds how many timed-out request ids are remembered so
	// their late replies are dropped rather than reported as unmatched.
	abandonedKept = 1024
	// tombstonesPerCommand bounds the placeholders that make an id-less
	// late reply to a timed-out request be dropped instead of matched to a
	// newer request of the same command.
	tombstonesPerCommand = 64
	// rawCommandKey groups requests sent as raw lines: an id-less "parse"
	// error answers the oldest of them.
	rawCommandKey = "\x00raw"
)

// Options configure a Client. The zero value is usable; New fills defaults.
type Options struct {
	// MaxLineBytes caps one line from the agent (default 64 MiB). A longer
	// line is reported as a protocol error and skipped.
	MaxLineBytes int
	// Backlog bounds events queued between the reader and the listeners
	// (default 256; the batch being dispatched is not counted). When it is
	// full the reader waits for the listeners up to StallTimeout (default
	// 2 s); past that it is an overflow, which fails the current turn with
	// ErrBacklogOverflow and retires the transport. Responses queued behind
	// a full backlog wait as long.
	Backlog      int
	StallTimeout time.Duration
	// BacklogBytes bounds the frame bytes of the events not yet delivered
	// to listeners, the batch being dispatched included (default 64 MiB):
	// pi repeats the whole partial message in every message_update, so
	// Backlog events alone can be gigabytes. A full byte budget is handled
	// like a full Backlog. One event larger than the budget still passes
	// when nothing else is queued.
	BacklogBytes int
	// Backpressure makes the reader wait for room in a full backlog for as
	// long as the listeners take, instead of failing the turn after
	// StallTimeout: the reader stops reading, and the agent's writes block
	// on its stdout pipe. For hosts whose listeners are slow but sure (a
	// CLI writing to a pipe); the caller's contexts still bound each turn
	// and call, and responses wait behind the backlog as events do. Once
	// the client is closed or retired, listeners that make no progress for
	// StallTimeout have the waiting event dropped (counted in Errors), so
	// Wait never waits on the reader for ever (Close does not wait for
	// listeners at all).
	Backpressure bool
	// DisableV2 keeps omp on protocol v1 even when it offers v2.
	DisableV2 bool
	// NoHandshake skips the get_state probe in Start. Start then returns at
	// once and a broken first frame is only reported as a protocol error.
	NoHandshake bool
	// UI answers extension UI dialogs. Nil cancels every dialog so no turn
	// waits on a question nobody will answer.
	UI UIHandler
	// HostToolConcurrency bounds host tool calls running at once (default
	// 32); calls beyond it are refused with an error result, written by a
	// separate goroutine so an agent that is not reading cannot stall the
	// reader.
	HostToolConcurrency int
	// RetainedTurnBytes bounds the event bytes a Turn keeps (default 64 MiB);
	// events past it are counted in Turn.DroppedEvents, not kept. Negative
	// keeps none (every event and message is counted as dropped), for a
	// caller that reads only a turn's outcome (Text, StopReason, Usage):
	// a flood then costs no copies.
	RetainedTurnBytes int
	// KeptErrors bounds the protocol errors kept for Errors (default 64).
	KeptErrors int
	// Logger receives diagnostics; never frame payloads. Default: discard.
	Logger *slog.Logger
	// Adopt, when set, makes the client one of an agent that is already
	// running (another client, perhaps in another process, drove it
	// before), reading its stdout from a position on: see Adopt.
	Adopt *Adopt
	// OnEvent, when set, is a listener for every frame, registered before
	// the reader starts (as On("", OnEvent) would be), so it also sees the
	// start handshake: omp's ready, the first responses. Spawn starts the
	// client before returning; a listener added with On after it misses them.
	OnEvent func(Event)
}

// Adopt describes an agent a client takes over mid-stream: its stdout is
// kept elsewhere (a file) and read from Offset, which must be a frame
// boundary (an Event's End).
type Adopt struct {
	// Offset is the stdout position of the first byte the client reads;
	// Event.End counts from it.
	Offset int64
	// V2: the agent speaks protocol v2 (negotiated by the client before);
	// its ready frame is not read again.
	V2 bool
	// RunOpen: a run may be in progress (its agent_start lies before
	// Offset), or about to begin (the acknowledgement of its prompt or
	// abort_and_prompt lies after Offset). The client then tracks one as an
	// Unsolicited turn from the start, which WaitTurn returns at the run's
	// agent_end, as for a run the agent started on its own. The first
	// get_state answer the client reads (Start's handshake, or with
	// NoHandshake the first GetState anyone sends) decides it in stream
	// order: an agent that is not streaming and has no acknowledged prompt
	// pending ends the turn there (AgentInvoked false), and a run that
	// starts after that answer is a turn of its own. With NoHandshake and
	// no get_state, the turn waits for an agent_end.
	RunOpen bool
	// Ready: the agent announced itself with ready when it started (omp):
	// it acknowledges a prompt before it prepares the run, so get_state
	// saying idle after the acknowledgement does not mean no run comes.
	Ready bool
}

func (a *Adopt) offset() int64 {
	if a == nil {
		return 0
	}
	return a.Offset
}

func (o *Options) fill() {
	if o.MaxLineBytes <= 0 {
		o.MaxLineBytes = DefaultMaxLineBytes
	}
	if o.Backlog <= 0 {
		o.Backlog = DefaultBacklog
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = DefaultStallTimeout
	}
	if o.BacklogBytes <= 0 {
		o.BacklogBytes = DefaultBacklogBytes
	}
	if o.HostToolConcurrency <= 0 {
		o.HostToolConcurrency = DefaultHostToolConcurrency
	}
	if o.RetainedTurnBytes == 0 {
		o.RetainedTurnBytes = DefaultRetainedTurnBytes
	}
	if o.KeptErrors <= 0 {
		o.KeptErrors = DefaultKeptErrors
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Response is the agent's answer to a command.
type Response struct {
	ID      string          `json:"id,omitempty"`
	Command string          `json:"command,omitempty"`
	Success bool            `json:"success"`
	Data    json.RawMessage `json:"data,omitempty"`
	Error   string          `json:"error,omitempty"`
	Code    string          `json:"code,omitempty"`

	// perr: not a response but a frame naming this request that could not
	// be used (see DuplicateKeyError); the waiter fails with it.
	perr error
}

func (r *Response) err(late bool) error {
	if r.Success {
		return nil
	}
	return &ResponseError{Command: r.Command, Message: r.Error, Code: r.Code, Late: late}
}

type pendingCall struct {
	id      string
	command string // wire command, or rawCommandKey
	ch      chan *Response
	dead    bool // timed out: a tombstone in byCommand
}

// Client talks to one agent over its stdin/stdout. Create it with New (any
// reader/writer pair) or Spawn (a process it owns), then Start it. All
// methods are safe for concurrent use.
type Client struct {
	opts  Options
	log   *slog.Logger
	r     io.Reader
	w     io.WriteCloser
	owned Process // nil when attached to a plain reader/writer
	stder *tailBuffer
	// resizePipe raises r's pipe while the agent floods (nil when r is
	// not a pipe or the platform cannot): see pipeResizer.
	resizePipe func(flooding bool)
	// runEnded: the reader just handled an agent_end, so a flood is over
	// (see framer.settle). The reader's own.
	runEnded bool

	// wlock serialises whole frames on w. A channel, not a mutex, so a
	// call waiting behind a write stuck on a full pipe can give up when its
	// context ends.
	wlock chan struct{}
	// replies carries frames the reader wants sent (refusals it decides
	// on): the reader never writes, so the agent can never stall it by
	// not reading its stdin. Drained by replyLoop.
	replies chan map[string]any

	tools hostTools

	nextID atomic.Uint64

	mu          sync.Mutex
	started     bool
	closed      bool
	exitErr     error // set once the transport ended
	pending     map[string]*pendingCall
	byCommand   map[string][]*pendingCall
	abandoned   map[string]struct{}
	abandonedQ  []string
	errs        []error
	turn        *turnState
	track       turnTrack
	uiCancel    map[string]context.CancelFunc
	toolCancel  map[string]context.CancelFunc
	v2          bool
	ready       *ReadyEvent
	readyCh     chan struct{} // closed when a ready frame arrived
	negotiated  chan struct{} // closed when v2 negotiation ended (either way)
	negotiate   bool
	negotiateID string // the negotiate_protocol request awaiting its answer

	lmu       sync.RWMutex
	listeners map[string][]*listener
	all       []*listener
	errLs     []*errListener

	// The backlog: the reader appends, the dispatcher takes everything
	// queued at once, so a flood costs one wake-up per batch, not per event.
	qmu    sync.Mutex
	queue  []dispatchItem // at most Backlog items waiting
	spare  []dispatchItem // the dispatcher's drained batch, reused
	qlen   atomic.Int32   // len(queue), read by the reader without the lock
	qbytes atomic.Int64   // frame bytes queued or in the batch; added to under qmu
	// holding counts enqueues waiting for room with an item (under qmu);
	// parked are Sync barriers that wait behind those items, queued when
	// the last of them is (so a barrier never passes an event already read).
	holding  int
	parked   []dispatchItem
	roomWait atomic.Int32  // enqueues waiting for room: the dispatcher signals space per event
	wake     chan struct{} // reader -> dispatcher: items queued
	space    chan struct{} // dispatcher -> reader: the queue was taken
	toolSem  chan struct{}
	done     chan struct{} // closed when the transport has ended
	quit     chan struct{} // closed once Close ran and the reader ended
	readDone chan struct{} // closed when the reader ended (or never runs)
	// readerParked is closed when the reader, the client closed, waits
	// for listeners to make room in a full backlog (Backpressure): it
	// reads nothing meanwhile, and Close does not wait for it.
	readerParked chan struct{}
	parkOnce     sync.Once
	joined       chan struct{}  // closed when Close ran and every goroutine ended (Wait)
	stderrWG     sync.WaitGroup // the stderr drain, also counted in wg
	wg           sync.WaitGroup // every goroutine but the reader

	// readEnd is the stream position past the frame being handled,
	// readStart where it began (its first chunk's line); lineStart and
	// chunkStart help find it. The reader's alone.
	readEnd, readStart, lineStart, chunkStart int64
	// settling is a turn the frame being handled ended, settled once that
	// frame is queued for the listeners (reader goroutine only).
	settling *turnState
	// adopted is the turn an adopted client assumed open (Adopt.RunOpen);
	// adoptDecide: no get_state answer has decided it yet (under mu).
	adopted     *turnState
	adoptDecide bool
	// idPrefix starts every request id: "ah-", or one of its own for an
	// adopted agent, whose stdout may still hold replies to the ids of the
	// client before.
	idPrefix string

	firstFrame chan error // Start's handshake: result of the first frame
	firstOnce  sync.Once
	closeErr   error
	reasm      *reassembler

	closeStarted bool          // under mu
	closeDone    chan struct{} // closed when Close has done its part
}

type dispatchItem struct {
	ev       Event
	err      error
	validate bool // not yet validated by the reader (see fastType)
	// barrier, if set, is closed by the dispatcher when it reaches the
	// item: everything queued before it has been delivered (Sync).
	barrier chan struct{}
}

type listener struct {
	fn func(Event)
}

type errListener struct {
	fn func(error)
}

// New returns a client over r (the agent's stdout) and w (its stdin). The
// client owns both from Start on: Close closes w. Options are copied.
func New(r io.Reader, w io.WriteCloser, opts Options) *Client {
	opts.fill()
	if opts.Adopt != nil {
		a := *opts.Adopt
		opts.Adopt = &a
	}
	c := &Client{
		opts:         opts,
		log:          opts.Logger,
		r:            r,
		w:            w,
		resizePipe:   pipeResizer(r),
		pending:      map[string]*pendingCall{},
		byCommand:    map[string][]*pendingCall{},
		abandoned:    map[string]struct{}{},
		uiCancel:     map[string]context.CancelFunc{},
		toolCancel:   map[string]context.CancelFunc{},
		listeners:    map[string][]*listener{},
		wake:         make(chan struct{}, 1),
		space:        make(chan struct{}, 1),
		toolSem:      make(chan struct{}, opts.HostToolConcurrency),
		done:         make(chan struct{}),
		quit:         make(chan struct{}),
		readDone:     make(chan struct{}),
		readerParked: make(chan struct{}),
		joined:       make(chan struct{}),
		readyCh:      make(chan struct{}),
		negotiated:   make(chan struct{}),
		firstFrame:   make(chan error, 1),
		reasm:        newReassembler(),

		wlock:     make(chan struct{}, 1),
		replies:   make(chan map[string]any, replyBacklog),
		closeDone: make(chan struct{}),
		all:       onEvent(opts.OnEvent),
		idPrefix:  "ah-",
	}
	if a := opts.Adopt; a != nil {
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.idPrefix = "ah" + hex.EncodeToString(b[:]) + "-"
		c.v2 = a.V2
		c.readEnd = a.Offset // the first frame starts there
		if a.RunOpen {
			t := newTurn()
			t.result.Unsolicited = true
			t.started = true
			c.turn = t
			c.track.runOpen = true
			c.adopted, c.adoptDecide = t, true
		}
	}
	return c
}

func onEvent(fn func(Event)) []*listener {
	if fn == nil {
		return nil
	}
	return []*listener{{fn: fn}}
}

// Start begins reading. Unless Options.NoHandshake is set it sends get_state
// and waits (bounded by ctx) for the answer, so a broken agent fails here with
// a clear error; if omp offered protocol v2 meanwhile, Start also waits for
// the negotiation. ctx bounds start-up only. Start may be called once; on
// failure the caller should Close.
func (c *Client) Start(ctx context.Context) error {
	c.mu.Lock()
	if c.started {
		c.mu.Unlock()
		return errors.New("rpc: client already started")
	}
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.started = true
	c.mu.Unlock()

	go c.readLoop()
	c.wg.Add(2)
	go c.dispatchLoop()
	go c.replyLoop()

	if c.opts.NoHandshake {
		return nil
	}
	hs := make(chan error, 1)
	go func() { // bounded by ctx and by the transport ending
		// An adopted client's assumed run is decided by the reader when it
		// reads this answer (see decideAdoptedLocked), in stream order.
		_, err := c.GetState(ctx)
		hs <- err
	}()
	var hsErr error
	firstSeen := false
	select {
	case err := <-c.firstFrame:
		if err != nil {
			return err
		}
		firstSeen = true
		hsErr = <-hs
	case hsErr = <-hs:
	case <-ctx.Done():
		return fmt.Errorf("rpc: start: %w", ctx.Err())
	}
	if hsErr != nil && !firstSeen {
		// What the agent wrote (a broken first frame, its exit) explains
		// more than a failed write or a bare timeout: wait for the reader's
		// verdict on the first frame while the transport runs down.
		select {
		case ferr := <-c.firstFrame:
			if ferr != nil {
				return ferr
			}
		case <-c.done:
			select {
			case ferr := <-c.firstFrame:
				if ferr != nil {
					return ferr
				}
			default:
			}
		case <-ctx.Done():
		}
	}
	if hsErr != nil {
		return fmt.Errorf("rpc: start: %w", hsErr)
	}
	// omp announces ready before answering; if it offered v2, wait for the
	// negotiation so later large frames arrive chunked, not elided.
	c.mu.Lock()
	neg := c.negotiate
	c.mu.Unlock()
	if neg {
		select {
		case <-c.negotiated:
		case <-ctx.Done():
			return fmt.Errorf("rpc: start: negotiating protocol v2: %w", ctx.Err())
		case <-c.done:
			return c.transportErr()
		}
	}
	return nil
}

// ProtocolVersion is 2 once omp accepted v2, else 1.
func (c *Client) ProtocolVersion() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.v2 {
		return 2
	}
	return 1
}

// Ready returns omp's ready frame, or nil (pi sends none).
func (c *Client) Ready() *ReadyEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ready
}

// Done is closed when the transport has ended (the agent exited, closed its
// stdout, or the client was closed or retired).
func (c *Client) Done() <-chan struct{} { return c.done }

// Err returns why the transport ended, or nil while it runs.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exitErr
}

// Errors returns the most recent protocol errors (bounded by
// Options.KeptErrors), oldest first.
func (c *Client) Errors() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.errs...)
}

// Stderr returns the bounded tail of the agent's stderr ("" when attached).
func (c *Client) Stderr() string {
	if c.stder == nil {
		return ""
	}
	return c.stder.String()
}

// On registers fn for events of type typ ("" for every event). Listeners run
// one at a time on the client's dispatcher, in frame order; a panic is
// recovered and reported as an error. The returned func unsubscribes.
func (c *Client) On(typ string, fn func(Event)) (unsubscribe func()) {
	l := &listener{fn: fn}
	c.lmu.Lock()
	if typ == "" {
		c.all = append(append([]*listener(nil), c.all...), l)
	} else {
		c.listeners[typ] = append(append([]*listener(nil), c.listeners[typ]...), l)
	}
	c.lmu.Unlock()
	return func() {
		c.lmu.Lock()
		defer c.lmu.Unlock()
		if typ == "" {
			c.all = without(c.all, l)
		} else if rest := without(c.listeners[typ], l); len(rest) > 0 {
			c.listeners[typ] = rest
		} else {
			delete(c.listeners, typ)
		}
	}
}

// OnError registers fn for protocol errors and listener panics, delivered on
// the dispatcher. The returned func unsubscribes.
func (c *Client) OnError(fn func(error)) (unsubscribe func()) {
	l := &errListener{fn: fn}
	c.lmu.Lock()
	c.errLs = append(append([]*errListener(nil), c.errLs...), l)
	c.lmu.Unlock()
	return func() {
		c.lmu.Lock()
		defer c.lmu.Unlock()
		c.errLs = without(c.errLs, l)
	}
}

func without[T comparable](s []T, x T) []T {
	out := make([]T, 0, len(s))
	for _, v := range s {
		if v != x {
			out = append(out, v)
		}
	}
	return out
}

func (c *Client) hasListeners() bool {
	c.lmu.RLock()
	defer c.lmu.RUnlock()
	return len(c.all) > 0 || len(c.listeners) > 0 || len(c.errLs) > 0
}

// Call sends cmd and waits for its response; on success the response's
// "data" is decoded into out (when out is non-nil and data is present). A
// response with success:false returns a *ResponseError.
func (c *Client) Call(ctx context.Context, cmd Command, out any) error {
	resp, err := c.Request(ctx, cmd.CommandType(), cmd)
	if err != nil {
		return err
	}
	if out != nil && len(resp.Data) > 0 && !bytes.Equal(resp.Data, []byte("null")) {
		if err := json.Unmarshal(resp.Data, out); err != nil {
			return fmt.Errorf("rpc: %s: decoding response data: %w", cmd.CommandType(), err)
		}
	}
	return nil
}

// Request sends a command of any type: params (nil, or anything that
// marshals to a JSON object) gets "id" and "type" added. It returns the
// response, or a *ResponseError for success:false.
func (c *Client) Request(ctx context.Context, typ string, params any) (*Response, error) {
	id := c.newID()
	line, err := encodeCommand(id, typ, params)
	if err != nil {
		return nil, err
	}
	return c.roundTrip(ctx, id, typ, line)
}

// RequestLine writes line verbatim (one frame; it must not contain LF) and
// waits for the response the agent gives to it. Meant for frames the typed
// API cannot express, including malformed ones: an id-less "parse" error
// answers the oldest pending raw line.
func (c *Client) RequestLine(ctx context.Context, line []byte) (*Response, error) {
	if bytes.IndexByte(line, '\n') >= 0 {
		return nil, errors.New("rpc: a raw frame must not contain a newline")
	}
	cmd, id := rawCommandKey, ""
	if h, err := scanFrame(line); err == nil && h.hasID && len(h.id) > 0 {
		cmd, id = headString(h.typ, h.typEsc), headString(h.id, h.idEsc)
	}
	if id == "" {
		id = c.newID() // internal key only; never sent
	}
	return c.roundTrip(ctx, id, cmd, line)
}

func (c *Client) newID() string {
	return c.idPrefix + strconv.FormatUint(c.nextID.Add(1), 10)
}

func encodeCommand(id, typ string, params any) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"id":`)
	writeJSONString(&b, id)
	b.WriteString(`,"type":`)
	writeJSONString(&b, typ)
	if params != nil {
		p, err := json.Marshal(params)
		if err != nil {
			return nil, fmt.Errorf("rpc: encoding %s: %w", typ, err)
		}
		p = bytes.TrimSpace(p)
		if len(p) < 2 || p[0] != '{' {
			return nil, fmt.Errorf("rpc: encoding %s: parameters must be a JSON object", typ)
		}
		if inner := bytes.TrimSpace(p[1 : len(p)-1]); len(inner) > 0 {
			b.WriteByte(',')
			b.Write(inner)
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func writeJSONString(b *bytes.Buffer, s string) {
	q, _ := json.Marshal(s)
	b.Write(q)
}

func (c *Client) roundTrip(ctx context.Context, id, command string, line []byte) (*Response, error) {
	p := &pendingCall{id: id, command: command, ch: make(chan *Response, 1)}
	c.mu.Lock()
	if err := c.usableLocked(); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	if _, dup := c.pending[id]; dup {
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: %q", ErrDuplicateID, id)
	}
	c.pending[id] = p
	c.byCommand[command] = append(c.byCommand[command], p)
	c.mu.Unlock()

	if err := c.writeFrame(ctx, line); err != nil {
		c.abandon(p, false)
		return nil, err
	}
	deliver := func(r *Response) (*Response, error) {
		if r.perr != nil {
			return nil, r.perr
		}
		return r, r.err(false)
	}
	select {
	case r := <-p.ch:
		return deliver(r)
	case <-ctx.Done():
		// A response read before the context ended is the answer: the
		// agent acted on the command (select picks either when both are
		// ready, and a caller must not take an acknowledged prompt for
		// one that never reached the agent).
		select {
		case r := <-p.ch:
			return deliver(r)
		default:
		}
		c.abandon(p, true)
		return nil, fmt.Errorf("rpc: %s: %w", displayCommand(command), ctx.Err())
	case <-c.done:
		// A response that raced the end is still delivered.
		select {
		case r := <-p.ch:
			return deliver(r)
		default:
		}
		c.abandon(p, false)
		return nil, c.transportErr()
	}
}

func displayCommand(cmd string) string {
	if cmd == rawCommandKey {
		return "raw frame"
	}
	return cmd
}

func (c *Client) usableLocked() error {
	if !c.started {
		return ErrNotStarted
	}
	if c.exitErr != nil {
		return c.exitErr
	}
	if c.closed {
		return ErrClosed
	}
	return nil
}

// abandon forgets a request. With tombstone set (it was sent and may still
// be answered), its late reply is dropped instead of reaching anyone else.
func (c *Client) abandon(p *pendingCall, tombstone bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.pending[p.id]; !ok {
		return // answered meanwhile
	}
	delete(c.pending, p.id)
	if !tombstone {
		c.removeFromCommandLocked(p)
		return
	}
	p.dead = true
	c.abandoned[p.id] = struct{}{}
	c.abandonedQ = append(c.abandonedQ, p.id)
	if len(c.abandonedQ) > abandonedKept {
		delete(c.abandoned, c.abandonedQ[0])
		c.abandonedQ = c.abandonedQ[1:]
	}
	q := c.byCommand[p.command]
	if dead := countDead(q); dead > tombstonesPerCommand {
		for i, x := range q {
			if x.dead {
				c.byCommand[p.command] = append(q[:i:i], q[i+1:]...)
				break
			}
		}
	}
}

func countDead(q []*pendingCall) int {
	n := 0
	for _, p := range q {
		if p.dead {
			n++
		}
	}
	return n
}

func (c *Client) removeFromCommandLocked(p *pendingCall) {
	q := c.byCommand[p.command]
	for i, x := range q {
		if x == p {
			q = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(c.byCommand, p.command)
	} else {
		c.byCommand[p.command] = q
	}
}

// writeFrame writes one frame and its LF in a single Write under the write
// lock. A deadline on ctx is applied when the writer supports it.
func (c *Client) writeFrame(ctx context.Context, line []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	buf := make([]byte, 0, len(line)+1)
	buf = append(append(buf, line...), '\n')
	select {
	case c.wlock <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("rpc: waiting to write to agent: %w", ctx.Err())
	case <-c.done:
		return c.transportErr()
	}
	defer func() { <-c.wlock }()
	select {
	case <-c.done:
		return c.transportErr()
	default:
	}
	ctxDeadline := false // the writer's deadline is ctx's
	if dl, ok := ctx.Deadline(); ok {
		if d, ok := c.w.(interface{ SetWriteDeadline(time.Time) error }); ok {
			if d.SetWriteDeadline(dl) == nil {
				ctxDeadline = true
				defer d.SetWriteDeadline(time.Time{})
			}
		}
	}
	if n, err := c.w.Write(buf); err != nil {
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return ErrClosed
		}
		if n > 0 {
			// Half a frame is in the agent's stdin: nothing written after
			// it can be trusted to parse. Retire the transport.
			perr := &ProtocolError{Op: "write", Err: fmt.Errorf("only %d of %d bytes of a frame written (%v); transport retired", n, len(buf), err)}
			c.keepError(perr)
			c.retire(perr)
			_ = c.w.Close()
			return perr
		}
		if c.owned != nil {
			// The stdin pipe closes when the agent exits: say so.
			select {
			case <-c.owned.Exited():
				return fmt.Errorf("rpc: writing to agent: %w", &ExitError{Status: c.owned.ExitErr(), Stderr: c.Stderr()})
			default:
			}
		}
		if ctxDeadline && errors.Is(err, os.ErrDeadlineExceeded) {
			// The write deadline is the context's: report it as such.
			return fmt.Errorf("rpc: writing to agent: %w", context.DeadlineExceeded)
		}
		return fmt.Errorf("rpc: writing to agent: %w", err)
	}
	return nil
}

// send writes a frame that expects no response (host tool results, UI
// answers), bounded by the client's lifetime.
func (c *Client) send(v any) error {
	line, err := json.Marshal(v)
	if err != nil {
		return err
	}
	// No deadline: Close closes the writer, which unblocks a stuck write.
	return c.writeFrame(context.Background(), line)
}

func (c *Client) transportErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.exitErr != nil {
		return c.exitErr
	}
	return ErrClosed
}

// reportError keeps a protocol error, logs it (without payload) and hands
// it to error listeners.
func (c *Client) reportError(err error) {
	c.keepError(err)
	var pe *ProtocolError
	if errors.As(err, &pe) {
		c.log.Warn("rpc: protocol error", "op", pe.Op, "err", pe.Err)
	} else {
		c.log.Warn("rpc: error", "err", err)
	}
	c.lmu.RLock()
	n := len(c.errLs)
	c.lmu.RUnlock()
	if n > 0 {
		c.enqueue(dispatchItem{err: err})
	}
}

// frameRef returns line limited to its length, so no append can reach the
// bytes after it. The reader's framer is stable, so lines need no copy.
func frameRef(line []byte) []byte {
	return line[:len(line):len(line)]
}

// keepError adds err to the bounded list Errors returns.
func (c *Client) keepError(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = append(c.errs, err)
	if len(c.errs) > c.opts.KeptErrors {
		c.errs = append(c.errs[:0:0], c.errs[len(c.errs)-c.opts.KeptErrors:]...)
	}
}

// quoteFrame trims a frame for an error message.
func quoteFrame(b []byte) string {
	const n = 120
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// lifetimeCtx is a context cancelled when the transport ends, for work the
// client starts on its own (protocol negotiation).
func (c *Client) lifetimeCtx() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		select {
		case <-c.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
