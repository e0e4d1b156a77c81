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
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/acpagent"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/daemonproc"
	"github.com/agenthost/agenthost/internal/gitws"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/natsroom"
	"github.com/agenthost/agenthost/internal/roomgit"
	"github.com/agenthost/agenthost/internal/roomsnap"
	"github.com/agenthost/agenthost/internal/roomsqlite"
	"github.com/agenthost/agenthost/internal/rpcagent"
	"github.com/agenthost/agenthost/internal/rpcagent/piext"
	"github.com/agenthost/agenthost/internal/server"
	"github.com/agenthost/agenthost/internal/snapshot"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/procd"
	"github.com/agenthost/agenthost/room"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
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
	// handoffBudget bounds asking the daemon for a handoff ticket.
	handoffBudget = 10 * time.Second
)

type serveFlags struct {
	listen, data, agent, model, workspaces  string
	transport                               string
	maxResident                             int
	idleAfter, turnTimeout, approvalTimeout time.Duration
	questionTimeout                         time.Duration
	approvalMode, config                    string
	budgetTokens                            int64
	budgetUSD                               float64
	daemon                                  bool
	pool                                    int
	snapshots                               bool
	snapshotMaxFile                         int64
	gitFileRoots                            []string
	// NATS modes
	node, natsListen, natsClusterListen, role string
	natsClusterAdvertise                      string
	nats, natsRoutes                          []string
	natsEmbedded                              bool
	natsReplicas                              int
	confine                                   confineFlags
	resources                                 resourceFlags
	natsSecretFile, natsTLS, natsCreds        string
	// agentEnv are the variables passed to agents by name (--agent-env).
	agentEnv []string
	// OpenTelemetry: the collector (--otlp), whether agents export to it
	// too (--otlp-agents), and tool inputs on spans (--otlp-tool-input).
	otlp                     string
	otlpAgents, otlpToolArgs bool

	// A room token's rate limits (0: none).
	tokenMessages, tokenStreams int
}

// serveEnv maps each overridable flag to its environment variable.
var serveEnv = map[string]string{
	"listen": "AGENTHOST_LISTEN", "data": "AGENTHOST_DATA", "agent": "AGENTHOST_AGENT", "model": "AGENTHOST_MODEL",
	"workspaces": "AGENTHOST_WORKSPACES", "max-resident": "AGENTHOST_MAX_RESIDENT", "idle-after": "AGENTHOST_IDLE_AFTER",
	"turn-timeout": "AGENTHOST_TURN_TIMEOUT", "approval-timeout": "AGENTHOST_APPROVAL_TIMEOUT",
	"question-timeout": "AGENTHOST_QUESTION_TIMEOUT",
	"approval-mode":    "AGENTHOST_APPROVAL_MODE", "transport": "AGENTHOST_TRANSPORT", "daemon": "AGENTHOST_DAEMON",
	"confine": "AGENTHOST_CONFINE", "confine-net": "AGENTHOST_CONFINE_NET", "confine-read": "AGENTHOST_CONFINE_READ",
	"agent-uids":         "AGENTHOST_AGENT_UIDS",
	"room-budget-tokens": "AGENTHOST_ROOM_BUDGET_TOKENS", "room-budget-usd": "AGENTHOST_ROOM_BUDGET_USD",
	"git-file-roots": "AGENTHOST_GIT_FILE_ROOTS",
	"agent-env":      "AGENTHOST_AGENT_ENV",
	"room-memory":    "AGENTHOST_ROOM_MEMORY", "room-pids": "AGENTHOST_ROOM_PIDS", "room-cpu": "AGENTHOST_ROOM_CPU",
	"pool": "AGENTHOST_POOL",
	"otlp": "AGENTHOST_OTLP", "otlp-agents": "AGENTHOST_OTLP_AGENTS", "otlp-tool-input": "AGENTHOST_OTLP_TOOL_INPUT",
	"token-messages-per-minute": "AGENTHOST_TOKEN_MESSAGES_PER_MINUTE", "token-streams": "AGENTHOST_TOKEN_STREAMS",
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
With --transport acp the agents run over the Agent Client Protocol (omp acp,
claude, codex or copilot, or an ACP command after "--").

The API needs a bearer token: AGENTHOST_TOKEN, or one generated on the first
start into a file in the data dir (mode 0600). The start line prints the
address to open. Settings come from flags, then AGENTHOST_* environment
variables (AGENTHOST_LISTEN, AGENTHOST_DATA, ...), then --config FILE (YAML,
or TOML for a .toml file, with the flags' names as keys), then defaults.

Each room's agent and everything it starts are confined with Landlock where
the kernel has it (--confine auto, the default; landlock refuses to start
without it; off): they read and write only the room's workspace, the agent's
home and a temporary folder of their own, read the system and the installed
agents, and cannot signal the server or other rooms. --confine-net PORTS
limits their TCP connects to those ports (and the built-in model's);
--confine-read DIR,... lets them read more folders, never write them (a custom
agent's interpreter in a user's home; never the data dir or the workspaces). A server
run as root gives each room's agent a uid of its own from --agent-uids
(default 2000000000-2000999999; off: agents run as the server's user). Agents
get an allowlisted environment: PATH, TERM, LANG, LC_*, the proxy and CA
variables, their own HOME and TMPDIR, and the key variables of the room's
model's provider; --agent-env NAME,... passes more by name, and AGENTHOST_*
never.

One server per data dir: a second one refuses to start.

Each room's processes are limited together (--room-memory, default 4G or half
the machine's memory; --room-pids, default 4096 tasks; --room-cpu, default all
cores), with an equal CPU share per room: by cgroup v2 controllers, by cgroup
v1 hierarchies on a hybrid host, or, where the server may write no cgroup (not
root and nothing delegated: see the systemd unit in contrib; or cgroups
mounted read-only, as in many containers), by RLIMIT_AS and RLIMIT_NPROC per
process. The start line says which. A room's config may lower
them (resources: memory, pids, cpu), never raise them.

With --daemon every room's agent runs as a process of the data dir's process
daemon (agenthost procd), and SIGUSR2 is a planned restart: the server hands
the daemon over, stops accepting, and exits 0 with the agents running; the next
"agenthost serve --daemon" on the data dir within 2 minutes takes them over,
and their running turns go on. SIGINT and SIGTERM still stop everything.

--otlp URL (or the standard OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_* variables)
exports OpenTelemetry traces over OTLP/HTTP: a span per turn (invoke_agent),
its tool calls (execute_tool), approval waits, the agent's start, snapshots and
git checkouts, and the API's requests; a caller's W3C traceparent on POST
.../messages is the parent of the turn its message starts. Export is batched
and bounded: a collector that is down costs dropped spans, counted in /metrics,
and nothing else. --otlp-agents has the agents export too (omp exports its own
GenAI spans), to the server's loopback relay, which places their spans in the
turns' traces and forwards them to the collector; --otlp-tool-input puts tool
inputs (redacted as the log has them) on their spans.`,
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
			return runServe(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), log, f, custom)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", defaultListen, "address to listen on")
	fl.StringVar(&f.data, "data", "", "data dir: the store, the token and the agents' homes (default: a per-user dir)")
	fl.StringVar(&f.transport, "transport", transportRPC, "wire protocol: rpc (omp, pi) or acp (omp, claude, codex, copilot)")
	fl.StringVar(&f.agent, "agent", "omp", "the rooms' agent: omp or pi (rpc); omp, claude, codex or copilot (acp)")
	fl.StringVar(&f.model, "model", "", "provider/model for the agents (default: the built-in scripted model)")
	fl.StringVar(&f.workspaces, "workspaces", "", "the rooms' folders (default: DATA/workspaces)")
	fl.IntVar(&f.maxResident, "max-resident", room.DefaultMaxResident, "agents running at once")
	fl.IntVar(&f.pool, "pool", 1, "agents of the default agent kept started ahead of their rooms: a new or waking room (rpc; acp: new rooms only) is bound to one instead of waiting for a boot; they count against --max-resident (0: off)")
	fl.DurationVar(&f.idleAfter, "idle-after", room.DefaultIdleAfter, "release a room's agent after this long idle")
	fl.DurationVar(&f.turnTimeout, "turn-timeout", room.DefaultTurnTimeout, "bound on a turn's active time")
	fl.DurationVar(&f.approvalTimeout, "approval-timeout", room.DefaultApprovalTimeout, "deny an approval nobody decided after this long")
	fl.DurationVar(&f.questionTimeout, "question-timeout", room.DefaultQuestionTimeout, "cancel a question nobody answered after this long (the agent goes on without an answer)")
	fl.StringVar(&f.approvalMode, "approval-mode", room.ApprovalAsk, "always-ask or yolo")
	fl.Int64Var(&f.budgetTokens, "room-budget-tokens", 0, "every room's token budget unless its config sets one (0: none)")
	fl.Float64Var(&f.budgetUSD, "room-budget-usd", 0, "every room's budget in dollars unless its config sets one (0: none)")
	fl.IntVar(&f.tokenMessages, "token-messages-per-minute", server.DefaultTokenMessagesPerMinute, "messages one room token may send in a minute; more are 429 with Retry-After (0: no limit; the admin token has none)")
	fl.IntVar(&f.tokenStreams, "token-streams", server.DefaultTokenStreams, "event streams one room token may keep open; another is 429 (0: no limit)")
	fl.StringVar(&f.config, "config", "", "a config file (YAML, or TOML for .toml)")
	fl.BoolVar(&f.snapshots, "snapshots", true, "snapshot each room's workspace before and after every turn (diff and revert)")
	fl.Int64Var(&f.snapshotMaxFile, "snapshot-max-file", snapshot.DefaultMaxFileSize, "files over this many bytes are left out of snapshots")
	fl.StringSliceVar(&f.gitFileRoots, "git-file-roots", nil, "folders whose git repositories rooms may name as file:// workspaces, comma-separated (default: none; the data dir and the workspaces never)")
	fl.BoolVar(&f.daemon, "daemon", false, "run the agents in the process daemon; SIGUSR2 restarts the server and keeps them running")
	fl.StringVar(&f.node, "node", "", "this node's name in a NATS cluster (needed with --nats or --nats-embedded)")
	fl.StringSliceVar(&f.nats, "nats", nil, "external JetStream: server URL(s), comma-separated")
	fl.BoolVar(&f.natsEmbedded, "nats-embedded", false, "run an embedded JetStream node in this process")
	fl.StringVar(&f.natsListen, "nats-listen", "", "the embedded node's client address (host:port)")
	fl.StringVar(&f.natsClusterListen, "nats-cluster-listen", "", "the embedded node's cluster (route) address (host:port)")
	fl.StringSliceVar(&f.natsRoutes, "nats-routes", nil, "the other embedded nodes' route URLs (nats://host:port), comma-separated")
	fl.StringVar(&f.role, "role", natsroom.RoleBoth, "in a NATS cluster: both, frontend (API only) or worker (runs agents only)")
	fl.IntVar(&f.natsReplicas, "nats-replicas", 0, "replicas of the rooms' streams (default: 3 with routes or --nats, else 1)")
	addConfineFlags(fl, &f.confine)
	addAgentUIDsFlag(fl, &f.confine)
	fl.StringSliceVar(&f.agentEnv, "agent-env", nil, "more variables the agents get from the server's environment, by name, comma-separated (besides PATH, HOME, TMPDIR, LANG, LC_*, TERM, proxies and the model's key; never AGENTHOST_*)")
	addResourceFlags(fl, &f.resources)
	fl.StringVar(&f.otlp, "otlp", "", "export OpenTelemetry traces to this OTLP/HTTP collector (base URL; /v1/traces is added); default: the OTEL_EXPORTER_OTLP_* variables, else off")
	fl.BoolVar(&f.otlpAgents, "otlp-agents", false, "have the agents that export (omp) send their own spans too, through the server, into their turns' traces")
	fl.BoolVar(&f.otlpToolArgs, "otlp-tool-input", false, "put each tool call's input (redacted as in the log) on its span")
	fl.StringVar(&f.natsClusterAdvertise, "nats-cluster-advertise", "", "the route address the other embedded nodes are told (host:port; default: what --nats-cluster-listen binds)")
	fl.StringVar(&f.natsSecretFile, "nats-secret-file", "", "the embedded cluster's shared secret, needed by every route and client (default: DATA/"+natsSecretFile+", made on the first start; give every node the same)")
	fl.StringVar(&f.natsTLS, "nats-tls", "", "a directory with ca.pem, cert.pem and key.pem: mutual TLS on the embedded node's routes and TLS on its client port, or TLS to the --nats servers")
	fl.StringVar(&f.natsCreds, "nats-creds", "", "credentials for the --nats servers: a .creds file (user JWT and seed) or a file holding an nkey seed")
	return cmd
}

// natsSecretFile is the generated cluster secret's file in the data dir.
const natsSecretFile = "nats-secret"

// fuseCmd is the hidden command that runs custody's fuse (see serve's
// cluster mode): the agents of rooms whose lease this host stops renewing
// are frozen by it, even while this host is paused.
const fuseCmd = "lease-fuse"

func newFuseCmd() *cobra.Command {
	return &cobra.Command{
		Use:    fuseCmd,
		Short:  "Hold a serve process's agents to their rooms' leases (started by serve)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return custody.RunFuse(cmd.InOrStdin())
		},
	}
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
		named := map[string]string{}
		for k, v := range file {
			// Keys are the flags' names; underscores for dashes too
			// (confine_net).
			name := strings.ReplaceAll(k, "_", "-")
			if _, ok := serveEnv[name]; !ok {
				return fmt.Errorf("config %s: unknown setting %q", filepath.Base(configPath), k)
			}
			if _, dup := named[name]; dup {
				return fmt.Errorf("config %s: %q is set twice", filepath.Base(configPath), name)
			}
			named[name] = v
		}
		file = named
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

func runServe(ctx context.Context, stdout, progress io.Writer, log *slog.Logger, f serveFlags, custom []string) (err error) {
	if f.approvalMode != room.ApprovalAsk && f.approvalMode != room.ApprovalYolo {
		return &exitError{2, fmt.Errorf("serve: --approval-mode %q: want always-ask or yolo", f.approvalMode)}
	}
	if f.budgetTokens < 0 || f.budgetUSD < 0 || f.budgetUSD != f.budgetUSD {
		return &exitError{2, errors.New("serve: --room-budget-tokens and --room-budget-usd must be 0 (none) or more")}
	}
	if f.tokenMessages < 0 || f.tokenStreams < 0 {
		return &exitError{2, errors.New("serve: --token-messages-per-minute and --token-streams must be 0 (no limit) or more")}
	}
	if err := f.confine.check(); err != nil {
		return err
	}
	if err := agents.CheckEnvNames(f.agentEnv); err != nil {
		return &exitError{2, fmt.Errorf("serve: --agent-env: %w", err)}
	}
	limits, err := f.resources.limits()
	if err != nil {
		return &exitError{2, err}
	}
	kind := agents.Kind(f.agent)
	switch {
	case f.transport != transportRPC && f.transport != transportACP:
		return &exitError{2, fmt.Errorf("serve: --transport %q: want rpc or acp", f.transport)}
	case f.daemon && f.transport == transportACP:
		// The daemon's handoff re-attaches an agent mid-stream by its
		// output offset, which only the RPC client can adopt.
		return &exitError{2, errors.New("serve: --daemon runs agents over RPC only (not with --transport acp)")}
	case len(custom) > 0:
	case f.transport == transportACP:
		if err := checkACPKind(f.agent); err != nil {
			return &exitError{2, fmt.Errorf("serve: %w", err)}
		}
	case kind != agents.OMP && kind != agents.Pi:
		return &exitError{2, fmt.Errorf("serve: %w", unknownRPCAgent(f.agent))}
	}
	if f.data == "" {
		if f.data, err = defaultDataDir(); err != nil {
			return &exitError{2, err}
		}
	}
	if f.workspaces == "" {
		f.workspaces = filepath.Join(f.data, "workspaces")
	}
	if err := f.confine.checkRead(f.data, f.workspaces); err != nil {
		return err
	}
	clustered := f.natsEmbedded || len(f.nats) > 0
	if err := checkClusterFlags(f, clustered); err != nil {
		return &exitError{2, err}
	}
	if clustered {
		if err := checkSecretPlaces(f); err != nil {
			return &exitError{2, err}
		}
	}
	if clustered && f.daemon {
		// A planned restart re-attaches the rooms this server held; in a
		// cluster they move to other nodes instead (the leases lapse).
		return &exitError{2, errors.New("serve: --daemon is for a single machine (not with --nats or --nats-embedded)")}
	}
	// The port first: a server that cannot serve creates nothing (no data
	// dir, no token) and says what to do.
	var ln net.Listener
	if f.role != natsroom.RoleWorker {
		if ln, err = net.Listen("tcp", f.listen); err != nil {
			return fmt.Errorf("serve: %w (give another --listen, or stop what serves there)", err)
		}
		defer ln.Close() // Serve's own close comes first; this one is for an early return
	}
	if err := os.MkdirAll(f.data, 0o700); err != nil {
		return fmt.Errorf("serve: data dir: %w", err)
	}
	// The server's alone, whatever made it looser (a chmod by an agent of a
	// server that shares its uid, an older version).
	if err := os.Chmod(f.data, 0o700); err != nil {
		log.Warn("serve: the data dir could not be made 0700", "err", err)
	}
	var restartSig chan os.Signal
	if f.daemon && len(restartSignals) > 0 {
		// From the start: SIGUSR2's default action would kill the server.
		restartSig = make(chan os.Signal, 1)
		signal.Notify(restartSig, restartSignals...)
		defer signal.Stop(restartSig)
	}

	health := &serveHealth{}
	var fuse *custody.Fuse
	if clustered {
		// Before custody and the cluster, and closed after both: every
		// agent of this host is held to its room's lease by a process
		// this one's pause or death does not stop (the cluster then
		// keeps a room whose lease lapsed paused rather than dropping it).
		if fuse, err = startFuse(); errors.Is(err, custody.ErrNoFreeze) {
			log.Warn("serve: this platform cannot freeze processes: a paused host's agents are not held to their rooms' leases")
		} else if err != nil {
			return fmt.Errorf("serve: %w", err)
		} else {
			defer fuse.Close()
		}
	}

	var rstore room.Store
	var cl *natsroom.Cluster
	var node *natsroom.Node
	if clustered {
		var stop func()
		cl, node, stop, err = startCluster(f, log, fuse != nil)
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		defer stop()
		rstore = cl.Store()
		if node != nil {
			health.check(healthNATS, node.Health)
		}
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
		rstore = roomsqlite.New(db)
	}
	tok, tokPath, created, err := loadToken(f.data)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}

	// Processes left by a host that died (kill -9) hold nothing we can
	// resume: end them before starting new ones (and remove the empty
	// groups such hosts left, with none).
	if orphans, ferr := custody.FindOrphans(); ferr == nil {
		left, kerr := custody.KillOrphans(ctx, orphans, time.Second)
		if kerr != nil {
			log.Warn("reaping orphans of dead hosts", "found", len(orphans), "still_running", len(left), "err", kerr)
		} else if len(orphans) > 0 {
			log.Info("reaped orphans of dead hosts", "ended", len(orphans))
		}
	} else {
		log.Debug("looking for orphans of dead hosts", "err", ferr) // not on this platform
	}

	// Resources: the rooms' limits; on a cgroup v2 host whose group the
	// server owns (Delegate=yes) it moves itself into a leaf below it.
	cust, err := custody.New(custody.Options{Logger: log, Fuse: fuse, Resources: true})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if s := cust.Support(); s.Enforced() {
		log.Info("room limits", "memory", int64(limits.Memory), "pids", limits.Pids, "cpu", limits.CPU, "by", string(s.Memory))
	} else {
		log.Warn("room limits are not enforced by cgroups", "why", s.Why)
	}
	defer func() {
		if cerr := cust.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	var install *agents.Install
	var modelURL string
	var pd *procd.Client
	var runner *daemonproc.Runner
	if f.daemon {
		// The owner of the data dir's daemon: a handoff left by the server
		// before is claimed (its agents run on), or a fresh daemon starts.
		if pd, err = procd.Own(ctx, f.data, nil); err != nil {
			return fmt.Errorf("serve: the process daemon: %w", err)
		}
		defer func() {
			// Without a prepared handoff this ends the daemon and
			// everything left in it.
			_ = pd.Close()
		}()
		switch {
		case pd.Claimed():
			log.Info("claimed the process daemon from the server before", "daemon_pid", pd.PID())
		case pd.HandoffErr() != nil:
			log.Warn("the handoff was not honoured; a fresh process daemon runs the agents", "err", pd.HandoffErr())
		}
		// One inotify instance for every agent's output (closed after the
		// rooms, deferred before them).
		if runner, err = daemonproc.NewRunner(pd); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		defer runner.Close()
		if pd.Claimed() && (f.model != "" || len(custom) > 0) {
			endModels(ctx, pd, log) // the server before used one; this one does not
		}
	}
	if len(custom) == 0 {
		if install, err = agents.Find(); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		if f.transport == transportACP && agents.ACPOnly(kind) {
			// Installed on first need (progress on stderr).
			if err := install.EnsureACP(ctx, progress); err != nil {
				return fmt.Errorf("serve: %w", err)
			}
		}
		if f.model == "" && pd != nil {
			// In the daemon, so a turn streaming from it goes on across
			// a planned restart; supervised, on one address for good.
			dm, err := startDaemonModel(ctx, runner, f.data, log, health)
			if err != nil {
				return fmt.Errorf("serve: starting the built-in model: %w", err)
			}
			defer dm.Close()
			modelURL = dm.URL()
		} else if f.model == "" {
			sim := modelsim.New(modelsim.Options{Logger: log})
			if err := sim.Start(ctx); err != nil {
				return fmt.Errorf("serve: starting the built-in model: %w", err)
			}
			defer sim.Close()
			modelURL = sim.URL()
		}
	}
	tools := ""
	if install != nil {
		tools = install.Dir
	}
	// Closed after the rooms (deferred before them): their last events
	// become spans.
	otel, err := startTracing(ctx, f, log)
	if err != nil {
		return err
	}
	defer otel.close(log)
	cf, err := f.confine.confiner(log, tools, modelURL, otel.agentURL())
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	var tr room.Transport
	pool := newWarmPool(f, kind, custom, clustered, limits)
	// rtr is the transport that keeps the warm pool.
	var rtr interface {
		StartPool() error
		Close() error
	}
	if f.transport == transportACP {
		var atr *acpagent.Transport
		atr, err = pool.acpTransport(acpagent.Options{Custodian: cust, Install: install, ModelURL: modelURL, Confine: cf, AgentEnv: f.agentEnv,
			OTLP: otel.agentEnv, Logger: log}, log)
		tr, rtr = atr, atr
	} else {
		var ptr *rpcagent.Transport
		ptr, err = pool.transport(rpcagent.Options{Custodian: cust, Install: install, ModelURL: modelURL, Daemon: runner, Confine: cf,
			AgentEnv: f.agentEnv, OTLP: otel.agentEnv, Logger: log}, log)
		tr, rtr = ptr, ptr
	}
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if rtr != nil {
		// Its idle agents end after the rooms' (deferred before them).
		defer rtr.Close()
	}
	ropts := room.Options{
		Store: rstore, Transport: tr, Root: filepath.Join(f.data, "rooms"), Workspaces: f.workspaces, MaxResident: f.maxResident, IdleAfter: f.idleAfter,
		Config: room.Config{Agent: string(kind), Command: custom, Model: f.model, ApprovalMode: f.approvalMode,
			TurnTimeout: f.turnTimeout, ApprovalTimeout: f.approvalTimeout, QuestionTimeout: f.questionTimeout, Limits: limits},
		Budget:  room.Budget{Tokens: f.budgetTokens, CostUSD: f.budgetUSD},
		Agents:  roomAgents(f.transport, kind, custom),
		Logger:  log,
		Observe: otel.observe(),
	}
	if cl != nil {
		ropts.Cluster = cl
	}
	// Workspaces from git (a room's config names a repository): one
	// mirror per repository under the data dir, a worktree per room.
	// file:// repositories only under the operator's roots, and never in
	// the data dir (other rooms' snapshots, homes, mirrors) or a room's
	// workspace.
	gitEngine, err := gitws.New(gitws.Options{Root: filepath.Join(f.data, "git"), Logger: log,
		FileRoots: f.gitFileRoots, Denied: []string{f.data, f.workspaces}})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	ropts.Sources = roomgit.New(gitEngine)
	if f.snapshots {
		snaps := roomsnap.New(roomsnap.Options{Repo: snapshot.Options{MaxFileSize: f.snapshotMaxFile}})
		// After the manager (deferred later, so closed first).
		defer func() {
			if cerr := snaps.Close(); cerr != nil {
				log.Warn("closing the rooms' snapshots", "err", cerr)
			}
		}()
		ropts.Snapshots = snaps
	}
	m, err := room.New(ropts)
	if err != nil {
		return &exitError{2, fmt.Errorf("serve: %w", err)}
	}
	otel.m = m
	pool.m.Store(m)
	if rtr != nil {
		// A bind a crash stopped is recovered before any room starts.
		if err := rtr.StartPool(); err != nil {
			return fmt.Errorf("serve: the warm pool: %w", err)
		}
	}
	began := time.Now()
	if err := m.Start(ctx); err != nil {
		return fmt.Errorf("serve: recovering the rooms: %w", err)
	}
	log.Debug("rooms recovered", "took", time.Since(began))
	defer func() {
		if cl != nil {
			// No new rooms or inbox entries while the rooms record their
			// shutdown; the leases go after (the deferred stop).
			cl.Stop()
		}
		if cerr := closeRooms(m); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if cl != nil {
		// Until the cluster's JetStream answers (the other nodes may start
		// later), or SIGTERM; a configuration it refuses fails at once.
		if err := cl.Start(ctx, m); err != nil {
			return fmt.Errorf("serve: joining the cluster: %w", err)
		}
		log.Info("in the cluster", "node", f.node, "role", f.role)
	}
	if f.role == natsroom.RoleWorker {
		// A worker serves no API: it runs rooms until told to stop.
		fmt.Fprintf(stdout, "agenthost: node %s running rooms (worker)\n", f.node)
		printGaps(stdout, f, kind, custom)
		fmt.Fprintf(stdout, "agenthost: agents confined: %s\n", confineReport(cf.Report()))
		printAgentUsers(stdout, cf)
		printLimits(stdout, limits, cust.Support())
		<-ctx.Done()
		log.Info("shutting down")
		return nil
	}
	// Room tokens (POST /v1/tokens): a file in the data dir, or in a
	// cluster the cluster's bucket, which every API node reads, writes
	// and follows (a token works, and its revocation ends it, through
	// every node).
	var toks server.TokenStore
	if cl != nil {
		ctoks, err := cl.Tokens(ctx)
		if err != nil {
			return fmt.Errorf("serve: opening the cluster's token store: %w", err)
		}
		toks = ctoks
	} else {
		ftoks, err := store.OpenTokens(ctx, filepath.Join(f.data, "tokens.db"))
		if err != nil {
			return fmt.Errorf("serve: opening the token store: %w", err)
		}
		defer func() {
			if cerr := ftoks.Close(); cerr != nil && err == nil {
				err = cerr
			}
		}()
		toks = ftoks
	}
	api, err := server.New(server.Options{Manager: m, Token: tok, Tokens: toks, Index: server.Page(), Health: health.err, Logger: log,
		TokenMessagesPerMinute: noLimit(f.tokenMessages), TokenStreams: noLimit(f.tokenStreams),
		Tracing:    otel.server(),
		Collectors: append(nodeCollectors(node), pool.collectors(tr)...)})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	hs := api.HTTPServer(slog.NewLogLogger(log.Handler(), slog.LevelWarn))
	served := make(chan error, 1)
	go func() { served <- hs.Serve(api.Listener(ln)) }()

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
	printGaps(stdout, f, kind, custom)
	fmt.Fprintf(stdout, "agenthost: agents confined: %s\n", confineReport(cf.Report()))
	printAgentUsers(stdout, cf)
	printLimits(stdout, limits, cust.Support())
	pool.print(stdout, kind)
	log.Info("serving", "addr", ln.Addr().String(), "pid", os.Getpid(), "data", f.data, "agent", f.agent, "transport", f.transport, "built_in_model", f.model == "" && len(custom) == 0)

	// The process daemon is watched while the server serves: one that
	// dies is replaced (watchDaemon); the watch ends before a planned
	// restart hands the daemon over, or a shutdown ends it.
	daemonLost := make(chan error, 1)
	stopWatch := func() {}
	if pd != nil {
		wctx, cancel := context.WithCancel(ctx)
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			if err := watchDaemon(wctx, pd, health, log); err != nil {
				daemonLost <- err
			}
		}()
		stopWatch = func() { cancel(); <-watched }
		defer stopWatch()
	}

	restart := false
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case <-restartSig:
		stopWatch()
		restart = handOver(pd, log)
	case err = <-daemonLost:
		// Exit non-zero: a supervisor starts the server again, and the
		// rooms recover as after a crash.
		log.Error("shutting down", "err", err)
		err = fmt.Errorf("serve: %w", err)
	case err = <-served:
		api.Close()
		return fmt.Errorf("serve: %w", err)
	}
	// Streams end first (they never go idle; clients reconnect with
	// Last-Event-ID), then in-flight requests finish; the rooms close
	// after (deferred), recording receipts, unless they are handed over.
	api.Close()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownBudget)
	defer cancel()
	if serr := hs.Shutdown(sctx); serr != nil {
		log.Warn("http shutdown", "err", serr)
		_ = hs.Close()
	}
	<-served
	if restart {
		if derr := m.Detach(); derr != nil {
			log.Warn("letting go of the rooms", "err", derr)
		} else if derr := waitRooms(m); derr != nil {
			log.Warn("letting go of the rooms", "err", derr)
		}
		fmt.Fprintf(stdout, "agenthost: restarting: the agents run on; start agenthost serve --daemon on %s within %s\n", f.data, procd.HandoffTTL)
	}
	return err
}

// roomsBudget bounds waiting for the rooms' end (Manager.Wait): their
// turns get room.DefaultShutdownBudget, and their agents as long again.
const roomsBudget = 3 * room.DefaultShutdownBudget

// closeRooms closes the rooms and waits for their end (after Detach,
// Close only returns Detach's result).
func closeRooms(m *room.Manager) error {
	if err := m.Close(); err != nil && !errors.Is(err, room.ErrClosed) {
		return err
	}
	return waitRooms(m)
}

// waitRooms waits for the end Close or Detach began.
func waitRooms(m *room.Manager) error {
	ctx, cancel := context.WithTimeout(context.Background(), roomsBudget)
	defer cancel()
	return m.Wait(ctx)
}

// handOver prepares the process daemon's handoff for a planned restart;
// false (a plain shutdown follows) when the daemon refused.
func handOver(pd *procd.Client, log *slog.Logger) bool {
	ctx, cancel := context.WithTimeout(context.Background(), handoffBudget)
	defer cancel()
	t, err := pd.PrepareHandoff(ctx)
	if err != nil {
		log.Error("planned restart: preparing the handoff failed; stopping everything instead", "err", err)
		return false
	}
	log.Info("planned restart: the agents are handed over", "expires", t.ExpiresAt)
	return true
}

// checkClusterFlags checks the NATS flags go together.
func checkClusterFlags(f serveFlags, clustered bool) error {
	switch {
	case !clustered:
		if f.node != "" || f.natsListen != "" || f.natsClusterListen != "" || len(f.natsRoutes) > 0 || f.role != natsroom.RoleBoth ||
			f.natsClusterAdvertise != "" || f.natsSecretFile != "" || f.natsTLS != "" || f.natsCreds != "" {
			return errors.New("serve: --node, --role and the --nats-* flags need --nats or --nats-embedded")
		}
		return nil
	case f.natsEmbedded && len(f.nats) > 0:
		return errors.New("serve: give either --nats (external) or --nats-embedded, not both")
	case f.node == "":
		return errors.New("serve: --node NAME is required with --nats or --nats-embedded")
	case len(f.nats) > 0 && (f.natsListen != "" || f.natsClusterListen != "" || len(f.natsRoutes) > 0 || f.natsClusterAdvertise != "" || f.natsSecretFile != ""):
		return errors.New("serve: --nats-listen, --nats-cluster-listen, --nats-cluster-advertise, --nats-routes and --nats-secret-file are for --nats-embedded")
	case f.natsEmbedded && f.natsCreds != "":
		return errors.New("serve: --nats-creds is for --nats (an embedded node signs in with the cluster's secret)")
	case len(f.natsRoutes) > 0 && f.natsClusterListen == "":
		return errors.New("serve: --nats-routes needs --nats-cluster-listen")
	case f.natsClusterAdvertise != "" && f.natsClusterListen == "":
		return errors.New("serve: --nats-cluster-advertise needs --nats-cluster-listen")
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

// startFuse starts custody's fuse as this binary's hidden command.
func startFuse() (*custody.Fuse, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("starting the lease fuse: %w", err)
	}
	return custody.StartFuse([]string{exe, fuseCmd})
}

// loadSecret returns the cluster secret in path, making it on first use
// (every node that shares the data dir then reads the same one).
func loadSecret(path string) (string, error) {
	read := func() (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		s := strings.TrimSpace(string(b))
		if s == "" {
			return "", fmt.Errorf("the cluster secret %s is empty", path)
		}
		return s, nil
	}
	s, err := read()
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return s, err
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	// Written whole under another name, then linked into place: a node
	// reading it at the same moment sees all of it or none, and of two
	// nodes making one at once, one wins and both use it.
	tmp, err := os.CreateTemp(filepath.Dir(path), ".nats-secret-*")
	if err != nil {
		return "", fmt.Errorf("writing the cluster secret: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(hex.EncodeToString(b[:]) + "\n")
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o600)
	}
	if err != nil {
		return "", fmt.Errorf("writing the cluster secret: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("writing the cluster secret: %w", err)
	}
	return read()
}

// startCluster starts the embedded node (if any), connects, and returns
// the cluster and the node; stop closes the cluster, the connection and
// the node, in order. heldAgents: custody's fuse holds the agents to their
// leases (natsroom.Config.HeldAgents).
func startCluster(f serveFlags, log *slog.Logger, heldAgents bool) (*natsroom.Cluster, *natsroom.Node, func(), error) {
	var node *natsroom.Node
	var nc *nats.Conn
	var err error
	var tlsFiles *natsroom.TLSFiles
	if f.natsTLS != "" {
		tlsFiles = natsroom.TLSDir(f.natsTLS)
	}
	replicas := f.natsReplicas
	if f.natsEmbedded {
		secretPath := f.natsSecretFile
		if secretPath == "" {
			secretPath = filepath.Join(f.data, natsSecretFile)
		}
		secret, serr := loadSecret(secretPath)
		if serr != nil {
			return nil, nil, nil, serr
		}
		node, err = natsroom.StartNode(natsroom.NodeConfig{Name: f.node, StoreDir: filepath.Join(f.data, "nats", f.node),
			Listen: f.natsListen, ClusterListen: f.natsClusterListen, ClusterAdvertise: f.natsClusterAdvertise, Routes: f.natsRoutes,
			Secret: secret, TLS: tlsFiles, Logger: log})
		if err != nil {
			return nil, nil, nil, err
		}
		nc, err = node.Connect("agenthost " + f.node)
		if replicas == 0 {
			replicas = 1
			if len(f.natsRoutes) > 0 {
				replicas = 3
			}
		}
	} else {
		nc, err = natsroom.Dial(f.nats, "agenthost "+f.node, natsroom.DialOptions{Creds: f.natsCreds, TLS: tlsFiles})
		if replicas == 0 {
			replicas = 3
		}
	}
	if err != nil {
		if node != nil {
			node.Close()
		}
		return nil, nil, nil, fmt.Errorf("connecting to NATS: %w", err)
	}
	cfg := natsroom.Config{Node: f.node, Conn: nc, Replicas: replicas, Slots: f.maxResident,
		Worker: f.role != natsroom.RoleFrontend, HeldAgents: heldAgents, Logger: log}
	if node != nil {
		cfg.StoreHealth = node.Health
	}
	cl, err := natsroom.New(cfg)
	if err != nil {
		nc.Close()
		if node != nil {
			node.Close()
		}
		return nil, nil, nil, err
	}
	stop := func() {
		cl.Close()
		nc.Close()
		if node != nil {
			node.Close()
		}
	}
	return cl, node, stop, nil
}

// nodeCollectors are the embedded node's metrics: whether its JetStream
// runs, and how often it was restarted in place (none without a node).
func nodeCollectors(node *natsroom.Node) []prometheus.Collector {
	if node == nil {
		return nil
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "agenthost_nats_jetstream_enabled",
			Help: "1 while the embedded NATS node's JetStream runs; 0 while it is disabled (its store could not write: a full disk), until the node restarts it.",
		}, func() float64 {
			if node.Status().JetStream {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "agenthost_nats_restarts_total",
			Help: "Restarts in place of the embedded NATS node, after its JetStream was disabled and its store had room again.",
		}, func() float64 { return float64(node.Status().Restarts) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "agenthost_nats_restart_stalls_total",
			Help: "Steps of a restart in place of the embedded NATS node that passed their deadline (the step is named in the log and /healthz; the node tries again once it returns).",
		}, func() float64 { return float64(node.Status().Stalls) }),
	}
}

// printGaps says, in one line, which room promises the rooms' agent cannot
// keep (pi's: no MCP), as the support matrix does.
func printGaps(stdout io.Writer, f serveFlags, kind agents.Kind, custom []string) {
	if len(custom) > 0 || f.transport != transportRPC || kind != agents.Pi {
		return
	}
	gaps := piext.Gaps()
	parts := make([]string, 0, len(gaps))
	for _, g := range gaps {
		parts = append(parts, fmt.Sprintf("%q: %s", g.Claim, g.Reason))
	}
	fmt.Fprintf(stdout, "agenthost: %s rooms cannot keep %s; docs/support-matrix.md lists every promise\n", kind, strings.Join(parts, "; "))
}

// roomAgents are the agent kinds a room's config may name: the transport's
// (with a custom command, only the server's own kind, which the rooms'
// effective settings report, so that they can be sent back as they are).
func roomAgents(transport string, kind agents.Kind, custom []string) []string {
	switch {
	case len(custom) > 0:
		return []string{string(kind)}
	case transport == transportACP:
		var out []string
		for _, k := range agents.ACPKinds {
			out = append(out, string(k))
		}
		return out
	default:
		return []string{string(agents.OMP), string(agents.Pi)}
	}
}

// noLimit maps a flag's 0 (no limit) to server.Options' "none" (-1); the
// Options' 0 is the default.
func noLimit(n int) int {
	if n == 0 {
		return -1
	}
	return n
}
