package procd

import (
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

// DefaultStartTimeout bounds starting a daemon and its first answer.
const DefaultStartTimeout = 15 * time.Second

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
}

// Client talks to the daemon of one data dir. Every request opens its own
// connection, so a Client is safe for concurrent use. An owner client (Own)
// also holds the owner connection; Close releases it, which ends the daemon
// and everything in it unless a handoff was prepared first.
type Client struct {
	dataDir string
	svc     service
	opts    ClientOptions

	// Owner state: nil conn for a plain client.
	ownMu       sync.Mutex // one owner request at a time
	owner       net.Conn
	ownReplies  chan ownFrame
	done        chan struct{} // closed when the owner connection is lost
	wg          sync.WaitGroup
	closeOnce   sync.Once
	claimed     bool
	handoffErr  error
	oldReceipts []custody.Receipt
}

type ownFrame struct {
	r Reply
}

// Dial connects to the daemon already running for dataDir; ErrNoDaemon
// when none answers.
func Dial(ctx context.Context, dataDir string) (*Client, error) {
	c := &Client{dataDir: dataDir}
	if err := c.find(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Connect connects to the daemon of dataDir, starting one when none
// answers. The client is not the owner.
func Connect(ctx context.Context, dataDir string, opts *ClientOptions) (*Client, error) {
	c := &Client{dataDir: dataDir}
	if opts != nil {
		c.opts = *opts
	}
	if err := c.findOrStart(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Own makes this client the daemon's owner: it claims the daemon with the
// handoff ticket in the data dir when there is one (Claimed reports true,
// and every process the old owner left runs on); otherwise, or when the
// claim fails (HandoffErr says why), it ends the old daemon (receipts in
// its log) and owns a fresh one. It fails with ErrOwned when another owner
// is connected. Done is closed if the owner connection is lost.
func Own(ctx context.Context, dataDir string, opts *ClientOptions) (*Client, error) {
	c := &Client{dataDir: dataDir}
	if opts != nil {
		c.opts = *opts
	}
	if t, err := readTicket(dataDir); err == nil {
		err := c.claim(ctx, t)
		_ = os.Remove(filepath.Join(procdDir(dataDir), ticketFile))
		if err == nil {
			c.claimed = true
			return c, nil
		}
		if errors.Is(err, ErrOwned) {
			return nil, err // a live owner's daemon is not ours to end
		}
		c.handoffErr = err
		// A failed handoff ends the old daemon so no process is left that
		// nobody owns; the restart goes on with a fresh one.
		if old, derr := Dial(ctx, dataDir); derr == nil {
			rs, serr := old.Shutdown(ctx)
			c.oldReceipts = rs
			if serr != nil && !errors.Is(serr, ErrShuttingDown) {
				return nil, fmt.Errorf("procd: ending the daemon after a failed handoff (%v): %w", err, serr)
			}
			if werr := waitGone(ctx, dataDir); werr != nil {
				return nil, werr
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		c.handoffErr = err
	}
	if err := c.findOrStart(ctx); err != nil {
		return nil, err
	}
	err := c.ownConn(ctx, "")
	if errors.Is(err, ErrHandoff) {
		// The daemon waits for a handoff whose ticket file is gone: end it
		// and start fresh.
		c.handoffErr = err
		rs, serr := c.Shutdown(ctx)
		c.oldReceipts = rs
		if serr != nil && !errors.Is(serr, ErrShuttingDown) {
			return nil, serr
		}
		if err := waitGone(ctx, dataDir); err != nil {
			return nil, err
		}
		if err := c.findOrStart(ctx); err != nil {
			return nil, err
		}
		err = c.ownConn(ctx, "")
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

// claim claims the daemon named by the ticket.
func (c *Client) claim(ctx context.Context, t Ticket) error {
	if err := c.find(ctx); err != nil {
		return err
	}
	if c.svc.InstanceID != t.InstanceID {
		return fmt.Errorf("%w: the ticket is for instance %s, the daemon is %s", ErrHandoff, t.InstanceID, c.svc.InstanceID)
	}
	return c.ownConn(ctx, t.Ticket)
}

// ownConn sends own on a connection kept for the owner's life.
func (c *Client) ownConn(ctx context.Context, ticket string) error {
	conn, err := c.dial(ctx)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	r, err := roundTrip(conn, c.svc.Token, map[string]any{"op": "own", "instance_id": c.svc.InstanceID, "ticket": ticket})
	if !stop() || err != nil {
		conn.Close()
		if err == nil {
			err = ctx.Err()
		}
		return err
	}
	if err := replyErr(r); err != nil {
		conn.Close()
		return err
	}
	if r.Type != TypeOwned {
		conn.Close()
		return fmt.Errorf("%w: own answered %q", ErrProtocol, r.Type)
	}
	c.owner = conn
	c.ownReplies = make(chan ownFrame, 1)
	c.done = make(chan struct{})
	c.wg.Add(1)
	go c.readOwner()
	return nil
}

// readOwner reads the owner connection until it closes; replies go to the
// one owner request in flight.
func (c *Client) readOwner() {
	defer c.wg.Done()
	defer close(c.done)
	defer close(c.ownReplies)
	for {
		b, err := readFrame(c.owner)
		if err != nil {
			return
		}
		var r Reply
		if err := json.Unmarshal(b, &r); err != nil {
			return
		}
		select {
		case c.ownReplies <- ownFrame{r: r}:
		default: // nobody asked: an unsolicited frame is dropped
		}
	}
}

// Claimed reports whether Own claimed a daemon through a handoff (its
// processes kept running) rather than starting fresh.
func (c *Client) Claimed() bool { return c.claimed }

// HandoffErr is why a handoff ticket present at Own was not honoured, or nil.
func (c *Client) HandoffErr() error { return c.handoffErr }

// OldReceipts are the receipts of the processes Own ended with the old
// daemon after a failed handoff.
func (c *Client) OldReceipts() []custody.Receipt { return c.oldReceipts }

// Owner reports whether this client is the daemon's owner.
func (c *Client) Owner() bool { return c.owner != nil }

// InstanceID names the daemon this client talks to.
func (c *Client) InstanceID() string { return c.svc.InstanceID }

// PID is the daemon's pid.
func (c *Client) PID() int { return c.svc.PID }

// Done is closed when the owner connection is lost (the daemon ended, or
// another owner claimed it); nil for a client that is not the owner.
func (c *Client) Done() <-chan struct{} { return c.done }

// Close releases the owner connection (for an owner: the daemon ends
// everything unless a handoff was prepared) and waits for the client's
// goroutine. Idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		if c.owner != nil {
			c.owner.Close()
		}
	})
	c.wg.Wait()
	return nil
}

// PrepareHandoff asks for a single-use ticket (valid for HandoffTTL) that
// lets the next owner claim the daemon; the daemon writes it to the data
// dir, where Own finds it. From then on closing this client ends nothing.
// Only the owner may ask.
func (c *Client) PrepareHandoff(ctx context.Context) (Ticket, error) {
	if c.owner == nil {
		return Ticket{}, fmt.Errorf("%w: prepare_handoff needs the owner", ErrForbidden)
	}
	c.ownMu.Lock()
	defer c.ownMu.Unlock()
	if err := writeFrame(c.owner, envelope{Token: c.svc.Token, Request: mustJSON(map[string]any{"op": "prepare_handoff"})}); err != nil {
		return Ticket{}, err
	}
	select {
	case f, ok := <-c.ownReplies:
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
	r, err := c.do(ctx, withOp("create_pipe", spec), TypeProcess)
	if err != nil {
		return ProcessInfo{}, err
	}
	return *r.Process, nil
}

// CreatePTY starts a process on a pseudo-terminal.
func (c *Client) CreatePTY(ctx context.Context, spec PTYSpec) (ProcessInfo, error) {
	r, err := c.do(ctx, withOp("create_pty", spec), TypeProcess)
	if err != nil {
		return ProcessInfo{}, err
	}
	return *r.Process, nil
}

// Write writes data to a process's stdin (a pipe process) or terminal
// input (a pty nobody controls). It returns once the data is written; data
// over one request's cap goes in several requests, in order.
func (c *Client) Write(ctx context.Context, id string, data []byte) error {
	for first := true; first || len(data) > 0; first = false {
		n := min(len(data), maxWrite)
		if _, err := c.do(ctx, map[string]any{"op": "write", "id": id, "data": data[:n]}, TypeOK); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// CloseStdin closes a pipe process's stdin (EOF for the child).
func (c *Client) CloseStdin(ctx context.Context, id string) error {
	_, err := c.do(ctx, map[string]any{"op": "write", "id": id, "eof": true}, TypeOK)
	return err
}

// Resize sets a pty's size (refused while another client controls it).
func (c *Client) Resize(ctx context.Context, id string, cols, rows uint16) error {
	_, err := c.do(ctx, map[string]any{"op": "resize", "id": id, "cols": cols, "rows": rows}, TypeOK)
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
	r, err := c.do(ctx, map[string]any{"op": "get", "id": id}, TypeProcess)
	if err != nil {
		return ProcessInfo{}, err
	}
	return *r.Process, nil
}

// Wait blocks until the process has exited and its output is complete, and
// returns how it ended; at once if it already has. ErrTerminated when it is
// terminated first, ErrShuttingDown when the daemon shuts down first.
func (c *Client) Wait(ctx context.Context, id string) (Exit, error) {
	r, err := c.do(ctx, map[string]any{"op": "wait", "id": id}, TypeExited)
	if err != nil {
		return Exit{}, err
	}
	return *r.Exit, nil
}

// Signal sends TERM, INT or KILL to the process's group and everything it
// started that custody owns. The record is kept (Wait still sees the
// exit); it is refused with ErrNotFound once the record is gone.
func (c *Client) Signal(ctx context.Context, id string, sig Signal) error {
	_, err := c.do(ctx, map[string]any{"op": "signal", "id": id, "signal": sig}, TypeOK)
	return err
}

// Trim releases the disk blocks of a running pipe process's output file
// before offset output, and of its stderr file before stderr (0: leave
// it): nobody will read those bytes again (a host trims up to what it
// committed). The files keep their size and offsets; the released range
// reads as zeros. Only whole pages are released; after the process ended
// it does nothing.
func (c *Client) Trim(ctx context.Context, id string, output, stderr int64) error {
	_, err := c.do(ctx, map[string]any{"op": "trim", "id": id, "output": output, "stderr": stderr}, TypeOK)
	return err
}

// SetMetadata replaces a process's opaque metadata (at most MaxMetadata).
func (c *Client) SetMetadata(ctx context.Context, id string, metadata json.RawMessage) error {
	_, err := c.do(ctx, map[string]any{"op": "set_metadata", "id": id, "metadata": metadata}, TypeOK)
	return err
}

// Terminate ends the process and everything it started (custody's Close of
// the whole tree) and removes its record; the receipt says what ended how.
func (c *Client) Terminate(ctx context.Context, id string) (*custody.Receipt, error) {
	r, err := c.do(ctx, map[string]any{"op": "terminate", "id": id}, TypeTerminated)
	if err != nil {
		return nil, err
	}
	return r.Receipt, nil
}

// Shutdown ends every process (with receipts) and then the daemon.
func (c *Client) Shutdown(ctx context.Context) ([]custody.Receipt, error) {
	r, err := c.do(ctx, map[string]any{"op": "shutdown"}, TypeShutdown)
	if err != nil {
		return nil, err
	}
	return r.Receipts, nil
}

// Ping checks that the daemon answers and speaks Protocol.
func (c *Client) Ping(ctx context.Context) error {
	r, err := c.do(ctx, map[string]any{"op": "ping"}, TypePong)
	if err != nil {
		return err
	}
	if r.Protocol != Protocol {
		return fmt.Errorf("%w: the daemon speaks protocol %d, not %d", ErrProtocol, r.Protocol, Protocol)
	}
	return nil
}

// Subscription is an attached pty: its replay, then live output and
// events. Not safe for concurrent Next calls; Input and Resize may be
// called concurrently with Next.
type Subscription struct {
	conn  net.Conn
	token string
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
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	r, err := roundTrip(conn, c.svc.Token, map[string]any{"op": "subscribe", "id": id, "offset": offset, "control": control})
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
	return &Subscription{conn: conn, token: c.svc.Token, Attached: r}, nil
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
	return writeFrame(s.conn, envelope{Token: s.token, Request: mustJSON(req)})
}

// Close detaches (giving up control).
func (s *Subscription) Close() error { return s.conn.Close() }

// do sends one request on a connection of its own and returns the reply,
// which must be of type want.
func (c *Client) do(ctx context.Context, req any, want string) (Reply, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return Reply{}, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	r, err := roundTrip(conn, c.svc.Token, req)
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

func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.svc.Socket)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDaemon, err)
	}
	return conn, nil
}

func roundTrip(conn net.Conn, token string, req any) (Reply, error) {
	raw, err := json.Marshal(req)
	if err != nil {
		return Reply{}, err
	}
	if err := writeFrame(conn, envelope{Token: token, Request: raw}); err != nil {
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

// withOp flattens a spec into a request with its op.
func withOp(op string, spec any) map[string]any {
	var m map[string]any
	_ = json.Unmarshal(mustJSON(spec), &m)
	m["op"] = op
	return m
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own request types reach here
	}
	return b
}

// find reads the registration file and checks the daemon answers.
func (c *Client) find(ctx context.Context) error {
	svc, err := readService(c.dataDir)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNoDaemon, err)
	}
	if svc.Protocol != Protocol {
		return fmt.Errorf("%w: the daemon registered protocol %d, not %d", ErrProtocol, svc.Protocol, Protocol)
	}
	c.svc = svc
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return c.Ping(pctx)
}

func (c *Client) findOrStartOnce(ctx context.Context) error {
	if err := c.find(ctx); err == nil || !errors.Is(err, ErrNoDaemon) {
		return err
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
			return fmt.Errorf("procd: starting a daemon: %w", err)
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
		return fmt.Errorf("procd: starting a daemon: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return c.find(ctx)
}

func (c *Client) findOrStart(ctx context.Context) error {
	err := c.findOrStartOnce(ctx)
	if errors.Is(err, ErrNoDaemon) {
		// The daemon just started may have ended already (idle, or shut
		// down by another client): once more.
		err = c.findOrStartOnce(ctx)
	}
	return err
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
