package rpcagent

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/daemonproc"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/roomtest"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/procd"
	"github.com/agenthost/agenthost/room"
)

// startDaemon runs a procd daemon for dir in this process and returns a
// client of it; the daemon ends (with every process) with the test.
func startDaemon(t *testing.T, dir string) *procd.Client {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- procd.Run(ctx, procd.Options{DataDir: dir}) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := procd.Dial(dctx, dir)
		dcancel()
		if err == nil {
			t.Cleanup(func() {
				cancel()
				select {
				case <-ran:
				case <-time.After(60 * time.Second):
					t.Error("the daemon did not end")
				}
			})
			return c
		}
		select {
		case err := <-ran:
			cancel()
			t.Fatalf("the daemon ended: %v", err)
		case <-time.After(10 * time.Millisecond): // its registration is a file: polled, bounded
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("the daemon does not answer: %v", err)
		}
	}
}

// startDaemonHost is startHost with every agent in the daemon d (through
// a Runner of its own, as each host process has), confined (the daemon
// runs the launcher, as under serve --daemon).
func startDaemonHost(t *testing.T, dir string, sim *modelsim.Server, d *procd.Client, opts room.Options) *host {
	t.Helper()
	r, err := daemonproc.NewRunner(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() }) // registered first: runs after the host's cleanup
	return roomtest.Start(t, dir, sim, opts, func(cust *custody.Custodian, in *agents.Install, url string) (room.Transport, error) {
		cf, err := confine.New(confine.Options{Mode: confine.ModeLandlock, Tools: in.Dir})
		if err != nil {
			return nil, err
		}
		return New(Options{Custodian: cust, Install: in, ModelURL: url, Daemon: r, Confine: cf})
	})
}

// A host restarted mid-turn (Detach, then a new host on the same store and
// daemon) re-attaches omp at the recorded offset without starting it again;
// the turn goes on to its end, and the room's log holds every text delta
// exactly once: together they are the answer.
func TestRealDaemonRestartMidTurn(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir)
	sim := roomtest.StartSim(t)
	h1 := startDaemonHost(t, dir, sim, d, room.Options{})
	words := "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu"
	acc := h1.Submit("r", "[[slow:250ms]] [[say:"+words+"]]")
	h1.Wait("r", acc.Seq, room.KindText, nil)
	h1.Detach()
	procs, err := d.List(t.Context(), procd.ModePipe)
	if err != nil || len(procs) != 1 || !procs[0].Running {
		t.Fatalf("after the host let go: %+v %v", procs, err)
	}

	// The next host allows the probe's tool call below.
	h2 := startDaemonHost(t, dir, sim, d, room.Options{Policy: func(string, room.ApprovalRequest) room.Decision { return room.Allow }})
	text := h2.Settled("r", acc)
	if text != words {
		t.Fatalf("the turn's answer %q", text)
	}
	var deltas strings.Builder
	starts, attaches := 0, 0
	for _, ev := range h2.Events("r") {
		switch ev.Type {
		case room.KindText:
			deltas.WriteString(roomtest.Field(ev.Data, "text"))
		case "agent.started":
			starts++
		case "agent.attached":
			attaches++
		}
	}
	if deltas.String() != words {
		t.Fatalf("text deltas across the restart add up to %q, want %q (each exactly once)", deltas.String(), words)
	}
	if starts != 1 || attaches != 1 {
		t.Fatalf("agent.started %d, agent.attached %d: want 1 and 1 (no second start)", starts, attaches)
	}
	// The room goes on on the same agent, which the daemon started
	// confined: the attached room says so, and the agent's tools reach
	// only the room.
	st, err := h2.M.State(t.Context(), "r")
	if err != nil || st.Confinement == nil || st.Confinement.Mode != "landlock" {
		t.Fatalf("the attached room's confinement: %+v %v", st.Confinement, err)
	}
	ws, _ := filepath.Glob(filepath.Join(h2.Root, "r-*", "workspace"))
	if len(ws) != 1 {
		t.Fatalf("the room's workspace: %v", ws)
	}
	other := filepath.Join(dir, "another-room")
	if err := os.MkdirAll(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "secret.txt"), []byte("the other room's secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	probe := roomtest.Probe{Other: filepath.Join(other, "secret.txt"), Store: filepath.Join(dir, "agenthost.db"), PID: os.Getpid(),
		Port: ln.Addr().(*net.TCPAddr).Port}
	probe.WriteProbe(t, ws[0])
	h2.Settled("r", h2.Submit("r", "Probe: "+roomtest.BashCall("bash "+roomtest.ProbeScript)))
	roomtest.CheckConfined(t, roomtest.ProbeResults(sim), false)
	// Closing the host (not a restart) ends the agent with a receipt.
	h2.Close()
	procs, err = d.List(t.Context(), procd.ModePipe)
	if err != nil || len(procs) != 0 {
		t.Fatalf("after close: %+v %v", procs, err)
	}
	db, err := store.Open(t.Context(), filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rs, err := db.Receipts(t.Context(), "r")
	if err != nil || len(rs) != 1 {
		t.Fatalf("receipts %d %v", len(rs), err)
	}
	var rec custody.Receipt
	if err := json.Unmarshal(rs[0].Receipt, &rec); err != nil || len(rec.Processes) == 0 {
		t.Fatalf("receipt %s: %v", rs[0].Receipt, err)
	}
	if rooms, _ := db.AgentRooms(t.Context()); len(rooms) != 0 {
		t.Fatalf("a released agent's handle is still recorded: %+v", rooms)
	}
}

// A restart while the turn waits on an approval: the next host re-reads
// the agent's request, takes the pending approval over (not asked twice),
// and a person's decision on it reaches the agent; the turn completes.
func TestRealDaemonRestartDuringApproval(t *testing.T) { daemonRestartDuringApproval(t, agents.OMP) }

// The same on pi, whose approvals come from agenthost's extension.
func TestRealDaemonRestartDuringApprovalPi(t *testing.T) { daemonRestartDuringApproval(t, agents.Pi) }

func daemonRestartDuringApproval(t *testing.T, kind agents.Kind) {
	dir := t.TempDir()
	d := startDaemon(t, dir)
	sim := roomtest.StartSim(t)
	opts := room.Options{Config: room.Config{Agent: string(kind)}}
	h1 := startDaemonHost(t, dir, sim, d, opts)
	acc := h1.Submit("r", "Run it: "+roomtest.BashCall("echo approved-run"))
	_, req := h1.Wait("r", acc.Seq, "approval.requested", nil)
	id := req["approval_id"].(string)
	h1.Detach()

	h2 := startDaemonHost(t, dir, sim, d, opts)
	// The pending approval is the agent's again (not denied by the
	// restart); deciding it reaches the agent, whether its request is
	// read again before or after.
	if err := h2.M.Approve(t.Context(), "r", id, true); err != nil {
		t.Fatalf("approving %s after the restart: %v", id, err)
	}
	if got := h2.Settled("r", acc); got != "done" {
		t.Fatalf("turn text %q", got)
	}
	requested, resolved := 0, 0
	var output string
	for _, ev := range h2.Events("r") {
		switch ev.Type {
		case "approval.requested":
			requested++
		case "approval.resolved":
			resolved++
			if by := roomtest.Field(ev.Data, "by"); by != "person" {
				t.Fatalf("approval resolved by %q", by)
			}
		case room.KindToolEnded:
			output = roomtest.Field(ev.Data, "output")
		}
	}
	if requested != 1 || resolved != 1 {
		t.Fatalf("approval.requested %d, approval.resolved %d: want 1 and 1", requested, resolved)
	}
	if !strings.Contains(output, "approved-run") {
		t.Fatalf("tool output %q", output)
	}
}

// A restart while omp's ask tool waits on a question: the question is
// asked once, answered after the restart by the room's next message, and
// the answer reaches the agent.
func TestRealDaemonRestartDuringQuestion(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir)
	sim := roomtest.StartSim(t)
	h1 := startDaemonHost(t, dir, sim, d, room.Options{})
	ask := `[[tool:ask {"questions":[{"id":"c","question":"Which color?","options":[{"label":"red"},{"label":"blue"}]}]}]]`
	acc := h1.Submit("r", ask)
	h1.Wait("r", acc.Seq, "question.asked", nil)
	h1.Detach()

	h2 := startDaemonHost(t, dir, sim, d, room.Options{})
	// The room's next message answers it, whether the agent asked again
	// yet or not.
	h2.Submit("r", "green-ish")
	h2.Settled("r", acc)
	asked, answered := 0, 0
	var output string
	for _, ev := range h2.Events("r") {
		switch ev.Type {
		case "question.asked":
			asked++
		case "question.answered":
			answered++
			if by := roomtest.Field(ev.Data, "by"); by != "message" {
				t.Fatalf("answered by %q", by)
			}
		case room.KindToolEnded:
			output = roomtest.Field(ev.Data, "output")
		}
	}
	if asked != 1 || answered != 1 || !strings.Contains(output, "green-ish") {
		t.Fatalf("question.asked %d, question.answered %d, tool output %q", asked, answered, output)
	}
}

// The daemon releases what the room committed of an agent's output: after
// a turn with a 300 kB answer (omp repeats the partial message in every
// update: about 4 MB of output) the file takes about one TrimEvery of disk,
// its size and offsets kept, and a host attaching at the committed offset
// reads on. (Each turn left all of it on disk for the agent's life.)
func TestRealDaemonOutputTrimmed(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir)
	sim := roomtest.StartSim(t)
	h1 := startDaemonHost(t, dir, sim, d, room.Options{})
	outputs := func() []string {
		m, _ := filepath.Glob(filepath.Join(dir, "rooms", "*", "agent-output", "agent-*.out"))
		return m
	}
	const bound = 2 * daemonproc.TrimEvery
	acc := h1.Submit("r", "[[big:300000]]")
	if text := h1.Settled("r", acc); len(text) != 300000 {
		t.Fatalf("%d bytes of text", len(text))
	}
	outs := outputs()
	if len(outs) != 1 {
		t.Fatalf("agent output files %v", outs)
	}
	var st syscall.Stat_t
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := syscall.Stat(outs[0], &st); err != nil {
			t.Fatal(err)
		}
		if st.Blocks*512 <= bound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the turn the agent's output takes %d bytes of disk (size %d), want at most %d", st.Blocks*512, st.Size, bound)
		}
		time.Sleep(20 * time.Millisecond) // the release goes to the daemon in the background: polled, bounded
	}
	t.Logf("%d bytes on disk of a %d byte output", st.Blocks*512, st.Size)
	h1.Detach()
	h2 := startDaemonHost(t, dir, sim, d, room.Options{})
	acc = h2.Submit("r", "[[say:after the release]]")
	if got := h2.Settled("r", acc); got != "after the release" {
		t.Fatalf("the attached agent's turn: %q", got)
	}
	if n := h2.Count("r", "agent.started"); n != 1 {
		t.Fatalf("agent.started %d: the agent should have been attached", n)
	}
}
