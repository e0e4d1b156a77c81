// Package acp is the client side of the Agent Client Protocol (JSON-RPC 2.0,
// one message per line over stdio) on github.com/coder/acp-go-sdk: it starts
// an ACP agent in a custody scope, initializes it, opens or loads sessions,
// runs prompts with every session/update reported as an Event, answers the
// agent's permission requests through a callback, serves fs requests
// confined to a workspace, and closes it with a custody receipt.
//
// Every line from the agent passes through this package before the SDK sees
// it: a line that is not a JSON-RPC message (or a request without an id) is
// reported (an Event of type TypeMalformed; the SDK would log its payload)
// and dropped, and session/update notifications are decoded here, so an
// update kind the SDK does not know is kept raw instead of arriving empty;
// the other notifications, which the client does not act on, never reach
// the SDK. A turn's update read after its prompt was answered is reported
// and dropped.
//
// Terminals (terminal/*) are not advertised: agents run their own shells,
// which are their descendants and so in the agent's custody scope.
package acp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/custody"
	sdk "github.com/coder/acp-go-sdk"
)

// Defaults for Options.
const (
	DefaultCancelTimeout     = 5 * time.Second
	DefaultCloseGrace        = 5 * time.Second
	DefaultPermissionTimeout = 10 * time.Minute
	// exitStatusWait bounds the wait, at stdout EOF, for the exit status
	// that goes into an ExitError.
	exitStatusWait = 500 * time.Millisecond
	// maxTurnText bounds the text a Prompt collects for its result.
	maxTurnText = 4 << 20
)

// Sentinel errors; match them with errors.Is.
var (
	// ErrSessionNotFound: the agent refused session/load (or cannot load
	// sessions at all).
	ErrSessionNotFound = errors.New("acp: session not found")
	// ErrAgentExited: the agent's stdout ended (the process exited or
	// closed it) before the request was answered. See ExitError.
	ErrAgentExited = errors.New("acp: the agent exited")
	// ErrCancelTimeout: the agent did not end the turn within the bound
	// after session/cancel.
	ErrCancelTimeout = errors.New("acp: the agent did not end the turn after session/cancel")
	// ErrClosed: the client was closed.
	ErrClosed = errors.New("acp: client closed")
	// ErrNoTurn: Cancel found no prompt running in the session.
	ErrNoTurn = errors.New("acp: no turn running")
	// ErrConnectionStopped: the SDK's side of the connection stopped (its
	// notification queue overflowed), so no request can be answered; the
	// agent must be closed.
	ErrConnectionStopped = errors.New("acp: the connection to the agent stopped")
)

// ExitError is returned for a request the agent did not answer because its
// stdout ended; it matches ErrAgentExited.
type ExitError struct {
	// Status is the process's exit status (nil: exited 0, or it had not
	// exited within a short wait).
	Status error
	// Stderr is the tail of what the agent wrote to stderr (at most
	// exitStderrTail bytes), if anything.
	Stderr string
}

// exitStderrTail bounds ExitError.Stderr: enough for a runtime's error and
// its stack, which the message picks the cause from (see causeLine).
const exitStderrTail = 4 << 10

func (e *ExitError) Error() string {
	s := "acp: the agent exited"
	if e.Status != nil {
		s += " (" + e.Status.Error() + ")"
	}
	if t := strings.TrimSpace(e.Stderr); t != "" {
		s += "; stderr: " + trim(causeLine(t), 300)
	}
	return s
}

// Is makes errors.Is(err, ErrAgentExited) true.
func (e *ExitError) Is(target error) bool { return target == ErrAgentExited }

// Unwrap returns the exit status.
func (e *ExitError) Unwrap() error { return e.Status }

// Spec is the agent's command line, run verbatim (never through a shell).
type Spec struct {
	Argv []string
	// Dir is the agent's working directory.
	Dir string
	// Env is the agent's whole environment; nil inherits the host's.
	Env []string
}

// Options configure Start. Custodian is required; the rest may be zero.
type Options struct {
	// Custodian owns the agent process and everything it starts.
	Custodian *custody.Custodian
	// Limits bound the agent's scope where the Custodian applies them.
	Limits custody.Limits
	// FSRoot, if set, advertises fs/read_text_file and fs/write_text_file,
	// confined to this directory: a path outside it (after resolving
	// symlinks and "..") is refused. "" advertises neither.
	FSRoot string
	// FSOwner, if set, gets the files and folders fs/write_text_file
	// creates (the agent runs as a user of its own, the host as root): the
	// agent may then change them itself. nil: the host's user.
	FSOwner *FileOwner
	// Events receives every session/update and every malformed line, in
	// the order read. It is called from the reader goroutine and must not
	// block. Nil drops them (Prompt still collects the turn's text).
	Events func(Event)
	// Permission decides a session/request_permission: true allows (the
	// agent's allow_once option, else allow_always), false rejects
	// (reject_once, else reject_always, else the cancelled outcome). Its ctx
	// ends at PermissionTimeout; an answer after that, or a nil Permission,
	// rejects.
	Permission func(ctx context.Context, req PermissionRequest) bool
	// Ask, if set, advertises elicitation forms (omp's ask tool uses them)
	// and answers each field of one; ok false (or an answer after
	// PermissionTimeout) cancels the form. Nil: not advertised.
	Ask func(ctx context.Context, q Question) (answer string, ok bool)
	// PermissionTimeout bounds one permission decision, and one question
	// (default 10 min).
	PermissionTimeout time.Duration
	// CancelTimeout bounds how long Cancel waits for the turn to end
	// (default 5 s).
	CancelTimeout time.Duration
	// CloseGrace is how long Close waits for stdout EOF after closing
	// stdin, before custody ends the process (default 5 s).
	CloseGrace time.Duration
	// MaxLineBytes caps one line from the agent (default and maximum
	// DefaultMaxLineBytes and 10 MiB).
	MaxLineBytes int
	// SessionMeta, if set, is sent as the _meta of every session/new and
	// session/load (agent-specific session options).
	SessionMeta map[string]any
	// ClientName and ClientVersion are sent in initialize (default
	// "agenthost", "dev").
	ClientName, ClientVersion string
	// Logger gets diagnostics; never a payload.
	Logger *slog.Logger
}

func (o *Options) fill() {
	if o.PermissionTimeout <= 0 {
		o.PermissionTimeout = DefaultPermissionTimeout
	}
	if o.CancelTimeout <= 0 {
		o.CancelTimeout = DefaultCancelTimeout
	}
	if o.CloseGrace <= 0 {
		o.CloseGrace = DefaultCloseGrace
	}
	if o.MaxLineBytes <= 0 {
		o.MaxLineBytes = DefaultMaxLineBytes
	}
	o.MaxLineBytes = min(o.MaxLineBytes, maxLineLimit)
	if o.ClientName == "" {
		o.ClientName = "agenthost"
	}
	if o.ClientVersion == "" {
		o.ClientVersion = "dev"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Client is one running ACP agent. Its methods are safe for concurrent use.
type Client struct {
	opts  Options
	scope *custody.Scope
	conn  *sdk.ClientSideConnection
	init  sdk.InitializeResponse
	fs    *fsRoot

	stderr     tail
	readerDone chan struct{} // stdout ended (EOF or CloseOutput), or the SDK stopped
	stderrDone chan struct{}
	sdkR       *io.PipeReader
	sdkW       *io.PipeWriter
	watchDone  chan struct{}  // watchSDK returned
	handlers   sync.WaitGroup // running permission and fs handlers
	hmu        sync.Mutex     // guards handlers.Add against join's Wait
	hclosed    bool
	joined     chan struct{} // closed when Close ran and every goroutine ended (Wait)
	joinOnce   sync.Once
	inflight   atomic.Int32 // inbound requests being handled

	mu         sync.Mutex
	turns      map[string]*turn  // running prompts by session id
	promptIDs  map[string]string // session/prompt requests sent, by id: their session
	loads      map[string]int    // session/load requests running, by session id
	cancelled  map[string]bool   // sessions sent session/cancel since their last prompt began
	malformed  int64
	closed     bool
	closure    Closure
	sdkStopped error // why the SDK stopped reading, if it did

	closeOnce sync.Once
}

// Closure says how the agent ended when Close ran.
type Closure struct {
	// StdoutEOF: the agent closed its stdout within CloseGrace of stdin
	// closing (after: how long it took); otherwise custody ended it.
	StdoutEOF bool
	After     time.Duration
}

// Start starts the agent in a custody scope and initializes it; ctx bounds
// both. On failure the process is released before Start returns.
func Start(ctx context.Context, spec Spec, opts Options) (*Client, error) {
	if opts.Custodian == nil {
		return nil, errors.New("acp: Options.Custodian is required")
	}
	if len(spec.Argv) == 0 {
		return nil, errors.New("acp: empty command")
	}
	opts.fill()
	c := &Client{
		opts:       opts,
		stderr:     tail{n: DefaultStderrTail},
		readerDone: make(chan struct{}),
		stderrDone: make(chan struct{}),
		watchDone:  make(chan struct{}),
		joined:     make(chan struct{}),
		turns:      map[string]*turn{},
		promptIDs:  map[string]string{},
		loads:      map[string]int{},
		cancelled:  map[string]bool{},
	}
	if opts.FSRoot != "" {
		fs, err := openFSRoot(opts.FSRoot)
		if err != nil {
			return nil, err
		}
		fs.owner = opts.FSOwner
		c.fs = fs
	}
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.Dir, cmd.Env = spec.Dir, spec.Env
	scope, err := opts.Custodian.StartWith(ctx, cmd, custody.StartOptions{Limits: opts.Limits})
	if err != nil {
		c.fs.close()
		return nil, fmt.Errorf("acp: starting %s: %w", spec.Argv[0], err)
	}
	c.scope = scope
	c.sdkR, c.sdkW = io.Pipe()
	c.conn = sdk.NewClientSideConnection((*sdkClient)(c), &outWriter{c: c, w: scope.Stdin()}, c.sdkR)
	// The SDK would log a bad line's payload; none reaches it, and any
	// attribute that could carry one is dropped. Its other diagnostics
	// ("connection closed") go to our logger at debug level.
	c.conn.SetLogger(slog.New(debugHandler{opts.Logger.Handler()}))
	go c.drainStderr()
	go c.read()
	go c.watchSDK()

	caps := sdk.ClientCapabilities{Fs: sdk.FileSystemCapabilities{ReadTextFile: c.fs != nil, WriteTextFile: c.fs != nil}}
	if opts.Ask != nil {
		caps.Elicitation = &sdk.ElicitationCapabilities{Form: &sdk.ElicitationFormCapabilities{}}
	}
	resp, err := c.conn.Initialize(ctx, sdk.InitializeRequest{
		ProtocolVersion:    sdk.ProtocolVersionNumber,
		ClientInfo:         &sdk.Implementation{Name: opts.ClientName, Version: opts.ClientVersion},
		ClientCapabilities: caps,
	})
	if err != nil {
		err = c.callErr(ctx, "initialize", err)
		_, cerr := c.Close(context.Background())
		if cerr == nil {
			// Nobody else could join the client the caller never gets.
			_ = c.Wait(context.Background())
		}
		return nil, errors.Join(err, cerr)
	}
	c.init = resp
	return c, nil
}

// MoveFSRoot tells the client that the folder it serves fs/* requests in
// (Options.FSRoot) was renamed to dir: paths the agent sends are taken as
// inside dir from now on (the files are those of the folder opened at the
// start, whatever its name). Without an FSRoot it does nothing.
func (c *Client) MoveFSRoot(dir string) error {
	if c.fs == nil {
		return nil
	}
	return c.fs.moved(dir)
}

// Initialize is the agent's answer to initialize: its capabilities, info
// and auth methods.
func (c *Client) Initialize() sdk.InitializeResponse { return c.init }

// Done is closed once the agent's stdout has ended (it exited, or Close
// ran).
func (c *Client) Done() <-chan struct{} { return c.readerDone }

// Pid is the agent process's pid.
func (c *Client) Pid() int { return c.scope.Pid() }

// Exited is closed once the agent's process (its custody scope's leader)
// has exited; until then its Pid names it (a warm pool reveals a room's
// folders in that process's mount view).
func (c *Client) Exited() <-chan struct{} { return c.scope.Exited() }

// Stderr is the tail of what the agent wrote to stderr.
func (c *Client) Stderr() string { return c.stderr.String() }

// Malformed is how many lines from the agent were dropped as malformed.
func (c *Client) Malformed() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.malformed
}

// Closure reports how the agent ended (valid after Close).
func (c *Client) Closure() Closure {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closure
}

// Receipt is the custody receipt once Close succeeded, else nil.
func (c *Client) Receipt() *custody.Receipt { return c.scope.Receipt() }

// Usage reads what the agent's custody scope has used (custody's
// Scope.Usage).
func (c *Client) Usage() custody.Usage { return c.scope.Usage() }

// ResetPeak starts a new window for the scope's peak memory.
func (c *Client) ResetPeak() error { return c.scope.ResetPeak() }

// HoldUntil freezes the agent's processes at deadline unless called again
// with a later one (custody's Scope.HoldUntil).
func (c *Client) HoldUntil(deadline time.Time) error { return c.scope.HoldUntil(deadline) }

// Kill ends the agent's processes at once, without Close's grace.
func (c *Client) Kill() error { return c.scope.Kill() }

// Close ends the agent: stdin closed, CloseGrace for stdout EOF, then the
// custody scope closed (SIGTERM, SIGKILL, every descendant confirmed gone),
// and returns the scope's receipt. Running requests fail.
//
// Close never waits for user code: Events, Permission and Ask may still
// be running when it returns (the contexts of Permission and Ask have
// ended); Wait joins them. So Close is safe to call from any callback,
// Events included (called from the reader, a Close there waits out
// CloseGrace, for the reader cannot see the agent's EOF meanwhile).
// Idempotent: a later call returns the same result, or retries a custody
// Close that failed.
func (c *Client) Close(ctx context.Context) (*custody.Receipt, error) {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		t0 := time.Now()
		_ = c.scope.Stdin().Close()
		t := time.NewTimer(c.opts.CloseGrace)
		select {
		case <-c.readerDone:
			c.mu.Lock()
			c.closure = Closure{StdoutEOF: true, After: time.Since(t0)}
			c.mu.Unlock()
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	})
	r, err := c.scope.Close(ctx)
	if err != nil {
		return nil, fmt.Errorf("acp: closing the agent: %w", err)
	}
	// Custody ended every process that could hold the pipes; this releases
	// the readers in any case, and a write into an SDK that stopped reading.
	c.scope.CloseOutput()
	c.sdkR.CloseWithError(ErrClosed)
	// The rest ends without Close: the reader once its callback returned,
	// the handlers once theirs did. Wait joins it all.
	c.joinOnce.Do(func() { go c.join() })
	return r, nil
}

// join waits for every goroutine of the client to end, then releases the
// fs root; it closes joined.
func (c *Client) join() {
	defer close(c.joined)
	<-c.readerDone
	<-c.stderrDone
	<-c.watchDone
	// The SDK cancels its handlers' contexts once its reader ends.
	c.hmu.Lock()
	c.hclosed = true
	c.hmu.Unlock()
	c.handlers.Wait()
	c.fs.close()
}

// Wait waits until everything the client started has ended once Close
// released the agent: the callbacks (Events, Permission, Ask) returned,
// every goroutine of the client gone, the fs root released. It returns
// with ctx's error first. Wait must not be called from a callback: it
// would wait for its own caller.
func (c *Client) Wait(ctx context.Context) error {
	select {
	case <-c.joined:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("acp: wait: %w", context.Cause(ctx))
	}
}

// watchSDK closes the SDK's input once the SDK stopped on its own (its
// notification queue overflowed): read() would block writing into the
// pipe nobody reads, and the turn would never end.
func (c *Client) watchSDK() {
	defer close(c.watchDone)
	select {
	case <-c.conn.Done():
		select {
		case <-c.readerDone:
			// The agent's output ended first (read closes readerDone before
			// the SDK's input): the SDK only saw its EOF.
			return
		default:
		}
		c.mu.Lock()
		c.sdkStopped = ErrConnectionStopped
		c.mu.Unlock()
		c.opts.Logger.Error("acp: the SDK stopped reading the agent's output; the agent must be closed")
		c.sdkR.CloseWithError(ErrConnectionStopped)
	case <-c.readerDone:
	}
}

// enter registers a running handler; false once Close waits for them.
func (c *Client) enter() bool {
	c.hmu.Lock()
	defer c.hmu.Unlock()
	if c.hclosed {
		return false
	}
	c.handlers.Add(1)
	return true
}

func (c *Client) drainStderr() {
	defer close(c.stderrDone)
	_, _ = io.Copy(&c.stderr, c.scope.Stderr())
}

// callErr turns the SDK's error for a request into ours: an agent that
// exited gives an ExitError, a ctx that ended gives ctx's error.
func (c *Client) callErr(ctx context.Context, what string, err error) error {
	select {
	case <-c.readerDone:
		c.mu.Lock()
		closed, stopped := c.closed, c.stopped()
		c.mu.Unlock()
		switch {
		case closed:
			return fmt.Errorf("acp: %s: %w", what, ErrClosed)
		case stopped:
			return fmt.Errorf("acp: %s: %w", what, ErrConnectionStopped)
		}
		return fmt.Errorf("acp: %s: %w", what, c.exitError())
	default:
	}
	if ctx.Err() != nil {
		return fmt.Errorf("acp: %s: %w", what, context.Cause(ctx))
	}
	return fmt.Errorf("acp: %s: %w", what, err)
}

// stopped reports whether the SDK stopped while the agent's output still
// ran. c.mu held.
func (c *Client) stopped() bool { return c.sdkStopped != nil }

func (c *Client) exitError() *ExitError {
	e := &ExitError{}
	t := time.NewTimer(exitStatusWait)
	defer t.Stop()
	expired := false
	select {
	case <-c.scope.Exited():
		e.Status = c.scope.ExitErr()
	case <-t.C:
		expired = true
	}
	if !expired {
		// The stderr drain ends at the pipe's EOF, just after the exit
		// (later if a descendant holds it: the same bound).
		select {
		case <-c.stderrDone:
		case <-t.C:
		}
	}
	tail := strings.TrimSpace(c.stderr.String())
	if len(tail) > exitStderrTail {
		tail = tail[len(tail)-exitStderrTail:]
		if i := strings.IndexByte(tail, '\n'); i >= 0 {
			tail = tail[i+1:]
		}
	}
	e.Stderr = tail
	return e
}

// read passes the agent's stdout to the SDK, line by line: malformed lines
// are reported and dropped, session/update notifications decoded here.
// Reporting an update before passing on any later line keeps a prompt's
// updates ahead of its response.
func (c *Client) read() {
	// readerDone is closed before the SDK sees EOF: a request the SDK
	// then fails ("peer disconnected") is reported as the agent's exit.
	defer c.sdkW.Close()
	defer close(c.readerDone)
	lr := newLineReader(c.scope.Stdout(), c.opts.MaxLineBytes)
	for {
		line, err := lr.next()
		var le *LineError
		if errors.As(err, &le) {
			c.reportMalformed(le)
			continue
		}
		if err != nil {
			return
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		out, le := c.route(lr.n, line)
		if le != nil {
			c.reportMalformed(le)
			continue
		}
		if out == nil {
			continue
		}
		// The SDK reads all the time (requests go to goroutines, responses
		// to buffered channels, notifications other than updates never reach
		// it); if it stops nonetheless, watchSDK fails this write.
		if _, err := c.sdkW.Write(append(out, '\n')); err != nil {
			c.opts.Logger.Error("acp: the SDK stopped reading", "err", err)
			return
		}
	}
}

// envelope is a JSON-RPC message as read checks it.
type envelope struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

// clientRequests are the methods the client answers: sent without an id
// they would run as notifications (the SDK's single notification
// goroutine blocked on a person's answer, its queue overflowing).
var clientRequests = map[string]bool{
	sdk.ClientMethodSessionRequestPermission: true,
	sdk.ClientMethodFsReadTextFile:           true, sdk.ClientMethodFsWriteTextFile: true,
	sdk.ClientMethodTerminalCreate: true, sdk.ClientMethodTerminalKill: true, sdk.ClientMethodTerminalOutput: true,
	sdk.ClientMethodTerminalRelease: true, sdk.ClientMethodTerminalWaitForExit: true,
	sdk.ClientMethodElicitationCreate: true,
	sdk.ClientMethodMcpConnect:        true, sdk.ClientMethodMcpDisconnect: true, sdk.ClientMethodMcpMessage: true,
}

// route checks one line as the SDK would take it: what to pass on (nil:
// nothing; the line itself, or a repaired copy), or why it is malformed.
// session/update is handled here; so are the other notifications, which
// the client does not act on (unknown ones are allowed by ACP).
func (c *Client) route(n int64, line []byte) ([]byte, *LineError) {
	bad := func(reason string) *LineError { return &LineError{Line: n, Len: int64(len(line)), Reason: reason} }
	var msg envelope
	if err := json.Unmarshal(line, &msg); err != nil {
		return nil, bad("not a JSON-RPC object")
	}
	id := bytes.TrimSpace(msg.ID)
	if string(id) == "null" {
		id = nil // JSON-RPC: a null id is no id the client could answer or match
	}
	switch {
	case msg.Method != "" && id == nil:
		if msg.Method == sdk.ClientMethodSessionUpdate {
			c.update(n, len(line), msg.Params)
			return nil, nil
		}
		if clientRequests[msg.Method] {
			return nil, bad("a request without an id")
		}
		return nil, nil
	case msg.Method != "":
		if !validID(id) {
			return nil, bad("a request whose id is neither a string nor a number")
		}
		return line, nil
	case id == nil:
		return nil, bad("neither a request, a notification nor a response with an id")
	case !validID(id):
		return nil, bad("a response whose id is neither a string nor a number")
	}
	c.answered(id)
	if len(msg.Error) == 0 || string(bytes.TrimSpace(msg.Error)) == "null" {
		return line, nil
	}
	var e struct {
		Code    *int    `json:"code"`
		Message *string `json:"message"`
	}
	if json.Unmarshal(msg.Error, &e) == nil && e.Code != nil && e.Message != nil {
		return line, nil
	}
	// The SDK could not parse it and would drop it, leaving the request to
	// wait for its deadline: it gets an internal error of ours instead.
	fixed, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": json.RawMessage(id),
		"error": map[string]any{"code": -32603, "message": "acp: the agent answered with a malformed error"}})
	if err != nil {
		return nil, bad("a response with a malformed error")
	}
	c.reportMalformed(bad("a response whose error is not an object with a code and a message (answered as an internal error)"))
	return fixed, nil
}

// outWriter is the agent's stdin as the SDK writes to it: whole frames,
// one a Write. It notes the ids of session/prompt requests, so that read
// knows, in stream order, when a prompt was answered (see answered).
type outWriter struct {
	c *Client
	w io.Writer
}

func (o *outWriter) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte(`"session/prompt"`)) {
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				SessionID string `json:"sessionId"`
			} `json:"params"`
		}
		if json.Unmarshal(b, &m) == nil && m.Method == sdk.AgentMethodSessionPrompt && len(m.ID) > 0 {
			o.c.mu.Lock()
			o.c.promptIDs[idKey(m.ID)] = m.Params.SessionID
			t := o.c.turns[m.Params.SessionID]
			o.c.mu.Unlock()
			if t != nil {
				// Written (or failed): a cancel may follow it now.
				defer t.sentOnce.Do(func() { close(t.sent) })
			}
		}
	}
	return o.w.Write(b)
}

// answered marks the prompt a response answers (if it is one): from this
// line on, the session's turn updates are late.
func (c *Client) answered(id []byte) {
	k := idKey(id)
	c.mu.Lock()
	defer c.mu.Unlock()
	session, ok := c.promptIDs[k]
	if !ok {
		return
	}
	delete(c.promptIDs, k)
	if t := c.turns[session]; t != nil {
		t.answered = true
	}
}

// idKey is a JSON-RPC id as a map key: numbers in their decoded form.
func idKey(id []byte) string {
	id = bytes.TrimSpace(id)
	if len(id) > 0 && id[0] != '"' {
		var n json.Number
		if json.Unmarshal(id, &n) == nil {
			if f, err := n.Float64(); err == nil {
				return strconv.FormatFloat(f, 'g', -1, 64)
			}
		}
	}
	return string(id)
}

// validID reports whether id is a JSON string or number.
func validID(id []byte) bool {
	if len(id) == 0 {
		return false
	}
	if id[0] == '"' {
		var s string
		return json.Unmarshal(id, &s) == nil
	}
	var f json.Number
	return json.Unmarshal(id, &f) == nil
}

func (c *Client) reportMalformed(le *LineError) {
	c.mu.Lock()
	c.malformed++
	c.mu.Unlock()
	c.opts.Logger.Warn("acp: dropped a malformed line from the agent", "line", le.Line, "bytes", le.Len, "reason", le.Reason)
	c.emit(Event{Type: TypeMalformed, Err: le})
}

func (c *Client) emit(ev Event) {
	if c.opts.Events != nil {
		c.opts.Events(ev)
	}
}

// debugHandler logs every record of the SDK at debug level, without the
// attributes that can carry a line's payload.
type debugHandler struct{ h slog.Handler }

// payloadAttrs are the SDK's attributes that hold what the agent sent.
var payloadAttrs = map[string]bool{"raw": true, "id": true, "requestId": true, "line": true, "params": true}

func (d debugHandler) Enabled(ctx context.Context, _ slog.Level) bool {
	return d.h.Enabled(ctx, slog.LevelDebug)
}

func (d debugHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, slog.LevelDebug, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		if payloadAttrs[a.Key] {
			a = slog.String(a.Key, "(dropped)")
		}
		out.AddAttrs(a)
		return true
	})
	return d.h.Handle(ctx, out)
}

func (d debugHandler) WithAttrs(as []slog.Attr) slog.Handler { return debugHandler{d.h.WithAttrs(as)} }
func (d debugHandler) WithGroup(g string) slog.Handler       { return debugHandler{d.h.WithGroup(g)} }
