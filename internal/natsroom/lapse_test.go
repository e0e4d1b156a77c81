package natsroom

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agenthost/agenthost/room"
)

// Regression tests for issue 48 (review-cluster): a stream's election
// costs a held room a pause, not a turn.

// TestStore_AppendWaitsOutTheLogWhileTheLeaseIsRenewed: an append the log
// does not answer for longer than the lease's deadline as it stood when the
// append began (the log electing a leader) goes on while the lease keeps
// being renewed, and lands once: it gave the room up at that first
// deadline, and every room of the cluster lost its turn when the node that
// led the log died.
func TestStore_AppendWaitsOutTheLogWhileTheLeaseIsRenewed(t *testing.T) {
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
	// The lease: its deadline 1 s ahead, renewed every 100 ms (as the
	// renew loop does, on a stream of its own that answers).
	var deadline atomic.Int64
	renew := func() { deadline.Store(time.Now().Add(time.Second).UnixNano()) }
	renew()
	stopRenewing := make(chan struct{})
	var renewer sync.WaitGroup
	renewer.Add(1)
	go func() {
		defer renewer.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopRenewing:
				return
			case <-tick.C:
				renew()
			}
		}
	}()
	defer func() { close(stopRenewing); renewer.Wait() }()
	st := newStore(nc, js, "n1")
	if err := st.takeover(ctx, "r", 1, func() time.Time { return time.Unix(0, deadline.Load()) }); err != nil {
		t.Fatal(err)
	}
	write := func(typ string) error {
		return st.Write(ctx, func(tx room.Tx) error { _, err := tx.Append("r", typ, nil); return err })
	}
	if err := write("a"); err != nil {
		t.Fatal(err)
	}
	// b: the log answers nothing until b was sent three times (each
	// attempt waits 1 s: past the deadline b began with).
	px.count(evSubject("r"))
	px.set(true)
	done := make(chan error, 1)
	began := time.Now()
	go func() { done <- write("b") }()
	bDone := make(chan struct{})
	var errB error
	go func() {
		errB = <-done
		close(bDone)
	}()
	sent := px.waitPubs(3, bDone)
	px.set(false)
	<-bDone
	if !sent {
		t.Fatalf("the append gave up after %v, before the log answered: %v", time.Since(began).Round(time.Millisecond), errB)
	}
	if errB != nil {
		t.Fatalf("the append the log answered late, the lease renewed all along: %v", errB)
	}
	if err := write("c"); err != nil {
		t.Fatalf("the next append: %v", err)
	}
	evs, err := newStore(nc, js, "n2").Events(ctx, "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range evs {
		types = append(types, e.Type)
	}
	if got := strings.Join(types, " "); got != "takeover a b c" {
		t.Fatalf("the log holds %q, want %q", got, "takeover a b c")
	}
}

// TestStore_ReadWithADeadlineDoesNotWaitOutAnAppend: on the holder, a
// read of the room (its state, its events) with a deadline gives up at
// that deadline while an append holds the room's log waiting out the
// log's election; it waited for the append (up to appendPatience), and a
// /metrics scrape, whose reading is bounded, went unanswered past 30 s.
func TestStore_ReadWithADeadlineDoesNotWaitOutAnAppend(t *testing.T) {
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
	// The lease renewed all along: its deadline always ahead.
	if err := st.takeover(ctx, "r", 1, func() time.Time { return time.Now().Add(time.Second) }); err != nil {
		t.Fatal(err)
	}
	write := func(typ string) error {
		return st.Write(ctx, func(tx room.Tx) error { _, err := tx.Append("r", typ, nil); return err })
	}
	if err := write("a"); err != nil {
		t.Fatal(err)
	}
	// The log answers nothing: the append holds the room's log.
	px.count(evSubject("r"))
	px.set(true)
	appended := make(chan error, 1)
	go func() { appended <- write("b") }()
	if !px.waitPubs(1, nil) {
		t.Fatal("the append was not sent")
	}
	for _, read := range []struct {
		name string
		fn   func(ctx context.Context) error
	}{
		{"the room", func(ctx context.Context) error { _, err := st.Room(ctx, "r"); return err }},
		{"its events", func(ctx context.Context) error { _, err := st.Events(ctx, "r", 0, 0); return err }},
	} {
		rctx, rcancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := read.fn(rctx)
		rcancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("reading %s while the append waits: %v; want its deadline's error", read.name, err)
		}
		select {
		case err := <-appended:
			t.Fatalf("the append ended (%v) before the read gave up: the read waited it out", err)
		default:
		}
	}
	px.set(false)
	if err := <-appended; err != nil {
		t.Fatalf("the append, answered once the log is heard again: %v", err)
	}
	if _, err := st.Room(ctx, "r"); err != nil {
		t.Fatalf("reading the room after the append: %v", err)
	}
}

// TestCluster_LapsedLeaseIsTakenBackByItsHolder: a holder cut off from
// JetStream past its lease (its renewals unanswered, the lease expired by
// the bucket) whose room nobody took meanwhile goes on with it once it is
// heard again: its agent was frozen at the deadline, the lease is taken
// back over its expiry, and the running turn ends settled, on the same
// holder, with no takeover. It dropped the room (the turn ended failed,
// "worker lost") and took it again.
func TestCluster_LapsedLeaseIsTakenBackByItsHolder(t *testing.T) {
	t.Run("its expiry marker there", func(t *testing.T) { lapsedLease(t, false) })
	// The marker lives a lease's life: once it is gone too, the key holds
	// nothing, which read as taken.
	t.Run("its expiry marker gone too", func(t *testing.T) { lapsedLease(t, true) })
}

func lapsedLease(t *testing.T, markerGone bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	h := startHost(t, hostOpts{name: "n1", storeDir: dir, replicas: 1, worker: true, stallLink: true})
	defer h.stop()
	h.run(ctx)
	rm := "lapse"
	acc, err := h.m.Submit(ctx, rm, room.Message{Text: "sleep:6s"})
	if err != nil {
		t.Fatal(err)
	}
	waitEvent(ctx, t, h, rm, 0, "turn.started", func(d map[string]any) bool { return d["message_id"] == acc.ID })
	// A connection of the test's own, not stalled, sees the lease expire.
	nc, err := h.node.Connect("watch")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, BucketLease)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, token(rm), jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	h.stall.stall(true)
	for expired := false; !expired; {
		select {
		case <-ctx.Done():
			t.Fatal("the lease did not expire while its holder was cut off")
		case e := <-w.Updates():
			expired = e != nil && e.Operation() != jetstream.KeyValuePut
		}
	}
	for markerGone {
		_, err := leaderGet(ctx, nc, "KV_"+BucketLease, msgGetReq{LastBySubj: "$KV." + BucketLease + "." + token(rm)})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the lease's expiry marker stayed")
		case <-time.After(100 * time.Millisecond): // the marker's own expiry: polled
		}
	}
	h.stall.stall(false)
	e := waitEvent(ctx, t, h, rm, 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == acc.ID })
	if !strings.Contains(string(e.Data), `"outcome":"settled"`) {
		t.Fatalf("the turn whose holder was cut off past its lease ended %s; want settled (a pause, not a lost turn)", e.Data)
	}
	for _, ev := range checkGapFree(ctx, t, h, rm) {
		if ev.Type == evTakeover && ev.Seq > 1 {
			t.Fatalf("the room was taken over again (seq %d): its holder dropped it", ev.Seq)
		}
	}
	if l, err := h.c.leaseEntry(ctx, rm); err != nil || !l.live || l.node != "n1" {
		t.Fatalf("the lease after the stall: %+v, %v; want it live, n1's", l, err)
	}
}

// TestCluster_StreamLeaderLossAndHealCostHeldRoomsAPause: the node that
// leads the rooms' log (and the lease bucket, or not) is cut off (for the
// others, as its death is) and then heard again (a heal: its raised raft
// terms make every leader step down), while every room runs one short turn
// after another (writing to its log all along); every room held by another
// node keeps its holder, and every turn of it ends settled, never "worker
// lost". Before, every busy room of the cluster lost its turn at the loss,
// and again at the heal. (With the lease bucket led elsewhere, the writes
// waiting out the log's election held up the lease renewals of every room
// on their node.)
func TestCluster_StreamLeaderLossAndHealCostHeldRoomsAPause(t *testing.T) {
	clusterTests(t)
	t.Run("the log and the lease bucket", func(t *testing.T) { leaderLossAndHeal(t, true) })
	t.Run("the log alone", func(t *testing.T) { leaderLossAndHeal(t, false) })
}

func leaderLossAndHeal(t *testing.T, leadsLeases bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	tc := startCluster(t, ctx, [3]bool{true, true, true})
	defer tc.stop()
	rooms := make([]string, 6)
	accs := map[string]room.Accepted{}
	for i := range rooms {
		rooms[i] = fmt.Sprintf("busy%d", i)
		acc, err := tc.hosts[i%3].m.Submit(ctx, rooms[i], room.Message{Text: "sleep:200ms"})
		if err != nil {
			t.Fatal(err)
		}
		accs[rooms[i]] = acc
	}
	holder := map[string]string{}
	perNode := map[string]int{}
	for _, rm := range rooms {
		waitEvent(ctx, t, tc.hosts[0], rm, 0, "turn.started", func(d map[string]any) bool { return d["message_id"] == accs[rm].ID })
		st, err := tc.hosts[0].m.State(ctx, rm)
		if err != nil || st.Node == "" {
			t.Fatalf("room %s: %+v, %v", rm, st, err)
		}
		holder[rm] = st.Node
		perNode[st.Node]++
	}
	// The victim: the node holding fewest rooms, made to lead the log
	// and the lease bucket.
	victim := 0
	for i, h := range tc.hosts {
		if perNode[h.name] < perNode[tc.hosts[victim].name] {
			victim = i
		}
	}
	vname := tc.hosts[victim].name
	healthy := tc.hosts[(victim+1)%3]
	js, _ := jetstream.New(healthy.nc)
	leadStream(ctx, t, healthy.nc, js, StreamRooms, vname)
	leaseLeader := healthy.name
	if leadsLeases {
		leaseLeader = vname
	}
	leadStream(ctx, t, healthy.nc, js, "KV_"+BucketLease, leaseLeader)
	t.Logf("holders %v; %s leads the log, %s the lease bucket; %s is cut off", holder, vname, leaseLeader, vname)
	var healthyRooms []string
	for _, rm := range rooms {
		if holder[rm] != vname {
			healthyRooms = append(healthyRooms, rm)
		}
	}
	// Every room busy: a turn of 200 ms after another, from now until the
	// heal's elections are over (through the first host that takes them).
	var (
		feedMu   sync.Mutex
		last     = map[string]string{} // room -> its last message accepted
		accepted = map[string]int{}    // room -> messages accepted
		refused  = map[string]error{}  // room -> the last error of a Submit
	)
	// First a backlog in each room: while the log elects a leader (at
	// the cut, and again at the heal) no message can be sent, and on a
	// loaded machine a feeder alone got none in from before the cut until
	// the heal's elections were over (the room then ran nothing across
	// them, and the test waited for the end of a message never sent).
	// The backlog (within the room's queue limit, 64) lasts past the cut's
	// election; the feeders keep adding.
	var backlog sync.WaitGroup
	for _, rm := range rooms {
		backlog.Add(1)
		go func() {
			defer backlog.Done()
			for range feedBacklog {
				acc, err := healthy.m.Submit(ctx, rm, room.Message{Text: "sleep:200ms"})
				if err != nil {
					t.Errorf("room %s's backlog: %v", rm, err)
					return
				}
				feedMu.Lock()
				last[rm] = acc.ID
				accepted[rm]++
				feedMu.Unlock()
			}
		}()
	}
	backlog.Wait()
	if t.Failed() {
		return
	}
	feedCtx, stopFeeding := context.WithCancel(ctx)
	var feeders sync.WaitGroup
	for _, rm := range rooms {
		feeders.Add(1)
		go func() {
			defer feeders.Done()
			for feedCtx.Err() == nil {
				for _, h := range tc.hosts {
					if h == tc.hosts[victim] {
						continue
					}
					sctx, scancel := context.WithTimeout(feedCtx, 5*time.Second)
					acc, err := h.m.Submit(sctx, rm, room.Message{Text: "sleep:200ms"})
					scancel()
					feedMu.Lock()
					if err == nil {
						last[rm] = acc.ID
						accepted[rm]++
					} else {
						refused[rm] = fmt.Errorf("through %s: %w", h.name, err)
					}
					feedMu.Unlock()
					if err == nil {
						break
					}
				}
				select {
				case <-feedCtx.Done():
				case <-time.After(250 * time.Millisecond): // the pace of the messages, not a wait for anything
				}
			}
		}()
	}
	defer func() { stopFeeding(); feeders.Wait() }()
	watch := watchLeases(ctx, t, js)
	defer func() { _ = watch.Stop() }()
	tc.isolate(victim, true)
	cutAt := time.Now()
	// The majority elects new leaders (4 to 9 s each), and moves the
	// victim's rooms.
	for _, s := range []string{StreamRooms, "KV_" + BucketLease} {
		waitLeader(ctx, t, js, s, vname)
	}
	t.Logf("new leaders %v after the cut", time.Since(cutAt).Round(time.Millisecond))
	for _, rm := range rooms {
		if holder[rm] == vname {
			waitEvent(ctx, t, healthy, rm, 0, evTakeover, func(d map[string]any) bool { return d["node"] != vname })
		}
	}
	tc.isolate(victim, false)
	healedAt := time.Now()
	// Every leader steps down at the heal and is elected again; the
	// healthy holders renew their leases twice after the heal's elections
	// (and never lose them).
	for _, s := range []string{StreamRooms, "KV_" + BucketLease} {
		waitCurrent(ctx, t, js, s)
	}
	t.Logf("every replica current %v after the heal", time.Since(healedAt).Round(time.Millisecond))
	// With the lease bucket's leader not cut off, no healthy room's
	// lease may expire before the heal: its renewals go on while the
	// log elects a leader.
	var steady time.Time
	if !leadsLeases {
		steady = healedAt
	}
	waitRenewals(ctx, t, watch, time.Now(), steady, healthyRooms, holder, 2)
	stopFeeding()
	feeders.Wait()
	for _, rm := range healthyRooms {
		t.Logf("room %s: %d messages accepted, the last %q; the last refusal: %v", rm, accepted[rm], last[rm], refused[rm])
		// Turns run in order: the last message's end is every one's.
		wctx, wcancel := context.WithTimeout(ctx, 90*time.Second)
		waitEventOr(wctx, t, healthy, rm, 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == last[rm] },
			func() { logRoom(t, tc, rm) })
		wcancel()
		turns := 0
		for _, ev := range checkGapFree(ctx, t, healthy, rm) {
			switch {
			case ev.Type == evTakeover && ev.Seq > 1:
				t.Errorf("room %s, held by healthy %s, was taken over (seq %d): %s", rm, holder[rm], ev.Seq, ev.Data)
			case ev.Type == "turn.ended":
				turns++
				if !strings.Contains(string(ev.Data), `"outcome":"settled"`) {
					t.Errorf("room %s, held by healthy %s: a turn ended %s; want every one settled", rm, holder[rm], ev.Data)
				}
			}
		}
		t.Logf("room %s (held by %s): %d turns, every one settled", rm, holder[rm], turns)
	}
	checkNoOverlap(t, tc.spans(t))
}

// feedBacklog is how many messages each room has queued before the cut.
const feedBacklog = 40

// logRoom logs what each host sees of a room that did not end a turn in
// time: its holder, its state, its last events.
func logRoom(t *testing.T, tc *testCluster, rm string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, h := range tc.hosts {
		if h.stopped {
			continue
		}
		waiting, running, _, werr := h.c.Waiting(ctx, rm)
		evs, err := h.m.Events(ctx, rm, 0, 0)
		var tail []string
		for _, e := range evs[max(0, len(evs)-12):] {
			tail = append(tail, fmt.Sprintf("%d %s %s", e.Seq, e.Type, e.Data))
		}
		t.Logf("room %s through %s: holder %q, owned here %v; waiting %d, running %v (%v); %d events (%v), the last:\n%s",
			rm, h.name, h.c.Holder(ctx, rm), h.c.Owns(rm), waiting, running, werr, len(evs), err, strings.Join(tail, "\n"))
	}
}

// leadStream makes node the leader of stream (a step-down asking for it,
// again until it is).
func leadStream(ctx context.Context, t *testing.T, nc *nats.Conn, js jetstream.JetStream, stream, node string) {
	t.Helper()
	for {
		s, err := js.Stream(ctx, stream)
		if err == nil && s.CachedInfo().Cluster != nil && s.CachedInfo().Cluster.Leader == node {
			return
		}
		req, _ := json.Marshal(map[string]any{"placement": map[string]any{"preferred": node}})
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, _ = nc.RequestWithContext(rctx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, req)
		cancel()
		select {
		case <-ctx.Done():
			t.Fatalf("%s never led %s", node, stream)
		case <-time.After(500 * time.Millisecond): // an election: no event to wait on
		}
	}
}

// waitLeader waits until stream has a leader other than not.
func waitLeader(ctx context.Context, t *testing.T, js jetstream.JetStream, stream, not string) {
	t.Helper()
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		s, err := js.Stream(rctx, stream)
		cancel()
		if err == nil && s.CachedInfo().Cluster != nil {
			if l := s.CachedInfo().Cluster.Leader; l != "" && l != not {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s elected no leader but %s", stream, not)
		case <-time.After(250 * time.Millisecond): // an election: polled
		}
	}
}

// waitCurrent waits until stream has a leader and every replica is
// current.
func waitCurrent(ctx context.Context, t *testing.T, js jetstream.JetStream, stream string) {
	t.Helper()
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		s, err := js.Stream(rctx, stream)
		cancel()
		if err == nil && s.CachedInfo().Cluster != nil && s.CachedInfo().Cluster.Leader != "" {
			ok := len(s.CachedInfo().Cluster.Replicas) == 2
			for _, r := range s.CachedInfo().Cluster.Replicas {
				ok = ok && r.Current && !r.Offline
			}
			if ok {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not every replica is current", stream)
		case <-time.After(250 * time.Millisecond): // a replica catching up: polled
		}
	}
}

// watchLeases watches every lease's updates from now.
func watchLeases(ctx context.Context, t *testing.T, js jetstream.JetStream) jetstream.KeyWatcher {
	t.Helper()
	var w jetstream.KeyWatcher
	for {
		// (Right after a heal JetStream may answer "temporarily
		// unavailable": asked again.)
		kv, err := js.KeyValue(ctx, BucketLease)
		if err == nil {
			if w, err = kv.WatchAll(ctx, jetstream.UpdatesOnly()); err == nil {
				break
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("watching the leases: %v", err)
		case <-time.After(250 * time.Millisecond):
		}
	}
	return w
}

// waitRenewals waits until each room's lease was renewed n times since
// by its holder; a lease given up or taken by another node, as w saw,
// fails the test (one expired by the lease bucket's new leader and taken
// back by its holder does not, unless it expired before steady).
func waitRenewals(ctx context.Context, t *testing.T, w jetstream.KeyWatcher, since, steady time.Time, rooms []string, holder map[string]string, n int) {
	t.Helper()
	want := map[string]string{}
	for _, rm := range rooms {
		want[token(rm)] = rm
	}
	seen := map[string]int{}
	for done := 0; done < len(rooms); {
		select {
		case <-ctx.Done():
			t.Fatalf("renewals seen: %v", seen)
		case e := <-w.Updates():
			if e == nil || want[e.Key()] == "" {
				continue
			}
			if e.Operation() == jetstream.KeyValuePurge {
				if e.Created().Before(steady) {
					t.Fatalf("room %s's lease expired (%v) while the lease bucket kept its leader: its holder stopped renewing it", want[e.Key()], e.Created().Format("15:04:05.000"))
				}
				t.Logf("room %s's lease expired (%v): its holder must take it back", want[e.Key()], e.Created().Format("15:04:05.000"))
				continue
			}
			if rm := want[e.Key()]; e.Operation() != jetstream.KeyValuePut || string(e.Value()) != holder[rm] {
				t.Fatalf("room %s's lease, held by %s: %s %q: its holder lost it", rm, holder[rm], e.Operation(), e.Value())
			}
			if e.Created().Before(since) {
				continue
			}
			if seen[e.Key()]++; seen[e.Key()] == n {
				done++
			}
		}
	}
}
