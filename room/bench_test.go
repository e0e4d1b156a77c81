package room_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/roomsqlite"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// The benchmarks host rooms on an in-process agent that answers at once,
// so what they measure is the host: the room manager, its durable store
// (SQLite with fsync on, in the benchmark's temporary directory) and the
// Go runtime. They run only with -bench:
//
//	go test ./room -run '^$' -bench . -benchtime 3000x
//
// benchRooms is the number of rooms the benchmarks spread their work over.
const benchRooms = 1000

// benchWait bounds every wait in the benchmarks: far longer than any
// healthy run, so it only ends a stuck one.
const benchWait = 2 * time.Minute

// BenchmarkSubmitToTurnStarted measures the host's latency from Submit to
// the message's turn.started event being durable (p50-ms, p99-ms), and to
// the prompt reaching the agent (prompt-p50-ms, prompt-p99-ms), over 1,000
// resident rooms. Each sender submits to its own rooms in turn and waits
// for the turn's end before its next message, so senders is the number of
// messages in flight; the agent answers at once and costs nothing.
func BenchmarkSubmitToTurnStarted(b *testing.B) {
	for _, senders := range []int{1, 16, 64} {
		b.Run("senders="+strconv.Itoa(senders), func(b *testing.B) {
			h := newBenchHost(b, room.Options{MaxResident: benchRooms})
			h.warm(b, benchRooms, false)
			var (
				mu                sync.Mutex
				started, prompted []time.Duration
				next              atomic.Int64
			)
			jobs := make(chan struct{})
			var wg sync.WaitGroup
			for s := range senders {
				wg.Go(func() {
					ctx := context.Background()
					var st, pr []time.Duration
					defer func() {
						mu.Lock()
						started, prompted = append(started, st...), append(prompted, pr...)
						mu.Unlock()
					}()
					// Each sender has rooms of its own, so no message
					// queues behind another sender's turn.
					for i := s; ; i += senders {
						if _, ok := <-jobs; !ok {
							return
						}
						if i >= benchRooms {
							i = s
						}
						id := benchRoomID(i)
						text := "m" + strconv.FormatInt(next.Add(1), 10)
						t0 := time.Now()
						acc, err := h.m.Submit(ctx, id, room.Message{Text: text})
						if err != nil {
							b.Error(err)
							return
						}
						tr, err := h.st.ended(acc.ID)
						if err != nil {
							b.Error(err)
							return
						}
						st = append(st, tr.started.Sub(t0))
						pr = append(pr, h.tr.promptedAt(text).Sub(t0))
					}
				})
			}
			for b.Loop() {
				jobs <- struct{}{}
			}
			close(jobs)
			wg.Wait()
			if b.Failed() {
				return
			}
			b.ReportMetric(percentileMS(started, 50), "p50-ms")
			b.ReportMetric(percentileMS(started, 99), "p99-ms")
			b.ReportMetric(percentileMS(prompted, 50), "prompt-p50-ms")
			b.ReportMetric(percentileMS(prompted, 99), "prompt-p99-ms")
		})
	}
}

// BenchmarkSubmitsToOneRoom measures concurrent submits to one busy room
// (its turn held, so every message queues): accepted messages per second
// (submits/s) and Submit's latency (p50-ms, p99-ms), with 16 senders. The
// limit check, the durable acceptance and the queue place are one step
// (the store's write), so this is the price of that step under contention.
func BenchmarkSubmitsToOneRoom(b *testing.B) {
	const senders = 16
	h := newBenchHost(b, room.Options{QueueLimit: 1 << 30})
	ctx := context.Background()
	if _, err := h.m.Submit(ctx, "one", room.Message{Text: "hold"}); err != nil {
		b.Fatal(err)
	}
	var (
		mu  sync.Mutex
		all []time.Duration
	)
	jobs := make(chan struct{})
	var wg sync.WaitGroup
	for range senders {
		wg.Go(func() {
			var lat []time.Duration
			defer func() {
				mu.Lock()
				all = append(all, lat...)
				mu.Unlock()
			}()
			for range jobs {
				t0 := time.Now()
				if _, err := h.m.Submit(ctx, "one", room.Message{Text: "q"}); err != nil {
					b.Error(err)
					return
				}
				lat = append(lat, time.Since(t0))
			}
		})
	}
	t0 := time.Now()
	for b.Loop() {
		jobs <- struct{}{}
	}
	close(jobs)
	wg.Wait()
	el := time.Since(t0)
	if b.Failed() {
		return
	}
	b.ReportMetric(float64(len(all))/el.Seconds(), "submits/s")
	b.ReportMetric(percentileMS(all, 50), "p50-ms")
	b.ReportMetric(percentileMS(all, 99), "p99-ms")
}

// BenchmarkRoomMemory measures the host's Go heap per room (B/room, after
// a GC, against the heap before the rooms existed) and its goroutines per
// room, for 1,000 rooms that each ran one turn and were then released
// (idle) or kept (resident, MaxResident 1,000). The in-process agent's
// own few hundred bytes count in the resident figure; an agent process
// would not. The SQLite page cache is outside the Go heap and bounded
// whatever the number of rooms.
func BenchmarkRoomMemory(b *testing.B) {
	for _, resident := range []bool{false, true} {
		name := "idle"
		if resident {
			name = "resident"
		}
		b.Run(name, func(b *testing.B) {
			var perRoom, goroutines float64
			for b.Loop() {
				h := newBenchHost(b, room.Options{MaxResident: benchRooms})
				heap0, g0 := heapInUse(), runtime.NumGoroutine()
				h.warm(b, benchRooms, !resident)
				if b.Failed() {
					return
				}
				h.st.forget()
				g := settledGoroutines(g0)
				perRoom += float64(int64(heapInUse())-int64(heap0)) / benchRooms
				goroutines += float64(g-g0) / benchRooms
				want := 0
				if resident {
					want = benchRooms
				}
				if got := h.tr.live(); got != want {
					b.Fatalf("%d agents alive, want %d", got, want)
				}
				h.close(b)
			}
			b.ReportMetric(perRoom/float64(b.N), "B/room")
			b.ReportMetric(goroutines/float64(b.N), "goroutines/room")
		})
	}
}

// BenchmarkEventsPersisted measures agent events (text deltas, through
// Handler.Event) durably recorded per second with fsync on, each room's
// turn streaming its share of one round's deltas at once while the other
// rooms stream theirs. rooms=1 is one agent streaming alone: its rate is
// bounded by one commit per event, since Handler.Event returns once its
// event is durable.
func BenchmarkEventsPersisted(b *testing.B) {
	for _, tc := range []struct{ rooms, deltas int }{{1, 500}, {100, 100}, {benchRooms, 20}} {
		b.Run(fmt.Sprintf("rooms=%d", tc.rooms), func(b *testing.B) {
			h := newBenchHost(b, room.Options{MaxResident: tc.rooms})
			h.warm(b, tc.rooms, false)
			var events int
			var elapsed time.Duration
			for b.Loop() {
				start := time.Now()
				h.round(b, tc.rooms, fmt.Sprintf("stream:%d", tc.deltas))
				elapsed += time.Since(start)
				events += tc.rooms * tc.deltas
			}
			if got := h.tr.deltas.Load(); got < int64(events) {
				b.Fatalf("%d deltas streamed, want %d", got, events)
			}
			b.ReportMetric(float64(events)/elapsed.Seconds(), "events/s")
		})
	}
}

func benchRoomID(i int) string { return fmt.Sprintf("room-%04d", i) }

// percentileMS is the p-th percentile of ds, in milliseconds (nearest
// rank).
func percentileMS(ds []time.Duration, p int) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p+99)/100 - 1
	return float64(s[max(i, 0)]) / float64(time.Millisecond)
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// settledGoroutines waits (briefly: workers exit right after their last
// write) for the goroutine count to stop exceeding base, and returns it.
func settledGoroutines(base int) int {
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return runtime.NumGoroutine()
}

// benchHost is a manager on a fresh store with the instant agent.
type benchHost struct {
	db *store.DB
	st *timedStore
	tr *instantTransport
	m  *room.Manager
}

func newBenchHost(b *testing.B, opts room.Options) *benchHost {
	b.Helper()
	dir := b.TempDir()
	db, err := store.Open(context.Background(), filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	h := &benchHost{db: db, st: newTimedStore(roomsqlite.New(db)), tr: &instantTransport{}}
	opts.Store, opts.Transport, opts.Root = h.st, h.tr, filepath.Join(dir, "rooms")
	if h.m, err = room.New(opts); err != nil {
		b.Fatal(err)
	}
	if err := h.m.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.close(b) })
	return h
}

func (h *benchHost) close(b *testing.B) {
	if h.m == nil {
		return
	}
	_ = h.m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.m.Wait(ctx); err != nil {
		b.Errorf("closing the rooms: %v", err)
	}
	if err := h.db.Close(); err != nil {
		b.Errorf("closing the store: %v", err)
	}
	h.m = nil
}

// warm runs one turn in each of n rooms, and releases their agents if
// release is set.
func (h *benchHost) warm(b *testing.B, n int, release bool) {
	b.Helper()
	h.round(b, n, "hello")
	if !release {
		return
	}
	for i := range n {
		if err := h.m.Release(context.Background(), benchRoomID(i)); err != nil {
			b.Fatal(err)
		}
	}
}

// round submits text to each of n rooms at once and waits for every
// turn to settle.
func (h *benchHost) round(b *testing.B, n int, text string) {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			acc, err := h.m.Submit(context.Background(), benchRoomID(i), room.Message{Text: text})
			if err == nil {
				var tr *track
				if tr, err = h.st.ended(acc.ID); err == nil && tr.outcome != room.OutcomeSettled {
					err = fmt.Errorf("room %s: turn %s", benchRoomID(i), tr.outcome)
				}
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
}

// timedStore notes when each message's turn.started and turn.ended events
// became durable: the moment the store Write carrying them returned.
type timedStore struct {
	room.Store
	mu   sync.Mutex
	msgs map[string]*track
}

type track struct {
	started time.Time
	outcome string
	ended   chan struct{} // closed once turn.ended is durable
}

func newTimedStore(s room.Store) *timedStore {
	return &timedStore{Store: s, msgs: map[string]*track{}}
}

// trackLocked returns the message's track, creating it.
func (s *timedStore) trackLocked(id string) *track {
	t := s.msgs[id]
	if t == nil {
		t = &track{ended: make(chan struct{})}
		s.msgs[id] = t
	}
	return t
}

func (s *timedStore) Write(ctx context.Context, fn func(tx room.Tx) error) error {
	var marks []turnMark
	err := s.Store.Write(ctx, func(tx room.Tx) error {
		marks = marks[:0]
		return fn(markingTx{Tx: tx, marks: &marks})
	})
	if err != nil || len(marks) == 0 {
		return err
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, mk := range marks {
		t := s.trackLocked(mk.messageID)
		if mk.outcome == "" {
			t.started = now
			continue
		}
		select {
		case <-t.ended:
		default:
			t.outcome = mk.outcome
			close(t.ended)
		}
	}
	return nil
}

// ended waits for the turn of message id to end, and forgets the message.
func (s *timedStore) ended(id string) (*track, error) {
	s.mu.Lock()
	t := s.trackLocked(id)
	s.mu.Unlock()
	timer := time.NewTimer(benchWait)
	defer timer.Stop()
	select {
	case <-t.ended:
	case <-timer.C:
		return nil, fmt.Errorf("message %s: no turn.ended within %v", id, benchWait)
	}
	s.mu.Lock()
	delete(s.msgs, id)
	s.mu.Unlock()
	return t, nil
}

// forget drops the tracking map, so that its memory is not counted as
// the rooms'.
func (s *timedStore) forget() {
	s.mu.Lock()
	s.msgs = map[string]*track{}
	s.mu.Unlock()
}

type turnMark struct{ messageID, outcome string }

// markingTx notes the turn events a write appends.
type markingTx struct {
	room.Tx
	marks *[]turnMark
}

func (t markingTx) Append(roomID, typ string, data any) (store.Event, error) {
	ev, err := t.Tx.Append(roomID, typ, data)
	if err == nil && (typ == "turn.started" || typ == "turn.ended") {
		var d struct {
			MessageID string `json:"message_id"`
			Outcome   string `json:"outcome"`
		}
		_ = json.Unmarshal(ev.Data, &d)
		if typ == "turn.ended" && d.Outcome == "" {
			d.Outcome = "unknown"
		}
		*t.marks = append(*t.marks, turnMark{messageID: d.MessageID, outcome: d.Outcome})
	}
	return ev, err
}

// instantTransport starts in-process agents that answer every prompt at
// once: "stream:N" streams N text deltas first.
type instantTransport struct {
	sessions atomic.Int64
	alive    atomic.Int64
	deltas   atomic.Int64
	prompted sync.Map // prompt text -> time.Time the agent got it
}

func (f *instantTransport) Start(ctx context.Context, spec room.AgentSpec) (room.Agent, error) {
	f.alive.Add(1)
	sess := spec.SessionID
	if sess == "" {
		sess = "s" + strconv.FormatInt(f.sessions.Add(1), 10)
	}
	return &instantAgent{f: f, h: spec.Handler, session: sess, done: make(chan struct{})}, nil
}

func (f *instantTransport) live() int { return int(f.alive.Load()) }

// promptedAt returns when the agent got text, and forgets it.
func (f *instantTransport) promptedAt(text string) time.Time {
	v, _ := f.prompted.LoadAndDelete(text)
	t, _ := v.(time.Time)
	return t
}

type instantAgent struct {
	f       *instantTransport
	h       room.Handler
	session string
	once    sync.Once
	done    chan struct{}
}

// delta is a streamed piece of assistant text of a typical size.
const delta = "a delta of streamed assistant text, about eighty bytes long......"

func (a *instantAgent) SessionID() string { return a.session }

func (a *instantAgent) Run(ctx context.Context, text string) (room.TurnResult, error) {
	if strings.HasPrefix(text, "m") {
		a.f.prompted.Store(text, time.Now())
	}
	if text == "hold" {
		<-ctx.Done()
		return room.TurnResult{}, ctx.Err()
	}
	if n, ok := strings.CutPrefix(text, "stream:"); ok {
		count, _ := strconv.Atoi(n)
		for range count {
			a.h.Event(room.AgentEvent{Kind: room.KindText, Text: delta})
		}
		a.f.deltas.Add(int64(count))
	}
	return room.TurnResult{Text: "ok"}, nil
}

func (a *instantAgent) Steer(ctx context.Context, text string) error    { return nil }
func (a *instantAgent) FollowUp(ctx context.Context, text string) error { return nil }
func (a *instantAgent) Done() <-chan struct{}                           { return a.done }

func (a *instantAgent) Close(ctx context.Context) (json.RawMessage, error) {
	a.once.Do(func() {
		close(a.done)
		a.f.alive.Add(-1)
	})
	return nil, nil
}
