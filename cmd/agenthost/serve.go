package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/natsroom"
	"github.com/agenthost/agenthost/internal/rpcagent"
	"github.com/agenthost/agenthost/internal/server"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Defaults of serve.
const (
	defaultListen = "127.0.0.1:7420"
	// tokenFile is the generated token's file in the data dir.
	tokenFile = "token"
	// shutdownBudget bounds the HTTP side of a shutdown (the rooms have
	// their own budget, room.DefaultShutdownBudget).
	shutdownBudget = 10 * time.Second
	tokenEnv       = "AGENTHOST_TOKEN"
)

type serveFlags struct {
	listen, data, agent, model, workspaces  string
	maxResident                             int
	idleAfter, turnTimeout, approvalTimeout time.Duration
	approvalMode, config                    string
	// NATS modes
	node, natsListen, natsClusterListen, role string
	nats, natsRoutes                          []string
	natsEmbedded                              bool
	natsReplicas                              int
}

// serveEnv maps each overridable flag to its environment variable.
var serveEnv = map[string]string{
	"listen": "AGENTHOST_LISTEN", "data": "AGENTHOST_DATA", "agent": "AGENTHOST_AGENT", "model": "AGENTHOST_MODEL",
	"workspaces": "AGENTHOST_WORKSPACES", "max-resident": "AGENTHOST_MAX_RESIDENT", "idle-after": "AGENTHOST_IDLE_AFTER",
	"turn-timeout": "AGENTHOST_TURN_TIMEOUT", "approval-timeout": "AGENTHOST_APPROVAL_TIMEOUT",
	"approval-mode": "AGENTHOST_APPROVAL_MODE",
}

func newServeCmd(verbose func() bool) *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve [flags] [-- COMMAND ARGS...]",
		Short: "Serve rooms over HTTP: the API, the live event stream and the page",
		Long: `Serve rooms over HTTP until SIGINT or SIGTERM.

Each room has its own agent (omp by default, on agenthost's built-in scripted
model unless --model names a real one), session, workspace and event log, kept
in --data. After "--", COMMAND ARGS... runs verbatim as every room's agent.

The API needs a bearer token: AGENTHOST_TOKEN, or one generated on the first
start into a file in the data dir (mode 0600). The start line prints the
address to open. Settings come from flags, then AGENTHOST_* environment
variables (AGENTHOST_LISTEN, AGENTHOST_DATA, ...), then --config FILE (YAML,
or TOML for a .toml file, with the flags' names as keys), then defaults.

One server per data dir: a second one refuses to start.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			var custom []string
			if dash := cmd.ArgsLenAtDash(); dash >= 0 {
				if dash != 0 {
					return &exitError{2, errors.New("serve: takes no arguments before --")}
				}
				if custom = args; len(custom) == 0 {
					return &exitError{2, errors.New("serve: -- must be followed by a command")}
				}
			} else if len(args) > 0 {
				return &exitError{2, fmt.Errorf("serve: unexpected argument %q (a command goes after --)", args[0])}
			}
			if err := applyOverrides(cmd.Flags(), f.config); err != nil {
				return &exitError{2, err}
			}
			level := slog.LevelInfo
			if verbose() {
				level = slog.LevelDebug
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			return runServe(cmd.Context(), cmd.OutOrStdout(), log, f, custom)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", defaultListen, "address to listen on")
	fl.StringVar(&f.data, "data", "", "data dir: the store, the token and the agents' homes (default: a per-user dir)")
	fl.StringVar(&f.agent, "agent", "omp", "the rooms' agent: omp or pi")
	fl.StringVar(&f.model, "model", "", "provider/model for the agents (default: the built-in scripted model)")
	fl.StringVar(&f.workspaces, "workspaces", "", "the rooms' folders (default: DATA/workspaces)")
	fl.IntVar(&f.maxResident, "max-resident", room.DefaultMaxResident, "agents running at once")
	fl.DurationVar(&f.idleAfter, "idle-after", room.DefaultIdleAfter, "release a room's agent after this long idle")
	fl.DurationVar(&f.turnTimeout, "turn-timeout", room.DefaultTurnTimeout, "bound on a turn's active time")
	fl.DurationVar(&f.approvalTimeout, "approval-timeout", room.DefaultApprovalTimeout, "deny an approval nobody decided after this long")
	fl.StringVar(&f.approvalMode, "approval-mode", room.ApprovalAsk, "always-ask or yolo")
	fl.StringVar(&f.config, "config", "", "a config file (YAML, or TOML for .toml)")
	fl.StringVar(&f.node, "node", "", "this node's name in a NATS cluster (needed with --nats or --nats-embedded)")
	fl.StringSliceVar(&f.nats, "nats", nil, "external JetStream: server URL(s), comma-separated")
	fl.BoolVar(&f.natsEmbedded, "nats-embedded", false, "run an embedded JetStream node in this process")
	fl.StringVar(&f.natsListen, "nats-listen", "", "the embedded node's client address (host:port)")
	fl.StringVar(&f.natsClusterListen, "nats-cluster-listen", "", "the embedded node's cluster (route) address (host:port)")
	fl.StringSliceVar(&f.natsRoutes, "nats-routes", nil, "the other embedded nodes' route URLs (nats://host:port), comma-separated")
	fl.StringVar(&f.role, "role", natsroom.RoleBoth, "in a NATS cluster: both, frontend (API only) or worker (runs agents only)")
	fl.IntVar(&f.natsReplicas, "nats-replicas", 0, "replicas of the rooms' streams (default: 3 with routes or --nats, else 1)")
	return cmd
}

// applyOverrides fills the flags not given on the command line from the
// environment, then from the config file.
func applyOverrides(fl *pflag.FlagSet, configPath string) error {
	if configPath == "" {
		configPath = os.Getenv("AGENTHOST_CONFIG")
	}
	var file map[string]string
	if configPath != "" {
		var err error
		if file, err = readConfig(configPath); err != nil {
			return err
		}
		for k := range file {
			if _, ok := serveEnv[k]; !ok {
				return fmt.Errorf("config %s: unknown setting %q", filepath.Base(configPath), k)
			}
		}
	}
	for name, env := range serveEnv {
		if fl.Changed(name) {
			continue
		}
		src, v := "", ""
		if e, ok := os.LookupEnv(env); ok && e != "" {
			src, v = env, e
		} else if c, ok := file[name]; ok {
			src, v = "config "+name, c
		} else {
			continue
		}
		if err := fl.Set(name, v); err != nil {
			return fmt.Errorf("%s: %w", src, err)
		}
	}
	return nil
}

// defaultDataDir is $XDG_DATA_HOME/agenthost or ~/.local/share/agenthost.
func defaultDataDir() (string, error) {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "agenthost"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no data dir: give --data (%w)", err)
	}
	return filepath.Join(home, ".local", "share", "agenthost"), nil
}

// loadToken returns AGENTHOST_TOKEN, or the data dir's token, generating
// it on first use; created says the file was just written.
func loadToken(data string) (tok, path string, created bool, err error) {
	if t := strings.TrimSpace(os.Getenv(tokenEnv)); t != "" {
		return t, "", false, nil
	}
	path = filepath.Join(data, tokenFile)
	if b, err := os.ReadFile(path); err == nil {
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, path, false, nil
		}
	} else if !os.IsNotExist(err) {
		return "", "", false, fmt.Errorf("reading the token: %w", err)
	}
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", false, err
	}
	tok = hex.EncodeToString(b[:])
	// O_EXCL: two servers racing on a fresh dir cannot both write one.
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", "", false, fmt.Errorf("writing the token: %w", err)
	}
	_, err = fh.WriteString(tok + "\n")
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", "", false, fmt.Errorf("writing the token: %w", err)
	}
	return tok, path, true, nil
}

func runServe(ctx context.Context, stdout io.Writer, log *slog.Logger, f serveFlags, custom []string) (err error) {
	if f.approvalMode != room.ApprovalAsk && f.approvalMode != room.ApprovalYolo {
		return &exitError{2, fmt.Errorf("serve: --approval-mode %q: want always-ask or yolo", f.approvalMode)}
	}
	kind := agents.Kind(f.agent)
	if len(custom) == 0 && kind != agents.OMP && kind != agents.Pi {
		return &exitError{2, fmt.Errorf("serve: unknown agent %q (omp or pi)", f.agent)}
	}
	if f.data == "" {
		if f.data, err = defaultDataDir(); err != nil {
			return &exitError{2, err}
		}
	}
	if f.workspaces == "" {
		f.workspaces = filepath.Join(f.data, "workspaces")
	}
	clustered := f.natsEmbedded || len(f.nats) > 0
	if err := checkClusterFlags(f, clustered); err != nil {
		return &exitError{2, err}
	}
	if err := os.MkdirAll(f.data, 0o700); err != nil {
		return fmt.Errorf("serve: data dir: %w", err)
	}

	var rstore room.Store
	var cl *natsroom.Cluster
	if clustered {
		var stop func()
		cl, stop, err = startCluster(f, log)
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		defer stop()
		rstore = cl.Store()
	} else {
		db, err := store.Open(ctx, filepath.Join(f.data, "agenthost.db"), store.Options{Logger: log})
		if errors.Is(err, store.ErrLocked) {
			return fmt.Errorf("serve: another agenthost is already serving the data dir %s (its store is locked); stop it or give another --data", f.data)
		}
		if err != nil {
			return fmt.Errorf("serve: opening the store: %w", err)
		}
		defer func() {
			if cerr := db.Close(); cerr != nil && err == nil {
				err = cerr
			}
		}()
		rstore = room.SQLite(db)
	}
	tok, tokPath, created, err := loadToken(f.data)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}

	// Processes left by a host that died (kill -9) hold nothing we can
	// resume: end them before starting new ones.
	if orphans, ferr := custody.FindOrphans(); ferr == nil && len(orphans) > 0 {
		left, kerr := custody.KillOrphans(ctx, orphans, time.Second)
		if kerr != nil {
			log.Warn("reaping orphans of dead hosts", "found", len(orphans), "still_running", len(left), "err", kerr)
		} else {
			log.Info("reaped orphans of dead hosts", "ended", len(orphans))
		}
	} else if ferr != nil {
		log.Debug("looking for orphans of dead hosts", "err", ferr) // not on this platform
	}

	cust, err := custody.New(custody.Options{Logger: log})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer func() {
		if cerr := cust.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	topts := rpcagent.Options{Custodian: cust, Logger: log}
	if len(custom) == 0 {
		if topts.Install, err = agents.Find(); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		if f.model == "" {
			sim := modelsim.New(modelsim.Options{Logger: log})
			if err := sim.Start(ctx); err != nil {
				return fmt.Errorf("serve: starting the built-in model: %w", err)
			}
			defer sim.Close()
			topts.ModelURL = sim.URL()
		}
	}
	tr, err := rpcagent.New(topts)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	ropts := room.Options{
		Store: rstore, Transport: tr, Root: filepath.Join(f.data, "rooms"), Workspaces: f.workspaces, MaxResident: f.maxResident, IdleAfter: f.idleAfter,
		Config: room.Config{Agent: string(kind), Command: custom, Model: f.model, ApprovalMode: f.approvalMode,
			TurnTimeout: f.turnTimeout, ApprovalTimeout: f.approvalTimeout},
		Logger: log,
	}
	if cl != nil {
		ropts.Cluster = cl
	}
	m, err := room.New(ropts)
	if err != nil {
		return &exitError{2, fmt.Errorf("serve: %w", err)}
	}
	if err := m.Start(ctx); err != nil {
		return fmt.Errorf("serve: recovering the rooms: %w", err)
	}
	defer func() {
		if cl != nil {
			// No new rooms or inbox entries while the rooms record their
			// shutdown; the leases go after (the deferred stop).
			cl.Stop()
		}
		if cerr := m.Close(); cerr != nil && !errors.Is(cerr, room.ErrClosed) && err == nil {
			err = cerr
		}
	}()
	if cl != nil {
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		err := cl.Start(sctx, m)
		cancel()
		if err != nil {
			return fmt.Errorf("serve: joining the cluster: %w", err)
		}
		log.Info("in the cluster", "node", f.node, "role", f.role)
	}
	if f.role == natsroom.RoleWorker {
		// A worker serves no API: it runs rooms until told to stop.
		fmt.Fprintf(stdout, "agenthost: node %s running rooms (worker)\n", f.node)
		<-ctx.Done()
		log.Info("shutting down")
		return nil
	}
	api, err := server.New(server.Options{Manager: m, Token: tok, Index: server.Page(), Logger: log})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		api.Close()
		return fmt.Errorf("serve: %w", err)
	}
	hs := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()

	addr := "http://" + ln.Addr().String() + "/"
	if tokPath != "" {
		// The page reads the token from the fragment, which browsers
		// never send to the server.
		fmt.Fprintf(stdout, "agenthost: serving rooms at %s#token=%s\n", addr, tok)
		if created {
			fmt.Fprintf(stdout, "agenthost: the API token is kept in %s\n", tokPath)
		}
	} else {
		fmt.Fprintf(stdout, "agenthost: serving rooms at %s (token from %s)\n", addr, tokenEnv)
	}
	log.Info("serving", "addr", ln.Addr().String(), "data", f.data, "agent", f.agent, "built_in_model", f.model == "" && len(custom) == 0)

	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err = <-served:
		api.Close()
		return fmt.Errorf("serve: %w", err)
	}
	// Streams end first (they never go idle), then in-flight requests
	// finish; the rooms close after (deferred), recording receipts.
	api.Close()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownBudget)
	defer cancel()
	if serr := hs.Shutdown(sctx); serr != nil {
		log.Warn("http shutdown", "err", serr)
		_ = hs.Close()
	}
	<-served
	return nil
}

// checkClusterFlags checks the NATS flags go together.
func checkClusterFlags(f serveFlags, clustered bool) error {
	switch {
	case !clustered:
		if f.node != "" || f.natsListen != "" || f.natsClusterListen != "" || len(f.natsRoutes) > 0 || f.role != natsroom.RoleBoth {
			return errors.New("serve: --node, --nats-listen, --nats-cluster-listen, --nats-routes and --role need --nats or --nats-embedded")
		}
		return nil
	case f.natsEmbedded && len(f.nats) > 0:
		return errors.New("serve: give either --nats (external) or --nats-embedded, not both")
	case f.node == "":
		return errors.New("serve: --node NAME is required with --nats or --nats-embedded")
	case len(f.nats) > 0 && (f.natsListen != "" || f.natsClusterListen != "" || len(f.natsRoutes) > 0):
		return errors.New("serve: --nats-listen, --nats-cluster-listen and --nats-routes are for --nats-embedded")
	case len(f.natsRoutes) > 0 && f.natsClusterListen == "":
		return errors.New("serve: --nats-routes needs --nats-cluster-listen")
	}
	switch f.role {
	case natsroom.RoleBoth, natsroom.RoleFrontend, natsroom.RoleWorker:
	default:
		return fmt.Errorf("serve: --role %q: want both, frontend or worker", f.role)
	}
	if err := room.ValidateID(f.node); err != nil || strings.ContainsAny(f.node, " \t") {
		return fmt.Errorf("serve: --node %q: a short name without spaces, dots or slashes", f.node)
	}
	return nil
}

// startCluster starts the embedded node (if any), connects, and returns
// the cluster; stop closes it, the connection and the node, in order.
func startCluster(f serveFlags, log *slog.Logger) (*natsroom.Cluster, func(), error) {
	var node *natsroom.Node
	var nc *nats.Conn
	var err error
	replicas := f.natsReplicas
	if f.natsEmbedded {
		node, err = natsroom.StartNode(natsroom.NodeConfig{Name: f.node, StoreDir: filepath.Join(f.data, "nats", f.node),
			Listen: f.natsListen, ClusterListen: f.natsClusterListen, Routes: f.natsRoutes, Logger: log})
		if err != nil {
			return nil, nil, err
		}
		nc, err = node.Connect("agenthost " + f.node)
		if replicas == 0 {
			replicas = 1
			if len(f.natsRoutes) > 0 {
				replicas = 3
			}
		}
	} else {
		nc, err = natsroom.Dial(f.nats, "agenthost "+f.node)
		if replicas == 0 {
			replicas = 3
		}
	}
	if err != nil {
		if node != nil {
			node.Close()
		}
		return nil, nil, fmt.Errorf("connecting to NATS: %w", err)
	}
	cl, err := natsroom.New(natsroom.Config{Node: f.node, Conn: nc, Replicas: replicas, Slots: f.maxResident,
		Worker: f.role != natsroom.RoleFrontend, Logger: log})
	if err != nil {
		nc.Close()
		if node != nil {
			node.Close()
		}
		return nil, nil, err
	}
	stop := func() {
		cl.Close()
		nc.Close()
		if node != nil {
			node.Close()
		}
	}
	return cl, stop, nil
}
