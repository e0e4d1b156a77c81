package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpSink is an OTLP/HTTP receiver keeping the spans posted to it, by
// the service that sent them.
type otlpSink struct {
	mu    sync.Mutex
	spans map[string][]*tracepb.Span   // by service.name
	res   map[string]map[string]string // service.name: its resource's string attributes
	bad   []string                     // what it could not read
	keys  map[string][]string          // service.name: the X-Collector-Key of each post
	srv   *httptest.Server
	// posted is signalled after each post taken.
	posted chan struct{}
}

func (s *otlpSink) count(svc string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.spans[svc])
}

func newOTLPSink(t *testing.T) *otlpSink {
	s := &otlpSink{spans: map[string][]*tracepb.Span{}, res: map[string]map[string]string{}, keys: map[string][]string{},
		posted: make(chan struct{}, 1)}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		s.mu.Lock()
		defer s.mu.Unlock()
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
			s.bad = append(s.bad, r.URL.Path+" "+r.Header.Get("Content-Type"))
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		for _, rs := range req.ResourceSpans {
			attrs := map[string]string{}
			for _, kv := range rs.GetResource().GetAttributes() {
				attrs[kv.Key] = kv.GetValue().GetStringValue()
			}
			svc := attrs["service.name"]
			s.res[svc] = attrs
			s.keys[svc] = append(s.keys[svc], r.Header.Get("X-Collector-Key"))
			for _, ss := range rs.ScopeSpans {
				s.spans[svc] = append(s.spans[svc], ss.Spans...)
			}
		}
		select {
		case s.posted <- struct{}{}:
		default:
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *otlpSink) span(svc, name string) *tracepb.Span {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sp := range s.spans[svc] {
		if sp.Name == name {
			return sp
		}
	}
	return nil
}

// serve --otlp URL --otlp-agents: the turn's spans reach the collector
// when the server stops (no later), under the request's span, which is
// the caller's child; omp exports its own spans to the server's relay,
// which forwards them to the collector inside the turn's trace. The
// collector's headers (OTEL_EXPORTER_OTLP_HEADERS, its credentials) go
// with the server's posts and the relayed ones, and never reach the agent;
// a confined agent reaches the relay.
func TestServe_OTLP(t *testing.T) {
	sink := newOTLPSink(t)
	const token, key = "otlp-token", "s3cret-collector-key"
	t.Setenv("AGENTHOST_TOKEN", token)
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-collector-key="+key)
	// Confined to port 1 (and the built-in model's): omp reaches the
	// relay because serve lets its port through, and not the collector.
	url, _, stop := startServe(t, "--data", t.TempDir(), "--approval-mode", "yolo", "--otlp", sink.srv.URL, "--otlp-agents",
		"--confine", "landlock", "--confine-net", "1")
	const traceID, caller = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	req, _ := http.NewRequest("POST", url+"v1/rooms/otlp/messages",
		strings.NewReader(`{"text":"Run this: [[tool:bash {\"command\":\"echo keys=$(env | grep -c `+key+`)\"}]]"}`))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("traceparent", "00-"+traceID+"-"+caller+"-01")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusAccepted {
		t.Fatalf("post: %d", res.StatusCode)
	}
	var output, outcome string
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	err = newTestClient(t, url, token).events(ctx, "otlp", 0, true, func(typ string, data []byte) (bool, error) {
		var ev struct{ Output, Outcome string }
		_ = json.Unmarshal(data, &ev)
		switch typ {
		case "tool.ended":
			output = ev.Output
		case "turn.ended":
			outcome = ev.Outcome
		}
		return outcome != "", nil
	})
	if err != nil || outcome != "settled" {
		t.Fatalf("turn ended %q: %v", outcome, err)
	}
	if !strings.Contains(output, "keys=0") {
		t.Errorf("the agent's environment holds the collector's key: %q", output)
	}
	// omp's own export (its telemetry reads the OTEL_* variables given)
	// comes with its batch, a few seconds after its run.
	deadline := time.Now().Add(90 * time.Second)
	for sink.count("oh-my-pi") == 0 && time.Now().Before(deadline) {
		select {
		case <-sink.posted:
		case <-time.After(time.Second):
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	post, turn := sink.span("agenthost", "POST /v1/rooms/{room}/messages"), sink.span("agenthost", "invoke_agent omp")
	tool := sink.span("agenthost", "execute_tool bash")
	if post == nil || turn == nil || tool == nil {
		t.Fatalf("spans missing: request %v, turn %v, tool %v (bad posts %v)", post != nil, turn != nil, tool != nil, sink.bad)
	}
	if hex.EncodeToString(post.TraceId) != traceID || hex.EncodeToString(post.ParentSpanId) != caller {
		t.Errorf("the request's span is not the caller's child: trace %x parent %x", post.TraceId, post.ParentSpanId)
	}
	if hex.EncodeToString(turn.TraceId) != traceID || string(turn.ParentSpanId) != string(post.SpanId) {
		t.Errorf("the turn is not the request's child: trace %x parent %x", turn.TraceId, turn.ParentSpanId)
	}
	if string(tool.ParentSpanId) != string(turn.SpanId) {
		t.Errorf("the tool call is not the turn's child")
	}
	// omp's spans came through the server's relay: in the turn's trace,
	// omp's run a child of the turn, named by the room.
	sink.mu.Lock()
	ompRes, ompSpans := sink.res["oh-my-pi"], sink.spans["oh-my-pi"]
	sink.mu.Unlock()
	if len(ompSpans) == 0 || ompRes["agenthost.room.id"] != "otlp" {
		t.Fatalf("omp exported %d spans, resource %v: want its spans, named by the room", len(ompSpans), ompRes)
	}
	sink.mu.Lock()
	for _, svc := range []string{"agenthost", "oh-my-pi"} {
		for _, k := range sink.keys[svc] {
			if k != key {
				t.Errorf("%s's spans were posted with X-Collector-Key %q, want the server's", svc, k)
			}
		}
	}
	sink.mu.Unlock()
	run := sink.span("oh-my-pi", "invoke_agent")
	for _, sp := range ompSpans {
		if strings.HasPrefix(sp.Name, "invoke_agent") {
			run = sp
		}
		if hex.EncodeToString(sp.TraceId) != traceID {
			t.Errorf("omp's %s is in trace %x, not the turn's", sp.Name, sp.TraceId)
		}
	}
	if run == nil || string(run.ParentSpanId) != string(turn.SpanId) {
		t.Errorf("omp's run is not the turn's child: %v", run)
	}
}

// --otlp-agents and --otlp-tool-input need an export to join; a protocol
// other than OTLP/HTTP's protobuf is refused at start.
func TestServe_OTLPFlagsRefused(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	for _, args := range [][]string{{"--otlp-agents"}, {"--otlp-tool-input"}} {
		_, errs, rc := runCLI(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--data", t.TempDir()}, args...)...)
		if rc != 2 || !strings.Contains(errs, "need --otlp") {
			t.Errorf("%v: code %d, %q", args, rc, errs)
		}
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	_, errs, rc := runCLI(t, "serve", "--listen", "127.0.0.1:0", "--data", t.TempDir())
	if rc != 2 || !strings.Contains(errs, "http/protobuf") {
		t.Errorf("grpc: code %d, %q", rc, errs)
	}
}
