package procd

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/agenthost/agenthost/custody"
)

// Defaults for ClientOptions.
const (
	// DefaultStartTimeout bounds starting a daemon and its first answer.
	DefaultStartTimeout = 15 * time.Second
	// DefaultPingTimeout bounds one ping (finding a daemon, one claim
	// attempt).
	DefaultPingTimeout = 5 * time.Second
)

// Claim retries: a daemon that does not answer while it holds its data
// dir and the ticket is valid is slow, not gone (stopped, swapping):
// claimed again, claimRetryMin apart, doubling up to claimRetryMax.
const (
	claimRetryMin = 50 * time.Millisecond
	claimRetryMax = time.Second
)

// ClientOptions configure how a client finds or starts the daemon. The
// zero value is usable.
type ClientOptions struct {
	// DaemonCommand runs a daemon when "--data DIR --detach" is appended:
	// it must start the daemon in the background and exit once it answers
	// (agenthost procd does). Nil means this executable with "procd".
	DaemonCommand []string
	// DaemonEnv is the daemon command's environment; nil means this
	// process's (without custody's scope marker).
	DaemonEnv []string
	// StartTimeout bounds starting a daemon (default DefaultStartTimeout).
	StartTimeout time.Duration
	// PingTimeout bounds one ping (default DefaultPingTimeout). A daemon
	// that does not answer a claim in time is asked again while its
	// handoff ticket is valid.
	PingTimeout time.Duration

	// protocols makes the client another build's (tests of version
	// skew); zero: Versions().
	protocols Range
}

func (o *ClientOptions) versions() Range {
	if o.protocols != (Range{}) {
		return o.protocols
	}
	return Versions()
}

func (o *ClientOptions) pingTimeout() time.Duration {
	if o.PingTimeout > 0 {
		return o.PingTimeout
	}
	return DefaultPingTimeout
}

// Client talks to the daemon of one data dir. Every request opens its own
// connection, so a Client is safe for concurrent use. An owner client (Own)
// also holds the owner connection; Close releases it, which ends the daemon
// and everything in it unless a handoff was prepared first. When the
// owner connection is lost (Done), Reown owns the data dir's daemon again
// (a fresh one when the old one is gone); requests made meanwhile wait
// for it within their context.
type Client struct {
	dataDir string
	opts    ClientOptions

	mu  sync.Mutex
	svc service // the daemon in use
	// own is the owner connection (nil for a plain client); renewed is
	// closed by the next Reown or Close (requests that found the daemon
	// gone wait for it).
	own         *ownerConn
	renewed     chan struct{}
	closed      bool
	claimed     bool
	handoffErr  error
	oldReceipts []custody.Receipt

	wg sync.WaitGroup // the owner connections' readers
}

// ownerConn is one owner connection and its reader's state.
type ownerConn struct {
	conn    net.Conn
	reqMu   sync.Mutex    // one owner request at a time
	replies chan ownFrame // the reply to the owner request in flight
	done    chan struct{} // closed when the connection is lost
}

type ownFrame struct {
	r Reply
}

// Dial connects to the daemon already running for dataDir; ErrNoDaemon
// when none answers.
func Dial(ctx context.Context, dataDir string) (*Client, error) {
	c := &Client{dataDir: dataDir}
	svc, err := c.find(ctx)
	if err != nil {
		return nil, err
	}
	c.svc = svc
	return c, nil
}

// Connect connects to the daemon of dataDir, starting one when none
// answers. The client is not the owner.
func Connect(ctx context.Context, dataDir string, opts *ClientOptions) (*Client, error) {
	c := &Client{dataDir: dataDir}
	if opts != nil {
		c.opts = *opts
	}
	svc, err := c.findOrStart(ctx)
	if err != nil {
		return nil, err
	}
	c.svc = svc
	return c, nil
}

// Own makes this client the daemon's owner: it claims the daemon with the
// handoff ticket in the data dir when there is one (Claimed reports true,
// and every process the old owner left runs on); otherwise, or when the
// claim fails (HandoffErr says why), it ends the old daemon (receipts in
// its log) and owns a fresh one. A daemon that holds the data dir but is
// slow to answer the claim is asked again while the ticket is valid; only
// a refusal (ErrHandoff), another instance, or the daemon gone fails the
// claim. It fails with ErrOwned when another owner is connected, and with a
// *VersionError, leaving the daemon and its ticket alone, when the daemon
// speaks no protocol version of this client's. Done is closed if the owner
// connection is lost.
func Own(ctx context.Context, dataDir string, opts *ClientOptions) (*Client, error) {
	c := &Client{dataDir: dataDir, renewed: make(chan struct{})}
	if opts != nil {
		c.opts = *opts
	}
	r, err := c.ownFlow(ctx)
	if err != nil {
		return nil, err
	}
	if err := c.install(r); err != nil {
		return nil, err
	}
	return c, nil
}

// Reown owns the data dir's daemon again after the owner connection was
// lost (Done is closed; the daemon died, or another owner claimed it):
// as Own, claiming a handed-over daemon or starting a fresh one. The
// client keeps its identity; InstanceID, PID, Claimed, HandoffErr and
// OldReceipts then describe the new daemon, Done is a new channel, and
// requests that waited for the daemon go on. Handles to processes of the
// daemon before name nothing in a fresh one (ErrNotFound).
func (c *Client) Reown(ctx context.Context) error {
	c.mu.Lock()
	switch {
	case c.own == nil:
		c.mu.Unlock()
		return fmt.Errorf("%w: Reown needs an owner client", ErrForbidden)
	case c.closed:
		c.mu.Unlock()
		return ErrClosed
	case !isClosed(c.own.done):
		c.mu.Unlock()
		return fmt.Errorf("%w: the owner connection is still up", ErrOwned)
	}
	c.mu.Unlock()
	r, err := c.ownFlow(ctx)
	if err != nil {
		return err
	}
	return c.install(r)
}

// ownResult is what ownFlow found: the daemon owned and how.
type ownResult struct {
	svc         service
	own         *ownerConn
	claimed     bool
	handoffErr  error
	oldReceipts []custody.Receipt
}

// install makes r the client's daemon and starts its owner reader; a
// Reown's waiters go on. ErrClosed when the client was closed meanwhile
// (the new owner connection is closed: without a handoff that daemon
// ends).
func (c *Client) install(r ownResult) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		r.own.conn.Close()
		return ErrClosed
	}
	c.svc, c.own = r.svc, r.own
	c.claimed, c.handoffErr, c.oldReceipts = r.claimed, r.handoffErr, r.oldReceipts
	old := c.renewed
	c.renewed = make(chan struct{})
	c.wg.Add(1)
	go c.readOwner(r.own)
	c.mu.Unlock()
	close(old)
	return nil
}

// ownFlow claims the handed-over daemon or owns a fresh one (see Own).
func (c *Client) ownFlow(ctx context.Context) (ownResult, error) {
	var r ownResult
	dataDir := c.dataDir
	if t, err := readTicket(dataDir); err == nil {
		svc, oc, err := c.claimWithin(ctx, t)
		var verr *VersionError
		if errors.As(err, &verr) {
			// Not ours to end either: the build the daemon came with can
			// still claim it with the ticket, kept for it.
			return r, err
		}
		_ = os.Remove(filepath.Join(procdDir(dataDir), ticketFile))
		if err == nil {
			return ownResult{svc: svc, own: oc, claimed: true}, nil
		}
		if errors.Is(err, ErrOwned) || ctx.Err() != nil {
			return r, err // a live owner's daemon is not ours to end
		}
		r.handoffErr = err
		// A failed handoff ends the old daemon so no process is left that
		// nobody owns; the restart goes on with a fresh one.
		if old, derr := Dial(ctx, dataDir); derr == nil {
			rs, serr := old.Shutdown(ctx)
			r.oldReceipts = rs
			if serr != nil && !errors.Is(serr, ErrShuttingDown) {
				return r, fmt.Errorf("procd: ending the daemon after a failed handoff (%v): %w", err, serr)
			}
			if werr := waitGone(ctx, dataDir); werr != nil {
				return r, werr
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		r.handoffErr = err
	}
	svc, err := c.findOrStart(ctx)
	if err != nil {
		return r, err
	}
	oc, err := c.ownConn(ctx, svc, "")
	if errors.Is(err, ErrHandoff) {
		// The daemon waits for a handoff whose ticket file is gone: end it
		// and start fresh.
		r.handoffErr = err
		rs, serr := c.doWith(ctx, svc, map[string]any{"op": "shutdown"}, TypeShutdown)
		r.oldReceipts = rs.Receipts
		if serr != nil && !errors.Is(serr, ErrShuttingDown) {
			return r, serr
		}
		if err := waitGone(ctx, dataDir); err != nil {
			return r, err
		}
		if svc, err = c.findOrStart(ctx); err != nil {
			return r, err
		}
		oc, err = c.ownConn(ctx, svc, "")
	}
	if err != nil {
		return r, err
	}
	r.svc, r.own = svc, oc
	return r, nil
}

// claimWithin claims the daemon named by the ticket, asking again while
// it holds the data dir without answering and the ticket is valid.
func (c *Client) claimWithin(ctx context.Context, t Ticket) (service, *ownerConn, error) {
	wait := claimRetryMin
	for {
		svc, oc, err := c.claim(ctx, t)
		if err == nil || errors.Is(err, ErrOwned) || errors.Is(err, ErrHandoff) || errors.Is(err, ErrProtocol) || ctx.Err() != nil {
			return svc, oc, err
		}
		// Not answered: slow, or gone. Gone is a free lock.
		if free, lerr := lockFree(c.dataDir); lerr != nil || free {
			return svc, oc, err
		}
		if time.Now().Add(wait).After(t.ExpiresAt) {
			return svc, oc, fmt.Errorf("%w (no answer while the ticket was valid)", err)
		}
		tm := time.NewTimer(wait)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return svc, oc, ctx.Err()
		}
		wait = min(2*wait, claimRetryMax)
	}
}

// claim claims the daemon named by the ticket.
func (c *Client) claim(ctx context.Context, t Ticket) (service, *ownerConn, error) {
	svc, err := c.find(ctx)
	if err != nil {
		return svc, nil, err
	}
	if svc.InstanceID != t.InstanceID {
		return svc, nil, fmt.Errorf("%w: the ticket is for instance %s, the daemon is %s", ErrHandoff, t.InstanceID, svc.InstanceID)
	}
	oc, err := c.ownConn(ctx, svc, t.Ticket)
	return svc, oc, err
}

// ownConn sends own on a connection kept for the owner's life.
func (c *Client) ownConn(ctx context.Context, svc service, ticket string) (*ownerConn, error) {
	conn, err := dialSocket(ctx, svc)
	if err != nil {
		return nil, err
	}
	// Bounded by ctx only: a claim the daemon took but whose answer came
	// too late for us would leave it without owner or handoff, and it
	// would end everything. The ping before said it answers.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	r, err := roundTrip(conn, svc, map[string]any{"op": "own", "instance_id": svc.InstanceID, "ticket": ticket})
	if !stop() || err != nil {
		conn.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, err
	}
	if err := replyErr(r); err != nil {
		conn.Close()
		return nil, err
	}
	if r.Type != TypeOwned {
		conn.Close()
		return nil, fmt.Errorf("%w: own answered %q", ErrProtocol, r.Type)
	}
	return &ownerConn{conn: conn, replies: make(chan ownFrame, 1), done: make(chan struct{})}, nil
}

// readOwner reads the owner connection until it closes; replies go to the
// one owner request in flight.
func (c *Client) readOwner(oc *ownerConn) {
	defer c.wg.Done()
	defer close(oc.done)
	defer close(oc.replies)
	for {
		b, err := readFrame(oc.conn)
		if err != nil {
			return
		}
		var r Reply
		if err := json.Unmarshal(b, &r); err != nil {
			return
		}
		select {
		case oc.replies <- ownFrame{r: r}:
		default: // nobody asked: an unsolicited frame is dropped
		}
	}
}

// Claimed reports whether Own (or the last Reown) claimed a daemon
// through a handoff (its processes kept running) rather than starting
// fresh.
func (c *Client) Claimed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.claimed
}

// HandoffErr is why a handoff ticket present at Own (or the last Reown)
// was not honoured, or nil.
func (c *Client) HandoffErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.handoffErr
}

// OldReceipts are the receipts of the processes Own (or the last Reown)
// ended with the old daemon after a failed handoff.
func (c *Client) OldReceipts() []custody.Receipt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.oldReceipts
}

// Owner reports whether this client is the daemon's owner.
func (c *Client) Owner() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.own != nil
}

// InstanceID names the daemon this client talks to.
func (c *Client) InstanceID() string { return c.service().InstanceID }

// PID is the daemon's pid.
func (c *Client) PID() int { return c.service().PID }

func (c *Client) service() service {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.svc
}

// Done is closed when the owner connection is lost (the daemon ended, or
// another owner claimed it); nil for a client that is not the owner.
// After Reown it is the new connection's.
func (c *Client) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.own == nil {
		return nil
	}
	return c.own.done
}

// Close releases the owner connection (for an owner: the daemon ends
// everything unless a handoff was prepared), ends the waits for a Reown
// (ErrClosed), and waits for the client's goroutines, which run no user
// code: it is safe to call from anywhere, and there is nothing for a
// separate wait to join. Every call returns the first one's result.
func (c *Client) Close() error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		if c.own != nil {
			c.own.conn.Close()
		}
		if c.renewed != nil {
			close(c.renewed)
		}
	}
	c.mu.Unlock()
	c.wg.Wait()
	return nil
}

// PrepareHandoff asks for a single-use ticket (valid for HandoffTTL) that
// lets the next owner claim the daemon; the daemon writes it to the data
// dir, where Own finds it. From then on closing this client ends nothing.
// Only the owner may ask.
func (c *Client) PrepareHandoff(ctx context.Context) (Ticket, error) {
	c.mu.Lock()
	oc, svc := c.own, c.svc
	c.mu.Unlock()
	if oc == nil {
		return Ticket{}, fmt.Errorf("%w: prepare_handoff needs the owner", ErrForbidden)
	}
	oc.reqMu.Lock()
	defer oc.reqMu.Unlock()
	if err := writeFrame(oc.conn, envelope{Token: svc.Token, Protocol: svc.speak, Request: mustJSON(map[string]any{"op": "prepare_handoff"})}); err != nil {
		return Ticket{}, err
	}
	select {
	case f, ok := <-oc.replies:
		if !ok {
			return Ticket{}, fmt.Errorf("%w: owner connection lost", ErrNoDaemon)
		}
		if err := replyErr(f.r); err != nil {
			return Ticket{}, err
		}
		if f.r.Type != TypeHandoff || f.r.Ticket == nil {
			return Ticket{}, fmt.Errorf("%w: prepare_handoff answered %q", ErrProtocol, f.r.Type)
		}
		return *f.r.Ticket, nil
	case <-ctx.Done():
		return Ticket{}, ctx.Err()
	}
}

// CreatePipe starts a pipe process.
func (c *Client) CreatePipe(ctx context.Context, spec PipeSpec) (ProcessInfo, error) {
	if c.Protocol() < limitsProtocol {
		spec.Limits = nil // an older daemon takes none (ProcessInfo.Limits says so)
	}
	r, err := c.do(ctx, withOp("create_pipe", spec), TypeProcess)
	if err != nil {
		return ProcessInfo{}, err
	}
	return *r.Process, nil
}

// CreatePTY starts a process on a pseudo-terminal.
func (c *Client) CreatePTY(ctx context.Context, spec PTYSpec) (ProcessInfo, error) {
	if c.Protocol() < limitsProtocol {
		spec.Limits = nil
	}
	r, err := c.do(ctx, withOp("create_pty", spec), TypeProcess)
	if err != nil {
		return ProcessInfo{}, err
	}
	return *r.Process, nil
}

// Usage reads what a process's scope has used (custody's Scope.Usage),
// then, with resetPeak, starts a new window for its peak memory.
// ErrUnsupported from a daemon before protocol 10.
func (c *Client) Usage(ctx context.Context, id string, resetPeak bool) (custody.Usage, error) {
	if c.Protocol() < limitsProtocol {
		return custody.Usage{}, fmt.Errorf("%w: usage needs protocol %d, the daemon speaks %d", ErrUnsupported, limitsProtocol, c.Protocol())
	}
	req := map[string]any{"op": "usage", "id": id}
	if resetPeak {
		req["reset_peak"] = true
	}
	r, err := c.doProc(ctx, req, TypeUsage)
	if err != nil {
		return custody.Usage{}, err
	}
	if r.Usage == nil {
		return custody.Usage{}, fmt.Errorf("%w: a usage reply without usage", ErrProtocol)
	}
	return *r.Usage, nil
}

// Write writes data to a process's stdin (a pipe process) or terminal
// input (a pty nobody controls). It returns once the data is written; data
// over one request's cap goes in several requests, in order.
func (c *Client) Write(ctx context.Context, id string, data []byte) error {
	for first := true; first || len(data) > 0; first = false {
		n := min(len(data), maxWrite)
		if _, err := c.doProc(ctx, map[string]any{"op": "write", "id": id, "data": data[:n]}, TypeOK); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// CloseStdin closes a pipe process's stdin (EOF for the child).
func (c *Client) CloseStdin(ctx context.Context, id string) error {
	_, err := c.doProc(ctx, map[string]any{"op": "write", "id": id, "eof": true}, TypeOK)
	return err
}

// Resize sets a pty's size (refused while another client controls it).
func (c *Client) Resize(ctx context.Context, id string, cols, rows uint16) error {
	_, err := c.doProc(ctx, map[string]any{"op": "resize", "id": id, "cols": cols, "rows": rows}, TypeOK)
	return err
}

// List lists the processes of one mode, oldest first, in as many
// requests as their size takes (a reply stays under a frame).
func (c *Client) List(ctx context.Context, mode Mode) ([]ProcessInfo, error) {
	var all []ProcessInfo
	after := ""
	for {
		req := map[string]any{"op": "list", "mode": mode}
		if after != "" {
			req["after"] = after
		}
		r, err := c.do(ctx, req, TypeProcesses)
		if err != nil {
			return nil, err
		}
		all = append(all, r.Processes...)
		if r.Next == "" || r.Next == after {
			return all, nil
		}
		after = r.Next
	}
}

// Get describes one process.
func (c *Client) Get(ctx context.Context, id string) (ProcessInfo, error) {
	r, err := c.doProc(ctx, map[string]any{"op": "get", "id": id}, TypeProcess)
	if err != nil {
		return ProcessInfo{}, err
	}
	return *r.Process, nil
}

// Wait blocks until the process has exited and its output is complete, and
// returns how it ended; at once if it already has. ErrTerminated when it is
// terminated first, ErrShuttingDown when the daemon shuts down first.
func (c *Client) Wait(ctx context.Context, id string) (Exit, error) {
	r, err := c.doProc(ctx, map[string]any{"op": "wait", "id": id}, TypeExited)
	if err != nil {
		return Exit{}, err
	}
	return *r.Exit, nil
}

// Signal sends TERM, INT or KILL to the process's group and everything it
// started that custody owns. The record is kept (Wait still sees the
// exit); it is refused with ErrNotFound once the record is gone.
func (c *Client) Signal(ctx context.Context, id string, sig Signal) error {
	_, err := c.doProc(ctx, map[string]any{"op": "signal", "id": id, "signal": sig}, TypeOK)
	return err
}

// Trim releases the disk blocks of a running pipe process's output file
// before offset output, and of its stderr file before stderr (0: leave
// it): nobody will read those bytes again (a host trims up to what it
// committed). The files keep their size and offsets; the released range
// reads as zeros. Only whole pages are released; after the process ended
// it does nothing.
func (c *Client) Trim(ctx context.Context, id string, output, stderr int64) error {
	_, err := c.doProc(ctx, map[string]any{"op": "trim", "id": id, "output": output, "stderr": stderr}, TypeOK)
	return err
}

// SetMetadata replaces a process's opaque metadata (at most MaxMetadata).
func (c *Client) SetMetadata(ctx context.Context, id string, metadata json.RawMessage) error {
	_, err := c.doProc(ctx, map[string]any{"op": "set_metadata", "id": id, "metadata": metadata}, TypeOK)
	return err
}

// Terminate ends the process and everything it started (custody's Close of
// the whole tree) and removes its record; the receipt says what ended how.
func (c *Client) Terminate(ctx context.Context, id string) (*custody.Receipt, error) {
	r, err := c.doProc(ctx, map[string]any{"op": "terminate", "id": id}, TypeTerminated)
	if err != nil {
		return nil, err
	}
	return r.Receipt, nil
}

// Shutdown ends every process (with receipts) and then the daemon.
func (c *Client) Shutdown(ctx context.Context) ([]custody.Receipt, error) {
	r, err := c.doProc(ctx, map[string]any{"op": "shutdown"}, TypeShutdown) // a dead daemon is shut down already
	if err != nil {
		return nil, err
	}
	return r.Receipts, nil
}

// Ping checks that the daemon answers and still speaks the protocol
// version the client negotiated with it (Protocol).
func (c *Client) Ping(ctx context.Context) error {
	r, err := c.do(ctx, map[string]any{"op": "ping"}, TypePong)
	if err != nil {
		return err
	}
	if dv := versions(r.Protocol, r.Protocols); !dv.contains(c.Protocol()) {
		return &VersionError{Client: c.opts.versions(), Daemon: dv}
	}
	return nil
}

// Protocol is the protocol version the client speaks with its daemon:
// the newest in both the client's range (Versions) and the daemon's.
func (c *Client) Protocol() int { return c.service().speak }

// Subscription is an attached pty: its replay, then live output and
// events. Not safe for concurrent Next calls; Input and Resize may be
// called concurrently with Next.
type Subscription struct {
	conn  net.Conn
	token string
	speak int // the protocol version
	wmu   sync.Mutex
	// Attached is the first frame: the replay from Attached.Offset
	// (Attached.Truncated when older output is gone), and whether this
	// subscription controls the terminal.
	Attached Reply
}

// Subscribe attaches to a pty from an absolute output offset (0: all the
// replay holds). control asks to be the terminal's controller (the only one
// who may write and resize; the previous controller is told). A subscriber
// that does not keep up is dropped (an event of type "dropped" when it can
// still be told, then EOF).
func (c *Client) Subscribe(ctx context.Context, id string, offset int64, control bool) (*Subscription, error) {
	svc := c.service()
	conn, err := dialSocket(ctx, svc)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	r, err := roundTrip(conn, svc, map[string]any{"op": "subscribe", "id": id, "offset": offset, "control": control})
	if !stop() || err != nil {
		conn.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, err
	}
	if err := replyErr(r); err != nil {
		conn.Close()
		return nil, err
	}
	if r.Type != TypeAttached {
		conn.Close()
		return nil, fmt.Errorf("%w: subscribe answered %q", ErrProtocol, r.Type)
	}
	return &Subscription{conn: conn, token: svc.Token, speak: svc.speak, Attached: r}, nil
}

// Next returns the next event: "output", "resized", "controller_changed",
// "exited" or "dropped". A *ReplyError (an "error" frame: input or a
// resize was refused) ends nothing: the subscription goes on. Other
// errors (io.EOF-like) mean the subscription ended.
func (s *Subscription) Next(ctx context.Context) (Reply, error) {
	stop := context.AfterFunc(ctx, func() { s.conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	b, err := readFrame(s.conn)
	if err != nil {
		if ctx.Err() != nil {
			return Reply{}, ctx.Err()
		}
		return Reply{}, err
	}
	var r Reply
	if err := json.Unmarshal(b, &r); err != nil {
		return Reply{}, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	return r, replyErr(r)
}

// Input writes to the terminal (the controller only).
func (s *Subscription) Input(data []byte) error {
	return s.send(map[string]any{"op": "input", "data": data})
}

// Resize resizes the terminal (the controller only).
func (s *Subscription) Resize(cols, rows uint16) error {
	return s.send(map[string]any{"op": "resize", "cols": cols, "rows": rows})
}

func (s *Subscription) send(req map[string]any) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return writeFrame(s.conn, envelope{Token: s.token, Protocol: s.speak, Request: mustJSON(req)})
}

// Close detaches (giving up control).
func (s *Subscription) Close() error { return s.conn.Close() }

// do sends one request on a connection of its own and returns the reply,
// which must be of type want.
// For an owner client whose daemon died it waits for Reown and asks the
// new daemon (what the dead one did died with it).
func (c *Client) do(ctx context.Context, req any, want string) (Reply, error) {
	for {
		conn, svc, err := c.dial(ctx)
		if err != nil {
			return Reply{}, err
		}
		r, err := exchange(ctx, conn, svc, req, want)
		if err == nil || !errors.Is(err, ErrNoDaemon) {
			return r, err
		}
		if again, cerr := c.awaitRenewal(ctx, svc); !again {
			return r, cmp.Or(cerr, err)
		}
	}
}

// doProc is do for a request about the daemon in use or a process of it:
// a process of a daemon that died is gone with it (ErrNoDaemon at once; a
// new daemon does not know it).
func (c *Client) doProc(ctx context.Context, req any, want string) (Reply, error) {
	return c.doWith(ctx, c.service(), req, want)
}

// doWith is do with the daemon svc.
func (c *Client) doWith(ctx context.Context, svc service, req any, want string) (Reply, error) {
	conn, err := dialSocket(ctx, svc)
	if err != nil {
		return Reply{}, err
	}
	return exchange(ctx, conn, svc, req, want)
}

// exchange sends req on conn (closed after) and returns the reply, which
// must be of type want.
func exchange(ctx context.Context, conn net.Conn, svc service, req any, want string) (Reply, error) {
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	r, err := roundTrip(conn, svc, req)
	if !stop() {
		return Reply{}, ctx.Err()
	}
	if err != nil {
		return Reply{}, err
	}
	if err := replyErr(r); err != nil {
		return Reply{}, err
	}
	if r.Type != want ||
		(want == TypeProcess && r.Process == nil) || (want == TypeExited && r.Exit == nil) {
		return Reply{}, fmt.Errorf("%w: expected a %q reply, got %q", ErrProtocol, want, r.Type)
	}
	return r, nil
}

// dial connects to the client's daemon. An owner client whose daemon is
// gone (Done) waits for Reown within ctx and dials the new one.
func (c *Client) dial(ctx context.Context) (net.Conn, service, error) {
	for {
		svc := c.service()
		conn, err := dialSocket(ctx, svc)
		if err == nil {
			return conn, svc, nil
		}
		if again, cerr := c.awaitRenewal(ctx, svc); !again {
			return nil, svc, cmp.Or(cerr, err)
		}
	}
}

// ownerLossWait bounds how long a request that lost its daemon waits for
// the owner connection to say the daemon is gone (the kernel closes a
// dead process's sockets one by one).
const ownerLossWait = time.Second

// awaitRenewal: a request to svc found no daemon. For an owner client
// whose daemon is gone it waits (within ctx) for Reown and reports true:
// try again. False for a plain client or a daemon that is not gone; false
// and ErrClosed for an owner client closed before or meanwhile.
func (c *Client) awaitRenewal(ctx context.Context, svc service) (bool, error) {
	c.mu.Lock()
	cur, own, renewed, closed := c.svc, c.own, c.renewed, c.closed
	c.mu.Unlock()
	switch {
	case own == nil || ctx.Err() != nil:
		return false, nil
	case closed:
		return false, ErrClosed
	case cur.InstanceID != svc.InstanceID:
		return true, nil // renewed meanwhile
	}
	if !isClosed(own.done) {
		t := time.NewTimer(ownerLossWait)
		select {
		case <-own.done:
			t.Stop()
		case <-t.C:
			return false, nil
		case <-ctx.Done():
			t.Stop()
			return false, nil
		}
	}
	select {
	case <-renewed:
		if c.isClosedClient() {
			return false, ErrClosed
		}
		return true, nil
	case <-ctx.Done():
		return false, nil
	}
}

func (c *Client) isClosedClient() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func dialSocket(ctx context.Context, svc service) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", svc.Socket)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDaemon, err)
	}
	return conn, nil
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func roundTrip(conn net.Conn, svc service, req any) (Reply, error) {
	raw, err := json.Marshal(req)
	if err != nil {
		return Reply{}, err
	}
	if err := writeFrame(conn, envelope{Token: svc.Token, Protocol: svc.speak, Request: raw}); err != nil {
		return Reply{}, fmt.Errorf("%w: %v", ErrNoDaemon, err)
	}
	b, err := readFrame(conn)
	if err != nil {
		return Reply{}, fmt.Errorf("%w: no reply: %v", ErrNoDaemon, err)
	}
	var r Reply
	if err := json.Unmarshal(b, &r); err != nil {
		return Reply{}, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	return r, nil
}

func replyErr(r Reply) error {
	if r.Type == TypeError {
		return &ReplyError{Code: r.Code, Message: r.Message}
	}
	return nil
}

// withOp flattens a spec (a struct: a JSON object) into a request with its
// op, splicing the op in rather than decoding and encoding the spec again
// (its metadata may be a megabyte).
func withOp(op string, spec any) json.RawMessage {
	b := mustJSON(spec)
	head := mustJSON(map[string]string{"op": op})
	if len(b) <= 2 {
		return head
	}
	return append(append(head[:len(head)-1:len(head)-1], ','), b[1:]...)
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own request types reach here
	}
	return b
}

// find reads the registration file, checks the daemon answers, and
// negotiates the protocol version: the newest both speak (*VersionError,
// from a daemon that answers, when none).
func (c *Client) find(ctx context.Context) (service, error) {
	svc, err := readService(c.dataDir)
	if err != nil {
		return svc, fmt.Errorf("%w: %v", ErrNoDaemon, err)
	}
	pctx, cancel := context.WithTimeout(ctx, c.opts.pingTimeout())
	defer cancel()
	r, err := c.doWith(pctx, svc, map[string]any{"op": "ping"}, TypePong)
	if err != nil {
		if pctx.Err() != nil && ctx.Err() == nil {
			// No answer in time: as good as no daemon for now.
			return svc, fmt.Errorf("%w: no answer to ping within %v", ErrNoDaemon, c.opts.pingTimeout())
		}
		return svc, err
	}
	// The daemon's answer decides, not its registration (which may be a
	// dead daemon's: then a fresh one is started).
	mine, dv := c.opts.versions(), versions(r.Protocol, r.Protocols)
	v, ok := mine.common(dv)
	if !ok {
		return svc, &VersionError{Client: mine, Daemon: dv}
	}
	svc.speak = v
	return svc, nil
}

func (c *Client) findOrStartOnce(ctx context.Context) (service, error) {
	if svc, err := c.find(ctx); err == nil || !errors.Is(err, ErrNoDaemon) {
		return svc, err
	}
	to := c.opts.StartTimeout
	if to <= 0 {
		to = DefaultStartTimeout
	}
	sctx, cancel := context.WithTimeout(ctx, to)
	defer cancel()
	argv := c.opts.DaemonCommand
	if len(argv) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return service{}, fmt.Errorf("procd: starting a daemon: %w", err)
		}
		argv = []string{exe, "procd"}
	}
	cmd := exec.CommandContext(sctx, argv[0], append(argv[1:len(argv):len(argv)], "--data", c.dataDir, "--detach")...)
	cmd.Env = c.opts.DaemonEnv
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = withoutMarker(cmd.Env)
	if out, err := cmd.CombinedOutput(); err != nil {
		return service{}, fmt.Errorf("procd: starting a daemon: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return c.find(ctx)
}

func (c *Client) findOrStart(ctx context.Context) (service, error) {
	svc, err := c.findOrStartOnce(ctx)
	if errors.Is(err, ErrNoDaemon) {
		// The daemon just started may have ended already (idle, or shut
		// down by another client): once more.
		svc, err = c.findOrStartOnce(ctx)
	}
	return svc, err
}

// withoutMarker drops custody's scope marker: the daemon is nobody's
// descendant to reap.
func withoutMarker(env []string) []string {
	out := make([]string, 0, len(env))
	for _, e := range env {
		if !strings.HasPrefix(e, custody.MarkerEnv+"=") {
			out = append(out, e)
		}
	}
	return out
}

// waitGone waits for the daemon of dataDir to be gone: its lock is free.
func waitGone(ctx context.Context, dataDir string) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	deadline := time.After(60 * time.Second)
	for {
		free, err := lockFree(dataDir)
		if err != nil || free {
			return err
		}
		select {
		case <-t.C:
		case <-deadline:
			return fmt.Errorf("procd: the old daemon did not exit")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
