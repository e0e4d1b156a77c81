package tracing

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/record"
	"github.com/agenthost/agenthost/room"
)

func TestMain(m *testing.M) {
	// The Jaeger binary built for the tests (real_test.go) goes with them.
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if jaegerDir != "" {
			_ = os.RemoveAll(jaegerDir)
		}
		os.Exit(code)
	}))
}

const callerTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// feed is a room's log as the Manager would tell it, one commit per call.
type feed struct {
	room string
	seq  int64
	at   time.Time
}

func (f *feed) ev(p event.Payload) room.Observed {
	f.seq++
	f.at = f.at.Add(100 * time.Millisecond)
	data, _ := json.Marshal(p)
	return room.Observed{Event: record.Event{Room: f.room, Seq: f.seq, Type: p.EventType(), Time: f.at, Data: data}, Payload: p}
}

func newTestTracer(t *testing.T, cfg Config) (*Tracer, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	if cfg.Exporter == nil {
		cfg.Exporter = exp
	}
	if cfg.RoomInfo == nil {
		cfg.RoomInfo = func(context.Context, string) (string, string, error) { return "omp", "agenthost/scripted", nil }
	}
	tr, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = tr.Close(ctx)
	})
	return tr, exp
}

func flush(t *testing.T, tr *Tracer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

func byName(spans tracetest.SpanStubs) map[string]tracetest.SpanStub {
	out := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		out[s.Name] = s
	}
	return out
}

func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes {
		out[kv.Key] = kv.Value
	}
	return out
}

// A turn with a tool call, an approval, the agent's start and snapshots:
// one trace under the caller's span, the turn's span named and attributed
// per the GenAI conventions, its usage turn.ended's.
func TestTurnSpans(t *testing.T) {
	tr, exp := newTestTracer(t, Config{})
	f := &feed{room: "r1", at: time.Now()}
	t0 := f.at
	acc := f.ev(event.MessageAccepted{MessageID: "m1", Text: "hi", Delivery: "queue"})
	acc.TraceParent = callerTraceParent
	tr.Observe([]room.Observed{acc, f.ev(event.MessageQueued{MessageID: "m1"}), f.ev(event.TurnStarted{TurnID: "t1", MessageID: "m1"})})
	tr.Observe([]room.Observed{f.ev(event.WorkspaceReady{URL: "https://user:secret@git.example/repo.git", Ref: "main", Kind: "branch", Commit: "abc"})})
	tr.Observe([]room.Observed{{Phase: &room.Phase{Room: "r1", TurnID: "t1", Name: room.PhaseSnapshotBefore, Start: f.at, End: f.at.Add(10 * time.Millisecond)}}})
	agentStart := f.at.Add(20 * time.Millisecond)
	tr.Observe([]room.Observed{{Phase: &room.Phase{Room: "r1", Name: room.PhaseAgentStart, Start: agentStart, End: agentStart.Add(time.Second)}}})
	f.at = f.at.Add(time.Second)
	tr.Observe([]room.Observed{f.ev(event.AgentStarted{SessionID: "s1", Confinement: &event.Confinement{Mode: "landlock"}})})
	tr.Observe([]room.Observed{f.ev(event.ToolStarted{TurnID: "t1", CallID: "c1", Tool: "bash", Input: `{"command":"echo hi"}`})})
	tr.Observe([]room.Observed{f.ev(event.ApprovalRequested{ApprovalID: "a1", TurnID: "t1", Tool: "bash", Deadline: f.at.Add(time.Minute)})})
	f.at = f.at.Add(3 * time.Second)
	tr.Observe([]room.Observed{f.ev(event.ApprovalResolved{ApprovalID: "a1", Decision: "allow", By: "person"})})
	tr.Observe([]room.Observed{f.ev(event.ToolEnded{TurnID: "t1", CallID: "c1", Tool: "bash", Output: "hi"})})
	usage := record.Usage{InputTokens: 120, OutputTokens: 34, CacheReadTokens: 5}
	tr.Observe([]room.Observed{{Phase: &room.Phase{Room: "r1", TurnID: "t1", Name: room.PhaseSnapshotAfter, Start: f.at, End: f.at.Add(5 * time.Millisecond)}}})
	tr.Observe([]room.Observed{f.ev(event.TurnEnded{TurnID: "t1", MessageID: "m1", Outcome: "settled", Usage: usage, Changes: &event.Changes{Files: 2, Insertions: 3}}),
		f.ev(event.MessageEnded{MessageID: "m1", Outcome: "settled", TurnID: "t1"})})
	flush(t, tr)

	spans := exp.GetSpans()
	got := byName(spans)
	turn, ok := got["invoke_agent omp"]
	if !ok {
		t.Fatalf("no invoke_agent span: %v", spans)
	}
	if turn.SpanKind != trace.SpanKindClient {
		t.Errorf("turn kind %v", turn.SpanKind)
	}
	want := map[attribute.Key]any{
		"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "omp", "gen_ai.provider.name": "agenthost",
		"gen_ai.request.model": "scripted", "agenthost.room.id": "r1", "agenthost.turn.id": "t1", "agenthost.message.id": "m1",
		"agenthost.turn.outcome": "settled", "gen_ai.usage.input_tokens": int64(120), "gen_ai.usage.output_tokens": int64(34),
		"gen_ai.usage.cache_read.input_tokens": int64(5), "agenthost.changes.files": int64(2), "agenthost.session.id": "s1",
		"gen_ai.conversation.id": "s1",
	}
	ta := attrs(turn)
	for k, v := range want {
		if ta[k].AsInterface() != v {
			t.Errorf("turn %s = %v, want %v", k, ta[k].AsInterface(), v)
		}
	}
	if turn.Parent.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || turn.Parent.SpanID().String() != "00f067aa0ba902b7" || !turn.Parent.IsRemote() {
		t.Errorf("turn's parent %v, want the caller's", turn.Parent)
	}
	if !turn.StartTime.Equal(t0.Add(300*time.Millisecond)) || !turn.EndTime.Equal(f.at.Add(-100*time.Millisecond)) {
		t.Errorf("turn from %v to %v: not turn.started to turn.ended", turn.StartTime.Sub(t0), turn.EndTime.Sub(t0))
	}
	for _, name := range []string{"execute_tool bash", "approval bash", "agent.start", "workspace.checkout", "snapshot.before", "snapshot.after"} {
		s, ok := got[name]
		if !ok {
			t.Errorf("no %s span", name)
			continue
		}
		if s.Parent.SpanID() != turn.SpanContext.SpanID() || s.SpanContext.TraceID() != turn.SpanContext.TraceID() {
			t.Errorf("%s is not the turn's child", name)
		}
	}
	tool := attrs(got["execute_tool bash"])
	if tool["gen_ai.tool.name"].AsString() != "bash" || tool["gen_ai.tool.call.id"].AsString() != "c1" || tool["agenthost.tool.outcome"].AsString() != "ok" {
		t.Errorf("tool span: %v", tool)
	}
	if _, ok := tool["gen_ai.tool.call.arguments"]; ok {
		t.Error("the tool's input is on its span though the operator did not ask")
	}
	ap := got["approval bash"]
	apa := attrs(ap)
	if apa["agenthost.approval.by"].AsString() != "person" || apa["agenthost.approval.decision"].AsString() != "allow" {
		t.Errorf("approval span: %v", apa)
	}
	if d := ap.EndTime.Sub(ap.StartTime); d != 3*time.Second+100*time.Millisecond || apa["agenthost.approval.wait_seconds"].AsFloat64() != d.Seconds() {
		t.Errorf("approval waited %v (%v)", d, apa["agenthost.approval.wait_seconds"])
	}
	as := got["agent.start"]
	if !as.StartTime.Equal(agentStart) || as.EndTime.Sub(as.StartTime) != time.Second || attrs(as)["agenthost.agent.confinement"].AsString() != "landlock" {
		t.Errorf("agent.start from %v for %v: %v", as.StartTime, as.EndTime.Sub(as.StartTime), attrs(as))
	}
	if u := attrs(got["workspace.checkout"])["agenthost.workspace.url"].AsString(); u != "https://git.example/repo.git" {
		t.Errorf("checkout url %q: credentials must not reach a span", u)
	}
	if len(spans) != 7 {
		t.Errorf("%d spans, want 7: %v", len(spans), spans)
	}
	if s := tr.Stats(); s.SpansExported != 7 || s.SpansDropped != 0 || s.EventsDropped != 0 {
		t.Errorf("stats %+v", s)
	}
}

// A steered message is a link of the turn it joins; a failed turn and a
// failed tool call say so in their status; the tool's input is there when
// asked for.
func TestSteerLinkAndFailure(t *testing.T) {
	tr, exp := newTestTracer(t, Config{ToolInput: true})
	f := &feed{room: "r2", at: time.Now()}
	tr.Observe([]room.Observed{f.ev(event.MessageAccepted{MessageID: "m1", Delivery: "queue"}), f.ev(event.TurnStarted{TurnID: "t1", MessageID: "m1"})})
	steer := f.ev(event.MessageAccepted{MessageID: "m2", Delivery: "steer"})
	steer.TraceParent = callerTraceParent
	tr.Observe([]room.Observed{steer})
	tr.Observe([]room.Observed{f.ev(event.MessageDelivered{MessageID: "m2", TurnID: "t1", Delivery: "steer"})})
	tr.Observe([]room.Observed{f.ev(event.ToolStarted{TurnID: "t1", CallID: "c1", Tool: "bash", Input: `{"command":"false"}`})})
	tr.Observe([]room.Observed{f.ev(event.ToolEnded{TurnID: "t1", CallID: "c1", Tool: "bash", IsError: true})})
	tr.Observe([]room.Observed{f.ev(event.TurnEnded{TurnID: "t1", MessageID: "m1", Outcome: "failed", Reason: "agent exited"})})
	flush(t, tr)
	got := byName(exp.GetSpans())
	turn := got["invoke_agent omp"]
	if turn.Parent.IsValid() {
		t.Errorf("a message without a trace context: the turn is a root, got parent %v", turn.Parent)
	}
	if len(turn.Links) != 1 || turn.Links[0].SpanContext.SpanID().String() != "00f067aa0ba902b7" {
		t.Fatalf("links %v, want the steered message's caller", turn.Links)
	}
	if turn.Status.Code != codes.Error || attrs(turn)["agenthost.turn.outcome"].AsString() != "failed" {
		t.Errorf("turn status %v", turn.Status)
	}
	tool := got["execute_tool bash"]
	if tool.Status.Code != codes.Error || attrs(tool)["gen_ai.tool.call.arguments"].AsString() != `{"command":"false"}` {
		t.Errorf("tool %v %v", tool.Status, attrs(tool))
	}
}

// blockingExporter never answers until released: a collector that hangs.
type blockingExporter struct {
	release chan struct{}
	mu      sync.Mutex
	calls   int
}

func (b *blockingExporter) ExportSpans(ctx context.Context, _ []sdktrace.ReadOnlySpan) error {
	b.mu.Lock()
	b.calls++
	b.mu.Unlock()
	select {
	case <-b.release:
		return errors.New("collector gone")
	case <-ctx.Done():
		return ctx.Err()
	}
}
func (b *blockingExporter) Shutdown(context.Context) error { return nil }

// A collector that hangs holds nothing up: Observe returns at once, spans
// past the queue are dropped and counted, and so are events past the
// event queue.
func TestHungCollectorDrops(t *testing.T) {
	exp := &blockingExporter{release: make(chan struct{})}
	tr, err := New(context.Background(), Config{Exporter: exp, SpanQueue: 4, EventQueue: 2, Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f := &feed{room: "r3", at: time.Now()}
	for i := range 50 {
		id := string(rune('a'+i%26)) + string(rune('a'+i/26))
		tr.Observe([]room.Observed{f.ev(event.TurnStarted{TurnID: id, MessageID: "m" + id}), f.ev(event.TurnEnded{TurnID: id, MessageID: "m" + id, Outcome: "settled"})})
	}
	close(exp.release)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := tr.Close(ctx); err != nil {
		t.Fatal(err)
	}
	s := tr.Stats()
	if s.SpansExported != 0 || s.EventsDropped%2 != 0 || s.SpansDropped+s.EventsDropped/2 != 50 {
		t.Errorf("stats %+v: every one of the 50 turns' spans must be dropped and counted (as a span or as its events)", s)
	}
}

// A turn a previous host started goes on here (serve --daemon's
// takeover): its span starts at agent.attached, marked attached, with an
// agent.attach child naming the session; a question's wait is a span
// saying who answered and how long it took, never the question or the
// answer; a turn still running at Close is exported, marked unfinished.
func TestAttachQuestionAndUnfinished(t *testing.T) {
	exp := &keepExporter{}
	tr, _ := newTestTracer(t, Config{Exporter: exp})
	f := &feed{room: "r4", at: time.Now()}
	tr.Observe([]room.Observed{f.ev(event.AgentAttached{TurnID: "t1", SessionID: "s1", Offset: 42})})
	tr.Observe([]room.Observed{f.ev(event.QuestionAsked{QuestionID: "q1", TurnID: "t1", Title: "secret question", Options: []string{"a", "b"}})})
	f.at = f.at.Add(2 * time.Second)
	tr.Observe([]room.Observed{f.ev(event.QuestionAnswered{QuestionID: "q1", By: "person", Answer: "secret answer"})})
	tr.Observe([]room.Observed{f.ev(event.TurnEnded{TurnID: "t1", Outcome: "settled"})})
	tr.Observe([]room.Observed{f.ev(event.MessageAccepted{MessageID: "m2"}), f.ev(event.TurnStarted{TurnID: "t2", MessageID: "m2"})})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Close(ctx); err != nil {
		t.Fatal(err)
	}
	var turns []tracetest.SpanStub
	got := map[string]tracetest.SpanStub{}
	for _, s := range exp.spans() {
		if s.Name == "invoke_agent omp" {
			turns = append(turns, s)
		}
		got[s.Name] = s
		for _, kv := range s.Attributes {
			if v := kv.Value.String(); v == "secret question" || v == "secret answer" {
				t.Errorf("%s carries %s = %q", s.Name, kv.Key, v)
			}
		}
	}
	if len(turns) != 2 {
		t.Fatalf("%d turn spans, want 2: %v", len(turns), exp.spans())
	}
	for _, turn := range turns {
		a := attrs(turn)
		switch a["agenthost.turn.id"].AsString() {
		case "t1":
			if !a["agenthost.turn.attached"].AsBool() || a["agenthost.turn.outcome"].AsString() != "settled" {
				t.Errorf("the attached turn: %v", a)
			}
			att, q := got["agent.attach"], got["question"]
			if att.Parent.SpanID() != turn.SpanContext.SpanID() || attrs(att)["agenthost.session.id"].AsString() != "s1" ||
				attrs(att)["agenthost.agent.offset"].AsInt64() != 42 {
				t.Errorf("agent.attach: %v under %v", attrs(att), att.Parent)
			}
			qa := attrs(q)
			if q.Parent.SpanID() != turn.SpanContext.SpanID() || qa["agenthost.question.by"].AsString() != "person" ||
				qa["agenthost.question.wait_seconds"].AsFloat64() < 2 || qa["agenthost.question.cancelled"].AsBool() {
				t.Errorf("question: %v", qa)
			}
		case "t2":
			if !a["agenthost.turn.unfinished"].AsBool() {
				t.Errorf("the turn left running: %v", a)
			}
		default:
			t.Errorf("turn %v", a)
		}
	}
}

// keepExporter keeps what it is given past its Shutdown (tracetest's
// in-memory exporter forgets it there).
type keepExporter struct {
	mu   sync.Mutex
	kept tracetest.SpanStubs
}

func (k *keepExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.kept = append(k.kept, tracetest.SpanStubsFromReadOnlySpans(spans)...)
	return nil
}

func (k *keepExporter) Shutdown(context.Context) error { return nil }

func (k *keepExporter) spans() tracetest.SpanStubs {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append(tracetest.SpanStubs(nil), k.kept...)
}
