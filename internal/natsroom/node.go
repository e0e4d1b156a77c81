// Package natsroom runs rooms on several hosts over NATS JetStream: a
// lease per room in a replicated KV bucket, a fenced per-room event log,
// a per-room FIFO inbox, wake-ups for unowned rooms, and placement by free
// agent slots. It implements room.Store and room.Cluster.
package natsroom

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// NodeConfig configures an embedded JetStream node.
type NodeConfig struct {
	// Name is the node's server name, unique in the cluster.
	Name string
	// StoreDir holds the node's JetStream data.
	StoreDir string
	// Listen is the client address (host:port; port 0 picks one); ""
	// serves in-process clients only.
	Listen string
	// ClusterListen is the route address; "" runs a single node.
	ClusterListen string
	// ClusterAdvertise, if set, is the route address told to peers
	// (tests set a dead port so that peers reach a node only through the
	// routes given, which they can cut).
	ClusterAdvertise string
	// Routes are the other nodes' route URLs (nats://host:port).
	Routes []string
	// ClusterName defaults to "agenthost".
	ClusterName string
	Logger      *slog.Logger
}

// Node is an embedded JetStream server. Create it with StartNode and
// Close it last.
type Node struct {
	ns *server.Server
}

// StartNode starts an embedded JetStream node and waits until it accepts
// clients (a cluster's JetStream may need a few more seconds to elect its
// meta leader: Setup waits for that).
func StartNode(cfg NodeConfig) (*Node, error) {
	if cfg.Name == "" || cfg.StoreDir == "" {
		return nil, errors.New("natsroom: node name and store dir are required")
	}
	opts := &server.Options{
		ServerName: cfg.Name, JetStream: true, StoreDir: cfg.StoreDir,
		NoSigs: true, NoLog: true, DontListen: cfg.Listen == "",
	}
	if cfg.Listen == "" && cfg.ClusterListen != "" {
		// A clustered node is not ready without a client listener.
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Listen != "" {
		opts.DontListen = false
		h, p, err := splitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("natsroom: --nats-listen: %w", err)
		}
		opts.Host, opts.Port = h, p
		if p == 0 {
			opts.Port = server.RANDOM_PORT
		}
	}
	if cfg.ClusterListen != "" {
		h, p, err := splitHostPort(cfg.ClusterListen)
		if err != nil {
			return nil, fmt.Errorf("natsroom: --nats-cluster-listen: %w", err)
		}
		name := cfg.ClusterName
		if name == "" {
			name = "agenthost"
		}
		opts.Cluster = server.ClusterOpts{Name: name, Host: h, Port: p, Advertise: cfg.ClusterAdvertise}
		for _, r := range cfg.Routes {
			u, err := url.Parse(strings.TrimSpace(r))
			if err != nil || u.Host == "" {
				return nil, fmt.Errorf("natsroom: route %q is not a nats://host:port URL", r)
			}
			opts.Routes = append(opts.Routes, u)
		}
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsroom: %w", err)
	}
	if cfg.Logger != nil {
		ns.SetLoggerV2(&logger{cfg.Logger}, false, false, false)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("natsroom: embedded node not ready after 10s")
	}
	return &Node{ns: ns}, nil
}

// Connect returns a client connection to the node (in-process when it
// serves no client port).
func (n *Node) Connect(name string) (*nats.Conn, error) {
	return nats.Connect("", nats.InProcessServer(n.ns), nats.Name(name), nats.MaxReconnects(-1))
}

// ClientURL is the node's client URL ("" when it listens for none).
func (n *Node) ClientURL() string {
	if a := n.ns.Addr(); a != nil {
		return "nats://" + a.String()
	}
	return ""
}

// ClusterAddr is the node's route listener address ("" for none).
func (n *Node) ClusterAddr() string {
	if a := n.ns.ClusterAddr(); a != nil {
		return a.String()
	}
	return ""
}

// Close shuts the node down and waits for it.
func (n *Node) Close() {
	n.ns.Shutdown()
	n.ns.WaitForShutdown()
}

// Dial connects to external NATS servers (comma-separated URLs allowed).
func Dial(urls []string, name string) (*nats.Conn, error) {
	return nats.Connect(strings.Join(urls, ","), nats.Name(name), nats.MaxReconnects(-1))
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

// logger routes the server's log lines to slog (warnings and errors).
type logger struct{ l *slog.Logger }

func (l *logger) Noticef(string, ...any) {}
func (l *logger) Warnf(f string, a ...any) {
	l.l.Warn("nats: " + fmt.Sprintf(f, a...))
}
func (l *logger) Fatalf(f string, a ...any) { l.l.Error("nats: " + fmt.Sprintf(f, a...)) }
func (l *logger) Errorf(f string, a ...any) { l.l.Error("nats: " + fmt.Sprintf(f, a...)) }
func (l *logger) Debugf(string, ...any)     {}
func (l *logger) Tracef(string, ...any)     {}
