package rpc

import (
	"io"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestClient_BacklogBoundsBytes: 300 message_updates of 256 KiB (pi repeats
// the whole partial message in each) with a listener that holds the first
// one until the reader waits for room, under the stall timeout. Every event
// arrives, and the backlog holds at most its byte budget: the heap peaked
// near 900 MiB when only the event count was bounded.
//
// The budget is 8 MiB instead of the default 64 MiB, and the frames 256 KiB
// instead of 2 MiB: the same proportions (a count-only backlog of 256 events
// holds 8 budgets, the limit is 5 budgets) for an eighth of the bytes, which
// under -race cost most of the test's time.
func TestClient_BacklogBoundsBytes(t *testing.T) {
	const n, size, budget = 300, 256 << 10, 8 << 20
	// The heap is measured as what is live: with the default GOGC the
	// garbage of delivered events (256 KiB each) may double it before a
	// collection runs, more so on a loaded machine where the collector
	// lags; a count-only backlog still holds 8 budgets live.
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	p := newPipePeer(t, Options{BacklogBytes: budget})
	var got atomic.Int32
	var heldPeak atomic.Uint64
	all := make(chan struct{})
	p.c.On(EventMessageUpdate, func(Event) {
		if got.Add(1) == 1 {
			// The slow listener under test. It holds the first event until
			// the reader waits for room, so the backlog is as full as its
			// bounds allow whatever the machine's speed (a fixed pause may
			// end before a count-only backlog fills), and notes the heap
			// then. Internal state with no event to wait on: polled, bounded
			// well under the stall timeout once reached.
			deadline := time.Now().Add(60 * time.Second)
			for p.c.roomWait.Load() == 0 {
				if time.Now().After(deadline) {
					t.Errorf("the reader never waited for room")
					break
				}
				time.Sleep(time.Millisecond)
			}
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			heldPeak.Store(ms.HeapAlloc)
		}
		if got.Load() == n {
			close(all)
		}
	})
	frame := `{"type":"message_update","message":{"role":"assistant","content":[{"type":"text","text":"` +
		strings.Repeat("z", size) + `"}]}}` + "\n"
	go func() {
		for i := 0; i < n; i++ {
			if _, err := io.WriteString(p.agentW, frame); err != nil {
				return
			}
		}
	}()
	runtime.GC()
	var peak uint64
	var ms runtime.MemStats
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(120 * time.Second)
wait:
	for {
		select {
		case <-all:
			break wait
		case <-tick.C:
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapAlloc)
		case <-deadline:
			t.Fatalf("%d of %d events after 120 s; errors %v", got.Load(), n, p.c.Errors())
		}
	}
	peak = max(peak, heldPeak.Load())
	t.Logf("peak heap %d MiB for %d events of %d KiB (%d MiB when the reader waited for room)",
		peak>>20, n, size>>10, heldPeak.Load()>>20)
	if errs := p.c.Errors(); len(errs) != 0 {
		t.Fatalf("errors: %v", errs)
	}
	if peak > 5*budget {
		t.Fatalf("peak heap %d MiB; the backlog should hold at most %d MiB", peak>>20, budget>>20)
	}
}

// TestClient_BackpressureWaitsForSlowListeners: with Backpressure a listener
// slower than the stall timeout slows the agent down instead of failing the
// turn; every event arrives and the turn ends normally.
func TestClient_BackpressureWaitsForSlowListeners(t *testing.T) {
	const n = 100
	p := newPipePeer(t, Options{Backlog: 8, StallTimeout: 50 * time.Millisecond, Backpressure: true})
	var got atomic.Int32
	p.c.On(EventMessageUpdate, func(Event) {
		if got.Add(1) == 1 {
			<-time.After(500 * time.Millisecond) // ten stall timeouts
		}
	})
	ctx := ctxT(t, 60*time.Second)
	errc := make(chan error, 1)
	go func() {
		_, err := p.c.Run(ctx, "hi", nil)
		errc <- err
	}()
	m := p.recv()
	go func() {
		p.say(`{"id":"`+m["id"].(string)+`","type":"response","command":"prompt","success":true}`, `{"type":"agent_start"}`)
		for i := 0; i < n; i++ {
			p.say(`{"type":"message_update"}`)
		}
		p.say(`{"type":"agent_end","messages":[]}`)
	}()
	if err := <-errc; err != nil {
		t.Fatalf("turn: %v", err)
	}
	if err := closeAndWait(t, p.c); err != nil {
		t.Fatal(err)
	}
	if got.Load() != n {
		t.Fatalf("%d of %d events delivered", got.Load(), n)
	}
	if errs := p.c.Errors(); len(errs) != 0 {
		t.Fatalf("errors: %v", errs)
	}
}

// Sync covers an event the reader has read and holds while it waits for
// room in the byte budget: the barrier waits behind it (it carried no
// bytes, so it passed the budget and went ahead of the event).
func TestClient_SyncWaitsForAnEventHeldByTheByteBudget(t *testing.T) {
	first := `{"type":"notice","n":1,"pad":"` + strings.Repeat("a", 200) + `"}`
	second := `{"type":"notice","n":2,"pad":"` + strings.Repeat("b", 200) + `"}`
	p := newPipePeer(t, Options{BacklogBytes: len(first) + 10, StallTimeout: time.Minute})
	gate := make(chan struct{})
	var seen atomic.Int32
	p.c.On("notice", func(ev Event) {
		var n struct{ N int32 }
		_ = ev.Decode(&n)
		if n.N == 1 {
			<-gate
		}
		seen.Store(n.N)
	})
	p.say(first, second)
	// Internal states with no event to wait on: polled, bounded.
	poll := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	poll("the reader to wait for room with frame 2", func() bool { return p.c.roomWait.Load() > 0 })
	synced := make(chan error, 1)
	go func() { synced <- p.c.Sync(ctxT(t, 30*time.Second)) }()
	poll("Sync's barrier", func() bool {
		p.c.qmu.Lock()
		defer p.c.qmu.Unlock()
		if len(p.c.parked) > 0 {
			return true
		}
		for _, it := range p.c.queue {
			if it.barrier != nil {
				return true
			}
		}
		return false
	})
	close(gate)
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if n := seen.Load(); n != 2 {
		t.Fatalf("Sync returned when the listeners had seen frame %d; the reader had read frame 2 before Sync", n)
	}
}
