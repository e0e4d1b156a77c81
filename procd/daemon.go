//go:build unix

package procd

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agenthost/agenthost/custody"
)

// A starting daemon retries a busy lock lockTries times, lockRetry apart.
const (
	lockTries = 20
	lockRetry = 10 * time.Millisecond
)

// daemon is one running daemon.
type daemon struct {
	opts       Options
	log        *slog.Logger
	instanceID string
	token      string
	cust       *custody.Custodian
	ln         *net.UnixListener
	sockDir    string

	wg   sync.WaitGroup // connections, process goroutines, the sweeper
	quit chan struct{}  // closed when shutdown begins
	stop chan string    // asks Run to shut down, with the reason

	mu       sync.Mutex
	procs    map[string]*proc
	seq      uint64 // the last record's proc.seq
	conns    int
	owner    net.Conn
	handoff  *Ticket
	closing  bool
	idleFrom time.Time
	receipts []custody.Receipt // of shutdown
	shutDone chan struct{}     // closed when shutdown's receipts are in
}

// Run runs a daemon for opts.DataDir in the foreground until it is shut
// down (the shutdown request, its owner gone without handoff, a handoff
// not claimed, idleness without owner) or ctx ends; every process is ended
// (with receipts, in the log) before it returns. ErrRunning when another
// daemon holds the data dir.
func Run(ctx context.Context, opts Options) error {
	if opts.DataDir == "" {
		return errors.New("procd: Options.DataDir is required")
	}
	opts.fill()
	// Clients probe the lock for a moment (lockFree): a lock held that
	// briefly is retried, one a daemon holds is not released in time.
	var lock *os.File
	for try := 0; ; try++ {
		l, ok, err := lockService(opts.DataDir)
		if err != nil {
			return fmt.Errorf("procd: lock: %w", err)
		}
		if ok {
			lock = l
			break
		}
		if try == lockTries {
			return ErrRunning
		}
		time.Sleep(lockRetry)
	}
	defer lock.Close()
	d := &daemon{
		opts:     opts,
		log:      opts.Logger,
		procs:    map[string]*proc{},
		quit:     make(chan struct{}),
		stop:     make(chan string, 1),
		shutDone: make(chan struct{}),
		idleFrom: time.Now(),
	}
	d.instanceID, d.token = randHex(16), randHex(16)
	dir := procdDir(opts.DataDir)
	// We hold the lock: any socket dir or ticket left here is a dead
	// daemon's.
	sweepStale(dir)
	if err := d.listen(dir); err != nil {
		return err
	}
	defer func() {
		os.RemoveAll(d.sockDir)
		os.Remove(filepath.Join(dir, sockDirFile))
	}()
	cust, err := custody.New(opts.Custody)
	if err != nil {
		d.ln.Close()
		return fmt.Errorf("procd: custody: %w", err)
	}
	d.cust = cust
	svc := service{InstanceID: d.instanceID, PID: os.Getpid(), Socket: filepath.Join(d.sockDir, "sock"), Token: d.token}
	svc.Protocol, svc.Protocols = d.pong()
	if err := writeJSON(filepath.Join(dir, serviceFile), svc); err != nil {
		d.ln.Close()
		cust.Close()
		return fmt.Errorf("procd: registration: %w", err)
	}
	d.log.Info("procd: serving", "instance", d.instanceID, "pid", os.Getpid())

	d.wg.Add(2)
	go d.accept()
	go d.sweep()
	var reason string
	select {
	case reason = <-d.stop:
	case <-ctx.Done():
		reason = "cancelled"
	}
	d.shutdown(reason)
	d.ln.Close()
	d.wg.Wait()
	// Unregister only what is still ours.
	if cur, err := readService(opts.DataDir); err == nil && cur.InstanceID == d.instanceID {
		os.Remove(filepath.Join(dir, serviceFile))
	}
	os.Remove(filepath.Join(dir, ticketFile))
	err = cust.Close()
	d.log.Info("procd: exited", "reason", reason)
	return err
}

// sweepStale removes a dead daemon's socket dirs (its temp one too, see
// sockDirFile) and ticket.
func sweepStale(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), "s-") {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, sockDirFile)); err == nil {
		if t := string(b); isOurTempSockDir(t) {
			os.RemoveAll(t)
		}
		os.Remove(filepath.Join(dir, sockDirFile))
	}
	os.Remove(filepath.Join(dir, ticketFile))
}

// isOurTempSockDir: path names a temp socket dir a daemon of ours made
// (what the record says is checked before anything is removed).
func isOurTempSockDir(path string) bool {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || !strings.HasPrefix(filepath.Base(path), tempSockPrefix) {
		return false
	}
	fi, err := os.Lstat(path)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Getuid()
}

// listen makes the 0700 socket dir and the 0600 socket.
func (d *daemon) listen(dir string) error {
	sockDir := filepath.Join(dir, "s-"+d.instanceID[:12])
	if len(filepath.Join(sockDir, "sock")) > socketPathLimit {
		// A deep data dir: the socket goes to a private temp dir instead
		// (MkdirTemp makes it 0700).
		t, err := os.MkdirTemp("", tempSockPrefix)
		if err != nil {
			return fmt.Errorf("procd: socket dir: %w", err)
		}
		// Recorded before anything listens there: a daemon killed from
		// here on leaves the record for the next one to sweep.
		if err := writeFile(filepath.Join(dir, sockDirFile), []byte(t)); err != nil {
			os.RemoveAll(t)
			return fmt.Errorf("procd: socket dir: %w", err)
		}
		sockDir = t
	} else if err := os.Mkdir(sockDir, 0o700); err != nil {
		return fmt.Errorf("procd: socket dir: %w", err)
	}
	if err := os.Chmod(sockDir, 0o700); err != nil {
		return err
	}
	d.sockDir = sockDir
	path := filepath.Join(sockDir, "sock")
	if len(path) > socketPathLimit {
		return fmt.Errorf("procd: socket path %s is longer than %d bytes", path, socketPathLimit)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		os.RemoveAll(sockDir)
		return fmt.Errorf("procd: listen: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		os.RemoveAll(sockDir)
		return err
	}
	d.ln = ln
	return nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (d *daemon) requestStop(reason string) {
	select {
	case d.stop <- reason:
	default:
	}
}

// Accept errors other than the listener's close (EMFILE, ENFILE, ENOBUFS,
// ECONNABORTED) are waited out, as net/http does: from acceptBackoffMin,
// doubling up to acceptBackoffMax, while the connection waits in the
// backlog. Ending the loop would leave a daemon that holds the data dir
// and never answers again.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

func (d *daemon) accept() {
	defer d.wg.Done()
	var backoff time.Duration
	for {
		conn, err := d.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if backoff == 0 {
				backoff = acceptBackoffMin
				d.log.Warn("procd: accepting a connection failed; retrying", "err", err)
			} else {
				backoff = min(2*backoff, acceptBackoffMax)
			}
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-d.quit:
				t.Stop()
				return
			}
			continue
		}
		if backoff != 0 {
			d.log.Info("procd: accepting connections again")
			backoff = 0
		}
		d.mu.Lock()
		d.conns++
		d.mu.Unlock()
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.serveConn(conn)
			conn.Close()
			d.mu.Lock()
			d.conns--
			if d.conns == 0 {
				d.idleFrom = time.Now()
			}
			d.mu.Unlock()
		}()
	}
}

// sweep ends unattended processes of an unowned daemon and stops an idle one.
func (d *daemon) sweep() {
	defer d.wg.Done()
	period := min(d.opts.Unattended/4, d.opts.IdleExit/4, time.Second)
	t := time.NewTicker(max(period, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-d.quit:
			return
		case <-t.C:
		}
		now := time.Now()
		var stale []*proc
		d.mu.Lock()
		if d.handoff != nil && now.After(d.handoff.ExpiresAt) {
			d.mu.Unlock()
			d.log.Warn("procd: handoff not claimed in time")
			d.requestStop("handoff expired")
			return
		}
		owned := d.owner != nil || d.handoff != nil
		for _, p := range d.procs {
			if owned || p.watchers > 0 {
				p.touched = now
			} else if now.Sub(p.touched) > d.opts.Unattended {
				stale = append(stale, p)
			}
		}
		idle := !owned && len(d.procs) == 0 && d.conns == 0 && now.Sub(d.idleFrom) > d.opts.IdleExit
		d.mu.Unlock()
		for _, p := range stale {
			if r, err := d.terminate(p, codeTerminated); err == nil {
				d.log.Info("procd: ended an unattended process", "id", p.id, "receipt", r.String())
			}
		}
		if idle {
			d.requestStop("idle without owner")
			return
		}
	}
}

// shutdown ends every process (receipts kept for the shutdown reply).
func (d *daemon) shutdown(reason string) {
	d.mu.Lock()
	if d.closing {
		d.mu.Unlock()
		<-d.shutDone
		return
	}
	d.closing = true
	close(d.quit)
	ps := make([]*proc, 0, len(d.procs))
	for _, p := range d.procs {
		ps = append(ps, p)
	}
	if d.owner != nil {
		d.owner.Close()
	}
	d.mu.Unlock()
	d.log.Info("procd: shutting down", "reason", reason, "processes", len(ps))
	var mu sync.Mutex
	var rs []custody.Receipt
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := d.terminate(p, codeShutdown)
			if err != nil {
				d.log.Error("procd: ending a process at shutdown", "id", p.id, "err", err)
				return
			}
			d.log.Info("procd: ended", "id", p.id, "receipt", r.String())
			mu.Lock()
			rs = append(rs, *r)
			mu.Unlock()
		}()
	}
	wg.Wait()
	sort.Slice(rs, func(i, j int) bool { return rs[i].Scope < rs[j].Scope })
	d.mu.Lock()
	d.receipts = rs
	d.mu.Unlock()
	close(d.shutDone)
}

// conn is one client connection.
type conn struct {
	net.Conn
	wmu sync.Mutex
}

func (c *conn) send(r Reply) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return writeFrame(c.Conn, r)
}

func (c *conn) fail(code, msg string) {
	_ = c.send(Reply{Type: TypeError, Code: code, Message: msg})
}

// reqErr is an error reply a handler returns.
type reqErr struct{ code, msg string }

func (e *reqErr) Error() string { return e.msg }

func invalid(op, format string, args ...any) error {
	return &reqErr{codeInvalid, "invalid " + op + " request: " + fmt.Sprintf(format, args...)}
}

func errf(code, format string, args ...any) error {
	return &reqErr{code, fmt.Sprintf(format, args...)}
}

// readRequest reads one envelope and checks its token and protocol
// version; it returns the op and the raw request.
func (d *daemon) readRequest(c *conn) (string, json.RawMessage, error) {
	b, err := readFrame(c)
	if err != nil {
		return "", nil, err
	}
	op, v, raw, err := parseVersioned(b, d.token)
	if err == nil {
		err = d.checkVersion(op, v)
	}
	return op, raw, err
}

// parseEnvelope checks one frame's envelope and token, and returns its op
// and raw request.
func parseEnvelope(b []byte, token string) (string, json.RawMessage, error) {
	op, _, raw, err := parseVersioned(b, token)
	return op, raw, err
}

// parseVersioned is parseEnvelope that also returns the protocol version
// the envelope names (0: none).
func parseVersioned(b []byte, token string) (string, int, json.RawMessage, error) {
	var env envelope
	if err := json.Unmarshal(b, &env); err != nil {
		return "", 0, nil, errf(codeInvalid, "invalid envelope: %v", err)
	}
	if subtle.ConstantTimeCompare([]byte(env.Token), []byte(token)) != 1 {
		return "", 0, nil, errf(codeForbidden, "forbidden: missing or wrong token")
	}
	var head struct {
		Op string `json:"op"`
	}
	if len(env.Request) == 0 || json.Unmarshal(env.Request, &head) != nil || head.Op == "" {
		return "", 0, nil, errf(codeInvalid, "invalid envelope: request.op is required")
	}
	return head.Op, env.Protocol, env.Request, nil
}

func (d *daemon) serveConn(nc *net.UnixConn) {
	c := &conn{Conn: nc}
	if uid, err := peerUID(nc); err != nil || uid != os.Getuid() {
		// Said, then closed: the peer learns why.
		c.fail(codeForbidden, "forbidden: peer is not the daemon's user")
		return
	}
	_ = nc.SetReadDeadline(time.Now().Add(firstFrameTimeout))
	op, raw, err := d.readRequest(c)
	_ = nc.SetReadDeadline(time.Time{})
	if err != nil {
		var re *reqErr
		if errors.As(err, &re) {
			c.fail(re.code, re.msg)
		} else if errors.Is(err, ErrProtocol) {
			// An oversized frame: said, then the connection closes (the
			// rest of the frame is not read).
			c.fail(codeInvalid, "invalid frame: over the 8 MiB limit")
		}
		return
	}
	h, ok := handlers[op]
	if !ok {
		c.fail(codeUnsupported, "unsupported request: "+op)
		return
	}
	if err := h(d, c, op, raw); err != nil {
		var re *reqErr
		if errors.As(err, &re) {
			c.fail(re.code, re.msg)
		} else {
			c.fail(codeFailed, op+": "+err.Error())
		}
	}
}

// handler serves one request; it replies itself, or returns an error to be
// sent as the reply.
type handler func(d *daemon, c *conn, op string, raw json.RawMessage) error

var handlers map[string]handler

func init() {
	handlers = map[string]handler{
		"ping":            (*daemon).opPing,
		"create_pipe":     (*daemon).opCreatePipe,
		"create_pty":      (*daemon).opCreatePTY,
		"write":           (*daemon).opWrite,
		"resize":          (*daemon).opResize,
		"list":            (*daemon).opList,
		"get":             (*daemon).opGet,
		"usage":           (*daemon).opUsage,
		"wait":            (*daemon).opWait,
		"signal":          (*daemon).opSignal,
		"set_metadata":    (*daemon).opSetMetadata,
		"trim":            (*daemon).opTrim,
		"terminate":       (*daemon).opTerminate,
		"subscribe":       (*daemon).opSubscribe,
		"own":             (*daemon).opOwn,
		"prepare_handoff": (*daemon).opPrepareHandoffAlone,
		"shutdown":        (*daemon).opShutdown,
	}
}

// decode decodes raw strictly into v (unknown fields are errors).
func decode(op string, raw json.RawMessage, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalid(op, "%v", err)
	}
	return nil
}

func (d *daemon) opPing(c *conn, op string, raw json.RawMessage) error {
	var r struct {
		Op string `json:"op"`
	}
	if err := decode(op, raw, &r); err != nil {
		return err
	}
	pong := Reply{Type: TypePong, InstanceID: d.instanceID}
	pong.Protocol, pong.Protocols = d.pong()
	return c.send(pong)
}

// pong is what the daemon says of its versions, in ping and in its
// registration: the oldest it speaks (so that a client before
// negotiation, which demands its own version exactly, uses a daemon that
// speaks it), and the range.
func (d *daemon) pong() (int, *Range) {
	w := d.opts.wire
	if w.preNegotiation {
		return w.Max, nil
	}
	r := w.Range
	return r.Min, &r
}

// checkVersion refuses a request in a protocol version the daemon does
// not speak (ping, which negotiates the version, excepted). No request
// differs between the versions spoken yet; one that will reads the
// version here.
func (d *daemon) checkVersion(op string, v int) error {
	w := d.opts.wire
	if v == 0 {
		v = preNegotiation
	}
	if op == "ping" || w.preNegotiation || w.contains(v) {
		return nil
	}
	return errf(codeProtocol, "unsupported protocol %d: this daemon speaks protocol %s", v, w.Range)
}

func (d *daemon) opShutdown(c *conn, op string, raw json.RawMessage) error {
	var r struct {
		Op string `json:"op"`
	}
	if err := decode(op, raw, &r); err != nil {
		return err
	}
	d.requestStop("shutdown requested")
	select {
	case <-d.shutDone:
	case <-time.After(2 * DefaultTerminate):
		return errf(codeFailed, "shutdown: processes not ended in time")
	}
	d.mu.Lock()
	rs := d.receipts
	d.mu.Unlock()
	return c.send(Reply{Type: TypeShutdown, Receipts: rs})
}

// opOwn makes this connection the owner, then holds it: prepare_handoff
// arrives on it, and its closing is the owner leaving.
func (d *daemon) opOwn(c *conn, op string, raw json.RawMessage) error {
	var r struct {
		Op         string `json:"op"`
		InstanceID string `json:"instance_id"`
		Ticket     string `json:"ticket"`
	}
	if err := decode(op, raw, &r); err != nil {
		return err
	}
	if r.InstanceID != d.instanceID {
		return errf(codeHandoff, "handoff refused: this daemon is instance %s", d.instanceID)
	}
	d.mu.Lock()
	switch {
	case d.closing:
		d.mu.Unlock()
		return errf(codeShutdown, "daemon shutting down")
	case r.Ticket != "":
		h := d.handoff
		if h == nil && d.owner != nil {
			// No handoff under way: a stale ticket must not make its
			// holder end a live owner's daemon.
			d.mu.Unlock()
			return errf(codeOwned, "daemon already owned (no handoff is pending)")
		}
		if h == nil || subtle.ConstantTimeCompare([]byte(r.Ticket), []byte(h.Ticket)) != 1 {
			d.mu.Unlock()
			return errf(codeHandoff, "handoff refused: no such ticket (wrong or already spent)")
		}
		if time.Now().After(h.ExpiresAt) {
			d.mu.Unlock()
			return errf(codeHandoff, "handoff refused: the ticket expired")
		}
		d.handoff = nil // single use
		os.Remove(filepath.Join(procdDir(d.opts.DataDir), ticketFile))
		if d.owner != nil {
			d.owner.Close() // the old owner is cut off
		}
	case d.handoff != nil:
		d.mu.Unlock()
		return errf(codeHandoff, "handoff refused: a handoff is pending; own needs its ticket")
	case d.owner != nil:
		d.mu.Unlock()
		return errf(codeOwned, "daemon already owned")
	}
	d.owner = c
	d.mu.Unlock()
	d.log.Info("procd: owned", "handoff", r.Ticket != "")
	if err := c.send(Reply{Type: TypeOwned, InstanceID: d.instanceID}); err != nil {
		d.ownerGone(c)
		return nil
	}
	for {
		op, raw, err := d.readRequest(c)
		if err != nil {
			var re *reqErr
			if errors.As(err, &re) {
				c.fail(re.code, re.msg)
				continue
			}
			d.ownerGone(c)
			return nil
		}
		if op != "prepare_handoff" {
			c.fail(codeUnsupported, "unsupported request: "+op+" (on the owner connection only prepare_handoff)")
			continue
		}
		if err := d.prepareHandoff(c, op, raw); err != nil {
			var re *reqErr
			if errors.As(err, &re) {
				c.fail(re.code, re.msg)
			} else {
				c.fail(codeFailed, err.Error())
			}
		}
	}
}

// ownerGone: the owner's connection closed. Without a prepared handoff
// everything ends.
func (d *daemon) ownerGone(c *conn) {
	d.mu.Lock()
	if d.owner != c {
		d.mu.Unlock()
		return // cut off by a new owner
	}
	d.owner = nil
	pending := d.handoff != nil
	d.mu.Unlock()
	if !pending {
		d.log.Info("procd: owner left without handoff")
		d.requestStop("owner left without handoff")
	}
}

func (d *daemon) prepareHandoff(c *conn, op string, raw json.RawMessage) error {
	var r struct {
		Op string `json:"op"`
	}
	if err := decode(op, raw, &r); err != nil {
		return err
	}
	t := Ticket{InstanceID: d.instanceID, Ticket: randHex(16), ExpiresAt: time.Now().Add(d.opts.HandoffTTL).UTC()}
	d.mu.Lock()
	if d.owner != c {
		d.mu.Unlock()
		return errf(codeForbidden, "forbidden: prepare_handoff needs the owner")
	}
	if err := writeJSON(filepath.Join(procdDir(d.opts.DataDir), ticketFile), t); err != nil {
		d.mu.Unlock()
		return fmt.Errorf("writing the ticket: %w", err)
	}
	d.handoff = &t
	d.mu.Unlock()
	d.log.Info("procd: handoff prepared", "expires", t.ExpiresAt)
	return c.send(Reply{Type: TypeHandoff, Ticket: &t})
}

// opPrepareHandoffAlone: prepare_handoff on a connection of its own is
// not the owner's.
func (d *daemon) opPrepareHandoffAlone(c *conn, op string, raw json.RawMessage) error {
	return errf(codeForbidden, "forbidden: prepare_handoff is accepted on the owner connection only")
}

// watchClose returns a channel closed when the peer closes c (or sends
// anything more, which a waiting request does not expect).
func watchClose(c *conn, wg *sync.WaitGroup) <-chan struct{} {
	ch := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(ch)
		var b [1]byte
		_, _ = c.Read(b[:])
	}()
	return ch
}
