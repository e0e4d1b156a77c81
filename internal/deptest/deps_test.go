package deptest

import (
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/agenthost/agenthost"

// allowed lists, for each package with a rule, the non-standard-library
// packages it may depend on (directly or not), by prefix.
var allowed = map[string][]string{
	// The protocol client stands alone: standard library, and the pipe
	// helper it shares with custody.
	module + "/rpc": {module + "/internal/procio"},
	// Custody: standard library, x/sys and the pipe helper.
	module + "/custody":         {"golang.org/x/sys/", module + "/internal/procio"},
	module + "/internal/procio": nil,
	// The HTTP API's Go client is for programs outside the module: the
	// standard library and the public data packages it shares with the
	// server (events and their records, custody's receipts, with what
	// custody itself needs), nothing else of ours.
	module + "/client": {module + "/event", module + "/record", module + "/custody", module + "/internal/procio", "golang.org/x/sys/"},
	// The events of a room's log: the standard library and the records.
	module + "/event": {module + "/record"},
	// The tests' fake room transport: rooms only.
	module + "/internal/roomfake": append([]string{module + "/room", module + "/internal/store", module + "/record", module + "/event"}, sqliteDeps...),
	// The process daemon and its client: custody, the pipe helper, x/sys
	// and the pty library; never rooms, the store or the server (those
	// drive it through its client).
	module + "/procd": {module + "/custody", module + "/internal/procio", "golang.org/x/sys/", "github.com/creack/pty"},
	// The ACP client: custody, the pipe helper and the ACP SDK; never rooms
	// or the server.
	module + "/acp": {module + "/custody", module + "/internal/procio", "golang.org/x/sys/", "github.com/coder/acp-go-sdk"},
	// The room transport over ACP knows rooms, the ACP client and custody;
	// never the server. warmpool, slotuid, slotpool: its warm pool.
	module + "/internal/acpagent": append([]string{module + "/room", module + "/acp", module + "/custody", module + "/internal/detail", module + "/internal/usage", module + "/internal/roomlimits", module + "/internal/startfail",
		module + "/internal/procio", module + "/internal/warmpool", module + "/internal/slotuid", module + "/internal/slotpool", module + "/internal/agents", module + "/internal/store", module + "/record", module + "/event", module + "/internal/confine", module + "/internal/agentfs", "golang.org/x/sys/",
		"github.com/coder/acp-go-sdk", "go.yaml.in/yaml/"}, append(sqliteDeps, append(mcpDeps, landlockDeps...)...)...),
	// Rooms' limits as custody's (and custody's support as rooms'
	// resources): rooms and custody only, for the transports to share.
	module + "/internal/roomlimits": {module + "/room", module + "/custody", module + "/record", module + "/event", module + "/internal/procio", "golang.org/x/sys/"},
	// Confinement (the policy and the Landlock launcher) stands alone: the
	// launcher runs in every binary that starts agents, before anything else.
	module + "/internal/confine": append([]string{module + "/internal/agentfs"}, landlockDeps...),
	// File operations in folders an agent can write: the standard library
	// (os.Root) only, so that every package that writes there can use it.
	module + "/internal/agentfs": nil,
	// The scripted model and the agent installs are leaves too.
	module + "/internal/modelsim": nil,
	module + "/internal/detail":   nil,
	// The tests' stdio MCP server stands alone.
	module + "/internal/mcpprobe": nil,
	// The transports' test host: rooms, their store, custody, the agents'
	// installs and the scripted model; never a transport (each test passes
	// its own in) or the server.
	module + "/internal/roomtest": append([]string{module + "/room", module + "/internal/store", module + "/record", module + "/event", module + "/internal/roomsqlite", module + "/custody",
		module + "/internal/procio", module + "/internal/agents", module + "/internal/agentfs", module + "/internal/modelsim", "go.yaml.in/yaml/"}, sqliteDeps...),
	// The agents' installs and homes: the standard library, agentfs for
	// what goes into a home, and YAML to clean omp's models file there.
	module + "/internal/agents": {module + "/internal/agentfs", "go.yaml.in/yaml/"},
	// Git workspaces: the standard library, the git program, and agentfs to
	// give a worktree to the uid of the room that owns its folder.
	module + "/internal/gitws": {module + "/internal/agentfs"},
	// Usage normalisation: the standard library and the records (its Usage is
	// record.Usage), so every agent path (rpc, acp) and rooms can use it.
	module + "/internal/usage": {module + "/record"},
	// agenthost's pi extension and its wire: the standard library, and
	// agentfs for what goes into a home.
	module + "/internal/rpcagent/piext": {module + "/internal/agentfs"},
	// The claims table lives in its tests; the package itself is a doc.
	module + "/internal/roomclaims": nil,
	// Workspace snapshots: the standard library and the system git binary;
	// rooms will call it, it knows nothing of them.
	module + "/internal/snapshot": nil,
	// Rooms' per-turn snapshots: the engine, and rooms (whose interface it
	// implements); never the server, a transport or an agent.
	module + "/internal/roomsnap": append([]string{module + "/room", module + "/internal/store", module + "/record", module + "/event", module + "/internal/snapshot"},
		sqliteDeps...),
	// Rooms' workspaces from git: the engine, and rooms (whose interface it
	// implements); never the server, a transport or an agent.
	module + "/internal/roomgit": {module + "/room", module + "/internal/gitws", module + "/internal/agentfs", module + "/record", module + "/event"},
	// The store is SQLite and the public record types: rooms own the
	// interface they need from it, so it can be swapped for another engine.
	module + "/internal/store": append([]string{module + "/record"}, sqliteDeps...),
	// The records rooms store: the standard library only, so that a store
	// in another module can use them.
	module + "/record": nil,
	// Rooms know their records and nothing else of ours: the store plugs
	// in through room.Store, transports through room.Transport (a program
	// outside this module can bring both).
	module + "/room": {module + "/record", module + "/event"},
	// The SQLite store as a room.Store.
	module + "/internal/roomsqlite": append([]string{module + "/room", module + "/internal/store", module + "/record", module + "/event"}, sqliteDeps...),
	// Agents as processes of the daemon: the daemon's client, the
	// protocol client and custody's receipts; never rooms.
	module + "/internal/daemonproc": {module + "/procd", module + "/rpc", module + "/custody", module + "/internal/procio",
		"golang.org/x/sys/", "github.com/creack/pty"},
	// The HTTP server knows rooms, their store and Prometheus' client;
	// never a transport or an agent (the command wires those in).
	// Rooms over NATS JetStream: rooms (whose interfaces it implements),
	// their store's record types and the NATS server and client; never
	// the HTTP server, a transport or an agent.
	module + "/internal/natsroom": append([]string{module + "/room", module + "/internal/store", module + "/record", module + "/event"},
		append(sqliteDeps, natsDeps...)...),
	// With OpenTelemetry's HTTP instrumentation (otelhttp) and API, never
	// its SDK or exporter (serve wires a provider in).
	module + "/internal/server": append([]string{module + "/room", module + "/internal/store", module + "/record", module + "/event", module + "/internal/buildinfo"},
		append(sqliteDeps, append(prometheusDeps, otelAPIDeps...)...)...),
	// Traces of rooms: rooms' events (their seam, room.Options.Observe) made
	// spans, and OpenTelemetry's SDK and OTLP/HTTP exporter; the only
	// package with the SDK. Never the server, a transport or an agent.
	module + "/internal/tracing": append([]string{module + "/room", module + "/record", module + "/event"}, otelSDKDeps...),
	// Start failures explained: the confinement policy (what the agent may
	// read) and the redactor; never a transport, rooms or the server.
	module + "/internal/startfail": append([]string{module + "/internal/confine", module + "/internal/detail", module + "/internal/agentfs"}, landlockDeps...),
	// The build's name: the standard library only.
	module + "/internal/buildinfo": nil,
	// A pool slot's folders handed to a room (renames by descriptor,
	// journaled): the standard library and x/sys; it knows no room or
	// agent.
	module + "/internal/warmpool": {"golang.org/x/sys/"},
	// A pool slot's agent uid handed to its room as root (journaled,
	// recovered), shared by both pools: the binds' journal and
	// confinement's uids; no room or agent.
	module + "/internal/slotuid": append([]string{module + "/internal/warmpool", module + "/internal/confine", module + "/internal/agentfs", "golang.org/x/sys/"}, landlockDeps...),
	// A warm pool's bookkeeping (slots, idle list, refill, counters),
	// shared by both pools: the binds' and uids' journals it recovers;
	// no room, and agents only through its interface.
	module + "/internal/slotpool": append([]string{module + "/internal/warmpool", module + "/internal/slotuid", module + "/internal/confine", module + "/internal/agentfs", "golang.org/x/sys/"}, landlockDeps...),
	// The pools' tests' shared helpers: the transports' test host (roomtest)
	// and the pool's folder name; never a transport.
	module + "/internal/slotpool/pooltest": append([]string{module + "/internal/slotpool", module + "/internal/warmpool", module + "/internal/slotuid", module + "/internal/confine",
		module + "/internal/roomtest", module + "/room", module + "/internal/store", module + "/record", module + "/event", module + "/internal/roomsqlite", module + "/custody",
		module + "/internal/procio", module + "/internal/agents", module + "/internal/agentfs", module + "/internal/modelsim", "go.yaml.in/yaml/"}, append(sqliteDeps, landlockDeps...)...),

	// The library a program hosts rooms with (issue 40): public wrappers
	// of the batteries serve uses; internal/ never imports them
	// (TestInternalImportsNoLibrary).
	// The SQLite store as a room.Store: rooms and the store, nothing else.
	module + "/sqlitestore": append([]string{module + "/room", module + "/internal/roomsqlite", module + "/internal/store", module + "/record", module + "/event"},
		sqliteDeps...),
	// The scripted model: the standard library and it.
	module + "/modeltest": {module + "/internal/modelsim"},
	// The transports: rooms, the agents' protocols, custody and
	// confinement; never the store or the server.
	module + "/transport": append([]string{module + "/room", module + "/record", module + "/event", module + "/custody", module + "/rpc", module + "/acp",
		module + "/procd", module + "/internal/rpcagent", module + "/internal/acpagent", module + "/internal/agentproc", module + "/internal/daemonproc",
		module + "/internal/agents", module + "/internal/agentfs", module + "/internal/confine", module + "/internal/detail", module + "/internal/usage",
		module + "/internal/procio", module + "/internal/roomlimits", module + "/internal/startfail", module + "/internal/warmpool", module + "/internal/slotuid", module + "/internal/slotpool"}, append(mcpDeps, append(landlockDeps,
		"github.com/coder/acp-go-sdk", "github.com/creack/pty", "go.yaml.in/yaml/")...)...),
	// Rooms' snapshots and git workspaces: the engines and their room
	// adapters; never a transport, the store or the server.
	module + "/workspace": {module + "/room", module + "/record", module + "/event", module + "/internal/roomsnap", module + "/internal/snapshot",
		module + "/internal/roomgit", module + "/internal/gitws", module + "/internal/agentfs"},
	// The HTTP API as a handler: what internal/server may use, and it.
	module + "/httpapi": append([]string{module + "/internal/server", module + "/room", module + "/internal/store", module + "/record", module + "/event", module + "/internal/buildinfo"},
		append(sqliteDeps, append(prometheusDeps, otelAPIDeps...)...)...),
}

// library are the public packages that wrap internal ones.
var library = []string{module + "/sqlitestore", module + "/modeltest", module + "/transport", module + "/httpapi", module + "/workspace"}

// TestInternalImportsNoLibrary: the public wrappers sit above internal/;
// an internal package that imported one would turn the layering round
// (and, through transport's init, make every binary a launcher).
func TestInternalImportsNoLibrary(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"/internal/...", module+"/cmd/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], module+"/internal/") {
			continue
		}
		for _, imp := range f[1:] {
			for _, lib := range library {
				if imp == lib {
					t.Errorf("%s imports %s: internal packages must not import the public library", f[0], lib)
				}
			}
		}
	}
}

// TestExamplesImportNoInternal: every public package's examples (the
// code go doc shows a user) import only public packages, so that a user
// can copy them into a module of their own.
func TestExamplesImportNoInternal(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{.Dir}} {{join .XTestGoFiles \",\"}},{{join .TestGoFiles \",\"}}", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	fset := token.NewFileSet()
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || strings.Contains(f[0], "/internal/") || strings.HasPrefix(f[0], module+"/cmd/") {
			continue
		}
		for _, name := range strings.Split(f[2], ",") {
			if !strings.HasPrefix(name, "example") || !strings.HasSuffix(name, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(fset, filepath.Join(f[1], name), nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			seen++
			for _, imp := range file.Imports {
				if path := strings.Trim(imp.Path.Value, `"`); strings.Contains(path, "/internal/") {
					t.Errorf("%s/%s imports %s: an example imports public packages only", f[0], name, path)
				}
			}
		}
	}
	if seen == 0 {
		t.Fatal("no example files found")
	}
}

// landlockDeps are go-landlock and its own dependencies.
var landlockDeps = []string{"github.com/landlock-lsm/go-landlock/", "kernel.org/pub/linux/libs/security/libcap/psx", "golang.org/x/sys/"}

// mcpDeps are the official MCP SDK and its own dependencies.
var mcpDeps = []string{
	"github.com/modelcontextprotocol/go-sdk/", "github.com/google/jsonschema-go/", "golang.org/x/oauth2",
	"github.com/segmentio/", "github.com/yosida95/uritemplate/", "golang.org/x/sync/", "golang.org/x/time/",
	"github.com/golang-jwt/jwt/",
}

// prometheusDeps are client_golang's own dependencies.
var prometheusDeps = []string{
	"github.com/prometheus/", "github.com/beorn7/perks/", "github.com/cespare/xxhash/", "github.com/munnerz/goautoneg",
	"google.golang.org/protobuf/",
}

// otelAPIDeps are OpenTelemetry's API and otelhttp with their own
// dependencies.
var otelAPIDeps = []string{"go.opentelemetry.io/otel", "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp",
	"go.opentelemetry.io/auto/sdk", "github.com/felixge/httpsnoop", "github.com/go-logr/", "github.com/cespare/xxhash/"}

// otelSDKDeps are OpenTelemetry's SDK and OTLP/HTTP trace exporter with
// their own dependencies (the OTLP protobufs, and gRPC's packages the
// generated collector service brings).
var otelSDKDeps = append([]string{"go.opentelemetry.io/proto/otlp/", "google.golang.org/protobuf/", "google.golang.org/grpc",
	"google.golang.org/genproto/", "github.com/grpc-ecosystem/grpc-gateway/", "github.com/cenkalti/backoff/", "github.com/google/uuid",
	"golang.org/x/net/", "golang.org/x/text/", "golang.org/x/sys/"}, otelAPIDeps...)

// natsDeps are the NATS server's and client's own dependencies.
var natsDeps = []string{
	"github.com/nats-io/", "github.com/klauspost/compress/", "github.com/minio/highwayhash",
	"github.com/antithesishq/antithesis-sdk-go/", "github.com/google/go-tpm/", "golang.org/x/crypto/", "golang.org/x/time/",
	"golang.org/x/sys/",
}

// sqliteDeps are modernc.org/sqlite's own dependencies.
var sqliteDeps = []string{
	"modernc.org/", "golang.org/x/sys/", "github.com/dustin/go-humanize", "github.com/google/uuid",
	"github.com/mattn/go-isatty", "github.com/ncruces/go-strftime", "github.com/remyoudompheng/bigfft",
}

func TestDependencyRules(t *testing.T) {
	for pkg, ok := range allowed {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			if dep == pkg {
				continue
			}
			permitted := false
			for _, prefix := range ok {
				permitted = permitted || strings.HasPrefix(dep, prefix)
			}
			if !permitted {
				t.Errorf("%s depends on %s, which its rule forbids", pkg, dep)
			}
		}
	}
}
