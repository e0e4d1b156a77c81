package natsroom

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agenthost/agenthost/room"
)

// Regression tests for issue 48 (review-cluster): a node whose JetStream
// a full disk disabled comes back by itself.

// TestNode_RestartsItsServerWhenJetStreamWasDisabled: a node whose
// JetStream was shut down (what the server does when its store cannot
// write: a full disk) says so in Health, restarts its server in place once
// its store has room (here: at once), and the in-process connections made
// before go on with the new server. It stayed down until restarted by
// hand.
func TestNode_RestartsItsServerWhenJetStreamWasDisabled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	node, err := StartNode(NodeConfig{Name: "n1", StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	nc, err := node.Connect("client")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s", []byte("before")); err != nil {
		t.Fatal(err)
	}
	if err := node.Health(); err != nil {
		t.Fatalf("health before: %v", err)
	}
	// What nats-server does on a store write error.
	if err := node.server().ShutdownJetStream(); err != nil {
		t.Fatal(err)
	}
	sawDown := false
	for {
		st := node.Status()
		if !st.JetStream {
			sawDown = sawDown || node.Health() != nil && strings.Contains(node.Health().Error(), "disabled")
		}
		if st.Restarts > 0 && st.JetStream {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the node did not restart its server: %+v, %v", node.Status(), node.Health())
		case <-time.After(100 * time.Millisecond): // the node's watch: polled
		}
	}
	if !sawDown {
		t.Log("the restart came before Health was read while down")
	}
	if err := node.Health(); err != nil {
		t.Fatalf("health after the restart: %v", err)
	}
	// The same connection, through the new server: the stream and its
	// message are there (kept on disk), and it takes another.
	for {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.Publish(pctx, "s", []byte("after"))
		pcancel()
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("publishing after the restart: %v", err)
		case <-time.After(100 * time.Millisecond): // the client reconnecting: polled
		}
	}
	wantKept(ctx, t, js)
}

// TestCluster_FullSharedDiskThenFreedComesBack: three nodes whose stores
// share one small disk (a tmpfs: root only); the disk fills, every node's
// JetStream is disabled, and each says so (Health, and the 503's reason of
// a message); once the space is freed every node restarts its server in
// place, and the cluster takes messages again and runs them, with no
// restart by hand. It stayed down until every node was restarted.
func TestCluster_FullSharedDiskThenFreedComesBack(t *testing.T) {
	clusterTests(t)
	if os.Geteuid() != 0 {
		t.Skip("mounting the small disk (a tmpfs) needs root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	disk := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", disk).CombinedOutput(); err != nil {
		t.Skipf("mounting a tmpfs (as root): %v: %s", err, out)
	}
	defer func() {
		if out, err := exec.Command("umount", "-l", disk).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", disk, err, out)
		}
	}()
	tc := startClusterIn(t, ctx, [3]bool{true, true, true}, func(i int) string { return filepath.Join(disk, fmt.Sprintf("n%d", i+1)) })
	defer tc.stop()
	front := tc.hosts[0]
	rm := "full"
	acc, err := front.m.Submit(ctx, rm, room.Message{Text: "first"})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(ctx, t, front, rm, 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == acc.ID })
	// Fill the disk, then write to the log until a store write fails.
	filler := filepath.Join(disk, "filler")
	fillDisk(t, filler)
	for i := 0; ; i++ {
		down := 0
		for _, h := range tc.hosts {
			if !h.node.Status().JetStream {
				down++
			}
		}
		if down == len(tc.hosts) {
			break
		}
		sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
		_, _ = front.m.Submit(sctx, rm, room.Message{Text: fmt.Sprintf("while full %d", i)})
		scancel()
		if ctx.Err() != nil {
			t.Fatalf("JetStream was disabled on %d of 3 nodes", down)
		}
	}
	for _, h := range tc.hosts {
		if err := h.node.Health(); err == nil || !strings.Contains(err.Error(), "disabled") {
			t.Fatalf("%s's health while its JetStream is disabled: %v", h.name, err)
		}
	}
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = front.m.Submit(sctx, rm, room.Message{Text: "refused"})
	scancel()
	if !errors.Is(err, room.ErrUnavailable) || !strings.Contains(err.Error(), "disabled") {
		t.Fatalf("a message while every node's JetStream is disabled: %v; want room.ErrUnavailable saying why", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	freedAt := time.Now()
	for _, h := range tc.hosts {
		for !h.node.Status().JetStream {
			select {
			case <-ctx.Done():
				logNATSGoroutines(t)
				t.Fatalf("%s did not come back: %v", h.name, h.node.Health())
			case <-time.After(250 * time.Millisecond): // the node's watch: polled
			}
		}
	}
	t.Logf("every node's JetStream back %v after the space was freed", time.Since(freedAt).Round(time.Millisecond))
	var after room.Accepted
	for {
		sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
		after, err = front.m.Submit(sctx, rm, room.Message{Text: "after"})
		scancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil || !errors.Is(err, room.ErrUnavailable) {
			t.Fatalf("a message after the space was freed: %v", err)
		}
	}
	e := waitEvent(ctx, t, front, rm, 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == after.ID })
	if !strings.Contains(string(e.Data), `"outcome":"settled"`) {
		t.Fatalf("the message after the space was freed ended %s", e.Data)
	}
	t.Logf("a message ran %v after the space was freed", time.Since(freedAt).Round(time.Millisecond))
}

// fillDisk writes path until its disk is full.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return
		}
	}
}

// TestNode_StuckRestartStepIsReportedAndRetried: a step of the restart in
// place that does not return (a fault hook blocks it: the test write in a
// store that does not answer, a shutdown waiting on a goroutine that never
// ends, a start that hangs, clients that do not reconnect) passes its deadline; the node stays
// responsive (Health and Status answer at once, and say which step is
// stuck), logs the step by name, counts it, and once the step returns
// tries again and comes back, the clients made before going on with the
// new server. The restart had no deadline and once hung.
func TestNode_StuckRestartStepIsReportedAndRetried(t *testing.T) {
	for _, stuck := range []string{stepProbe, stepShutdown, stepStart, stepClients} {
		t.Run(stuck, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			var mu sync.Mutex
			var logs bytes.Buffer
			node, err := StartNode(NodeConfig{Name: "n1", StoreDir: t.TempDir(),
				Logger: slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: &logs}, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer node.Close()
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			node.mu.Lock()
			node.limits = restartLimits{probe: time.Second, shutdown: time.Second, start: time.Second, clients: 2 * time.Second}
			node.fault = func(step string) {
				if step != stuck {
					return
				}
				first := false
				once.Do(func() { first = true })
				if first {
					close(entered)
					<-release
				}
			}
			node.mu.Unlock()
			var released sync.Once
			unblock := func() { released.Do(func() { close(release) }) }
			defer unblock() // (before Close: a test that failed leaves nothing blocked)
			nc, err := node.Connect("client")
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}}); err != nil {
				t.Fatal(err)
			}
			if _, err := js.Publish(ctx, "s", []byte("before")); err != nil {
				t.Fatal(err)
			}
			if err := node.server().ShutdownJetStream(); err != nil { // what a full disk does
				t.Fatal(err)
			}
			select {
			case <-entered:
			case <-ctx.Done():
				t.Fatalf("the %s never ran: %+v", stuck, node.Status())
			}
			for node.Status().Stuck != stuck {
				select {
				case <-ctx.Done():
					t.Fatalf("the %s blocked was not reported stuck: %+v", stuck, node.Status())
				case <-time.After(50 * time.Millisecond): // its deadline (1 s) passing: polled
				}
			}
			// Responsive: Health and Status answer (no lock is held across
			// the step), and say which step is stuck.
			answered := make(chan error, 1)
			go func() { answered <- node.Health() }()
			select {
			case herr := <-answered:
				if herr == nil || !strings.Contains(herr.Error(), "stuck") || !strings.Contains(herr.Error(), stuck) {
					t.Fatalf("health while the %s is stuck: %v", stuck, herr)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Health did not answer while a restart's step was stuck")
			}
			if st := node.Status(); st.JetStream || st.Stalls < 1 {
				t.Fatalf("status while the %s is stuck: %+v", stuck, st)
			}
			mu.Lock()
			logged := strings.Contains(logs.String(), "passed its deadline") && strings.Contains(logs.String(), stuck)
			mu.Unlock()
			if !logged {
				t.Fatalf("no log line names the stuck step:\n%s", logs.String())
			}
			// The step returns: the node tries again and comes back.
			unblock()
			for st := node.Status(); !st.JetStream || st.Stuck != "" || st.Restarts == 0; st = node.Status() {
				select {
				case <-ctx.Done():
					t.Fatalf("the node did not come back after the %s returned: %+v, %v", stuck, node.Status(), node.Health())
				case <-time.After(100 * time.Millisecond): // the node's watch: polled
				}
			}
			if err := node.Health(); err != nil {
				t.Fatalf("health after the restart: %v", err)
			}
			// The clients are connected to the new server (the restart ends
			// when they are): the stream kept its message and takes one.
			pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
			_, err = js.Publish(pctx, "s", []byte("after"))
			pcancel()
			if err != nil {
				t.Fatalf("publishing after the restart: %v", err)
			}
			wantKept(ctx, t, js)
		})
	}
}

// TestCluster_StuckRestartKeepsTheClusterAnswering: one node of three
// loses its JetStream and its restart in place sticks in the old server's
// shutdown (a fault hook). The other hosts run rooms on, a message through
// the stuck node's host is answered (taken, or 503 saying why) rather than
// left waiting, and its Health names the stuck step; once the step
// returns the node comes back and a message through it runs.
func TestCluster_StuckRestartKeepsTheClusterAnswering(t *testing.T) {
	clusterTests(t)
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	tc := startCluster(t, ctx, [3]bool{true, true, true})
	defer tc.stop()
	stuck, other := tc.hosts[0], tc.hosts[1]
	entered, release := make(chan struct{}), make(chan struct{})
	var released sync.Once
	unblock := func() { released.Do(func() { close(release) }) }
	var once sync.Once
	stuck.node.mu.Lock()
	stuck.node.limits.shutdown = 2 * time.Second
	stuck.node.fault = func(step string) {
		if step == stepShutdown {
			once.Do(func() {
				close(entered)
				<-release
			})
		}
	}
	stuck.node.mu.Unlock()
	defer unblock() // (runs before tc.stop: nothing is left blocked)
	// What a full disk does:
	if err := stuck.node.server().ShutdownJetStream(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatalf("the restart never reached the shutdown: %+v", stuck.node.Status())
	}
	for stuck.node.Status().Stuck != stepShutdown {
		select {
		case <-ctx.Done():
			t.Fatalf("the blocked shutdown was not reported stuck: %+v", stuck.node.Status())
		case <-time.After(100 * time.Millisecond): // its deadline (2 s) passing: polled
		}
	}
	if err := stuck.node.Health(); err == nil || !strings.Contains(err.Error(), stepShutdown) {
		t.Fatalf("the stuck node's health: %v", err)
	}
	// The others run a room on.
	acc, err := other.m.Submit(ctx, "others", room.Message{Text: "while stuck"})
	if err != nil {
		t.Fatalf("a message through another host while a node's restart is stuck: %v", err)
	}
	waitEvent(ctx, t, other, "others", 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == acc.ID })
	// Through the stuck node's host: an answer within the caller's
	// deadline, never a wait without end.
	sctx, scancel := context.WithTimeout(ctx, 45*time.Second)
	_, err = stuck.m.Submit(sctx, "through", room.Message{Text: "through the stuck node"})
	scancel()
	if err != nil && !errors.Is(err, room.ErrUnavailable) {
		t.Fatalf("a message through the stuck node's host: %v; want it taken, or room.ErrUnavailable", err)
	}
	t.Logf("a message through the stuck node's host: %v", err)
	unblock()
	for st := stuck.node.Status(); !st.JetStream || st.Restarts == 0; st = stuck.node.Status() {
		select {
		case <-ctx.Done():
			t.Fatalf("the node did not come back once its shutdown returned: %+v, %v", stuck.node.Status(), stuck.node.Health())
		case <-time.After(250 * time.Millisecond): // the node's watch: polled
		}
	}
	var after room.Accepted
	for {
		sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
		after, err = stuck.m.Submit(sctx, "after", room.Message{Text: "after"})
		scancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil || !errors.Is(err, room.ErrUnavailable) {
			t.Fatalf("a message through the node once back: %v", err)
		}
	}
	e := waitEvent(ctx, t, stuck, "after", 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == after.ID })
	if !strings.Contains(string(e.Data), `"outcome":"settled"`) {
		t.Fatalf("the message through the node once back ended %s", e.Data)
	}
}

// logNATSGoroutines logs the stacks of the embedded servers' goroutines
// (bounded): what a stuck restart step waits for.
func logNATSGoroutines(t *testing.T) {
	buf := make([]byte, 16<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out strings.Builder
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "nats-server") && out.Len() < 1<<20 {
			out.WriteString(g + "\n\n")
		}
	}
	t.Logf("the embedded servers' goroutines:\n%s", out.String())
}

// TestCluster_TakenEntriesAreDeletedNeverPurged: taken inbox entries are
// deleted one by one and the work mark taken away by a delete; nothing
// purges a subject. A purge whose tombstone cannot be written deadlocks
// nats-server's file store for good (the node's server then never
// finished its shutdown after a full disk, and the node stayed out:
// TestCluster_FullSharedDiskThenFreedComesBack failed 2 of 4 runs).
func TestCluster_TakenEntriesAreDeletedNeverPurged(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := startHost(t, hostOpts{name: "n1", storeDir: t.TempDir(), replicas: 1, worker: true})
	defer h.stop()
	h.run(ctx)
	purges := make(chan string, 64)
	for _, subj := range []string{"$JS.API.STREAM.PURGE.>", "$KV." + BucketWork + ".>"} {
		sub, err := h.nc.Subscribe(subj, func(m *nats.Msg) {
			if strings.HasPrefix(m.Subject, "$JS.API.STREAM.PURGE.") || m.Header.Get("KV-Operation") == "PURGE" {
				select {
				case purges <- m.Subject:
				default:
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	if err := h.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	rm := "taken"
	for round := range 2 {
		var accs []room.Accepted
		for i := range 3 {
			acc, err := h.m.Submit(ctx, rm, room.Message{Text: fmt.Sprintf("round %d message %d", round, i)})
			if err != nil {
				t.Fatal(err)
			}
			accs = append(accs, acc)
		}
		for _, acc := range accs {
			waitEvent(ctx, t, h, rm, 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == acc.ID })
		}
		if err := h.m.Release(ctx, rm); err != nil {
			t.Fatal(err)
		}
		waitLeaseGone(ctx, t, h, rm) // after the entries' and the mark's deletes
		js, _ := jetstream.New(h.nc)
		st, err := js.Stream(ctx, StreamRooms)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(inSubject(rm)))
		if err != nil {
			t.Fatal(err)
		}
		if n := info.State.Subjects[inSubject(rm)]; n != 0 {
			t.Fatalf("round %d: %d taken entries left in the idle room's inbox", round, n)
		}
		kv, err := js.KeyValue(ctx, BucketWork)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Get(ctx, token(rm)); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("round %d: the idle room's work mark: %v, want it gone", round, err)
		}
	}
	if err := h.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case subj := <-purges:
		t.Fatalf("a purge on %s", subj)
	default:
	}
}

// wantKept checks stream S holds its two messages after a restart in
// place: the one from before (kept on disk) and the one after.
func wantKept(ctx context.Context, t *testing.T, js jetstream.JetStream) {
	t.Helper()
	s, err := js.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 2 {
		t.Fatalf("%d messages in the stream after the restart, want 2", n)
	}
}
