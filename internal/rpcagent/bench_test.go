package rpcagent

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/roomsqlite"
	"github.com/agenthost/agenthost/internal/roomtest"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// benchAgentEnv makes the test binary a minimal RPC agent (benchAgent;
// see TestMain).
const benchAgentEnv = "RPCAGENT_BENCH_AGENT"

// benchAgent speaks just enough of the RPC protocol for a room: it
// answers get_state, and a prompt with one assistant message ("ok"),
// after "stream:N" with N text deltas first.
func benchAgent() int {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	send := func(v any) {
		b, _ := json.Marshal(v)
		_, _ = out.Write(append(b, '\n'))
	}
	session := "bench-" + strconv.Itoa(os.Getpid())
	for in.Scan() {
		var cmd struct {
			ID      any    `json:"id"`
			Type    string `json:"type"`
			Message string `json:"message"`
		}
		if json.Unmarshal(in.Bytes(), &cmd) != nil {
			continue
		}
		switch cmd.Type {
		case "get_state":
			send(map[string]any{"id": cmd.ID, "type": "response", "command": "get_state", "success": true,
				"data": map[string]any{"isStreaming": false, "sessionId": session, "messageCount": 0, "pendingMessageCount": 0}})
		case "prompt":
			send(map[string]any{"id": cmd.ID, "type": "response", "command": "prompt", "success": true})
			send(map[string]any{"type": "agent_start"})
			n := 0
			if s, ok := strings.CutPrefix(cmd.Message, "stream:"); ok {
				n, _ = strconv.Atoi(s)
			}
			for range n {
				send(map[string]any{"type": "message_update", "message": map[string]any{"role": "assistant"},
					"assistantMessageEvent": map[string]any{"type": "text_delta", "contentIndex": 0, "delta": benchDelta}})
			}
			send(map[string]any{"type": "message_end", "message": map[string]any{
				"role": "assistant", "content": []any{map[string]any{"type": "text", "text": "ok"}}, "stopReason": "stop",
				"usage": map[string]any{"input": 1, "output": 1, "totalTokens": 2}}})
			send(map[string]any{"type": "agent_end", "messages": []any{}})
		default:
			send(map[string]any{"id": cmd.ID, "type": "response", "command": cmd.Type, "success": false, "error": "Unknown command: " + cmd.Type})
		}
		if err := out.Flush(); err != nil {
			return 1
		}
	}
	return 0
}

const benchDelta = "a delta of streamed assistant text, about eighty bytes long......"

// benchHost is a room manager whose rooms run benchAgent processes in
// custody, through rpc.Client.
type benchHost struct {
	db   *store.DB
	cust *custody.Custodian
	m    *room.Manager
}

func newBenchHost(b *testing.B, rooms int) *benchHost {
	b.Helper()
	dir := b.TempDir()
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	h := &benchHost{}
	if h.db, err = store.Open(context.Background(), filepath.Join(dir, "agenthost.db"), store.Options{}); err != nil {
		b.Fatal(err)
	}
	if h.cust, err = custody.New(custody.Options{}); err != nil {
		b.Fatal(err)
	}
	tr, err := New(Options{Custodian: h.cust})
	if err != nil {
		b.Fatal(err)
	}
	// GORACE: a race-enabled agent would otherwise sleep 1 s at exit.
	cfg := room.Config{Command: []string{exe, "-test.run=^$"}, Env: []string{benchAgentEnv + "=1", "GORACE=atexit_sleep_ms=0"}}
	h.m, err = room.New(room.Options{Store: roomsqlite.New(h.db), Transport: tr, Root: filepath.Join(dir, "rooms"),
		Config: cfg, MaxResident: rooms})
	if err != nil {
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
	wctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.m.Wait(wctx); err != nil {
		b.Errorf("closing the rooms: %v", err)
	}
	if err := h.cust.Close(); err != nil {
		b.Errorf("closing custody: %v", err)
	}
	_ = h.db.Close()
	h.m = nil
}

// round submits text to each of n rooms at once and waits for every turn
// to settle.
func (h *benchHost) round(b *testing.B, n int, text string) {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() { errs <- h.turn(fmt.Sprintf("room-%03d", i), text) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
}

// turn submits text to the room and waits (bounded) for its turn to
// settle.
func (h *benchHost) turn(roomID, text string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	watch, stop := h.db.Watch(roomID)
	defer stop()
	acc, err := h.m.Submit(ctx, roomID, room.Message{Text: text})
	if err != nil {
		return err
	}
	for after := acc.Seq; ; {
		evs, err := h.db.Events(ctx, roomID, after, 0)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			after = ev.Seq
			if ev.Type == "turn.ended" && roomtest.Field(ev.Data, "message_id") == acc.ID {
				if o := roomtest.Field(ev.Data, "outcome"); o != room.OutcomeSettled {
					return fmt.Errorf("room %s: turn %s: %s", roomID, o, roomtest.Field(ev.Data, "reason"))
				}
				return nil
			}
		}
		select {
		case <-watch:
		case <-ctx.Done():
			return fmt.Errorf("room %s: no turn.ended: %w", roomID, ctx.Err())
		}
	}
}

// BenchmarkResidentRPCRoom measures the host's Go heap (B/room, after a
// GC) and goroutines per resident room whose agent is a real process
// (the test binary as a minimal RPC agent) behind rpc.Client and a
// custody scope: 50 rooms that each ran one turn. The agent processes'
// own memory is not counted.
//
//	go test ./internal/rpcagent -run '^$' -bench ResidentRPCRoom
func BenchmarkResidentRPCRoom(b *testing.B) {
	const rooms = 50
	var perRoom, goroutines float64
	for b.Loop() {
		h := newBenchHost(b, rooms)
		heap0, g0 := heapInUse(), runtime.NumGoroutine()
		h.round(b, rooms, "hello")
		perRoom += float64(int64(heapInUse())-int64(heap0)) / rooms
		goroutines += float64(runtime.NumGoroutine()-g0) / rooms
		h.close(b)
	}
	b.ReportMetric(perRoom/float64(b.N), "B/room")
	b.ReportMetric(goroutines/float64(b.N), "goroutines/room")
}

// BenchmarkRPCRoomStream measures text deltas persisted per second from
// one agent process streaming alone (2,000 deltas a turn) through
// rpc.Client into its room's event log, fsync on: the rate a single
// streaming room gets, since Handler.Event returns once its event is
// durable and the client's listener runs one event at a time.
//
//	go test ./internal/rpcagent -run '^$' -bench RPCRoomStream
func BenchmarkRPCRoomStream(b *testing.B) {
	const deltas = 2000
	h := newBenchHost(b, 1)
	h.round(b, 1, "hello")
	var elapsed time.Duration
	for b.Loop() {
		start := time.Now()
		h.round(b, 1, fmt.Sprintf("stream:%d", deltas))
		elapsed += time.Since(start)
	}
	b.ReportMetric(float64(deltas*b.N)/elapsed.Seconds(), "events/s")
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}
