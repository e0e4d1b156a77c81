package tracing

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/roomsnap"
	"github.com/agenthost/agenthost/internal/roomsqlite"
	"github.com/agenthost/agenthost/internal/rpcagent"
	"github.com/agenthost/agenthost/internal/server"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

const realToken = "tracing-test-token"

// realHost is a server of rooms on real omp and the scripted model, traced
// by a Tracer exporting to cfg's endpoint: what serve --otlp runs.
type realHost struct {
	t      *testing.T
	m      *room.Manager
	tracer *Tracer
	ts     *httptest.Server
	sim    *modelsim.Server
}

func newRealHost(t *testing.T, cfg Config) *realHost {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	sim := modelsim.New(modelsim.Options{})
	if err := sim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	in, err := agents.Find()
	if err != nil {
		t.Fatalf("the real agents are needed (run make setup): %v", err)
	}
	dir := t.TempDir()
	db, err := store.Open(ctx, filepath.Join(dir, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cust, err := custody.New(custody.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := &realHost{t: t, sim: sim}
	var agentOTLP func(string) []string
	if cfg.AgentRelay != "" {
		// serve --otlp-agents: the agent exports to the relay.
		agentOTLP = func(rm string) []string {
			return agents.OTLPEnv(agents.OTLPOptions{TracesURL: h.tracer.AgentURL(rm), Room: rm})
		}
	}
	tr, err := rpcagent.New(rpcagent.Options{Custodian: cust, Install: in, ModelURL: sim.URL(), OTLP: agentOTLP})
	if err != nil {
		t.Fatal(err)
	}
	cfg.RoomInfo = func(ctx context.Context, id string) (string, string, error) {
		e, err := h.m.EffectiveSettings(ctx, id)
		if err != nil {
			return "", "", err
		}
		return e.Agent, "agenthost/" + agents.ModelID, nil
	}
	if h.tracer, err = New(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	snaps := roomsnap.New(roomsnap.Options{})
	h.m, err = room.New(room.Options{Store: roomsqlite.New(db), Transport: tr, Root: filepath.Join(dir, "rooms"),
		Config: room.Config{Agent: "omp"}, Snapshots: snaps, Observe: h.tracer.Observe})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := server.New(server.Options{Manager: h.m, Token: realToken, Tracing: &server.Tracing{
		Provider: h.tracer.Provider(), Propagator: h.tracer.Propagator(),
		Stats: func() server.TraceStats {
			st := h.tracer.Stats()
			return server.TraceStats{SpansExported: st.SpansExported, SpansDropped: st.SpansDropped, EventsDropped: st.EventsDropped,
				AgentBatchesRelayed: st.AgentBatchesForwarded, AgentBatchesRefused: st.AgentBatchesRefused}
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	h.ts = httptest.NewServer(s)
	t.Cleanup(func() {
		s.Close()
		h.ts.Close()
		_ = h.m.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := h.m.Wait(ctx); err != nil {
			t.Errorf("closing the rooms: %v", err)
		}
		if err := h.tracer.Close(ctx); err != nil {
			t.Errorf("closing the tracer: %v", err)
		}
		_ = snaps.Close()
		if err := cust.Close(); err != nil {
			t.Errorf("closing custody: %v", err)
		}
		_ = db.Close()
	})
	return h
}

// do sends an API request and decodes its JSON answer into out.
func (h *realHost) do(method, path string, header http.Header, body, out any) int {
	h.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = strings.NewReader(string(b))
	}
	req, err := http.NewRequest(method, h.ts.URL+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Authorization", "Bearer "+realToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			h.t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
	}
	return resp.StatusCode
}

// waitEvent returns the room's first event after seq after that match
// says is the one, waiting for it (the room's own Watch).
func (h *realHost) waitEvent(ctx context.Context, rm string, after int64, match func(event.Payload) bool) (event.Payload, int64) {
	h.t.Helper()
	watch, stop := h.m.Watch(rm)
	defer stop()
	for {
		evs, err := h.m.Events(ctx, rm, after, 0)
		if err != nil {
			h.t.Fatal(err)
		}
		for _, ev := range evs {
			after = ev.Seq
			p, err := event.Decode(ev.Type, ev.Data)
			if err == nil && match(p) {
				return p, ev.Seq
			}
		}
		select {
		case <-watch:
		case <-ctx.Done():
			h.t.Fatalf("room %s: the event waited for never came: %v", rm, ctx.Err())
		}
	}
}

// runApprovedTurn sends a message (with the caller's traceparent, if
// any) whose turn runs a bash call that waits for approval, allows it,
// and returns the turn's end.
func (h *realHost) runApprovedTurn(ctx context.Context, rm, traceparent string) event.TurnEnded {
	h.t.Helper()
	header := http.Header{}
	if traceparent != "" {
		header.Set("traceparent", traceparent)
	}
	var acc room.Accepted
	if code := h.do("POST", "/v1/rooms/"+rm+"/messages", header,
		map[string]string{"text": `Run this: [[tool:bash {"command":"echo traced > traced.txt"}]]`}, &acc); code != http.StatusAccepted {
		h.t.Fatalf("POST message: %d", code)
	}
	p, seq := h.waitEvent(ctx, rm, 0, func(p event.Payload) bool { _, ok := p.(event.ApprovalRequested); return ok })
	ap := p.(event.ApprovalRequested)
	if code := h.do("POST", "/v1/rooms/"+rm+"/approvals/"+ap.ApprovalID, nil, map[string]string{"decision": "allow"}, nil); code != http.StatusOK {
		h.t.Fatalf("approve: %d", code)
	}
	p, _ = h.waitEvent(ctx, rm, seq, func(p event.Payload) bool { _, ok := p.(event.TurnEnded); return ok })
	return p.(event.TurnEnded)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// A collector that is down: turns run as ever, and the spans they made
// are dropped and counted in /metrics; so are omp's own (--otlp-agents),
// which the relay refuses.
func TestCollectorDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	h := newRealHost(t, Config{Endpoint: closed, AgentRelay: closed + "/v1/traces"})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	end := h.runApprovedTurn(ctx, "down", "")
	if end.Outcome != room.OutcomeSettled {
		t.Fatalf("turn %s: %s", end.Outcome, end.Reason)
	}
	if err := h.tracer.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st := h.tracer.Stats()
	if st.SpansExported != 0 || st.SpansDropped < 5 {
		t.Fatalf("stats %+v: the turn's spans (turn, tool, approval, agent start, snapshots, request) must be dropped and counted", st)
	}
	// omp posts its spans to the relay after its run, on a timer of its
	// own: wait for the refusal (no event tells it).
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for h.tracer.Stats().AgentBatchesRefused == 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("omp's spans never reached the relay: %+v", h.tracer.Stats())
		case <-tick.C:
		}
	}
	if st := h.tracer.Stats(); st.AgentBatchesForwarded != 0 {
		t.Errorf("stats %+v: nothing can be relayed to a collector that is down", st)
	}
	before := h.tracer.Stats()
	req, _ := http.NewRequest("GET", h.ts.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+realToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// The counters only grow (omp may post again meanwhile): /metrics has
	// at least what Stats said before it.
	for name, least := range map[string]uint64{
		"agenthost_trace_spans_dropped_total": before.SpansDropped, "agenthost_trace_agent_batches_refused_total": before.AgentBatchesRefused,
	} {
		if v, ok := metricValue(string(b), name); !ok || v < float64(least) {
			t.Errorf("/metrics: %s = %v (%v), want at least %d:\n%s", name, v, ok, least, grepLines(string(b), "agenthost_trace"))
		}
	}
	for _, name := range []string{"agenthost_trace_spans_exported_total", "agenthost_trace_agent_batches_relayed_total"} {
		if v, ok := metricValue(string(b), name); !ok || v != 0 {
			t.Errorf("/metrics: %s = %v (%v), want 0", name, v, ok)
		}
	}
}

// metricValue is the value of an unlabelled metric in Prometheus' text
// format.
func metricValue(text, name string) (float64, bool) {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f, true
			}
		}
	}
	return 0, false
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// jaeger is a Jaeger all-in-one on loopback ports of its own.
type jaeger struct {
	otlp, query string // base URLs
}

var (
	jaegerOnce sync.Once
	jaegerDir  string // removed by TestMain
	jaegerBin  string
	jaegerErr  error
)

// jaegerBinary builds Jaeger (testdata/jaeger pins it) once per test
// binary, without the race detector: on a cold cache that is minutes of
// CPU, paid only by the tests that start Jaeger.
func jaegerBinary(t *testing.T) string {
	t.Helper()
	jaegerOnce.Do(func() {
		dir, err := os.MkdirTemp("", "agenthost-jaeger")
		if err != nil {
			jaegerErr = err
			return
		}
		jaegerDir, jaegerBin = dir, filepath.Join(dir, "jaeger")
		// On an empty build cache this is 8.6 minutes of CPU: on 2 busy
		// cores, give it time, but not forever.
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", jaegerBin, "github.com/jaegertracing/jaeger/cmd/jaeger")
		cmd.Dir = filepath.Join("testdata", "jaeger")
		cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
		if out, err := cmd.CombinedOutput(); err != nil {
			jaegerErr = fmt.Errorf("building jaeger: %v\n%s", err, out)
		}
	})
	if jaegerErr != nil {
		t.Fatal(jaegerErr)
	}
	return jaegerBin
}

// freePort is a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%d
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`

// jaegerUI, if set, is a folder of Jaeger UI's built assets for Jaeger to
// serve (the Go module ships none: Jaeger serves a placeholder page).
var jaegerUI string

// startJaeger runs Jaeger until the test ends; it returns once both its
// OTLP receiver and its query API answer.
func startJaeger(t *testing.T) *jaeger {
	t.Helper()
	bin := jaegerBinary(t)
	qp, gp, op := freePort(t), freePort(t), freePort(t)
	cfg := filepath.Join(t.TempDir(), "jaeger.yaml")
	conf := fmt.Sprintf(jaegerConfig, qp, gp, op)
	if jaegerUI != "" {
		conf = strings.Replace(conf, "      traces: mem\n", "      traces: mem\n    ui:\n      assets_path: "+jaegerUI+"\n", 1)
	}
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--config", cfg)
	// Jaeger traces itself to the default OTLP port unless told not to.
	cmd.Env = append(os.Environ(), "OTEL_SDK_DISABLED=true", "OTEL_TRACES_EXPORTER=none")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cancel()
		<-exited
	})
	j := &jaeger{otlp: fmt.Sprintf("http://127.0.0.1:%d", op), query: fmt.Sprintf("http://127.0.0.1:%d", qp)}
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		q, qerr := http.Get(j.query + "/api/services")
		if qerr == nil {
			q.Body.Close()
		}
		o, oerr := http.Post(j.otlp+"/v1/traces", "application/x-protobuf", strings.NewReader(""))
		if oerr == nil {
			o.Body.Close()
		}
		if qerr == nil && oerr == nil && q.StatusCode == http.StatusOK && o.StatusCode == http.StatusOK {
			return j
		}
		select {
		case err := <-exited:
			t.Fatalf("jaeger exited: %v", err)
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			t.Fatal("jaeger did not answer within 2 minutes")
		}
	}
}

// jaegerSpan is a span as Jaeger's query API gives it.
type jaegerSpan struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	StartTime int64 `json:"startTime"` // µs
	Duration  int64 `json:"duration"`  // µs
	Tags      []struct {
		Key   string `json:"key"`
		Value any    `json:"value"`
	} `json:"tags"`
	ProcessID string `json:"processID"`
}

type jaegerTrace struct {
	TraceID   string       `json:"traceID"`
	Spans     []jaegerSpan `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
		Tags        []struct {
			Key   string `json:"key"`
			Value any    `json:"value"`
		} `json:"tags"`
	} `json:"processes"`
}

func (s jaegerSpan) tag(k string) any {
	for _, t := range s.Tags {
		if t.Key == k {
			return t.Value
		}
	}
	return nil
}

func (s jaegerSpan) parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// traces asks Jaeger's query API (path and query after /api/traces).
func (j *jaeger) traces(t *testing.T, q string) []jaegerTrace {
	t.Helper()
	resp, err := http.Get(j.query + "/api/traces" + q)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Data []jaegerTrace `json:"data"`
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusNotFound {
		return nil
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("jaeger: %d %s", resp.StatusCode, b)
	}
	return out.Data
}

// waitTrace polls Jaeger (it stores spans a batch later) until the
// trace's spans satisfy done.
func (j *jaeger) waitTrace(ctx context.Context, t *testing.T, q string, done func([]jaegerTrace) bool) []jaegerTrace {
	t.Helper()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		got := j.traces(t, q)
		if done(got) {
			return got
		}
		select {
		case <-ctx.Done():
			t.Fatalf("jaeger never had what the test waits for (%s): %v; it has %s", q, ctx.Err(), describe(got))
		case <-tick.C:
		}
	}
}

func describe(ts []jaegerTrace) string {
	var out []string
	for _, tr := range ts {
		for _, s := range tr.Spans {
			out = append(out, tr.TraceID+"/"+s.SpanID+" "+s.OperationName+" <- "+s.parent())
		}
	}
	return strings.Join(out, "; ")
}

// A turn with a tool call and an approval, on real omp, exported to a real
// Jaeger and read back through its query API: one trace, the caller's;
// the request's span under the caller's, the turn's (invoke_agent, per
// the GenAI conventions) under it with its usage turn.ended's, and the
// tool call, the approval wait, the agent's start and the snapshots under
// the turn. With --otlp-agents, omp's own spans reach Jaeger too, named by
// the room and carrying the session the turn's span names.
func TestJaegerTrace(t *testing.T) {
	j := startJaeger(t)
	target, _ := TracesURL(j.otlp)
	h := newRealHost(t, Config{Endpoint: j.otlp, Interval: 100 * time.Millisecond, AgentRelay: target})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	traceID, callerSpan := randomHex(16), randomHex(8)
	end := h.runApprovedTurn(ctx, "traced", "00-"+traceID+"-"+callerSpan+"-01")
	if end.Outcome != room.OutcomeSettled {
		t.Fatalf("turn %s: %s", end.Outcome, end.Reason)
	}
	if err := h.tracer.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	names := []string{"POST /v1/rooms/{room}/messages", "invoke_agent omp", "execute_tool bash", "approval bash", "agent.start",
		"snapshot.before", "snapshot.after"}
	got := j.waitTrace(ctx, t, "/"+traceID, func(ts []jaegerTrace) bool {
		if len(ts) != 1 {
			return false
		}
		have := map[string]bool{}
		for _, s := range ts[0].Spans {
			have[s.OperationName] = true
		}
		for _, n := range names {
			if !have[n] {
				return false
			}
		}
		return true
	})[0]
	spans := map[string]jaegerSpan{}
	for _, s := range got.Spans {
		if s.TraceID != traceID {
			t.Errorf("span %s in trace %s, want the caller's %s", s.OperationName, s.TraceID, traceID)
		}
		spans[s.OperationName] = s
	}
	post, turn := spans["POST /v1/rooms/{room}/messages"], spans["invoke_agent omp"]
	if post.parent() != callerSpan {
		t.Errorf("the request's span's parent is %q, want the caller's span %s", post.parent(), callerSpan)
	}
	if turn.parent() != post.SpanID {
		t.Errorf("the turn's parent is %q, want the request's span %s (under the caller's)", turn.parent(), post.SpanID)
	}
	if svc := got.Processes[turn.ProcessID].ServiceName; svc != "agenthost" {
		t.Errorf("the turn's service is %q", svc)
	}
	want := map[string]any{
		"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "omp", "gen_ai.provider.name": "agenthost",
		"gen_ai.request.model": strings.TrimPrefix(agents.ModelID, ""), "agenthost.room.id": "traced", "agenthost.turn.id": end.TurnID,
		"agenthost.message.id": end.MessageID, "agenthost.turn.outcome": "settled",
		"gen_ai.usage.input_tokens": float64(end.Usage.InputTokens), "gen_ai.usage.output_tokens": float64(end.Usage.OutputTokens),
	}
	for k, v := range want {
		if got := turn.tag(k); got != v {
			t.Errorf("turn tag %s = %v (%T), want %v", k, got, got, v)
		}
	}
	if end.Usage.InputTokens == 0 || end.Usage.OutputTokens == 0 {
		t.Errorf("turn.ended's usage %+v: the scripted model reports tokens", end.Usage)
	}
	if end.Changes != nil && turn.tag("agenthost.changes.files") != float64(end.Changes.Files) {
		t.Errorf("changes %v, turn.ended says %+v", turn.tag("agenthost.changes.files"), end.Changes)
	}
	for _, n := range names[2:] {
		if spans[n].parent() != turn.SpanID {
			t.Errorf("%s's parent is %q, want the turn %s", n, spans[n].parent(), turn.SpanID)
		}
	}
	tool, ap := spans["execute_tool bash"], spans["approval bash"]
	if tool.tag("gen_ai.tool.name") != "bash" || tool.tag("agenthost.tool.outcome") != "ok" || tool.tag("gen_ai.tool.call.id") == nil {
		t.Errorf("tool span tags %v", tool.Tags)
	}
	if ap.tag("agenthost.approval.by") != "person" || ap.tag("agenthost.approval.decision") != "allow" || ap.Duration <= 0 {
		t.Errorf("approval span: %v, %d µs", ap.Tags, ap.Duration)
	}
	for _, n := range names[2:] {
		s := spans[n]
		if s.StartTime < turn.StartTime || s.StartTime+s.Duration > turn.StartTime+turn.Duration {
			t.Errorf("%s [%d, +%d] lies outside its turn [%d, +%d]", n, s.StartTime, s.Duration, turn.StartTime, turn.Duration)
		}
	}
	if sess := turn.tag("agenthost.session.id"); sess == nil || turn.tag("gen_ai.conversation.id") != sess {
		t.Errorf("the turn names no agent session: %v", turn.Tags)
	}
	// One trace holds the turn: no other has a span of it.
	if others := j.traces(t, `?service=agenthost&tags=`+urlQuery(`{"agenthost.turn.id":"`+end.TurnID+`"}`)); len(others) != 1 || others[0].TraceID != traceID {
		t.Errorf("traces with the turn: %s", describe(others))
	}

	// omp's own spans (--otlp-agents), through the relay: in the turn's
	// trace, omp's invoke_agent a child of the turn's span, its model
	// calls and tools under it, named by the room.
	got = j.waitTrace(ctx, t, "/"+traceID, func(ts []jaegerTrace) bool {
		if len(ts) != 1 {
			return false
		}
		for _, s := range ts[0].Spans {
			if ts[0].Processes[s.ProcessID].ServiceName == "oh-my-pi" && strings.HasPrefix(s.OperationName, "invoke_agent") {
				return true
			}
		}
		return false
	})[0]
	var ompRun jaegerSpan
	ompSpans := map[string]jaegerSpan{}
	for _, s := range got.Spans {
		p := got.Processes[s.ProcessID]
		if p.ServiceName != "oh-my-pi" {
			continue
		}
		ompSpans[s.SpanID] = s
		if strings.HasPrefix(s.OperationName, "invoke_agent") {
			ompRun = s
		}
		room := ""
		for _, tag := range p.Tags {
			if tag.Key == "agenthost.room.id" {
				room, _ = tag.Value.(string)
			}
		}
		if room != "traced" {
			t.Errorf("omp's span %s names room %q", s.OperationName, room)
		}
	}
	if ompRun.parent() != turn.SpanID {
		t.Errorf("omp's run's parent is %q, want the turn's span %s", ompRun.parent(), turn.SpanID)
	}
	if ompRun.tag("gen_ai.conversation.id") != sess(turn) {
		t.Errorf("omp's run names conversation %v, the turn's session is %v", ompRun.tag("gen_ai.conversation.id"), sess(turn))
	}
	chats := 0
	for _, s := range ompSpans {
		if strings.HasPrefix(s.OperationName, "chat") {
			chats++
			if _, ok := ompSpans[s.parent()]; !ok {
				t.Errorf("omp's %s hangs from %s, none of omp's spans", s.OperationName, s.parent())
			}
		}
	}
	if chats == 0 {
		t.Errorf("no model call of omp's in the trace: %s", describe([]jaegerTrace{got}))
	}
	if st := h.tracer.Stats(); st.AgentBatchesForwarded == 0 || st.AgentSpansUnplaced != 0 {
		t.Errorf("relay stats %+v", st)
	}
}

func sess(s jaegerSpan) any { return s.tag("agenthost.session.id") }

func urlQuery(s string) string {
	r := strings.NewReplacer("{", "%7B", "}", "%7D", `"`, "%22", ":", "%3A", ",", "%2C", " ", "%20")
	return r.Replace(s)
}
