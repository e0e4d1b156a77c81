package natsroom

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// Regression tests for the faults of issue 16 (review-nats): each fails on
// the code before its fix.

// TestCluster_QueueFullAtTheHolderEndsEveryMessage: messages already in
// the inbox (answered 202 by front ends that could not see each other)
// that the holder's full queue cannot take are refused with an outcome in
// the write that moves the inbox cursor past them; none is skipped in
// silence, and the ones taken still run, in order.
func TestCluster_QueueFullAtTheHolderEndsEveryMessage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	h := startHost(t, hostOpts{name: "n1", storeDir: t.TempDir(), replicas: 1, worker: true, queueLimit: 2})
	defer h.stop()
	h.run(ctx)
	rm := "overfill"
	hung, err := h.m.Submit(ctx, rm, room.Message{Text: "hang"})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(ctx, t, h, rm, 0, "turn.started", func(d map[string]any) bool { return d["message_id"] == hung.ID })
	// Straight into the inbox, as front ends that counted the queue at
	// the same moment do: five for a queue of two.
	ids := make([]string, 5)
	var wg sync.WaitGroup
	errs := make([]error, len(ids))
	for i := range ids {
		ids[i] = fmt.Sprintf("m_over%02d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = h.c.Forward(ctx, rm, ids[i], room.Message{Text: fmt.Sprintf("over %d", i), Delivery: room.DeliverQueue})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("forward %d: %v", i, err)
		}
	}
	if err := h.m.Cancel(ctx, rm); err != nil {
		t.Fatal(err)
	}
	// Every forwarded message ends, exactly once: the queued ones
	// settle, the rest were refused.
	byID := map[string]store.Message{}
	for _, id := range ids {
		for {
			m, err := h.c.st.Message(ctx, rm, id)
			if err == nil && m.Status == store.MessageEnded {
				byID[id] = m
				break
			}
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				t.Fatal(err)
			}
			// The message's end is a record, not an event of its own on
			// every path: wait for the log to grow, then look again.
			watch, unwatch := h.m.Watch(rm)
			select {
			case <-ctx.Done():
				unwatch()
				t.Fatalf("message %s never ended (%+v, %v): a 202 without an outcome", id, m, err)
			case <-watch:
			case <-time.After(time.Second):
			}
			unwatch()
		}
	}
	settled, refused := 0, 0
	for _, m := range byID {
		switch {
		case m.Outcome == room.OutcomeSettled:
			settled++
		case m.Outcome == room.OutcomeFailed && strings.Contains(m.Reason, "queue"):
			refused++
		default:
			t.Errorf("message %s ended %s (%s)", m.ID, m.Outcome, m.Reason)
		}
	}
	if settled != 2 || refused != 3 {
		t.Fatalf("%d settled and %d refused, want 2 and 3", settled, refused)
	}
	evs := checkGapFree(ctx, t, h, rm)
	ended, accepted := map[string]int{}, map[string]int{}
	for _, e := range evs {
		var d map[string]any
		_ = json.Unmarshal(e.Data, &d)
		id, _ := d["message_id"].(string)
		switch e.Type {
		case "message.accepted":
			accepted[id]++
		case "message.ended":
			ended[id]++
		}
	}
	for _, id := range ids {
		if accepted[id] != 1 {
			t.Errorf("message %s accepted %d times in the log", id, accepted[id])
		}
		if byID[id].Outcome == room.OutcomeFailed && ended[id] != 1 {
			t.Errorf("refused message %s: %d message.ended events, want 1", id, ended[id])
		}
	}
}

// TestCluster_RoomsResumeAfterTheWholeClusterStops: a node that held a
// room with a turn running and a message queued stops (the only node: the
// whole cluster), its lease expires while it is down, and it starts
// again: the room resumes without a new message (the turn cut ends
// failed, the queued message runs).
func TestCluster_RoomsResumeAfterTheWholeClusterStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	h := startHost(t, hostOpts{name: "n1", storeDir: dir, replicas: 1, worker: true})
	h.run(ctx)
	rm := "restart"
	cut, err := h.m.Submit(ctx, rm, room.Message{Text: "hang"})
	if err != nil {
		h.stop()
		t.Fatal(err)
	}
	waitEvent(ctx, t, h, rm, 0, "turn.started", func(d map[string]any) bool { return d["message_id"] == cut.ID })
	after, err := h.m.Submit(ctx, rm, room.Message{Text: "after"})
	if err != nil {
		h.stop()
		t.Fatal(err)
	}
	h.kill()
	// While the cluster is down the lease expires: a bare node on the
	// store watches it go.
	waitLeaseExpired(ctx, t, dir, rm)

	h2 := startHost(t, hostOpts{name: "n1", storeDir: dir, replicas: 1, worker: true})
	defer h2.stop()
	h2.run(ctx)
	e := waitEvent(ctx, t, h2, rm, 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == cut.ID })
	if !strings.Contains(string(e.Data), `"outcome":"failed"`) {
		t.Fatalf("the cut turn ended %s", e.Data)
	}
	e = waitEvent(ctx, t, h2, rm, 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == after.ID })
	if !strings.Contains(string(e.Data), `"outcome":"settled"`) {
		t.Fatalf("the queued message ended %s", e.Data)
	}
	checkGapFree(ctx, t, h2, rm)
}

// waitLeaseExpired opens the node's store alone and waits until the room's
// lease is gone (expired, while no agenthost runs).
func waitLeaseExpired(ctx context.Context, t *testing.T, dir, rm string) {
	t.Helper()
	node, err := StartNode(NodeConfig{Name: "n1", StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	nc, err := node.Connect("watch")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, BucketLease)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return // kept in memory: gone with the node
	}
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, token(rm))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			t.Fatal("the lease never expired")
		case e := <-w.Updates():
			if e != nil && e.Operation() != jetstream.KeyValuePut {
				return
			}
			if e == nil {
				if _, err := kv.Get(ctx, token(rm)); errors.Is(err, jetstream.ErrKeyNotFound) {
					return
				}
			}
		}
	}
}

// holdProxy forwards TCP connections to a target. While held, nothing
// goes from the server to the client (the bytes wait, as on a stalled
// link); while stalled, nothing goes either way; it counts the client's
// publishes to a subject.
type holdProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	cond   *sync.Cond
	hold   bool
	holdUp bool
	subj   string
	pubs   int
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newHoldProxy(t *testing.T, target string) *holdProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holdProxy{l: l, target: target}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *holdProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { // client -> server, counting publishes to subj
			defer p.wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					p.mu.Lock()
					for p.holdUp {
						p.cond.Wait()
					}
					if p.subj != "" {
						p.pubs += bytes.Count(buf[:n], []byte(" "+p.subj+" "))
						p.cond.Broadcast()
					}
					p.mu.Unlock()
					if _, werr := up.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					_ = up.Close()
					return
				}
			}
		}()
		go func() { // server -> client, held while p.hold
			defer p.wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := up.Read(buf)
				p.mu.Lock()
				for p.hold {
					p.cond.Wait()
				}
				p.mu.Unlock()
				if n > 0 {
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					_ = c.Close()
					return
				}
			}
		}()
	}
}

func (p *holdProxy) set(hold bool) {
	p.mu.Lock()
	p.hold = hold
	p.cond.Broadcast()
	p.mu.Unlock()
}

// stall holds both directions (or lets both go).
func (p *holdProxy) stall(on bool) {
	p.mu.Lock()
	p.hold, p.holdUp = on, on
	p.cond.Broadcast()
	p.mu.Unlock()
}

// count starts counting the client's publishes to subj.
func (p *holdProxy) count(subj string) {
	p.mu.Lock()
	p.subj, p.pubs = subj, 0
	p.mu.Unlock()
}

// waitPubs waits until the client published n times to the counted
// subject, or done closes; it reports which.
func (p *holdProxy) waitPubs(n int, done <-chan struct{}) bool {
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-done:
		case <-stop:
		}
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	}()
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.pubs < n {
		select {
		case <-done:
			return false
		default:
		}
		p.cond.Wait()
	}
	return true
}

func (p *holdProxy) close() {
	_ = p.l.Close()
	p.stall(false)
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// TestStore_AppendWhoseAnswerWasLost: an append whose answer is lost (the
// link stalls past the attempt's wait, the caller's context ends) but
// which landed is not followed by a different append under its identity:
// the writer learns it landed before it writes again, and every write it
// reports stored is in the log, once, in the order the owner folded it.
func TestStore_AppendWhoseAnswerWasLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	node, err := StartNode(NodeConfig{Name: "n1", StoreDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	px := newHoldProxy(t, strings.TrimPrefix(node.ClientURL(), "nats://"))
	nc, err := nats.Connect("nats://"+px.l.Addr().String(), nats.PingInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := Setup(ctx, js, 1, 3*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	st := newStore(nc, js, "n1")
	far := func() time.Time { return time.Now().Add(time.Hour) }
	if err := st.takeover(ctx, "r", 1, far); err != nil {
		t.Fatal(err)
	}
	write := func(ctx context.Context, typ string) error {
		return st.Write(ctx, func(tx room.Tx) error { _, err := tx.Append("r", typ, nil); return err })
	}
	if err := write(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	// b: the link holds every answer; the caller gives up after 300 ms.
	// The link is released once the writer sent b again (its first
	// attempt unanswered) or gave up.
	px.count(evSubject("r"))
	px.set(true)
	bctx, bcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	done := make(chan error, 1)
	go func() { done <- write(bctx, "b") }()
	bDone := make(chan struct{})
	var errB error
	go func() {
		errB = <-done
		close(bDone)
	}()
	px.waitPubs(2, bDone)
	px.set(false)
	<-bDone
	bcancel()
	t.Logf("write b: %v", errB)
	stored := map[string]bool{"a": true}
	if errB == nil {
		stored["b"] = true
	}
	for _, typ := range []string{"c", "d"} {
		err := write(ctx, typ)
		t.Logf("write %s: %v", typ, err)
		if err == nil {
			stored[typ] = true
		}
	}
	owner, err := st.Events(ctx, "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	fresh := newStore(nc, js, "n2")
	evs, err := fresh.Events(ctx, "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ownerTypes, logTypes []string
	for _, e := range owner {
		ownerTypes = append(ownerTypes, e.Type)
	}
	for i, e := range evs {
		if e.Seq != int64(i+1) {
			t.Fatalf("log event %d has seq %d", i, e.Seq)
		}
		logTypes = append(logTypes, e.Type)
	}
	if fmt.Sprint(ownerTypes) != fmt.Sprint(logTypes) {
		t.Fatalf("the owner folded %v, the log holds %v", ownerTypes, logTypes)
	}
	count := map[string]int{}
	for _, ty := range logTypes {
		count[ty]++
	}
	for typ := range stored {
		if count[typ] != 1 {
			t.Errorf("write %s returned nil but is in the log %d times: %v", typ, count[typ], logTypes)
		}
	}
	if !stored["b"] || !stored["c"] || !stored["d"] {
		t.Errorf("writes reported failed: stored %v (an answer lost is resolved, not failed)", stored)
	}
	if st.unclear.Load() < 1 {
		t.Errorf("no append was resolved after a lost answer (the fault was not injected)")
	}
}

// TestCluster_RenewalThatLandedUnansweredKeepsTheRoom: a lease renewal
// whose answer was lost but which landed (a stall of the lease stream
// longer than the renewal's wait) leaves the lease at a revision the
// holder did not hear of; its next renewal must not read the conflict as
// "taken" and drop a room it still holds.
func TestCluster_RenewalThatLandedUnansweredKeepsTheRoom(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := startHost(t, hostOpts{name: "n1", storeDir: t.TempDir(), replicas: 1, worker: true})
	defer h.stop()
	h.run(ctx)
	rm := "stall"
	hung, err := h.m.Submit(ctx, rm, room.Message{Text: "hang"})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(ctx, t, h, rm, 0, "turn.started", func(d map[string]any) bool { return d["message_id"] == hung.ID })
	h.c.mu.Lock()
	hd := h.c.held[rm]
	h.c.mu.Unlock()
	if hd == nil {
		t.Fatal("the room is not held here")
	}
	w, err := h.c.lease.Watch(ctx, token(rm), jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	// The renewal that landed unanswered: the holder's own renewal,
	// published over the revision it holds, whose answer it never gets.
	hd.mu.Lock()
	rev := hd.rev
	hd.mu.Unlock()
	ack, err := h.c.publishLease(ctx, rm, rev)
	if err != nil {
		t.Fatal(err)
	}
	// The holder's next two renewals go on from it.
	renewals := 0
	for renewals < 2 {
		select {
		case <-ctx.Done():
			t.Fatal("the holder stopped renewing the lease")
		case e := <-w.Updates():
			if e == nil {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut || string(e.Value()) != "n1" {
				t.Fatalf("lease entry %s %q after the unanswered renewal: the room was given up", e.Operation(), e.Value())
			}
			if e.Revision() > ack.Sequence {
				renewals++
			}
		}
	}
	if !h.c.Owns(rm) {
		t.Fatal("the room is no longer held here")
	}
	evs := checkGapFree(ctx, t, h, rm)
	for _, e := range evs {
		if e.Type == "turn.ended" || e.Type == evTakeover && e.Seq > 1 {
			t.Fatalf("the room moved or its turn ended: %s %s", e.Type, e.Data)
		}
	}
}

// TestCluster_ManyRoomsKeepTheirLeasesOnASlowLink: a node holding many
// rooms over a link where each answer takes 250 ms keeps every one of
// them. Renewed one after another, a round took rooms x 250 ms, and the
// last rooms passed their deadline (2.5 s) and moved without a fault: the
// "worker lost" turns of a loaded cluster.
func TestCluster_ManyRoomsKeepTheirLeasesOnASlowLink(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	h := startHost(t, hostOpts{name: "n1", storeDir: t.TempDir(), replicas: 1, worker: true, slots: 32, slowLink: true})
	defer h.stop()
	h.run(ctx)
	rooms := make([]string, 16)
	for i := range rooms {
		rooms[i] = fmt.Sprintf("slow%d", i)
		if _, err := h.m.Submit(ctx, rooms[i], room.Message{Text: "hang"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, rm := range rooms {
		waitEvent(ctx, t, h, rm, 0, "turn.started", nil)
	}
	h.link.setLatency(250 * time.Millisecond)
	// Three renewals of every room, each seen in the lease bucket.
	w, err := h.c.lease.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	renewed := map[string]int{}
	for done := 0; done < len(rooms); {
		select {
		case <-ctx.Done():
			t.Fatalf("renewals seen: %v", renewed)
		case e := <-w.Updates():
			if e == nil {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				t.Fatalf("lease of %s: %s: a room was given up", e.Key(), e.Operation())
			}
			if renewed[e.Key()]++; renewed[e.Key()] == 3 {
				done++
			}
		}
	}
	for _, rm := range rooms {
		if !h.c.Owns(rm) {
			t.Fatalf("room %s is no longer held here", rm)
		}
		for _, e := range checkGapFree(ctx, t, h, rm) {
			if e.Type == "turn.ended" || e.Type == evTakeover && e.Seq > 1 {
				t.Fatalf("room %s moved or its turn ended: %s %s", rm, e.Type, e.Data)
			}
		}
	}
}

// TestCluster_LongRoomAnswersWithTheSequence: past 10,000 messages in a
// room a new message is still answered with its sequence as soon as the
// holder logs it (not after the whole AcceptWait with seq 0), and an inbox
// entry read again finds its first acceptance however far back.
func TestCluster_LongRoomAnswersWithTheSequence(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	h := startHost(t, hostOpts{name: "n1", storeDir: t.TempDir(), replicas: 1, worker: true})
	defer h.stop()
	h.run(ctx)
	rm := "long"
	hung, err := h.m.Submit(ctx, rm, room.Message{Text: "hang"})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(ctx, t, h, rm, 0, "turn.started", func(d map[string]any) bool { return d["message_id"] == hung.ID })
	// 10,001 messages that already ended, written by the holder in
	// large batches (running them would take minutes).
	const n, per = store.MaxEventsPage + 1, 1000
	now := time.Now()
	var lastID string
	for i := 0; i < n; i += per {
		err := h.c.st.Write(ctx, func(tx room.Tx) error {
			for j := i; j < min(n, i+per); j++ {
				lastID = fmt.Sprintf("m_long%06d", j)
				if err := tx.PutMessage(store.Message{ID: lastID, Room: rm, Seq: int64(j + 100), Text: "x",
					Delivery: room.DeliverQueue, Status: store.MessageEnded, Outcome: room.OutcomeSettled, Accepted: now, Ended: now}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	acc, err := h.m.Submit(ctx, rm, room.Message{Text: "one more"})
	if err != nil {
		t.Fatal(err)
	}
	if acc.Seq == 0 {
		t.Fatal("a message past the 10,000th answered seq 0 (its acceptance was not found)")
	}
	again, err := h.m.Accept(ctx, rm, lastID, room.Message{Text: "x"})
	if err != nil || again.Seq != int64(n-1+100) {
		t.Fatalf("accepting message %d again: %+v, %v; want its first acceptance", n, again, err)
	}
}

// TestCluster_EventsReplayWhileTheLogElectsALeader: the node that leads
// the rooms' log and holds the room is cut off; through another node the
// room's state and events still read at once (from that node's replica),
// and its event stream goes on live when the new holder writes.
func TestCluster_EventsReplayWhileTheLogElectsALeader(t *testing.T) {
	clusterTests(t)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	tc := startCluster(t, ctx, [3]bool{false, true, true})
	defer tc.stop()
	front := tc.hosts[0]
	rm := "replay"
	cut, err := front.m.Submit(ctx, rm, room.Message{Text: "hang"})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(ctx, t, front, rm, 0, "turn.started", func(d map[string]any) bool { return d["message_id"] == cut.ID })
	st, err := front.m.State(ctx, rm)
	if err != nil {
		t.Fatal(err)
	}
	holder := tc.byName(st.Node)
	if holder < 1 {
		t.Fatalf("room held by %q", st.Node)
	}
	// The holder leads the log's stream too.
	js, _ := jetstream.New(front.nc)
	leadTo(ctx, t, front.nc, js, st.Node)
	before := checkGapFree(ctx, t, front, rm)
	watch, unwatch := front.m.Watch(rm)
	defer unwatch()
	tc.isolate(holder, true)
	defer tc.isolate(holder, false)
	// At once, while the stream has no leader: a read waits for none (a
	// read of the leader cannot be answered until another is elected).
	if _, err := front.m.State(ctx, rm); err != nil {
		t.Fatalf("the room's state through %s while the log elects a leader: %v", front.name, err)
	}
	evs, err := front.m.Events(ctx, rm, 0, 0)
	if err != nil || len(evs) != len(before) {
		t.Fatalf("the room's events through %s while the log elects a leader: %d of %d, %v", front.name, len(evs), len(before), err)
	}
	// Live: the new holder's takeover reaches the watcher.
	after := before[len(before)-1].Seq
	for {
		evs, err := front.m.Events(ctx, rm, after, 0)
		if err == nil {
			for _, e := range evs {
				after = e.Seq
				if e.Type == evTakeover {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatal("the room's events did not go on after the failover")
		case <-watch:
		case <-time.After(time.Second):
		}
	}
}

// leadTo makes node the leader of the rooms' log stream.
func leadTo(ctx context.Context, t *testing.T, nc *nats.Conn, js jetstream.JetStream, node string) {
	t.Helper()
	for {
		s, err := js.Stream(ctx, StreamRooms)
		if err == nil && s.CachedInfo().Cluster != nil && s.CachedInfo().Cluster.Leader == node {
			return
		}
		req, _ := json.Marshal(map[string]any{"placement": map[string]any{"preferred": node}})
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, _ = nc.RequestWithContext(rctx, "$JS.API.STREAM.LEADER.STEPDOWN."+StreamRooms, req)
		cancel()
		select {
		case <-ctx.Done():
			t.Fatalf("%s never led the log stream", node)
		case <-time.After(500 * time.Millisecond): // an election: no event to wait on
		}
	}
}

// TestNode_RefusesClientsAndRoutesWithoutTheSecret: a secured node refuses
// a client and a route that do not sign in with the cluster's secret (and
// a wrong one), and takes those that do.
func TestNode_RefusesClientsAndRoutesWithoutTheSecret(t *testing.T) {
	lines := make(chan string, 100)
	lg := slog.New(slog.NewTextHandler(lineWriter(lines), nil))
	// A cluster of two nodes, the second started last.
	memberAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	secured, err := StartNode(NodeConfig{Name: "s1", StoreDir: t.TempDir(), Listen: "127.0.0.1:0",
		ClusterListen: fmt.Sprintf("127.0.0.1:%d", freePort(t)), Routes: []string{"nats://" + memberAddr},
		Secret: "the secret", Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	defer secured.Close()
	if nc, err := nats.Connect(secured.ClientURL(), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a client without the secret was let in")
	}
	wrong, _ := Auth("another secret")
	if nc, err := nats.Connect(secured.ClientURL(), wrong, nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a client with a wrong secret was let in")
	}
	right, _ := Auth("the secret")
	nc, err := nats.Connect(secured.ClientURL(), right, nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("a client with the secret: %v", err)
	}
	nc.Close()

	// A route without the secret: the secured node refuses it.
	open, err := StartNode(NodeConfig{Name: "o1", StoreDir: t.TempDir(), ClusterListen: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		Routes: []string{"nats://" + secured.ClusterAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	waitLine(t, lines, "authentication error", 30*time.Second)
	if n := secured.NumRoutes(); n != 0 {
		t.Fatalf("the secured node has %d routes to a node without the secret", n)
	}
	// A route with it joins.
	member, err := StartNode(NodeConfig{Name: "m1", StoreDir: t.TempDir(), ClusterListen: memberAddr,
		Routes: []string{"nats://" + secured.ClusterAddr()}, Secret: "the secret"})
	if err != nil {
		t.Fatal(err)
	}
	defer member.Close()
	deadline := time.Now().Add(30 * time.Second)
	for member.NumRoutes() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a node with the secret did not join")
		}
		time.Sleep(50 * time.Millisecond) // polling the server's route count: no event to wait on
	}
}

// TestNode_RouteRetriesAreWarnings: a node whose peer is not up yet logs
// its route retries as warnings, not errors (a cluster's normal start).
func TestNode_RouteRetriesAreWarnings(t *testing.T) {
	lines := make(chan string, 100)
	lg := slog.New(slog.NewTextHandler(lineWriter(lines), nil))
	node, err := StartNode(NodeConfig{Name: "w1", StoreDir: t.TempDir(), ClusterListen: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		Routes: []string{fmt.Sprintf("nats://127.0.0.1:%d", freePort(t))}, Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l := <-lines:
			if !strings.Contains(l, "Error trying to connect to route") {
				continue
			}
			if !strings.Contains(l, "level=WARN") {
				t.Fatalf("route retry logged %q: want level=WARN", l)
			}
			return
		case <-timeout:
			t.Fatal("no route retry logged")
		}
	}
}

type lineWriter chan string

func (w lineWriter) Write(b []byte) (int, error) {
	select {
	case w <- string(b):
	default:
	}
	return len(b), nil
}

func waitLine(t *testing.T, lines <-chan string, want string, d time.Duration) {
	t.Helper()
	timeout := time.After(d)
	for {
		select {
		case l := <-lines:
			if strings.Contains(l, want) {
				return
			}
		case <-timeout:
			t.Fatalf("no log line with %q", want)
		}
	}
}

// TestSetup_OneServerWithThreeReplicasFailsAtOnce: JetStream without a
// cluster cannot keep 3 replicas; Setup says what to change at once
// instead of retrying until its context ends.
func TestSetup_OneServerWithThreeReplicasFailsAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node, err := StartNode(NodeConfig{Name: "n1", StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	nc, err := node.Connect("t")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	err = Setup(ctx, js, 3, 3*time.Second, nil)
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "--nats-replicas 1") {
		t.Fatalf("Setup with 3 replicas on one server: %v; want ErrConfig naming --nats-replicas 1", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Setup retried until its context ended")
	}
}

// TestNode_BusyPortSaysWhich: a node whose port is taken fails at once,
// naming the address and why.
func TestNode_BusyPortSaysWhich(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := l.Addr().String()
	_, err = StartNode(NodeConfig{Name: "n1", StoreDir: t.TempDir(), ClusterListen: addr})
	if err == nil || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("a node on a busy route port: %v; want the address and the reason", err)
	}
}

var _ io.Writer = lineWriter(nil)

// writeTLS writes a CA and one certificate for 127.0.0.1 signed by it
// (for both ends of a route, and a client port) into dir.
func writeTLS(t *testing.T, dir string) *TLSFiles {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "node"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	caCert, _ := x509.ParseCertificate(caDER)
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	f := TLSDir(dir)
	for path, b := range map[string]*pem.Block{f.CA: {Type: "CERTIFICATE", Bytes: caDER}, f.Cert: {Type: "CERTIFICATE", Bytes: leafDER},
		f.Key: {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// TestNode_TLSRoutesAndClients: with TLS, nodes whose certificates the
// CA signed route to each other, a client that trusts the CA signs in,
// and a node without TLS is not let in as a route.
func TestNode_TLSRoutesAndClients(t *testing.T) {
	tlsFiles := writeTLS(t, t.TempDir())
	lines := make(chan string, 100)
	lg := slog.New(slog.NewTextHandler(lineWriter(lines), nil))
	a, b := fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	n1, err := StartNode(NodeConfig{Name: "t1", StoreDir: t.TempDir(), Listen: "127.0.0.1:0", ClusterListen: a,
		Routes: []string{"nats://" + b}, Secret: "s", TLS: tlsFiles, Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	defer n1.Close()
	n2, err := StartNode(NodeConfig{Name: "t2", StoreDir: t.TempDir(), ClusterListen: b, Routes: []string{"nats://" + a}, Secret: "s", TLS: tlsFiles})
	if err != nil {
		t.Fatal(err)
	}
	defer n2.Close()
	deadline := time.Now().Add(30 * time.Second)
	for n1.NumRoutes() == 0 || n2.NumRoutes() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("two nodes with TLS did not route to each other")
		}
		time.Sleep(50 * time.Millisecond) // polling the servers' route counts: no event to wait on
	}
	nc, err := Dial([]string{n1.ClientURL()}, "tls client", DialOptions{TLS: &TLSFiles{CA: tlsFiles.CA}})
	if err == nil {
		nc.Close()
		t.Fatal("a TLS client without the cluster's key was let in")
	}
	auth, _ := Auth("s")
	nc, err = nats.Connect(n1.ClientURL(), auth, nats.RootCAs(tlsFiles.CA), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("a client trusting the CA, with the key: %v", err)
	}
	nc.Close()
	if nc, err := nats.Connect(n1.ClientURL(), auth, nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a client without TLS was let in")
	}
	// A node with the secret but no TLS: its route fails the handshake.
	plain, err := StartNode(NodeConfig{Name: "p1", StoreDir: t.TempDir(), ClusterListen: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		Routes: []string{"nats://" + a}, Secret: "s"})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	waitLine(t, lines, "TLS", 30*time.Second)
	if plain.NumRoutes() != 0 {
		t.Fatal("a node without TLS routed to a node that requires it")
	}
}

// TestDial_Creds: --nats-creds with a file holding an nkey seed signs in
// to a server that knows the key; without it the server refuses.
func TestDial_Creds(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true,
		Nkeys: []*server.NkeyUser{{Nkey: pub}}})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("the server did not start")
	}
	if nc, err := Dial([]string{ns.ClientURL()}, "no creds", DialOptions{}); err == nil {
		nc.Close()
		t.Fatal("a client without credentials was let in")
	}
	file := t.TempDir() + "/user.nk"
	if err := os.WriteFile(file, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	nc, err := Dial([]string{ns.ClientURL()}, "with creds", DialOptions{Creds: file})
	if err != nil {
		t.Fatalf("a client with the seed: %v", err)
	}
	nc.Close()
}
