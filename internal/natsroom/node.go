// Package natsroom runs rooms on several hosts over NATS JetStream: a
// lease per room in a replicated KV bucket, a fenced per-room event log,
// a per-room FIFO inbox, wake-ups for unowned rooms, and placement by free
// agent slots. It implements room.Store and room.Cluster.
package natsroom

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// NodeConfig configures an embedded JetStream node.
type NodeConfig struct {
	// Name is the node's server name, unique in the cluster.
	Name string
	// StoreDir holds the node's JetStream data.
	StoreDir string
	// Listen is the client address (host:port; port 0 picks one); ""
	// serves in-process clients only on a single node, and a loopback
	// port of the system's choosing on a clustered one (the server needs
	// one to route).
	Listen string
	// ClusterListen is the route address; "" runs a single node.
	ClusterListen string
	// ClusterAdvertise, if set, is the route address told to peers
	// (behind NAT; tests set a dead port so that peers reach a node only
	// through the routes given, which they can cut).
	ClusterAdvertise string
	// Routes are the other nodes' route URLs (nats://host:port).
	Routes []string
	// ClusterName defaults to "agenthost".
	ClusterName string
	// Secret is the cluster's shared secret: a client must sign in with
	// the key derived from it (Auth), and a route with the password
	// derived from it, or be refused. Empty leaves both listeners open
	// (in-process tests only: serve always gives one).
	Secret string
	// TLS, when set, encrypts the routes with mutual TLS (each node's
	// certificate signed by TLS.CA, verified both ways) and the client
	// listener (clients verify the node against TLS.CA).
	TLS    *TLSFiles
	Logger *slog.Logger
}

// TLSFiles are PEM files: the CA that signs every node's certificate, and
// this node's certificate and key (for a client of an external server,
// the certificate and key are optional: a client certificate).
type TLSFiles struct {
	CA, Cert, Key string
}

// TLSDir is the TLSFiles of a directory holding ca.pem, cert.pem and
// key.pem (serve's --nats-tls).
func TLSDir(dir string) *TLSFiles {
	return &TLSFiles{CA: dir + "/ca.pem", Cert: dir + "/cert.pem", Key: dir + "/key.pem"}
}

// Node is an embedded JetStream server. Create it with StartNode and
// Close it last.
//
// The server disables its JetStream when its store cannot write (a full
// disk: nats-server shuts JetStream down and never turns it on again); a
// node then serves no replica, and when every node's store shares the full
// disk, the whole cluster stops. The Node watches for that: Health says
// so, and once its store has room again (free space, and a test write that
// succeeds) it restarts the server in place, with the same options (it
// rejoins its JetStream cluster with the state kept on disk); the
// in-process connections reconnect to it. Every step of that restart has
// a deadline: one that passes it is reported (Health, the log,
// NodeStatus) and the restart is tried again once the step returns.
type Node struct {
	cfg    NodeConfig
	secret string
	lg     *logger

	mu       sync.Mutex
	ns       *server.Server
	disabled time.Time // since when JetStream is disabled (zero: it is not)
	restarts int
	lastErr  error // the last restart's failure
	closed   bool
	conns    []*nats.Conn // Connect's, to see them reconnect after a restart
	// pending is the restart's step running now (nil: none), kept after
	// its deadline passed until it returns: the next attempt waits for it.
	pending *restartStep
	stalls  int // steps that passed their deadline
	// limits bound the restart's steps; fault, if set, runs at the start
	// of each (tests block a step with it).
	limits restartLimits
	fault  func(step string)

	reconnected chan struct{} // a client reconnected (buffered: one)
	stop        chan struct{}
	done        chan struct{}
}

// restartStep is a step of a restart in place that runs now.
type restartStep struct {
	name  string
	since time.Time
	limit time.Duration
	stuck bool          // its deadline passed
	done  chan struct{} // closed when it returns
}

// restartLimits bound the steps of a restart in place: the test write in
// the store, the old server's shutdown, the new server's start (until it
// accepts clients), and the node's clients' reconnection to it.
type restartLimits struct {
	probe, shutdown, start, clients time.Duration
}

// defaultRestartLimits are generous: a step that takes longer is stuck
// (a store that does not answer, a shutdown waiting on a goroutine that
// never ends), and waiting longer would not help.
func defaultRestartLimits() restartLimits {
	return restartLimits{probe: 30 * time.Second, shutdown: 30 * time.Second, start: 30 * time.Second, clients: 15 * time.Second}
}

// Steps of a restart in place, as Health, the log and NodeStatus name
// them.
const (
	stepProbe    = "test write in the store"
	stepShutdown = "shutdown of the old server"
	stepStart    = "start of the new server"
	stepClients  = "reconnection of the node's clients"
)

// routeUser is the user name every route signs in with (the password is
// derived from the cluster's secret).
const routeUser = "agenthost-route"

// derive is an HMAC of the cluster's secret for one purpose.
func derive(secret, purpose string) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("agenthost nats " + purpose))
	return m.Sum(nil)
}

// clientKey is the nkey clients sign in with (the server knows only its
// public half, and no secret crosses the wire).
func clientKey(secret string) (nkeys.KeyPair, error) {
	return nkeys.FromRawSeed(nkeys.PrefixByteUser, derive(secret, "client")[:32])
}

func routePassword(secret string) string { return hex.EncodeToString(derive(secret, "route")) }

// Auth is the client option that signs in to a node secured with secret.
func Auth(secret string) (nats.Option, error) {
	kp, err := clientKey(secret)
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	return nats.Nkey(pub, kp.Sign), nil
}

// StartNode starts an embedded JetStream node and waits until it accepts
// clients (a cluster's JetStream may need a few more seconds to elect its
// meta leader: Setup waits for that). A listener that cannot bind fails it
// at once, naming the address and the reason.
func StartNode(cfg NodeConfig) (*Node, error) {
	if cfg.Name == "" || cfg.StoreDir == "" {
		return nil, errors.New("natsroom: node name and store dir are required")
	}
	if cfg.Listen == "" && cfg.ClusterListen != "" {
		// The server starts its routes only once a client listener is
		// up: a clustered node has one, on loopback, signed in to like
		// any other (its own host connects in-process all the same).
		cfg.Listen = "127.0.0.1:0"
	}
	if _, err := nodeOptions(cfg, true); err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, secret: cfg.Secret, lg: &logger{l: cfg.Logger}, limits: defaultRestartLimits(),
		reconnected: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	ns, err := n.startServer(ctx)
	cancel()
	if err != nil {
		return nil, err
	}
	n.ns = ns
	go n.watch()
	return n, nil
}

// startServer starts a server with the node's options and waits until it
// accepts clients, or ctx ends.
func (n *Node) startServer(ctx context.Context) (*server.Server, error) {
	opts, err := nodeOptions(n.cfg, false)
	if err != nil {
		return nil, err
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsroom: %w", err)
	}
	n.lg.reset()
	ns.SetLoggerV2(n.lg, false, false, false)
	ns.Start()
	for start := time.Now(); !ns.ReadyForConnections(100 * time.Millisecond); {
		if why := n.lg.fatal(); why != "" {
			ns.Shutdown()
			return nil, fmt.Errorf("natsroom: the embedded node did not start: %s", why)
		}
		if ctx.Err() != nil {
			ns.Shutdown()
			return nil, fmt.Errorf("natsroom: embedded node not ready after %v", time.Since(start).Round(time.Second))
		}
	}
	return ns, nil
}

// nodeOptions are the server options of cfg (check: the listeners are
// checked free first, at the node's first start).
func nodeOptions(cfg NodeConfig, check bool) (*server.Options, error) {
	opts := &server.Options{
		ServerName: cfg.Name, JetStream: true, StoreDir: cfg.StoreDir,
		NoSigs: true, NoLog: true, DontListen: cfg.Listen == "",
	}
	if cfg.Listen != "" {
		h, p, err := splitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("natsroom: --nats-listen: %w", err)
		}
		if check {
			if err := canListen("--nats-listen", h, p); err != nil {
				return nil, err
			}
		}
		opts.Host, opts.Port = h, p
		if p == 0 {
			opts.Port = server.RANDOM_PORT
		}
	}
	if cfg.Secret != "" {
		kp, err := clientKey(cfg.Secret)
		if err != nil {
			return nil, err
		}
		pub, _ := kp.PublicKey()
		opts.Nkeys = []*server.NkeyUser{{Nkey: pub}}
	}
	var tlsConf *tls.Config
	if cfg.TLS != nil {
		var err error
		if tlsConf, err = server.GenTLSConfig(&server.TLSConfigOpts{CertFile: cfg.TLS.Cert, KeyFile: cfg.TLS.Key, CaFile: cfg.TLS.CA}); err != nil {
			return nil, fmt.Errorf("natsroom: --nats-tls: %w", err)
		}
		if cfg.Listen != "" {
			opts.TLSConfig, opts.TLS, opts.TLSTimeout = tlsConf.Clone(), true, 5
		}
	}
	if cfg.ClusterListen != "" {
		h, p, err := splitHostPort(cfg.ClusterListen)
		if err != nil {
			return nil, fmt.Errorf("natsroom: --nats-cluster-listen: %w", err)
		}
		if check {
			if err := canListen("--nats-cluster-listen", h, p); err != nil {
				return nil, err
			}
		}
		name := cfg.ClusterName
		if name == "" {
			name = "agenthost"
		}
		opts.Cluster = server.ClusterOpts{Name: name, Host: h, Port: p, Advertise: cfg.ClusterAdvertise}
		var user *url.Userinfo
		if cfg.Secret != "" {
			opts.Cluster.Username, opts.Cluster.Password = routeUser, routePassword(cfg.Secret)
			user = url.UserPassword(routeUser, opts.Cluster.Password)
		}
		if tlsConf != nil {
			// Routes verify each other: both ends are client and server.
			rt := tlsConf.Clone()
			rt.ClientAuth, rt.RootCAs = tls.RequireAndVerifyClientCert, rt.ClientCAs
			opts.Cluster.TLSConfig, opts.Cluster.TLSTimeout = rt, 5
		}
		for _, r := range cfg.Routes {
			u, err := url.Parse(strings.TrimSpace(r))
			if err != nil || u.Host == "" {
				return nil, fmt.Errorf("natsroom: route %q is not a nats://host:port URL", r)
			}
			if user != nil {
				u.User = user
			}
			opts.Routes = append(opts.Routes, u)
		}
	}
	return opts, nil
}

// canListen fails with the address and the reason when addr cannot be
// bound now (the server would only log it, then time out).
func canListen(flag, host string, port int) error {
	if port == 0 {
		return nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("natsroom: %s %s: cannot listen there (%w); is another node or program using the port?", flag, net.JoinHostPort(host, strconv.Itoa(port)), err)
	}
	return l.Close()
}

// server is the node's server now (another after a restart).
func (n *Node) server() *server.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ns
}

// InProcessConn is a connection to the node's server now: the in-process
// clients reconnect through it after a restart.
func (n *Node) InProcessConn() (net.Conn, error) { return n.server().InProcessConn() }

// Connect returns an in-process client connection to the node, signed in
// (it reconnects to the node's server after a restart in place).
func (n *Node) Connect(name string) (*nats.Conn, error) {
	opts := []nats.Option{nats.InProcessServer(n), nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) { n.kick() }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			// (Without one the client prints to stderr: a restart in
			// place leaves a watch's consumer behind, for one.)
			n.lg.log(slog.LevelDebug, "a client's asynchronous error", "client", name, "err", err)
		})}
	if n.secret != "" {
		auth, err := Auth(n.secret)
		if err != nil {
			return nil, err
		}
		opts = append(opts, auth)
	}
	nc, err := nats.Connect("", opts...)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.conns = append(slices.DeleteFunc(n.conns, (*nats.Conn).IsClosed), nc)
	n.mu.Unlock()
	return nc, nil
}

// kick tells a restart waiting for the clients that one reconnected.
func (n *Node) kick() {
	select {
	case n.reconnected <- struct{}{}:
	default:
	}
}

// ClientURL is the node's client URL ("" when it listens for none).
func (n *Node) ClientURL() string {
	if a := n.server().Addr(); a != nil {
		return "nats://" + a.String()
	}
	return ""
}

// ClusterAddr is the node's route listener address ("" for none).
func (n *Node) ClusterAddr() string {
	if a := n.server().ClusterAddr(); a != nil {
		return a.String()
	}
	return ""
}

// NumRoutes is how many routes the node has to other nodes now.
func (n *Node) NumRoutes() int { return n.server().NumRoutes() }

// Close shuts the node down and waits for it.
func (n *Node) Close() {
	n.mu.Lock()
	closed := n.closed
	n.closed = true
	n.mu.Unlock()
	if !closed {
		close(n.stop)
	}
	<-n.done
	// A restart's step still running (stuck): the server is the one it
	// leaves once it returns. Neither wait is unbounded: a node that
	// cannot stop is left to the process's exit, and says so.
	n.mu.Lock()
	p := n.pending
	n.mu.Unlock()
	if p != nil {
		select {
		case <-p.done:
		case <-time.After(closeWithin):
			n.lg.log(slog.LevelError, "closing the node: a step of the NATS server's restart in place has not returned; left running", "step", p.name, "since", p.since.UTC().Format(time.RFC3339))
			return
		}
	}
	ns := n.server()
	down := make(chan struct{})
	go func() {
		defer close(down)
		ns.Shutdown()
		ns.WaitForShutdown()
	}()
	select {
	case <-down:
	case <-time.After(closeWithin):
		n.lg.log(slog.LevelError, "closing the node: the NATS server's shutdown has not returned; left running", "after", closeWithin)
	}
}

// closeWithin bounds each of Close's waits (a clustered server's shutdown
// takes seconds; one that takes a minute will not end).
const closeWithin = time.Minute

// NodeStatus is what a node tells of its JetStream (serve's /healthz and
// /metrics).
type NodeStatus struct {
	// JetStream: the node's JetStream runs (false: disabled, its store
	// could not write).
	JetStream bool
	// DisabledSince is when this node saw it disabled (zero: it is not).
	DisabledSince time.Time
	// Restarts is how many times the node restarted its server in place.
	Restarts int
	// Stalls is how many steps of a restart in place passed their
	// deadline (each was given up on and tried again once it returned).
	Stalls int
	// Stuck names the restart's step that passed its deadline and has
	// not returned yet ("" for none).
	Stuck string
}

// Status is the node's JetStream status now.
func (n *Node) Status() NodeStatus {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := NodeStatus{JetStream: n.disabled.IsZero(), DisabledSince: n.disabled, Restarts: n.restarts, Stalls: n.stalls}
	if p := n.pending; p != nil && p.stuck {
		st.Stuck = p.name
	}
	return st
}

// Health is nil while the node's JetStream runs, else why not, and what
// the node waits for (for /healthz, and a 503's reason).
func (n *Node) Health() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.disabled.IsZero() {
		return nil
	}
	why := fmt.Sprintf("JetStream is disabled on node %s since %s (its store at %s could not write: is the disk full?); the node restarts it once the store has room",
		n.cfg.Name, n.disabled.UTC().Format(time.RFC3339), n.cfg.StoreDir)
	if p := n.pending; p != nil && p.stuck {
		age := time.Since(p.since)
		why += fmt.Sprintf("; restarting it is stuck: the %s has not returned for %v (its deadline: %v), and the node tries again once it does",
			p.name, age.Round(time.Second), p.limit)
		if age > 4*p.limit {
			// A hang inside nats-server does not end by itself.
			why += "; if it does not, restart this node"
		}
	} else if n.lastErr != nil {
		why += " (last try: " + n.lastErr.Error() + ")"
	}
	return errors.New(why)
}

// Bounds of the node's watch: how often it looks, how much free space its
// store needs (the smaller of storeRoom and a quarter of the disk) and the
// size of the test write, before it restarts a server whose JetStream was
// disabled.
const (
	watchEvery = time.Second
	storeRoom  = 64 << 20
	probeSize  = 1 << 20
)

// watch restarts the server in place once its JetStream was disabled and
// its store has room again (see Node).
func (n *Node) watch() {
	defer close(n.done)
	tick := time.NewTicker(watchEvery)
	defer tick.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-tick.C:
		}
		n.check()
	}
}

// check is a round of the watch. Every step of a restart in place has a
// deadline (restartLimits): one that passes it is reported (Health, the
// log, NodeStatus.Stalls) and left to return while the watch goes on; the
// restart starts over at the first round after it returned. No lock is
// held across a step.
func (n *Node) check() {
	n.mu.Lock()
	if p := n.pending; p != nil {
		select {
		case <-p.done:
			n.pending = nil
		default:
			n.mu.Unlock()
			return // still stuck
		}
	}
	ns, down, limits := n.ns, !n.disabled.IsZero(), n.limits
	n.mu.Unlock()
	if ns.JetStreamEnabled() {
		if down {
			n.rejoined(limits.clients) // a restart whose clients were not all back
		}
		return
	}
	if !down {
		n.mu.Lock()
		n.disabled = time.Now()
		n.mu.Unlock()
		n.lg.log(slog.LevelError, "JetStream is disabled on this node (its store could not write: is the disk full?); the node restarts it once the store has room")
	}
	if err := n.step(stepProbe, limits.probe, func(context.Context) error { return storeHasRoom(n.cfg.StoreDir) }); err != nil {
		n.failed(err)
		return
	}
	n.lg.log(slog.LevelWarn, "the node's store has room again; restarting the embedded NATS server in place")
	if err := n.step(stepShutdown, limits.shutdown, func(context.Context) error {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil
	}); err != nil {
		n.failed(err)
		return
	}
	if err := n.step(stepStart, limits.start, n.startInPlace); err != nil {
		// The old server is gone: the next round tries again (its
		// JetStream reads as disabled).
		n.failed(err)
		n.lg.log(slog.LevelError, "restarting the embedded NATS server failed; trying again", "err", err)
		return
	}
	n.rejoined(limits.clients)
}

// startInPlace starts the new server and makes it the node's.
func (n *Node) startInPlace(ctx context.Context) error {
	nns, err := n.startServer(ctx)
	if err != nil {
		return err
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		nns.Shutdown()
		nns.WaitForShutdown()
		return errNodeClosed
	}
	n.ns, n.restarts = nns, n.restarts+1
	n.mu.Unlock()
	return nil
}

// rejoined ends a restart once the node's clients are connected to its
// new server.
func (n *Node) rejoined(limit time.Duration) {
	if err := n.step(stepClients, limit, n.awaitClients); err != nil {
		n.failed(err)
		return
	}
	n.mu.Lock()
	n.disabled, n.lastErr = time.Time{}, nil
	n.mu.Unlock()
	n.lg.log(slog.LevelWarn, "the embedded NATS server runs again, its JetStream enabled, and the node's clients are connected to it")
}

// awaitClients waits until every open client of Connect is connected to
// the node's server now (they reconnect by themselves), or ctx ends.
func (n *Node) awaitClients(ctx context.Context) error {
	for {
		n.mu.Lock()
		n.conns = slices.DeleteFunc(n.conns, (*nats.Conn).IsClosed)
		conns, id := slices.Clone(n.conns), n.ns.ID()
		n.mu.Unlock()
		away := 0
		for _, nc := range conns {
			// (Connected to the old server: it has not seen it go yet.)
			if !nc.IsConnected() || nc.ConnectedServerId() != id {
				away++
			}
		}
		if away == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of the node's %d clients not connected to the new server", away, len(conns))
		case <-n.reconnected:
		}
	}
}

// errNodeClosed ends a restart's step when the node closes.
var errNodeClosed = errors.New("natsroom: the node is closed")

// step runs fn, a step of a restart in place, and waits for it within
// limit (ctx ends there; fn may not heed it: a server's shutdown cannot be
// cancelled). A step that passes its deadline is logged, counted and
// left pending: check starts nothing else until it returns.
func (n *Node) step(name string, limit time.Duration, fn func(ctx context.Context) error) error {
	p := &restartStep{name: name, since: time.Now(), limit: limit, done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	n.mu.Lock()
	n.pending = p
	fault := n.fault
	n.mu.Unlock()
	var err error
	go func() {
		defer close(p.done)
		if fault != nil {
			fault(name)
		}
		err = fn(ctx)
	}()
	select {
	case <-p.done:
		n.mu.Lock()
		n.pending = nil
		n.mu.Unlock()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	case <-n.stop:
		return errNodeClosed // (pending: Close waits for it)
	case <-ctx.Done():
	}
	n.mu.Lock()
	p.stuck = true
	n.stalls++
	n.mu.Unlock()
	n.lg.log(slog.LevelError, "restarting the embedded NATS server in place: a step passed its deadline; the node tries again once it returns", "step", name, "deadline", limit)
	return fmt.Errorf("the %s did not return within %v", name, limit)
}

// failed records why the last try of a restart failed (Health tells it).
func (n *Node) failed(err error) {
	n.mu.Lock()
	n.lastErr = err
	n.mu.Unlock()
}

// storeHasRoom checks the store's disk has room for JetStream again:
// enough free space, and a test write (with its sync) that succeeds.
func storeHasRoom(dir string) error {
	if free, size, err := diskSpace(dir); err == nil {
		need := min(uint64(storeRoom), size/4)
		if free < need {
			return fmt.Errorf("%d MiB free on the store's disk, %d MiB needed", free>>20, need>>20)
		}
	}
	f, err := os.CreateTemp(dir, ".room-probe-*")
	if err != nil {
		return fmt.Errorf("a test write in the store: %w", err)
	}
	defer os.Remove(f.Name())
	_, err = f.Write(make([]byte, probeSize))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("a test write in the store: %w", err)
	}
	return nil
}

// DialOptions are how Dial signs in to external servers: a credentials
// file (a .creds file with a user JWT, or a file holding an nkey seed) and
// TLS (the CA the servers' certificates are signed with, and optionally
// a client certificate).
type DialOptions struct {
	Creds string
	TLS   *TLSFiles
}

// Dial connects to external NATS servers (comma-separated URLs allowed).
func Dial(urls []string, name string, do DialOptions) (*nats.Conn, error) {
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1)}
	if do.Creds != "" {
		b, err := os.ReadFile(do.Creds)
		if err != nil {
			return nil, fmt.Errorf("natsroom: --nats-creds: %w", err)
		}
		if _, err := nkeys.ParseDecoratedJWT(b); err == nil && strings.Contains(string(b), "BEGIN NATS USER JWT") {
			opts = append(opts, nats.UserCredentials(do.Creds))
		} else {
			o, err := nats.NkeyOptionFromSeed(do.Creds)
			if err != nil {
				return nil, fmt.Errorf("natsroom: --nats-creds %s: neither a user JWT nor an nkey seed: %w", do.Creds, err)
			}
			opts = append(opts, o)
		}
	}
	if do.TLS != nil {
		if do.TLS.CA != "" {
			opts = append(opts, nats.RootCAs(do.TLS.CA))
		}
		if _, err := os.Stat(do.TLS.Cert); err == nil {
			opts = append(opts, nats.ClientCert(do.TLS.Cert, do.TLS.Key))
		}
	}
	return nats.Connect(strings.Join(urls, ","), opts...)
}

func splitHostPort(addr string) (string, int, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", addr)
	}
	if h == "" {
		h = "127.0.0.1"
	}
	return h, port, nil
}

// logger routes the server's log lines to slog (warnings and errors) and
// keeps its first fatal error (a listener that could not bind) for
// StartNode to report. A warning repeated word for word is logged once per
// repeatWarnEvery: the server says "Waiting for routing to be
// established..." every second or two while its peers are down (its own
// rate limit forgets what it said), which is what the node waits for, not
// news each time.
type logger struct {
	l     *slog.Logger
	mu    sync.Mutex
	first string
	// warned is when each recent warning was last logged (at most
	// maxRepeatKeys, the oldest dropped).
	warned map[string]time.Time
	now    func() time.Time // tests move the clock
}

// repeatWarnEvery is how often a warning repeated word for word is logged
// (the README's "every 10 s").
const repeatWarnEvery = 10 * time.Second

// maxRepeatKeys bounds the warnings remembered for repeatWarnEvery.
const maxRepeatKeys = 64

// repeated reports whether msg was logged less than repeatWarnEvery ago,
// and otherwise records it as logged now.
func (l *logger) repeated(msg string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.now != nil {
		now = l.now()
	}
	if last, ok := l.warned[msg]; ok && now.Sub(last) < repeatWarnEvery {
		return true
	}
	if l.warned == nil {
		l.warned = map[string]time.Time{}
	}
	if len(l.warned) >= maxRepeatKeys {
		oldest := ""
		for k, t := range l.warned {
			if oldest == "" || t.Before(l.warned[oldest]) {
				oldest = k
			}
		}
		delete(l.warned, oldest)
	}
	l.warned[msg] = now
	return false
}

func (l *logger) fatal() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.first
}

// reset forgets the fatal error of a server before (a restart).
func (l *logger) reset() {
	l.mu.Lock()
	l.first = ""
	l.mu.Unlock()
}

func (l *logger) log(level slog.Level, msg string, args ...any) {
	if l.l != nil {
		l.l.Log(context.Background(), level, "natsroom: "+msg, args...)
	}
}

// logf logs one of the server's own lines.
func (l *logger) logf(level slog.Level, f string, a ...any) {
	if l.l != nil {
		l.l.Log(context.Background(), level, "nats: "+fmt.Sprintf(f, a...))
	}
}

func (l *logger) Noticef(string, ...any) {}
func (l *logger) Warnf(f string, a ...any) {
	if !l.repeated(fmt.Sprintf(f, a...)) {
		l.logf(slog.LevelWarn, f, a...)
	}
}
func (l *logger) Errorf(f string, a ...any) { l.logf(errorLevel(f), f, a...) }

// routeRetryFormat is the NATS server's line for a route it could not dial
// yet (its first attempt, then every so often): at a cluster's start, peers
// not up yet; later, a peer that is down. Both are the cluster waiting, not
// a failure of this node, so they are warnings.
const routeRetryFormat = "Error trying to connect to route (attempt %v): %v"

func errorLevel(format string) slog.Level {
	if format == routeRetryFormat {
		return slog.LevelWarn
	}
	return slog.LevelError
}
func (l *logger) Debugf(string, ...any) {}
func (l *logger) Tracef(string, ...any) {}
func (l *logger) Fatalf(f string, a ...any) {
	l.mu.Lock()
	if l.first == "" {
		l.first = fmt.Sprintf(f, a...)
	}
	l.mu.Unlock()
	l.logf(slog.LevelError, f, a...)
}
