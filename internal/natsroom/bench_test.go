package natsroom

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// TestBench_Cluster prints the cluster's figures (AGENTHOST_NATS_BENCH=1):
// placement latency, messages per second across 3 nodes with a fake
// agent, events per second appended through R3, and memory per idle room.
func TestBench_Cluster(t *testing.T) {
	if os.Getenv("AGENTHOST_NATS_BENCH") == "" {
		t.Skip("set AGENTHOST_NATS_BENCH=1 to measure")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tc := startCluster(t, ctx, [3]bool{true, true, true})
	defer tc.stop()

	// Placement: first message of an unowned room → turn.started.
	var lat []time.Duration
	for i := range 20 {
		rm := fmt.Sprintf("place-%d", i)
		t0 := time.Now()
		if _, err := tc.hosts[i%3].m.Submit(ctx, rm, room.Message{Text: "hi"}); err != nil {
			t.Fatal(err)
		}
		waitEvent(ctx, t, tc.hosts[(i+1)%3], rm, 0, "turn.started", nil)
		lat = append(lat, time.Since(t0))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("placement latency (submit → turn.started, 20 rooms): p50 %v, p90 %v, max %v",
		lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)*9/10].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))

	// Messages per second: 30 rooms × 10 messages, sent through all 3
	// nodes at once, until every turn ended.
	const rooms, per = 30, 10
	t0 := time.Now()
	var wg sync.WaitGroup
	last := make([]room.Accepted, rooms)
	errs := make(chan error, rooms)
	for r := range rooms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range per {
				acc, err := tc.hosts[(r+j)%3].m.Submit(ctx, fmt.Sprintf("tp-%d", r), room.Message{Text: fmt.Sprintf("m%d", j)})
				if err != nil {
					errs <- err
					return
				}
				last[r] = acc
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for r := range rooms {
		waitEvent(ctx, t, tc.hosts[r%3], fmt.Sprintf("tp-%d", r), 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == last[r].ID })
	}
	el := time.Since(t0)
	t.Logf("messages: %d through 3 nodes into %d rooms, every turn ended in %v: %.0f messages/s",
		rooms*per, rooms, el.Round(time.Millisecond), float64(rooms*per)/el.Seconds())

	// Events appended through R3: one writer per room, 8 rooms at once.
	var h *host
	for _, x := range tc.hosts {
		if x.c.heldCount() > 0 {
			h = x
			break
		}
	}
	var held []string
	h.c.mu.Lock()
	for rm := range h.c.held {
		held = append(held, rm)
	}
	h.c.mu.Unlock()
	const n = 300
	for _, par := range []int{1, min(8, len(held))} {
		t0 = time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		done := 0
		for k := range par {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range n {
					if err := h.c.Store().Write(ctx, func(tx room.Tx) error {
						_, err := tx.Append(held[k], "bench", map[string]int{"x": 1})
						return err
					}); err != nil {
						// An idle room may give its lease up meanwhile:
						// count what was appended.
						t.Logf("room %s: %v", held[k], err)
						return
					}
					mu.Lock()
					done++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		el = time.Since(t0)
		t.Logf("events appended through R3 (fenced, one write each), %d room(s) at once: %d in %v: %.0f events/s",
			par, done, el.Round(time.Millisecond), float64(done)/el.Seconds())
	}

	// Memory per idle room: heap (all 3 nodes share this process) before
	// and after 200 more rooms, each with one ended turn, agents released.
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const idle = 200
	for i := range idle {
		rm := fmt.Sprintf("idle-%d", i)
		acc, err := tc.hosts[i%3].m.Submit(ctx, rm, room.Message{Text: "hi"})
		if err != nil {
			t.Fatal(err)
		}
		waitEvent(ctx, t, tc.hosts[i%3], rm, 0, "turn.ended", func(d map[string]any) bool { return d["message_id"] == acc.ID })
	}
	for _, x := range tc.hosts {
		for i := range idle {
			_ = x.m.Release(ctx, fmt.Sprintf("idle-%d", i))
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	t.Logf("memory per idle room (3 nodes in one process, leases held, logs cached): %.1f KiB heap",
		float64(after.HeapAlloc-before.HeapAlloc)/idle/1024)
}

// BenchmarkStore_WriteInLongRoom: one write (an event and a message
// record, as an acceptance is) into a room that already has n messages;
// the cost must not grow with n (each write copied the room's records).
func BenchmarkStore_WriteInLongRoom(b *testing.B) {
	for _, n := range []int{100, 10000, 100000} {
		b.Run(fmt.Sprintf("messages=%d", n), func(b *testing.B) {
			ctx := context.Background()
			node, err := StartNode(NodeConfig{Name: "n1", StoreDir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer node.Close()
			nc, err := node.Connect("bench")
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			if err := Setup(ctx, js, 1, 3*time.Second, nil); err != nil {
				b.Fatal(err)
			}
			s := newStore(nc, js, "n1")
			if err := s.takeover(ctx, "r", 1, func() time.Time { return time.Now().Add(time.Hour) }); err != nil {
				b.Fatal(err)
			}
			for i := 0; i < n; i += 2000 {
				err := s.Write(ctx, func(tx room.Tx) error {
					for j := i; j < min(n, i+2000); j++ {
						if err := tx.PutMessage(store.Message{ID: fmt.Sprintf("old%d", j), Room: "r", Seq: int64(j), Status: store.MessageEnded}); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				err := s.Write(ctx, func(tx room.Tx) error {
					ev, err := tx.Append("r", "message.accepted", map[string]string{"message_id": fmt.Sprintf("new%d", i)})
					if err != nil {
						return err
					}
					return tx.PutMessage(store.Message{ID: fmt.Sprintf("new%d", i), Room: "r", Seq: ev.Seq, Status: store.MessageQueued})
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
