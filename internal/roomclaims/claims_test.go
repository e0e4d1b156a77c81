//go:build linux

package roomclaims

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/acpagent"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/mcpprobe"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/roomsqlite"
	"github.com/agenthost/agenthost/internal/rpcagent"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
	"go.uber.org/goleak"
)

// mcpHelperEnv makes the test binary a minimal stdio MCP server with one tool, echo_upper; the
// variable's value is a file it creates when it starts.
const mcpHelperEnv = "ROOMCLAIMS_TEST_MCP"

func TestMain(m *testing.M) {
	// The launcher of the confined agents the tests start.
	confine.Launch()
	if os.Getenv(mcpHelperEnv) != "" {
		os.Exit(mcpHelper())
	}
	goleak.VerifyTestMain(m)
}

// probeGapsEnv, set, runs the claims a path names as gaps too, to see whether one closed (then
// take it out of the table and regenerate the matrix).
const probeGapsEnv = "ROOMCLAIMS_PROBE_GAPS"

// parallelPaths bounds how many agent paths run at once: the agents are Node and Bun programs of
// ~250 MB that each want a core while starting, and CI boxes have two.
const parallelPaths = 2

// The rooms each path uses.
const (
	roomMain  = "main"      // every claim but model selection
	roomModel = "model-ok"  // selects path.model
	roomBad   = "model-bad" // selects a model no agent has
)

// waitTimeout bounds one wait for a room event; generous, for a loaded two-core box.
const waitTimeout = 120 * time.Second

// TestClaims runs every claim on every real agent path; a path's gap is a named skip with its
// reason. Claims of one path run in order on one host, sharing its rooms.
func TestClaims(t *testing.T) {
	in, err := agents.Find()
	if err != nil {
		t.Fatalf("the real agents are needed (run make setup): %v", err)
	}
	pins := pinnedVersions(t)
	sem := make(chan struct{}, parallelPaths)
	for _, p := range paths {
		t.Run(p.id, func(t *testing.T) {
			t.Parallel()
			select {
			case sem <- struct{}{}:
			case <-t.Context().Done():
				return
			}
			defer func() { <-sem }()
			if v, err := in.Version(p.kind); err != nil || v != pins[p.kind] {
				t.Fatalf("%s is at %q (%v), the matrix says %q: run make setup", p.kind, v, err, pins[p.kind])
			}
			r := newPathRun(t, in, p)
			start := time.Now()
			for _, c := range claims {
				if !t.Run(c.id, func(t *testing.T) {
					if reason, gap := p.gaps[c.id]; gap && os.Getenv(probeGapsEnv) == "" {
						t.Skipf("gap on %s: %s", p.id, reason)
					}
					r.t = t
					c.run(r)
				}) && c.id != cCleanup {
					r.failed = true
				}
			}
			t.Logf("%s: %d claims in %v", p.id, len(claims), time.Since(start).Round(time.Millisecond))
		})
	}
}

// pathRun is one path's host and the state its claims share.
type pathRun struct {
	t      *testing.T // the running claim's
	top    *testing.T // the path's
	p      path
	in     *agents.Install
	dir    string
	sim    *modelsim.Server
	h      *host
	mcp    string // the file the probe MCP server creates when it starts
	failed bool   // an earlier claim failed (later ones may be its echo)

	askPerson atomic.Bool // approvals go to a person (the approval claims); else the policy allows
	bgPid     int         // the background process claimBackground left running
}

func newPathRun(t *testing.T, in *agents.Install, p path) *pathRun {
	r := &pathRun{t: t, top: t, p: p, in: in, dir: t.TempDir()}
	r.sim = modelsim.New(modelsim.Options{})
	if err := r.sim.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.sim.Close() })
	// In the room's home: a confined MCP server writes nowhere else.
	r.mcp = filepath.Join(r.homeOf(roomMain), "probe-started")
	r.plantMCP(t)
	r.h = r.startHost()
	return r
}

// plantMCP writes MCP configurations into the main room's workspace before its agent first starts,
// as a repository could: none of their servers may reach the agent (claimMCP checks).
func (r *pathRun) plantMCP(t *testing.T) {
	ws := r.workspaceOf(roomMain)
	evil, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{"injected": map[string]any{
		"command": os.Args[0], "args": []string{"-test.run=^$"}, "env": map[string]string{mcpHelperEnv: r.injected()},
	}}})
	if err := os.MkdirAll(ws, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range plantedMCP {
		if err := os.WriteFile(filepath.Join(ws, name), evil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// workspaceOf is the room's workspace folder, whether or not it exists yet: its id, a dash and the
// first 10 bytes of its SHA-256 in hex (room's own naming; claims fail at once if it changes, as
// workspace() finds no folder).
func (r *pathRun) workspaceOf(roomID string) string {
	sum := sha256.Sum256([]byte(roomID))
	return filepath.Join(r.dir, "ws", roomID+"-"+hex.EncodeToString(sum[:10]))
}

// homeOf is the room's agent home, named as its workspace.
func (r *pathRun) homeOf(roomID string) string {
	return filepath.Join(r.dir, "rooms", filepath.Base(r.workspaceOf(roomID)), "home")
}

// plantedMCP are the workspace files agents read MCP servers from (omp reads both, claude the first).
var plantedMCP = []string{".mcp.json", "mcp.json"}

// injected is the file a planted MCP server creates when an agent starts it.
// It is in the room's home, where a confined server could write it.
func (r *pathRun) injected() string { return filepath.Join(r.homeOf(roomMain), "injected-started") }

// host is a room manager on the path's transport, its store and custody.
type host struct {
	r    *pathRun
	db   *store.DB
	cust *custody.Custodian
	m    *room.Manager
	once sync.Once
}

// startHost starts the path's host: it lives as long as the path (r.top),
// and a failure to start it fails the running claim (r.t; a subtest may
// not fail its parent).
func (r *pathRun) startHost() *host {
	t := r.t
	ctx, cancel := context.WithTimeout(r.top.Context(), 60*time.Second)
	defer cancel()
	db, err := store.Open(ctx, filepath.Join(r.dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cust, err := custody.New(custody.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Every claim runs confined, the network limited to the model's port
	// and the room tools'.
	cf, err := confine.New(confine.Options{Mode: confine.ModeLandlock, Net: []uint16{}, Ports: []uint16{r.simPort()}, Tools: r.in.Dir})
	if err != nil {
		t.Fatal(err)
	}
	var tr room.Transport
	switch r.p.transport {
	case "rpc":
		tr, err = rpcagent.New(rpcagent.Options{Custodian: cust, Install: r.in, ModelURL: r.sim.URL(), Confine: cf})
	case "acp":
		tr, err = acpagent.New(acpagent.Options{Custodian: cust, Install: r.in, ModelURL: r.sim.URL(), Confine: cf})
	}
	if err != nil {
		t.Fatal(err)
	}
	probe := map[string]room.MCPServer{
		"probe": {Command: []string{os.Args[0], "-test.run=^$"}, Env: map[string]string{mcpHelperEnv: r.mcp}},
	}
	if _, gap := r.p.gaps[cMCP]; gap && os.Getenv(probeGapsEnv) == "" {
		// An agent without MCP refuses a room that configures servers.
		probe = nil
	}
	m, err := room.New(room.Options{
		Store: roomsqlite.New(db), Transport: tr,
		Root: filepath.Join(r.dir, "rooms"), Workspaces: filepath.Join(r.dir, "ws"),
		Config: room.Config{Agent: string(r.p.kind), MCP: probe, ApprovalTimeout: 3 * time.Second},
		RoomConfig: func(id string) room.Config {
			switch id {
			case roomModel:
				return room.Config{Model: r.p.model}
			case roomBad:
				return room.Config{Model: "no-such-provider/no-such-model"}
			}
			return room.Config{}
		},
		// Only the approval claims ask a person; otherwise the policy allows, so claims about
		// other things do not depend on the approval machinery.
		Policy: func(string, room.ApprovalRequest) room.Decision {
			if r.askPerson.Load() {
				return room.Ask
			}
			return room.Allow
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	h := &host{r: r, db: db, cust: cust, m: m}
	r.top.Cleanup(h.close)
	return h
}

// simPort is the scripted model's TCP port.
func (r *pathRun) simPort() uint16 {
	u, err := url.Parse(r.sim.URL())
	if err != nil {
		r.t.Fatal(err)
	}
	n, err := strconv.ParseUint(u.Port(), 10, 16)
	if err != nil {
		r.t.Fatal(err)
	}
	return uint16(n)
}

func (h *host) close() {
	h.once.Do(func() {
		_ = h.m.Close()
		wctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := h.m.Wait(wctx); err != nil {
			h.r.top.Errorf("closing the rooms: %v", err)
		}
		if err := h.cust.Close(); err != nil {
			h.r.top.Errorf("closing custody: %v", err)
		}
		_ = h.db.Close()
	})
}

func (r *pathRun) submit(roomID, text string) room.Accepted {
	r.t.Helper()
	acc, err := r.h.m.Submit(r.t.Context(), roomID, room.Message{Text: text, Sender: "ann", Delivery: room.DeliverQueue})
	if err != nil {
		r.t.Fatalf("submit to %q: %v", roomID, err)
	}
	return acc
}

// wait returns the room's first event of type typ after seq that match accepts (nil: any).
func (r *pathRun) wait(roomID string, after int64, typ string, match func(map[string]any) bool) (store.Event, map[string]any) {
	r.t.Helper()
	watch, stop := r.h.db.Watch(roomID)
	defer stop()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for {
		evs, err := r.h.db.Events(r.t.Context(), roomID, after, 0)
		if err != nil {
			r.t.Fatal(err)
		}
		for _, ev := range evs {
			after = ev.Seq
			if ev.Type != typ {
				continue
			}
			var d map[string]any
			_ = json.Unmarshal(ev.Data, &d)
			if match == nil || match(d) {
				return ev, d
			}
		}
		select {
		case <-watch:
		case <-deadline.C:
			r.t.Fatalf("room %q: no %s event after seq %d within %v", roomID, typ, after, waitTimeout)
		case <-r.t.Context().Done():
			r.t.Fatal("test ended")
		}
	}
}

func (r *pathRun) ended(roomID string, acc room.Accepted) (store.Event, map[string]any) {
	r.t.Helper()
	return r.wait(roomID, acc.Seq, "turn.ended", func(d map[string]any) bool { return d["message_id"] == acc.ID })
}

func (r *pathRun) settled(roomID string, acc room.Accepted) string {
	r.t.Helper()
	_, d := r.ended(roomID, acc)
	if d["outcome"] != room.OutcomeSettled {
		r.t.Fatalf("room %q: turn ended %v", roomID, d)
	}
	s, _ := d["text"].(string)
	return s
}

// events returns the room's events of type typ after seq.
func (r *pathRun) events(roomID string, after int64, typ string) []map[string]any {
	r.t.Helper()
	evs, err := r.h.db.Events(r.t.Context(), roomID, after, 0)
	if err != nil {
		r.t.Fatal(err)
	}
	var out []map[string]any
	for _, ev := range evs {
		if ev.Type == typ {
			var d map[string]any
			_ = json.Unmarshal(ev.Data, &d)
			out = append(out, d)
		}
	}
	return out
}

// modelSaw reports whether a request to the model carried s in a message of role (any if "").
func (r *pathRun) modelSaw(role, s string) bool {
	for _, q := range r.sim.Requests() {
		for _, m := range q.Messages {
			if (role == "" || m.Role == role) && strings.Contains(m.Content, s) {
				return true
			}
		}
	}
	return false
}

// modelSawTogether reports whether one model request carried both now (in a user message) and
// before (anywhere): the agent sent the earlier turns with the new one. Side requests such as
// claude's title request carry only the new message, so any request may be the one.
func (r *pathRun) modelSawTogether(now, before string) bool {
	for _, q := range r.sim.Requests() {
		hasNow, hasBefore := false, false
		for _, m := range q.Messages {
			hasNow = hasNow || m.Role == "user" && strings.Contains(m.Content, now)
			hasBefore = hasBefore || strings.Contains(m.Content, before)
		}
		if hasNow && hasBefore {
			return true
		}
	}
	return false
}

// workspace returns the room's workspace folder.
func (r *pathRun) workspace(roomID string) string {
	r.t.Helper()
	ws, _ := filepath.Glob(filepath.Join(r.dir, "ws", roomID+"-*"))
	if len(ws) != 1 {
		r.t.Fatalf("workspaces of room %q: %v", roomID, ws)
	}
	return ws[0]
}

// answerText strips what an agent puts before the model's answer in a turn's text: codex starts
// every turn with a warning that the scripted model's metadata is unknown.
func (r *pathRun) answerText(text string) string {
	const codexWarning = "Warning: Model metadata for `fake-model` not found."
	if r.p.kind == agents.Codex && strings.HasPrefix(text, codexWarning) {
		if _, rest, ok := strings.Cut(text, "\n\n"); ok {
			return rest
		}
	}
	return text
}

func mcpHelper() int { return mcpprobe.Serve(os.Stdin, os.Stdout, os.Getenv(mcpHelperEnv)) }

// pinnedVersions reads the versions setup installs, from the tools folder's package.json.
func pinnedVersions(t testing.TB) map[agents.Kind]string {
	t.Helper()
	// omp's and pi's pins are the tools folder's own project's, the ACP
	// agents' their project's (acp/).
	var pj struct{ Dependencies map[string]string }
	for _, dir := range []string{".", "acp"} {
		data, err := os.ReadFile(filepath.Join("..", "..", ".tools", dir, "package.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &pj); err != nil {
			t.Fatal(err)
		}
	}
	return map[agents.Kind]string{
		agents.OMP:     pj.Dependencies["@oh-my-pi/pi-coding-agent"],
		agents.Pi:      pj.Dependencies["@mariozechner/pi-coding-agent"],
		agents.Claude:  pj.Dependencies["@agentclientprotocol/claude-agent-acp"],
		agents.Codex:   pj.Dependencies["@agentclientprotocol/codex-acp"],
		agents.Copilot: pj.Dependencies["@github/copilot"],
	}
}

// markerProc is a live process of this test binary's custody, with its scope.
type markerProc struct {
	pid   int
	start string
	scope string
	cmd   string
}

// markerProcs lists live (not zombie) processes whose custody marker names this test process.
func markerProcs() []markerProc {
	self := strconv.Itoa(os.Getpid())
	var out []markerProc
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		env, err := os.ReadFile(filepath.Join(dir, "environ"))
		if err != nil {
			continue
		}
		f := statFields(pid)
		if len(f) < 20 || f[0] == "Z" {
			continue
		}
		for _, kv := range strings.Split(string(env), "\x00") {
			// <pid namespace>.<host pid>.<host start>.<scope>
			m, ok := strings.CutPrefix(kv, custody.MarkerEnv+"=")
			if !ok {
				continue
			}
			if parts := strings.Split(m, "."); len(parts) == 4 && parts[1] == self {
				cmd, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
				out = append(out, markerProc{pid: pid, start: f[19], scope: parts[3], cmd: strings.ReplaceAll(strings.TrimRight(string(cmd), "\x00"), "\x00", " ")})
			}
		}
	}
	return out
}

// alive reports whether p still runs (same pid and start time, not a zombie).
func (p markerProc) alive() bool {
	f := statFields(p.pid)
	return len(f) >= 20 && f[0] != "Z" && f[19] == p.start
}

// statFields returns the fields of /proc/PID/stat after the command name, or nil.
func statFields(pid int) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

// scopeOf returns the custody scope of the room's running agent: the scope of a marked process
// whose working directory is the room's workspace.
func (r *pathRun) scopeOf(roomID string) string {
	r.t.Helper()
	ws := r.workspace(roomID)
	for _, p := range markerProcs() {
		if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", p.pid)); err == nil && cwd == ws {
			return p.scope
		}
	}
	r.t.Fatalf("no agent process runs in room %q's workspace", roomID)
	return ""
}

var pidRE = regexp.MustCompile(`pid=(\d+)`)
