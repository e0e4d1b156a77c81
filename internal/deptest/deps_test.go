package deptest

import (
	"os/exec"
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
	// server (events and their records), nothing else of ours.
	module + "/client": {module + "/event", module + "/record"},
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
	// never the server.
	module + "/internal/acpagent": append([]string{module + "/room", module + "/acp", module + "/custody", module + "/internal/detail", module + "/internal/usage", module + "/internal/startfail",
		module + "/internal/procio", module + "/internal/agents", module + "/internal/store", module + "/record", module + "/event", module + "/internal/confine", module + "/internal/agentfs", "golang.org/x/sys/",
		"github.com/coder/acp-go-sdk", "go.yaml.in/yaml/"}, append(sqliteDeps, append(mcpDeps, landlockDeps...)...)...),
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
	module + "/internal/server": append([]string{module + "/room", module + "/internal/store", module + "/record", module + "/event", module + "/internal/buildinfo"},
		append(sqliteDeps, prometheusDeps...)...),
	// Start failures explained: the confinement policy (what the agent may
	// read) and the redactor; never a transport, rooms or the server.
	module + "/internal/startfail": append([]string{module + "/internal/confine", module + "/internal/detail", module + "/internal/agentfs"}, landlockDeps...),
	// The build's name: the standard library only.
	module + "/internal/buildinfo": nil,
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
