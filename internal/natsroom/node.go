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
// in-process connections reconnect to it.
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

	stop chan struct{}
	done chan struct{}
}

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
	n := &Node{cfg: cfg, secret: cfg.Secret, lg: &logger{l: cfg.Logger}, stop: make(chan struct{}), done: make(chan struct{})}
	ns, err := n.startServer()
	if err != nil {
		return nil, err
	}
	n.ns = ns
	go n.watch()
	return n, nil
}

// startServer starts a server with the node's options and waits until it
// accepts clients.
func (n *Node) startServer() (*server.Server, error) {
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
	for deadline := time.Now().Add(10 * time.Second); !ns.ReadyForConnections(100 * time.Millisecond); {
		if why := n.lg.fatal(); why != "" {
			ns.Shutdown()
			return nil, fmt.Errorf("natsroom: the embedded node did not start: %s", why)
		}
		if time.Now().After(deadline) {
			ns.Shutdown()
			return nil, errors.New("natsroom: embedded node not ready after 10s")
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
	return nats.Connect("", opts...)
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
	ns := n.server()
	ns.Shutdown()
	ns.WaitForShutdown()
}

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
}

// Status is the node's JetStream status now.
func (n *Node) Status() NodeStatus {
	n.mu.Lock()
	defer n.mu.Unlock()
	return NodeStatus{JetStream: n.disabled.IsZero(), DisabledSince: n.disabled, Restarts: n.restarts}
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
	if n.lastErr != nil {
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
		ns := n.server()
		if ns.JetStreamEnabled() {
			continue
		}
		n.mu.Lock()
		first := n.disabled.IsZero()
		if first {
			n.disabled = time.Now()
		}
		n.mu.Unlock()
		if first {
			n.lg.log(slog.LevelError, "JetStream is disabled on this node (its store could not write: is the disk full?); the node restarts it once the store has room")
		}
		if err := storeHasRoom(n.cfg.StoreDir); err != nil {
			n.mu.Lock()
			n.lastErr = err
			n.mu.Unlock()
			continue
		}
		n.lg.log(slog.LevelWarn, "the node's store has room again; restarting the embedded NATS server in place")
		ns.Shutdown()
		ns.WaitForShutdown()
		nns, err := n.startServer()
		n.mu.Lock()
		if err != nil {
			// The old server is gone: the next round tries again (its
			// JetStream reads as disabled).
			n.lastErr = err
			n.mu.Unlock()
			n.lg.log(slog.LevelError, "restarting the embedded NATS server failed; trying again", "err", err)
			continue
		}
		n.ns, n.restarts, n.lastErr, n.disabled = nns, n.restarts+1, nil, time.Time{}
		n.mu.Unlock()
		n.lg.log(slog.LevelWarn, "the embedded NATS server runs again, its JetStream enabled")
	}
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
