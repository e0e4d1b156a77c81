// Package roomtest hosts rooms on a real transport for the transports'
// tests: a room manager over SQLite in the test's folder, the scripted
// model, custody, and helpers that submit messages and wait for events.
// Only tests import it.
package roomtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/roomsqlite"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/record"
	"github.com/agenthost/agenthost/room"
)

// Host is a room manager on the transport under test.
type Host struct {
	T    *testing.T
	Sim  *modelsim.Server
	DB   *store.DB
	Cust *custody.Custodian
	M    *room.Manager
	Root string
}

// Transport makes the transport under test from the host's custodian,
// the installed agents and the scripted model's URL.
type Transport func(cust *custody.Custodian, in *agents.Install, modelURL string) (room.Transport, error)

// Start runs a room manager on tr in dir (a fresh folder if ""), on sim
// (a fresh scripted model if nil), closed when the test ends. The real
// agents must be installed (make setup): the test fails, never skips,
// without them.
func Start(t *testing.T, dir string, sim *modelsim.Server, opts room.Options, tr Transport) *Host {
	t.Helper()
	return StartCustody(t, dir, sim, opts, custody.Options{}, tr)
}

// StartCustody is Start with the custodian made from copts (Resources, to
// limit and meter the rooms' agents).
func StartCustody(t *testing.T, dir string, sim *modelsim.Server, opts room.Options, copts custody.Options, tr Transport) *Host {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	// Starting resumes or re-attaches rooms, slow on a loaded machine.
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	if sim == nil {
		sim = StartSim(t)
	}
	in, err := agents.Find()
	if err != nil {
		t.Fatalf("the real agents are needed (run make setup): %v", err)
	}
	db, err := store.Open(ctx, filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cust, err := custody.New(copts)
	if err != nil {
		t.Fatal(err)
	}
	transport, err := tr(cust, in, sim.URL())
	if err != nil {
		t.Fatal(err)
	}
	opts.Store, opts.Transport, opts.Root = roomsqlite.New(db), transport, filepath.Join(dir, "rooms")
	m, err := room.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	h := &Host{T: t, Sim: sim, DB: db, Cust: cust, M: m, Root: opts.Root}
	t.Cleanup(h.Close)
	return h
}

// StartSim starts the scripted model, closed when the test ends.
func StartSim(t *testing.T) *modelsim.Server {
	t.Helper()
	sim := modelsim.New(modelsim.Options{})
	if err := sim.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}

// Close closes the rooms (their agents end), custody and the store.
// Idempotent.
func (h *Host) Close() {
	if h.M == nil {
		return
	}
	if err := h.M.Close(); err != nil && !errors.Is(err, room.ErrClosed) {
		h.T.Errorf("closing the rooms: %v", err)
	}
	if err := h.waitRooms(); err != nil {
		h.T.Errorf("closing the rooms: %v", err)
	}
	h.closeRest()
}

// Detach ends the host as a planned restart does: its agents run on.
func (h *Host) Detach() {
	h.T.Helper()
	if err := h.M.Detach(); err != nil {
		h.T.Fatalf("detaching the rooms: %v", err)
	}
	if err := h.waitRooms(); err != nil {
		h.T.Fatalf("detaching the rooms: %v", err)
	}
	h.closeRest()
}

// waitRooms waits for the shutdown Close or Detach began.
func (h *Host) waitRooms() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return h.M.Wait(ctx)
}

func (h *Host) closeRest() {
	if err := h.Cust.Close(); err != nil {
		h.T.Errorf("closing custody: %v", err)
	}
	h.checkEvents()
	_ = h.DB.Close()
	h.M = nil
}

// checkEvents checks every event the rooms wrote: each is exactly what
// its type in package event says.
func (h *Host) checkEvents() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rooms, err := h.DB.RoomIDs(ctx)
	if err != nil {
		h.T.Errorf("the rooms: %v", err)
		return
	}
	for _, rm := range rooms {
		for after := int64(0); ; {
			evs, err := h.DB.Events(ctx, rm, after, 0)
			if err != nil {
				h.T.Errorf("room %s: %v", rm, err)
				return
			}
			for _, ev := range evs {
				if err := event.Validate(ev.Type, ev.Data); err != nil {
					h.T.Errorf("room %s, event %d: %v", rm, ev.Seq, err)
				}
				after = ev.Seq
			}
			if len(evs) < record.MaxPage {
				break
			}
		}
	}
}

// Submit queues text in the room, from "ann".
func (h *Host) Submit(roomID, text string) room.Accepted {
	h.T.Helper()
	return h.SubmitAs(roomID, text, room.DeliverQueue)
}

// SubmitAs submits text in the room, from "ann", with the delivery given.
func (h *Host) SubmitAs(roomID, text, delivery string) room.Accepted {
	h.T.Helper()
	acc, err := h.M.Submit(h.T.Context(), roomID, room.Message{Text: text, Sender: "ann", Delivery: delivery})
	if err != nil {
		h.T.Fatalf("submit to %q: %v", roomID, err)
	}
	return acc
}

// Wait returns the room's first event of type typ after seq after that
// match accepts (nil: any), failing the test after 120 s.
func (h *Host) Wait(roomID string, after int64, typ string, match func(map[string]any) bool) (store.Event, map[string]any) {
	h.T.Helper()
	var d map[string]any
	ev := h.waitFor(roomID, after, typ, func(ev store.Event) bool {
		if ev.Type != typ {
			return false
		}
		d = nil
		_ = json.Unmarshal(ev.Data, &d)
		return match == nil || match(d)
	})
	return ev, d
}

// WaitFirst returns the room's first event after seq of any of types (an
// approval.requested, or the turn.ended that says none came), failing the
// test after 120 s.
func (h *Host) WaitFirst(roomID string, after int64, types ...string) store.Event {
	h.T.Helper()
	return h.waitFor(roomID, after, strings.Join(types, " or "), func(ev store.Event) bool { return slices.Contains(types, ev.Type) })
}

// waitFor returns the room's first event after seq that ok accepts.
func (h *Host) waitFor(roomID string, after int64, what string, ok func(store.Event) bool) store.Event {
	h.T.Helper()
	watch, stop := h.DB.Watch(roomID)
	defer stop()
	deadline := time.NewTimer(120 * time.Second)
	defer deadline.Stop()
	var seen []string // what came instead, for the failure's message
	for {
		evs, err := h.DB.Events(h.T.Context(), roomID, after, 0)
		if err != nil {
			h.T.Fatal(err)
		}
		for _, ev := range evs {
			after = ev.Seq
			if ok(ev) {
				return ev
			}
			if len(seen) < 40 {
				seen = append(seen, fmt.Sprintf("%d %s %.200s", ev.Seq, ev.Type, ev.Data))
			}
		}
		select {
		case <-watch:
		case <-deadline.C:
			h.T.Fatalf("room %q: no %s event after seq %d; came instead:\n%s", roomID, what, after, strings.Join(seen, "\n"))
		}
	}
}

// Ended waits for acc's turn.ended and returns its data.
func (h *Host) Ended(roomID string, acc room.Accepted) map[string]any {
	h.T.Helper()
	_, d := h.Wait(roomID, acc.Seq, event.TypeTurnEnded, func(d map[string]any) bool { return d["message_id"] == acc.ID })
	return d
}

// Settled waits for acc's turn to end settled and returns its text.
func (h *Host) Settled(roomID string, acc room.Accepted) string {
	h.T.Helper()
	d := h.Ended(roomID, acc)
	if d["outcome"] != room.OutcomeSettled {
		h.T.Fatalf("room %q: turn ended %v", roomID, d)
	}
	return d["text"].(string)
}

// ModelUsage is what the scripted model reported for the agent's requests
// from the next'th on (those that offered tools: the agent's own), at the
// price registered for it; next moves past them.
func (h *Host) ModelUsage(next *int) record.Usage {
	h.T.Helper()
	reqs := h.Sim.Requests()
	var u modelsim.Usage
	for _, r := range reqs[*next:] {
		if len(r.Tools) > 0 {
			u = u.Add(r.Usage)
		}
	}
	*next = len(reqs)
	return record.Usage{InputTokens: int64(u.Input), OutputTokens: int64(u.Output), CacheReadTokens: int64(u.CacheRead),
		CacheWriteTokens: int64(u.CacheWrite),
		CostUSD:          agents.Cost(int64(u.Input), int64(u.Output), int64(u.CacheRead), int64(u.CacheWrite))}
}

// TurnUsage is a turn.ended's usage.
func TurnUsage(t testing.TB, ended map[string]any) record.Usage {
	t.Helper()
	b, _ := json.Marshal(ended["usage"])
	var u record.Usage
	if err := json.Unmarshal(b, &u); err != nil {
		t.Fatalf("turn.ended usage %s: %v", b, err)
	}
	return u
}

// SameTokens: the same token counts (costs aside).
func SameTokens(a, b record.Usage) bool {
	a.CostUSD, b.CostUSD = 0, 0
	return a == b
}

// Events is the room's whole log.
func (h *Host) Events(roomID string) []store.Event {
	h.T.Helper()
	evs, err := h.DB.Events(h.T.Context(), roomID, 0, 0)
	if err != nil {
		h.T.Fatal(err)
	}
	return evs
}

// Count is how many events of type typ the room's log holds.
func (h *Host) Count(roomID, typ string) int {
	h.T.Helper()
	n := 0
	for _, ev := range h.Events(roomID) {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

// CheckTurnEvents fails the test when a text or tool event in the room's
// log names no turn, or another turn than the one running.
func (h *Host) CheckTurnEvents(roomID string) {
	h.T.Helper()
	running := ""
	for _, ev := range h.Events(roomID) {
		id := Field(ev.Data, "turn_id")
		switch ev.Type {
		case event.TypeTurnStarted:
			running = id
		case event.TypeTurnEnded:
			running = ""
		case room.KindText, room.KindToolStarted, room.KindToolEnded:
			if id == "" || id != running {
				h.T.Fatalf("room %q: %s at seq %d for turn %q while turn %q runs", roomID, ev.Type, ev.Seq, id, running)
			}
		}
	}
}

// ModelSaw reports whether some request to the model carried s.
func (h *Host) ModelSaw(s string) bool {
	for _, r := range h.Sim.Requests() {
		for _, m := range r.Messages {
			if strings.Contains(m.Content, s) {
				return true
			}
		}
	}
	return false
}

// LastRequestHas reports whether the last request to the model carried s
// (a resumed session's history is in the request that follows it).
func (h *Host) LastRequestHas(s string) bool {
	reqs := h.Sim.Requests()
	if len(reqs) == 0 {
		return false
	}
	for _, m := range reqs[len(reqs)-1].Messages {
		if strings.Contains(m.Content, s) {
			return true
		}
	}
	return false
}

// Field is the string at key in a JSON object ("" when absent).
func Field(raw json.RawMessage, key string) string {
	var d map[string]any
	_ = json.Unmarshal(raw, &d)
	s, _ := d[key].(string)
	return s
}

// BashCall is the scripted model's directive for a bash tool call.
func BashCall(cmd string) string {
	b, _ := json.Marshal(map[string]string{"command": cmd})
	return "[[tool:bash " + string(b) + "]]"
}

// Probe is the confinement probe: a script an agent's shell tool runs in
// room a's workspace (one tool call, written there by WriteProbe) that
// writes and reads its own workspace, reads a system file, another room's
// file, the store and a symlink planted in the workspace that points into
// the other room, signals the server, connects to a TCP port and binds one.
// Each prints one line: NAME=read:FIRST BYTES or NAME=denied:ERROR, and
// signal=, connect=, bind= sent/ok or denied.
type Probe struct {
	// Other is a file of another room; Store the server's store; PID the
	// server's; Port a TCP port something listens on.
	Other, Store string
	PID          int
	Port         int
}

// ProbeScript is the file WriteProbe writes into the workspace.
const ProbeScript = "confine-probe.sh"

// ProbeLink is the symlink WriteProbe plants in the workspace.
const ProbeLink = "into-other-room"

// WriteProbe writes the probe's script and symlink into workspace; the
// tool then runs `bash confine-probe.sh`.
func (p Probe) WriteProbe(t testing.TB, workspace string) {
	t.Helper()
	script := `read1() { if out=$(head -c 16 "$2" 2>&1); then echo "$1=read:$out"; else echo "$1=denied:$out"; fi; }
echo confined-probe > own.txt
read1 own own.txt
read1 system /etc/passwd
read1 other ` + shellQuote(p.Other) + `
read1 store ` + shellQuote(p.Store) + `
read1 link ` + ProbeLink + `
if out=$(kill -0 ` + strconv.Itoa(p.PID) + ` 2>&1); then echo signal=sent; else echo "signal=denied:$out"; fi
if out=$( (exec 3<>/dev/tcp/127.0.0.1/` + strconv.Itoa(p.Port) + `) 2>&1); then echo connect=ok; else echo "connect=denied:$out"; fi
if out=$(perl -MIO::Socket::INET -e 'IO::Socket::INET->new(Listen=>1,LocalAddr=>"127.0.0.1",LocalPort=>0) or die "$!\n"' 2>&1); then echo bind=ok; else echo "bind=denied:$out"; fi
echo "privilege=$(grep -E '^(CapPrm|CapEff|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status | tr -d '\t' | tr '\n' ' ')"
`
	if err := os.WriteFile(filepath.Join(workspace, ProbeScript), []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(filepath.Join(workspace, ProbeLink))
	if err := os.Symlink(p.Other, filepath.Join(workspace, ProbeLink)); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{ProbeScript, ProbeLink} {
		if err := giveToFolderOwner(workspace, filepath.Join(workspace, n)); err != nil {
			t.Fatal(err)
		}
	}
}

// RemoveProbe removes what WriteProbe and the probe wrote.
func RemoveProbe(workspace string) {
	for _, n := range []string{ProbeScript, ProbeLink, "own.txt"} {
		_ = os.Remove(filepath.Join(workspace, n))
	}
}

// ProbeResults finds the probe's output in what the agents sent the model
// (a tool result) and parses it (ParseProbe); nil when no tool result
// carries it.
func ProbeResults(sim *modelsim.Server) map[string]string {
	for _, r := range sim.Requests() {
		for _, m := range r.Messages {
			if res := ParseProbe(m.Content); res != nil {
				return res
			}
		}
	}
	return nil
}

// ParseProbe returns each probe's result in s ("read:...", "denied:...",
// "sent", "ok"), nil when s is not the probe's output.
func ParseProbe(s string) map[string]string {
	i := strings.Index(s, "own=")
	if i < 0 || !strings.Contains(s, "bind=") {
		return nil
	}
	out := map[string]string{}
	for _, line := range strings.Split(s[i:], "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && out[k] == "" {
			out[k] = v
		}
	}
	return out
}

// CheckConfined fails the test unless the probe's results show a confined
// agent: its own workspace written and read, a system file read; the other
// room's file, the store and the link denied (permission denied), the
// server not signalled; with net, the connect and the bind denied; no
// capability, no_new_privs set and (amd64, arm64) a seccomp filter.
func CheckConfined(t testing.TB, res map[string]string, net bool) {
	t.Helper()
	want := map[string]string{"own": "read:confined-probe", "system": "read:", "other": "denied:", "store": "denied:",
		"link": "denied:", "signal": "denied", "connect": "ok", "bind": "ok"}
	if net {
		want["connect"], want["bind"] = "denied", "denied"
	}
	checkProbe(t, res, want)
	// No privilege: the launcher dropped every capability and set
	// no_new_privs, and filters system calls where it has a filter.
	wantPriv := []string{"CapPrm:0000000000000000", "CapEff:0000000000000000", "CapAmb:0000000000000000", "NoNewPrivs:1"}
	if runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64" {
		wantPriv = append(wantPriv, "Seccomp:2")
	}
	for _, w := range wantPriv {
		if !slices.Contains(strings.Fields(res["privilege"]), w) {
			t.Errorf("probe privilege: %q, want %s", res["privilege"], w)
		}
	}
	// Denied by Landlock, or hidden: an agent running as a uid of its own
	// sees only its own folders of a folder that uid cannot search (the
	// launcher's mount view), so the file (which the test made) is not
	// there for it.
	for _, k := range []string{"other", "store", "link"} {
		if l := strings.ToLower(res[k]); !strings.Contains(l, "permission denied") && !strings.Contains(l, "no such file or directory") {
			t.Errorf("probe %s: %q says neither permission denied nor no such file", k, res[k])
		}
	}
}

// CheckUnconfined fails the test unless every probe succeeded.
func CheckUnconfined(t testing.TB, res map[string]string) {
	t.Helper()
	checkProbe(t, res, map[string]string{"own": "read:confined-probe", "system": "read:", "other": "read:", "store": "read:SQLite",
		"link": "read:", "signal": "sent", "connect": "ok", "bind": "ok"})
}

func checkProbe(t testing.TB, res map[string]string, want map[string]string) {
	t.Helper()
	if res == nil {
		t.Fatal("no tool result carries the probe's output")
	}
	t.Logf("probe: %q", res)
	for k, prefix := range want {
		if !strings.HasPrefix(res[k], prefix) {
			t.Errorf("probe %s: %q, want %q…", k, res[k], prefix)
		}
	}
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
