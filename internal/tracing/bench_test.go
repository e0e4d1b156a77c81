package tracing

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/record"
	"github.com/agenthost/agenthost/room"
)

// discardExporter takes spans and does nothing with them.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// benchTurn is one turn's commits as a room tells them: a message with a
// caller's trace context, the turn, the agent's start, snapshots, a tool
// call that waits for an approval, the turn's end (6 spans).
func benchTurn(i int) [][]room.Observed {
	f := &feed{room: fmt.Sprintf("r%d", i%16), at: time.Now()}
	m, tu, c, a := fmt.Sprintf("m%d", i), fmt.Sprintf("t%d", i), fmt.Sprintf("c%d", i), fmt.Sprintf("a%d", i)
	acc := f.ev(event.MessageAccepted{MessageID: m, Text: "hi", Delivery: "queue"})
	acc.TraceParent = callerTraceParent
	return [][]room.Observed{
		{acc, f.ev(event.MessageQueued{MessageID: m}), f.ev(event.TurnStarted{TurnID: tu, MessageID: m})},
		{{Phase: &room.Phase{Room: f.room, TurnID: tu, Name: room.PhaseSnapshotBefore, Start: f.at, End: f.at.Add(time.Millisecond)}}},
		{{Phase: &room.Phase{Room: f.room, Name: room.PhaseAgentStart, Start: f.at, End: f.at.Add(time.Second)}}},
		{f.ev(event.AgentStarted{SessionID: "s" + tu})},
		{f.ev(event.ToolStarted{TurnID: tu, CallID: c, Tool: "bash", Input: `{"command":"echo hi"}`})},
		{f.ev(event.ApprovalRequested{ApprovalID: a, TurnID: tu, Tool: "bash", Deadline: f.at.Add(time.Minute)})},
		{f.ev(event.ApprovalResolved{ApprovalID: a, Decision: "allow", By: "person"})},
		{f.ev(event.ToolEnded{TurnID: tu, CallID: c, Tool: "bash", Output: "hi"})},
		{{Phase: &room.Phase{Room: f.room, TurnID: tu, Name: room.PhaseSnapshotAfter, Start: f.at, End: f.at.Add(time.Millisecond)}}},
		{f.ev(event.TurnEnded{TurnID: tu, MessageID: m, Outcome: "settled", Usage: record.Usage{InputTokens: 120, OutputTokens: 34},
			Changes: &event.Changes{Files: 1, Insertions: 1}}), f.ev(event.MessageEnded{MessageID: m, Outcome: "settled", TurnID: tu})},
	}
}

// BenchmarkTurn is what tracing costs a turn, all of it: the rooms'
// Observe calls, the spans made of the events, and their export
// (discarded, or encoded and posted over OTLP/HTTP to a loopback
// collector that reads and drops them). ns/op is per turn; a turn's
// commits are the 10 of benchTurn. It fails if an event or span was
// dropped (the figure would then leave work out).
func BenchmarkTurn(b *testing.B) {
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer sink.Close()
	for _, c := range []struct {
		name string
		cfg  Config
	}{
		{"discard", Config{Exporter: discardExporter{}}},
		{"otlp-http", Config{Endpoint: sink.URL}},
	} {
		b.Run(c.name, func(b *testing.B) {
			c.cfg.RoomInfo = func(context.Context, string) (string, string, error) { return "omp", "agenthost/scripted", nil }
			c.cfg.Interval = 50 * time.Millisecond
			tr, err := New(context.Background(), c.cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_ = tr.Close(ctx)
			}()
			turns := make([][][]room.Observed, 1024)
			for i := range turns {
				turns[i] = benchTurn(i)
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for _, commit := range turns[i%len(turns)] {
					tr.Observe(commit)
				}
				// Within the queues' bounds: nothing is dropped.
				if i%256 == 255 {
					if err := tr.Flush(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			if err := tr.Flush(ctx); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if st := tr.Stats(); st.EventsDropped != 0 || st.SpansDropped != 0 {
				b.Fatalf("dropped: %+v", st)
			}
		})
	}
}

// BenchmarkObserve is what a room's commit pays: Observe's queueing.
func BenchmarkObserve(b *testing.B) {
	tr, err := New(context.Background(), Config{Exporter: discardExporter{}, EventQueue: 1 << 16})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = tr.Close(ctx)
	}()
	// Events of no turn the tracer knows: it reads and drops them, so the
	// figure is the queueing, not the spans (BenchmarkTurn has those).
	f := &feed{room: "r", at: time.Now()}
	commit := []room.Observed{f.ev(event.ToolStarted{TurnID: "none", CallID: "c", Tool: "bash"})}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tr.Observe(commit)
		if i%4096 == 4095 {
			if err := tr.Flush(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	if st := tr.Stats(); st.EventsDropped != 0 {
		b.Fatalf("dropped: %+v", st)
	}
}
