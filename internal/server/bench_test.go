package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/internal/roomsqlite"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

func p99(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[(len(d)*99)/100]
}

// BenchmarkStreamFanout: one room, 200 stream clients; b.N events are
// appended to the room's log as fast as the store takes them (commits of
// 10), and each client reads them all. Reports events delivered per
// second (all clients together) and the p99 lag from an event's append
// to its arrival at a client (a backlog, at this rate).
func BenchmarkStreamFanout(b *testing.B) { benchFanout(b, 10, 0) }

// BenchmarkStreamFanoutPaced: as BenchmarkStreamFanout, with one event
// every 10 ms (100 events/s, 20000 deliveries/s): the delivery lag of a
// busy room that the server keeps up with.
func BenchmarkStreamFanoutPaced(b *testing.B) { benchFanout(b, 1, 10*time.Millisecond) }

func benchFanout(b *testing.B, batch int, pace time.Duration) {
	const clients = 200
	h := newBenchHarness(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// committed[seq] is when the Write that appended seq returned: the lag
	// after it is the stream's own; the lag after the event's time adds
	// the commit (an fsync).
	var cmu sync.Mutex
	committed := map[int64]time.Time{}
	appendN := func(n int) {
		tick := time.NewTicker(max(pace, time.Microsecond))
		defer tick.Stop()
		for i := 0; i < n; i += batch {
			if pace > 0 {
				<-tick.C
			}
			var seqs []int64
			err := h.db.Write(ctx, func(w *store.Writer) error {
				seqs = seqs[:0]
				for j := i; j < min(i+batch, n); j++ {
					ev, err := w.Append("fan", "bench.tick", map[string]int{"i": j})
					if err != nil {
						return err
					}
					seqs = append(seqs, ev.Seq)
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			now := time.Now()
			cmu.Lock()
			for _, q := range seqs {
				committed[q] = now
			}
			cmu.Unlock()
		}
	}
	appendN(1) // the room exists
	var wg sync.WaitGroup
	lags := make([][]time.Duration, clients)
	type arrival struct {
		seq int64
		at  time.Time
	}
	arrivals := make([][]arrival, clients)
	ready := make(chan struct{}, clients)
	total := int64(b.N) + 1
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "GET", h.url+"/v1/rooms/fan/events", nil)
			req.Header.Set("Authorization", "Bearer "+testToken)
			req.Header.Set("Last-Event-ID", "1")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Error(err)
				ready <- struct{}{}
				return
			}
			defer res.Body.Close()
			ready <- struct{}{}
			// A light client: the lag needs only the id and the time, and
			// the clients share the server's two cores.
			sc := newScanner(res.Body)
			var cursor int64 = 1
			for cursor < total && sc.Scan() {
				line := sc.Bytes()
				if id, ok := bytes.CutPrefix(line, []byte("id: ")); ok {
					num, _, _ := bytes.Cut(id, []byte("."))
					n, err := strconv.ParseInt(string(num), 10, 64)
					if err != nil || n != cursor+1 {
						b.Errorf("event %s after %d", id, cursor)
						return
					}
					cursor = n
					continue
				}
				if d, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
					i := bytes.Index(d, []byte(`"time":"`))
					if i < 0 {
						b.Errorf("no time in %s", d)
						return
					}
					rest := d[i+8:]
					tm, err := time.Parse(time.RFC3339Nano, string(rest[:bytes.IndexByte(rest, '"')]))
					if err != nil {
						b.Error(err)
						return
					}
					now := time.Now()
					lags[c] = append(lags[c], now.Sub(tm))
					arrivals[c] = append(arrivals[c], arrival{cursor, now})
				}
			}
			if cursor < total {
				b.Errorf("stream ended at %d of %d: %v", cursor, total, sc.Err())
			}
		}()
	}
	for range clients {
		<-ready
	}
	b.ResetTimer()
	start := time.Now()
	appendN(b.N)
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	var all []time.Duration
	for _, l := range lags {
		all = append(all, l...)
	}
	b.ReportMetric(float64(len(all))/el.Seconds(), "events/s")
	b.ReportMetric(float64(p99(all).Microseconds())/1000, "p99-lag-ms")
	var after []time.Duration
	for _, as := range arrivals {
		for _, a := range as {
			if t0, ok := committed[a.seq]; ok {
				after = append(after, max(a.at.Sub(t0), 0))
			}
		}
	}
	b.ReportMetric(float64(p99(after).Microseconds())/1000, "p99-lag-after-commit-ms")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkSubmit100Rooms: b.N messages posted through the API to 100
// rooms by 32 concurrent clients, each answered by the fake agent.
// Reports requests per second and the p99 latency of a POST; 32 clients
// saturate the store's writer, so the latency is mostly queueing.
func BenchmarkSubmit100Rooms(b *testing.B) { benchSubmit(b, 32) }

// BenchmarkSubmit100Rooms4Clients: the same with 4 clients, below
// saturation: the latency of one submit.
func BenchmarkSubmit100Rooms4Clients(b *testing.B) { benchSubmit(b, 4) }

func benchSubmit(b *testing.B, workers int) {
	const rooms = 100
	h := newBenchHarness(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	next := make(chan int)
	lat := make([][]time.Duration, workers)
	var wg sync.WaitGroup
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				body, _ := json.Marshal(map[string]string{"text": fmt.Sprintf("message %d", i)})
				req, _ := http.NewRequestWithContext(ctx, "POST", fmt.Sprintf("%s/v1/rooms/room-%d/messages", h.url, i%rooms), bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+testToken)
				t0 := time.Now()
				res, err := hc.Do(req)
				if err != nil {
					b.Error(err)
					continue
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				lat[w] = append(lat[w], time.Since(t0))
				if res.StatusCode != http.StatusAccepted {
					b.Errorf("post: %d", res.StatusCode)
				}
			}
		}()
	}
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		next <- i
	}
	close(next)
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	b.ReportMetric(float64(len(all))/el.Seconds(), "req/s")
	b.ReportMetric(float64(p99(all).Microseconds())/1000, "p99-submit-ms")
	b.ReportMetric(0, "ns/op")
}

type benchHarness struct {
	db  *store.DB
	url string
}

func newBenchHarness(b *testing.B) *benchHarness {
	b.Helper()
	dir := b.TempDir()
	db, err := store.Open(context.Background(), dir+"/agenthost.db", store.Options{NoSync: os.Getenv("BENCH_NOSYNC") != ""})
	if err != nil {
		b.Fatal(err)
	}
	m, err := room.New(room.Options{Store: roomsqlite.New(db), Transport: newFakeTransport(), Root: dir + "/rooms",
		QueueLimit: 100000, MaxResident: 100})
	if err != nil {
		b.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	s, err := New(Options{Manager: m, Token: testToken})
	if err != nil {
		b.Fatal(err)
	}
	srv := newTestServer(s)
	b.Cleanup(func() {
		s.Close()
		srv.Close()
		_ = m.Close()
		wctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_ = m.Wait(wctx)
		cancel()
		_ = db.Close()
	})
	return &benchHarness{db: db, url: srv.URL}
}

func newTestServer(h http.Handler) *httptest.Server { return httptest.NewServer(h) }

func newScanner(r io.Reader) *bufio.Scanner {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	return sc
}

// manyRooms is the room count of the listing and scrape benchmarks.
const manyRooms = 20000

// seedRooms writes n rooms into h's store, each with a settled exchange
// (a message, its turn, five events), as a server that ran for a while
// would hold them; the first pending rooms also keep an approval waiting.
func seedRooms(b *testing.B, h *benchHarness, n, pending int) {
	b.Helper()
	ctx := context.Background()
	const batch = 500
	for i := 0; i < n; i += batch {
		err := h.db.Write(ctx, func(w *store.Writer) error {
			for j := i; j < min(i+batch, n); j++ {
				id := fmt.Sprintf("room-%06d", j)
				mid, tid := fmt.Sprintf("m%d", j), fmt.Sprintf("t%d", j)
				now := time.Now()
				for _, typ := range []string{"message.accepted", "turn.started", "text.delta", "turn.ended", "message.ended"} {
					if _, err := w.Append(id, typ, map[string]string{"message_id": mid, "turn_id": tid, "outcome": "settled", "text": "ok"}); err != nil {
						return err
					}
				}
				if err := w.PutMessage(store.Message{ID: mid, Room: id, Seq: 1, Sender: "bench", Text: "hello", Delivery: "queue",
					Status: "ended", Outcome: "settled", TurnID: tid, Accepted: now, Started: now, Ended: now}); err != nil {
					return err
				}
				if err := w.PutTurn(store.Turn{ID: tid, Room: id, MessageID: mid, Started: now}); err != nil {
					return err
				}
				if err := w.EndTurn(tid, "settled", "", "ok", store.Usage{}); err != nil {
					return err
				}
				if j < pending {
					if err := w.PutApproval(store.Approval{ID: "a" + mid, Room: id, TurnID: tid, Tool: "bash", Input: "ls",
						Options: []string{"allow", "deny"}, Created: now, Deadline: now.Add(time.Hour)}); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

func benchGet(b *testing.B, url string) int {
	b.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer res.Body.Close()
	n, _ := io.Copy(io.Discard, res.Body)
	if res.StatusCode != http.StatusOK {
		b.Fatalf("GET %s: %d", url, res.StatusCode)
	}
	return int(n)
}

// BenchmarkListRooms20k: GET /v1/rooms on a store of 20,000 rooms: its
// first page (what a client without paging gets), a page deep in the
// list and a page of the largest size; reports the bytes of one answer.
//
//	BENCH_NOSYNC=1 go test ./internal/server -run '^$' -bench 'ListRooms20k|Metrics20k' -benchtime 20x
func BenchmarkListRooms20k(b *testing.B) {
	h := newBenchHarness(b)
	seedRooms(b, h, manyRooms, 10)
	for _, c := range []struct{ name, query string }{
		{"first", ""},
		{"after-19000", "?after=room-019000"},
		{"limit-1000", "?limit=1000&after=room-010000"},
	} {
		b.Run(c.name, func(b *testing.B) {
			var n int
			for range b.N {
				n = benchGet(b, h.url+"/v1/rooms"+c.query)
			}
			b.ReportMetric(float64(n), "bytes/page")
		})
	}
}

// BenchmarkMetrics20k: one /metrics scrape on a store of 20,000 rooms.
func BenchmarkMetrics20k(b *testing.B) {
	h := newBenchHarness(b)
	seedRooms(b, h, manyRooms, 10)
	b.ResetTimer()
	for range b.N {
		benchGet(b, h.url+"/metrics")
	}
}

// BenchmarkSubmitToTurnStarted100Rooms4Clients: 4 clients post through
// the API to 100 rooms (each client to rooms of its own, one message in
// flight per client) and read each room's event stream; a message's
// latency is from its POST to its turn.started arriving on the stream,
// as a client sees it. The fake agent answers at once, so this is the
// host: the store's writes (fsync on), the room's worker and the stream.
// Reports p50 and p99 in milliseconds.
func BenchmarkSubmitToTurnStarted100Rooms4Clients(b *testing.B) {
	const rooms, clients = 100, 4
	h := newBenchHarness(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tr := &http.Transport{MaxIdleConnsPerHost: rooms + clients}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	post := func(rm int, text string) (string, error) {
		body, _ := json.Marshal(map[string]string{"text": text})
		req, _ := http.NewRequestWithContext(ctx, "POST", fmt.Sprintf("%s/v1/rooms/room-%d/messages", h.url, rm), bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testToken)
		res, err := hc.Do(req)
		if err != nil {
			return "", err
		}
		defer res.Body.Close()
		var acc struct{ ID string }
		if err := json.NewDecoder(res.Body).Decode(&acc); err != nil || res.StatusCode != http.StatusAccepted {
			return "", fmt.Errorf("post: %d %v", res.StatusCode, err)
		}
		return acc.ID, nil
	}
	// seen carries, per room, the turn.started and message.ended events
	// its stream reads: "started <message id>" and "ended <message id>".
	seen := make([]chan string, rooms)
	var readers sync.WaitGroup
	defer readers.Wait()
	defer cancel()
	for rm := range rooms {
		seen[rm] = make(chan string, 64)
		first, err := post(rm, "warm")
		if err != nil {
			b.Fatal(err)
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/v1/rooms/room-%d/events", h.url, rm), nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		res, err := hc.Do(req)
		if err != nil || res.StatusCode != http.StatusOK {
			b.Fatalf("stream: %v", err)
		}
		readers.Go(func() {
			defer res.Body.Close()
			sc := newScanner(res.Body)
			var typ string
			for sc.Scan() {
				line := sc.Text()
				switch {
				case strings.HasPrefix(line, "event: "):
					typ = line[len("event: "):]
				case strings.HasPrefix(line, "data: ") && (typ == event.TypeTurnStarted || typ == event.TypeMessageEnded):
					var d struct {
						MessageID string `json:"message_id"`
					}
					_ = json.Unmarshal([]byte(line[len("data: "):]), &d)
					what := "ended "
					if typ == event.TypeTurnStarted {
						what = "started "
					}
					select {
					case seen[rm] <- what + d.MessageID:
					case <-ctx.Done():
						return
					}
				}
			}
		})
		if err := waitFor(ctx, seen[rm], "ended "+first); err != nil {
			b.Fatal(err)
		}
	}
	jobs := make(chan struct{})
	// lat: submit to turn.started; acc: submit to its 202 (the rest is
	// the turn's start and its way to the stream).
	lat := make([][]time.Duration, clients)
	acc := make([][]time.Duration, clients)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := c; ; i = (i + clients) % rooms {
				if _, ok := <-jobs; !ok {
					return
				}
				t0 := time.Now()
				id, err := post(i, "hello")
				if err != nil {
					b.Error(err)
					return
				}
				acc[c] = append(acc[c], time.Since(t0))
				if err := waitFor(ctx, seen[i], "started "+id); err != nil {
					b.Error(err)
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
				// The room is idle again before its next message.
				if err := waitFor(ctx, seen[i], "ended "+id); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	for b.Loop() {
		jobs <- struct{}{}
	}
	close(jobs)
	wg.Wait()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(p99(all).Microseconds())/1000, "p99-ms")
	}
	var accs []time.Duration
	for _, l := range acc {
		accs = append(accs, l...)
	}
	if len(accs) > 0 {
		slices.Sort(accs)
		b.ReportMetric(float64(accs[len(accs)/2].Microseconds())/1000, "202-p50-ms")
		b.ReportMetric(float64(p99(accs).Microseconds())/1000, "202-p99-ms")
	}
}

// waitFor reads ch until it gives want.
func waitFor(ctx context.Context, ch <-chan string, want string) error {
	for {
		select {
		case got := <-ch:
			if got == want {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("waiting for %q: %w", want, ctx.Err())
		}
	}
}
