package natsroom

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// logTail keeps the last maxTailLines lines written to it (a text
// handler writes a record per Write).
type logTail struct {
	mu    sync.Mutex
	lines []string
}

const maxTailLines = 300

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) == maxTailLines {
		l.lines = append(l.lines[:0], l.lines[1:]...)
	}
	l.lines = append(l.lines, string(p))
	return len(p), nil
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "")
}

// host is one agenthost node in a test: an embedded JetStream node, a
// Cluster and a Manager on a fake transport.
type host struct {
	t       *testing.T
	name    string
	node    *Node
	nc      *nats.Conn
	c       *Cluster
	m       *room.Manager
	tr      *fakeTransport
	link    *latencyProxy // with hostOpts.slowLink
	stall   *holdProxy    // with hostOpts.stallLink
	stopped bool
	// roomsStopped: stopRooms ran (the node may still run).
	roomsStopped bool
}

type hostOpts struct {
	name, storeDir, clusterListen, advertise string
	routes                                   []string
	replicas                                 int
	worker                                   bool
	journal                                  string
	queueLimit                               int
	slots                                    int
	// slowLink puts the host's client connection on a link whose latency
	// the test sets (host.link).
	slowLink bool
	// observe is the rooms' room.Options.Observe.
	observe func([]room.Observed)
	// stallLink puts it on a link the test stalls (host.stall).
	stallLink bool
	// idleAfter releases an idle room's agent (and then its lease).
	idleAfter time.Duration
}

func startHost(t *testing.T, o hostOpts) *host {
	t.Helper()
	listen := ""
	if o.slowLink || o.stallLink {
		listen = "127.0.0.1:0"
	}
	// The node's, the cluster's and the rooms' log lines (info and up, the
	// last maxTailLines of them) are shown if the test fails: a stall
	// under load is rarely seen twice.
	tail := &logTail{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the last log lines of %s:\n%s", o.name, tail.String())
		}
	})
	tailLog := slog.New(slog.NewTextHandler(tail, &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", o.name)
	node, err := StartNode(NodeConfig{Name: o.name, StoreDir: o.storeDir, ClusterListen: o.clusterListen,
		ClusterAdvertise: o.advertise, Routes: o.routes, Listen: listen, Logger: tailLog})
	if err != nil {
		t.Fatal(err)
	}
	h := &host{t: t, name: o.name, node: node}
	switch {
	case o.slowLink:
		h.link = newLatencyProxy(t, strings.TrimPrefix(node.ClientURL(), "nats://"))
		h.nc, err = nats.Connect("nats://"+h.link.addr(), nats.Name(o.name), nats.MaxReconnects(-1))
	case o.stallLink:
		h.stall = newHoldProxy(t, strings.TrimPrefix(node.ClientURL(), "nats://"))
		h.nc, err = nats.Connect("nats://"+h.stall.l.Addr().String(), nats.Name(o.name), nats.MaxReconnects(-1), nats.PingInterval(time.Hour))
	default:
		h.nc, err = node.Connect(o.name)
	}
	if err != nil {
		node.Close()
		t.Fatal(err)
	}
	lg := tailLog
	if os.Getenv("NATSROOM_DEBUG") != "" {
		lg = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("node", o.name)
	}
	// The fake agents are held to their leases as serve's are (see
	// fakeAgent): a room whose deadline passes is paused, not dropped.
	h.c, err = New(Config{Node: o.name, Conn: h.nc, Replicas: o.replicas, Worker: o.worker, Slots: cmp.Or(o.slots, 8), AcceptWait: 20 * time.Second,
		HeldAgents: true, StoreHealth: node.Health, Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	h.tr = newFakeTransport(o.name, o.journal)
	h.m, err = room.New(room.Options{Store: h.c.Store(), Transport: h.tr, Root: filepath.Join(o.storeDir, "rooms"),
		Cluster: h.c, Logger: lg, ShutdownBudget: 5 * time.Second, QueueLimit: o.queueLimit, Observe: o.observe, IdleAfter: o.idleAfter})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return h
}

// run starts the cluster side (after every node is up: a cluster's
// JetStream needs a quorum).
func (h *host) run(ctx context.Context) {
	h.t.Helper()
	if err := h.c.Start(ctx, h.m); err != nil {
		h.t.Fatal(err)
	}
}

// stop shuts the host down in serve's order.
func (h *host) stop() {
	h.stopRooms()
	h.stopNode()
}

// stopRooms is the first half of stop: the rooms and the cluster side,
// while the NATS node still runs.
func (h *host) stopRooms() {
	if h.stopped || h.roomsStopped {
		return
	}
	h.roomsStopped = true
	h.c.Stop()
	_ = h.m.Close()
	wctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	_ = h.m.Wait(wctx)
	cancel()
	h.c.Close()
}

// stopNode is the second half of stop: the connection and the node.
func (h *host) stopNode() {
	if h.stopped {
		return
	}
	h.stopped = true
	h.nc.Close()
	h.node.Close()
}

// kill is a crash: the node and its connection go first, so nothing it
// does afterwards reaches the cluster; then its goroutines are ended.
func (h *host) kill() {
	h.stopped = true
	h.nc.Close()
	h.node.Close()
	h.c.Stop()
	_ = h.m.Close()
	wctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	_ = h.m.Wait(wctx)
	cancel()
	h.c.Close()
}

// waitEvent waits for an event of typ in rm (after seq after) that
// matches ok, reading through h.
func waitEvent(ctx context.Context, t *testing.T, h *host, rm string, after int64, typ string, ok func(map[string]any) bool) store.Event {
	t.Helper()
	return waitEventOr(ctx, t, h, rm, after, typ, ok, nil)
}

// waitEventOr is waitEvent that runs failed (when not nil) before it
// fails the test.
func waitEventOr(ctx context.Context, t *testing.T, h *host, rm string, after int64, typ string, ok func(map[string]any) bool, failed func()) store.Event {
	t.Helper()
	watch, unwatch := h.m.Watch(rm)
	defer unwatch()
	var lastErr error
	for {
		evs, err := h.m.Events(ctx, rm, after, 0)
		if err != nil && err != lastErr {
			t.Logf("reading %q through %s: %v", rm, h.name, err)
			lastErr = err
		}
		if err == nil {
			for _, e := range evs {
				after = e.Seq
				if e.Type != typ {
					continue
				}
				var d map[string]any
				_ = json.Unmarshal(e.Data, &d)
				if ok == nil || ok(d) {
					return e
				}
			}
		}
		select {
		case <-ctx.Done():
			if failed != nil {
				failed()
			}
			t.Fatalf("room %q: no %s event after seq %d: %v", rm, typ, after, context.Cause(ctx))
		case <-watch:
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// checkGapFree checks a room's events are numbered 1, 2, 3… and returns
// them.
func checkGapFree(ctx context.Context, t *testing.T, h *host, rm string) []store.Event {
	t.Helper()
	evs, err := h.m.Events(ctx, rm, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range evs {
		if e.Seq != int64(i+1) {
			t.Fatalf("room %q: event %d has seq %d", rm, i, e.Seq)
		}
	}
	return evs
}

func TestCluster_SingleNodeRunsRoomFromInbox(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := startHost(t, hostOpts{name: "n1", storeDir: t.TempDir(), replicas: 1, worker: true})
	defer h.stop()
	h.run(ctx)

	rm := "team chat*>" // characters no subject token may hold
	var accs []room.Accepted
	for i := range 3 {
		acc, err := h.m.Submit(ctx, rm, room.Message{Text: fmt.Sprintf("msg %d", i)})
		if err != nil {
			t.Fatal(err)
		}
		if acc.Seq == 0 {
			t.Fatalf("message %d accepted without a sequence", i)
		}
		accs = append(accs, acc)
	}
	for _, acc := range accs {
		waitEvent(ctx, t, h, rm, 0, "turn.ended", func(d map[string]any) bool {
			return d["message_id"] == acc.ID && d["outcome"] == room.OutcomeSettled
		})
	}
	evs := checkGapFree(ctx, t, h, rm)
	if evs[0].Type != evTakeover {
		t.Fatalf("first event %s, want %s", evs[0].Type, evTakeover)
	}
	// Turns ran in order of acceptance.
	var order []string
	for _, e := range evs {
		if e.Type == "turn.started" {
			var d map[string]string
			_ = json.Unmarshal(e.Data, &d)
			order = append(order, d["message_id"])
		}
	}
	for i, acc := range accs {
		if order[i] != acc.ID {
			t.Fatalf("turn %d ran %s, want %s", i, order[i], acc.ID)
		}
	}
	st, err := h.m.State(ctx, rm)
	if err != nil {
		t.Fatal(err)
	}
	if st.Node != "n1" {
		t.Fatalf("State.Node = %q, want n1", st.Node)
	}
	ids, err := h.m.Rooms(ctx)
	if err != nil || len(ids) != 1 || ids[0] != rm {
		t.Fatalf("Rooms = %q, %v", ids, err)
	}
}

// TestCluster_TraceContextRidesTheInbox: a message's sender's trace
// context (the HTTP request's span) travels with it through the room's
// inbox, so the holder's observer (the tracer) sees it on the message's
// message.accepted and the turn continues the sender's trace; it never
// enters the room's log.
func TestCluster_TraceContextRidesTheInbox(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const tp, ts = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "vendor=opaque"
	type seen struct{ id, tp, ts string }
	accepted := make(chan seen, 16)
	h := startHost(t, hostOpts{name: "n1", storeDir: t.TempDir(), replicas: 1, worker: true, observe: func(obs []room.Observed) {
		for _, o := range obs {
			if o.Event.Type == "message.accepted" {
				var d struct {
					MessageID string `json:"message_id"`
				}
				_ = json.Unmarshal(o.Event.Data, &d)
				select {
				case accepted <- seen{d.MessageID, o.TraceParent, o.TraceState}:
				default:
				}
			}
		}
	}})
	defer h.stop()
	h.run(ctx)
	acc, err := h.m.Submit(ctx, "traced", room.Message{Text: "hi", TraceParent: tp, TraceState: ts})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(ctx, t, h, "traced", 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == acc.ID })
	select {
	case s := <-accepted:
		if s.id != acc.ID || s.tp != tp || s.ts != ts {
			t.Errorf("the holder observed %+v, want message %s with %q %q", s, acc.ID, tp, ts)
		}
	case <-ctx.Done():
		t.Fatal("the holder observed no message.accepted")
	}
	for _, e := range checkGapFree(ctx, t, h, "traced") {
		if strings.Contains(string(e.Data), "4bf92f3577b34da6a3ce929d0e0e4736") {
			t.Errorf("the trace context reached the log: %s %s", e.Type, e.Data)
		}
	}
}

// TestStore_OldHolderFenced: after another host takes the room's log
// over, the old holder's append is refused (and reported), whatever its
// lease says.
func TestStore_OldHolderFenced(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, js := singleNode(t, ctx)
	forever := func() time.Time { return time.Now().Add(time.Hour) }
	a, b := newStore(nc, js, "a"), newStore(nc, js, "b")
	var fencedRoom string
	a.fence = func(rm string, err error) { fencedRoom = rm }
	if err := a.takeover(ctx, "r", 1, forever); err != nil {
		t.Fatal(err)
	}
	appendEv := func(s *Store, typ string) error {
		return s.Write(ctx, func(tx room.Tx) error {
			_, err := tx.Append("r", typ, nil)
			return err
		})
	}
	if err := appendEv(a, "one"); err != nil {
		t.Fatal(err)
	}
	if err := b.takeover(ctx, "r", 2, forever); err != nil {
		t.Fatal(err)
	}
	err := appendEv(a, "late")
	if !errors.Is(err, ErrFenced) || !errors.Is(err, room.ErrNotHeld) {
		t.Fatalf("late append by the old holder: %v, want ErrFenced", err)
	}
	if fencedRoom != "r" {
		t.Fatalf("fence reported %q", fencedRoom)
	}
	if err := appendEv(b, "two"); err != nil {
		t.Fatal(err)
	}
	evs, err := b.Events(ctx, "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for i, e := range evs {
		if e.Seq != int64(i+1) {
			t.Fatalf("seq %d at %d", e.Seq, i)
		}
		types = append(types, e.Type)
	}
	if fmt.Sprint(types) != "[takeover one takeover two]" {
		t.Fatalf("log %v", types)
	}
	// A holder past its own lease deadline stops writing by itself.
	c := newStore(nc, js, "c")
	past := time.Now().Add(-time.Second)
	if err := c.takeover(ctx, "r2", 1, func() time.Time { return time.Now().Add(time.Hour) }); err != nil {
		t.Fatal(err)
	}
	c.log("r2").deadline = func() time.Time { return past }
	if err := appendEv2(ctx, c, "r2"); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("append after the deadline: %v, want ErrLeaseExpired", err)
	}
}

// singleNode starts one node with the rooms' streams set up (one
// replica), and returns a connection to it and its JetStream; both end
// with the test.
func singleNode(t *testing.T, ctx context.Context) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	node, err := StartNode(NodeConfig{Name: "n1", StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(node.Close)
	nc, err := node.Connect("t")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if err := Setup(ctx, js, 1, 3*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	return nc, js
}

func appendEv2(ctx context.Context, s *Store, rm string) error {
	return s.Write(ctx, func(tx room.Tx) error {
		_, err := tx.Append(rm, "x", nil)
		return err
	})
}

// freePort finds a loopback port number free now, for a node to listen
// on later (a NATS node takes an address, not a listener). It picks below
// the kernel's ephemeral range: a port from that range, free when looked
// at, may be taken before the node binds it by any connection made
// meanwhile, by this test binary or by the tests running beside it (a
// cluster failed to start so once). Only a program binding that very
// port can take one of these.
func freePort(t *testing.T) int {
	t.Helper()
	low := 32768 // Linux's default ephemeral range starts here
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const first = 10000 // clear of the well-known ports tests must not use
	for range 100 {
		if low <= first+1000 {
			break
		}
		port := first + rand.IntN(low-first)
		if port == 11434 {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // in use: another
		}
		_ = l.Close()
		return port
	}
	// No room below the ephemeral range: any free port.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestCluster_IdleRoomGivesUpItsLease: a room with nothing to do and no
// agent gives its lease up (no renewals, a free slot); its next message
// places it again and runs, in the same gap-free log.
func TestCluster_IdleRoomGivesUpItsLease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := startHost(t, hostOpts{name: "n1", storeDir: t.TempDir(), replicas: 1, worker: true})
	defer h.stop()
	h.run(ctx)
	rm := "idle"
	for i := range 2 {
		acc, err := h.m.Submit(ctx, rm, room.Message{Text: fmt.Sprintf("m%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		waitEvent(ctx, t, h, rm, 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == acc.ID })
		if err := h.m.Release(ctx, rm); err != nil {
			t.Fatal(err)
		}
		waitLeaseGone(ctx, t, h, rm)
	}
	takeovers := 0
	for _, e := range checkGapFree(ctx, t, h, rm) {
		if e.Type == evTakeover {
			takeovers++
		}
	}
	if takeovers != 2 {
		t.Fatalf("%d takeovers, want 2 (one per placement)", takeovers)
	}
}

// TestStore_WritesAndScansDoNotDeadlock: a write that updates a message
// by id while other goroutines list the held rooms' open records (the
// Manager's recovery does) must not deadlock (a write holds its room
// while it finds the message's room).
func TestStore_WritesAndScansDoNotDeadlock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, js := singleNode(t, ctx)
	s := newStore(nc, js, "a")
	forever := func() time.Time { return time.Now().Add(time.Hour) }
	for _, rm := range []string{"a", "b"} {
		if err := s.takeover(ctx, rm, 1, forever); err != nil {
			t.Fatal(err)
		}
		if err := s.Write(ctx, func(tx room.Tx) error {
			return tx.PutMessage(store.Message{ID: "m-" + rm, Room: rm, Status: store.MessageQueued})
		}); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			_ = s.Write(ctx, func(tx room.Tx) error {
				if _, err := tx.Append("a", "x", nil); err != nil {
					return err
				}
				// A message of the other room, found by id.
				return tx.UpdateMessage("m-b", store.MessageQueued, "", "", fmt.Sprint(i))
			})
		}
	}()
	scanned := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(scanned)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = s.OpenTurns(ctx)
			_, _ = s.OpenMessages(ctx)
		}
	}()
	select {
	case <-done:
		close(stop)
	case <-time.After(30 * time.Second):
		t.Fatal("deadlocked: writes stopped while the held rooms were scanned")
	}
	<-scanned
}

// waitLeaseGone waits for an idle room to give its lease up (within a
// renewal period or two), polling the KV read model: the watch on it is
// the cluster's own.
func waitLeaseGone(ctx context.Context, t *testing.T, h *host, rm string) {
	t.Helper()
	for h.c.Holder(ctx, rm) != "" {
		select {
		case <-ctx.Done():
			t.Fatal("the idle room kept its lease")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestStore_IdleRoomRecordsDropped: a node keeps the records it folded
// for a room only while it holds the room or someone asks for them; a
// dropped room reads back whole from its log, and a held room is never
// dropped (its next write still lands).
func TestStore_IdleRoomRecordsDropped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := startHost(t, hostOpts{name: "n1", storeDir: t.TempDir(), replicas: 1, worker: true})
	defer h.stop()
	h.run(ctx)

	idle := "idle"
	acc, err := h.m.Submit(ctx, idle, room.Message{Text: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(ctx, t, h, idle, 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == acc.ID })
	if err := h.m.Release(ctx, idle); err != nil {
		t.Fatal(err)
	}
	waitLeaseGone(ctx, t, h, idle)
	before := checkGapFree(ctx, t, h, idle)

	busy := "busy"
	hung, err := h.m.Submit(ctx, busy, room.Message{Text: "hang"})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(ctx, t, h, busy, 0, "turn.started", func(d map[string]any) bool { return d["message_id"] == hung.ID })

	if n := h.c.st.evictIdle(0); n != 1 {
		t.Fatalf("dropped %d rooms, want 1 (the idle one; the held one stays)", n)
	}
	if n := h.c.st.cached(); n != 1 {
		t.Fatalf("%d rooms cached after the drop, want 1", n)
	}
	after := checkGapFree(ctx, t, h, idle)
	if len(after) != len(before) {
		t.Fatalf("%d events read back after the drop, want %d", len(after), len(before))
	}
	msgs, err := h.m.Messages(ctx, idle, 0, 0)
	if err != nil || len(msgs) != 1 || msgs[0].ID != acc.ID || msgs[0].Outcome != room.OutcomeSettled {
		t.Fatalf("messages read back after the drop: %+v, %v", msgs, err)
	}
	if err := h.m.Cancel(ctx, busy); err != nil {
		t.Fatal(err)
	}
	e := waitEvent(ctx, t, h, busy, 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == hung.ID })
	if !strings.Contains(string(e.Data), `"outcome":"cancelled"`) {
		t.Fatalf("held room's turn ended %s", e.Data)
	}
}

// TestCluster_FullQueueRefusedAtTheFrontEnd: a message that would overfill
// a room's queue is refused with room.ErrQueueFull (the server's 429) by
// the node that takes it, as on one machine, not left in the inbox.
func TestCluster_FullQueueRefusedAtTheFrontEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := startHost(t, hostOpts{name: "n1", storeDir: t.TempDir(), replicas: 1, worker: true, queueLimit: 2})
	defer h.stop()
	h.run(ctx)
	rm := "full"
	hung, err := h.m.Submit(ctx, rm, room.Message{Text: "hang"})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(ctx, t, h, rm, 0, "turn.started", func(d map[string]any) bool { return d["message_id"] == hung.ID })
	var waiting []string
	for i := range 2 {
		acc, err := h.m.Submit(ctx, rm, room.Message{Text: fmt.Sprintf("wait %d", i)})
		if err != nil {
			t.Fatalf("message %d of the queue's 2: %v", i, err)
		}
		waiting = append(waiting, acc.ID)
	}
	if _, err := h.m.Submit(ctx, rm, room.Message{Text: "one too many"}); !errors.Is(err, room.ErrQueueFull) {
		t.Fatalf("a third waiting message: %v, want room.ErrQueueFull", err)
	}
	if err := h.m.Cancel(ctx, rm); err != nil {
		t.Fatal(err)
	}
	waitEvent(ctx, t, h, rm, 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == hung.ID })
	// The two waiting ones run (until then the queue is still full).
	for _, id := range waiting {
		waitEvent(ctx, t, h, rm, 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == id })
	}
	// Once the queue moves, messages are taken again.
	acc, err := h.m.Submit(ctx, rm, room.Message{Text: "later"})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(ctx, t, h, rm, 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == acc.ID })
	msgs, err := h.m.Messages(ctx, rm, 0, 0)
	if err != nil || len(msgs) != 4 {
		t.Fatalf("%d messages in the room (%v), want 4: the refused one is not among them", len(msgs), err)
	}
}

// TestStore_Turns: the room's turns in order of the message each consumed,
// with their final text, from a given message on (room.Store.Turns, as
// the SQLite store answers it).
func TestStore_Turns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, js := singleNode(t, ctx)
	s := newStore(nc, js, "a")
	if err := s.takeover(ctx, "r", 1, func() time.Time { return time.Now().Add(time.Hour) }); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var seqs []int64
	err := s.Write(ctx, func(tx room.Tx) error {
		for i := range 3 {
			id := fmt.Sprintf("m%d", i)
			ev, err := tx.Append("r", "message.accepted", map[string]string{"message_id": id})
			if err != nil {
				return err
			}
			seqs = append(seqs, ev.Seq)
			if err := tx.PutMessage(store.Message{ID: id, Room: "r", Seq: ev.Seq, Sender: "ann", Text: id, Status: store.MessageQueued, Accepted: now}); err != nil {
				return err
			}
		}
		// Turns start out of their messages' order: the order is the messages'.
		for _, i := range []int{2, 0, 1} {
			if err := tx.PutTurn(store.Turn{ID: fmt.Sprintf("t%d", i), Room: "r", MessageID: fmt.Sprintf("m%d", i), Started: now}); err != nil {
				return err
			}
		}
		if err := tx.EndTurn("t0", "settled", "", "answer 0", store.Usage{InputTokens: 7, CostUSD: 0.5}); err != nil {
			return err
		}
		return tx.(room.ComputeTx).AddCompute("r", store.Compute{CPUSeconds: 2.5, PeakMemoryBytes: 1 << 20, Processes: 3})
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := func(after int64, limit int) string {
		ts, err := s.Turns(ctx, "r", after, limit)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tr := range ts {
			out = append(out, tr.ID+":"+tr.Outcome+":"+tr.Text)
		}
		return strings.Join(out, " ")
	}
	if got := ids(0, 0); got != "t0:settled:answer 0 t1:: t2::" {
		t.Fatalf("turns: %s", got)
	}
	if got := ids(seqs[0], 1); got != "t1::" {
		t.Fatalf("turns after the first message, one: %s", got)
	}
	if got := ids(seqs[2], 0); got != "" {
		t.Fatalf("turns after the last message: %s", got)
	}
	// The ended turn's cost, in the room's totals: on the writer, and on a
	// node that folds the room from its log.
	spent := store.Usage{InputTokens: 7, CostUSD: 0.5}
	for _, st := range []*Store{s, newStore(nc, js, "b")} {
		r, err := st.Room(ctx, "r")
		if err != nil || r.Turns != 1 || r.Usage != spent || r.UsageBySender["ann"] != (store.SenderUsage{Turns: 1, Usage: spent}) ||
			r.Compute != (store.Compute{CPUSeconds: 2.5, PeakMemoryBytes: 1 << 20, Processes: 3}) {
			t.Fatalf("room %+v, %v", r, err)
		}
		ts, err := st.Turns(ctx, "r", 0, 1)
		if err != nil || len(ts) != 1 || ts[0].Usage != spent {
			t.Fatalf("turns %+v, %v", ts, err)
		}
	}
}

// A room's settings are kept outside its log: any node writes them, a
// room no node holds included, and every node reads them.
func TestStore_RoomSettings(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, js := singleNode(t, ctx)
	a, b := newStore(nc, js, "a"), newStore(nc, js, "b")
	if got, err := a.RoomSettings(ctx, "r"); err != nil || got != nil {
		t.Fatalf("settings of a room without any: %s, %v", got, err)
	}
	if err := a.PutRoomSettings(ctx, "r", json.RawMessage(`{"model":"m","budget":{"tokens":5,"cost_usd":0,"turns":0}}`)); err != nil {
		t.Fatal(err)
	}
	got, err := b.RoomSettings(ctx, "r")
	if err != nil || string(got) != `{"model":"m","budget":{"tokens":5,"cost_usd":0,"turns":0}}` {
		t.Fatalf("read on another node: %s, %v", got, err)
	}
	if got, err := b.RoomSettings(ctx, "other"); err != nil || got != nil {
		t.Fatalf("another room: %s, %v", got, err)
	}
}

// TestCluster_TokenRidesTheInbox: the room token a message was sent with
// (room.WithToken) travels with it through the room's inbox, and the
// holder's message.accepted names it.
func TestCluster_TokenRidesTheInbox(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := startHost(t, hostOpts{name: "n1", storeDir: t.TempDir(), replicas: 1, worker: true})
	defer h.stop()
	h.run(ctx)
	acc, err := h.m.Submit(room.WithToken(ctx, event.TokenRef{ID: "tok_1", Label: "ann"}), "tokened", room.Message{Text: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(ctx, t, h, "tokened", 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == acc.ID })
	for _, e := range checkGapFree(ctx, t, h, "tokened") {
		if e.Type != "message.accepted" {
			continue
		}
		var d event.MessageAccepted
		if err := json.Unmarshal(e.Data, &d); err != nil || d.Token == nil || *d.Token != (event.TokenRef{ID: "tok_1", Label: "ann"}) {
			t.Fatalf("message.accepted %s: want the token", e.Data)
		}
	}
}
