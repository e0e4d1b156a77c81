package tracing

import (
	"bytes"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/room"
)

// collector keeps the OTLP requests posted to it.
type collector struct {
	mu      sync.Mutex
	reqs    []*coltrace.ExportTraceServiceRequest
	headers []http.Header
	srv     *httptest.Server
}

func newCollector(t *testing.T) *collector {
	c := &collector{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if proto.Unmarshal(b, &req) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.reqs = append(c.reqs, &req)
		c.headers = append(c.headers, r.Header.Clone())
		c.mu.Unlock()
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *collector) spans() []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*tracepb.Span
	for _, r := range c.reqs {
		for _, rs := range r.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				out = append(out, ss.Spans...)
			}
		}
	}
	return out
}

// agentExport is what an agent's exporter posts: spans of one trace of
// its own, a root and a child, begun at start.
func agentExport(t *testing.T, start time.Time, root string) []byte {
	t.Helper()
	tid, _ := hex.DecodeString("11111111111111111111111111111111")
	rootID, _ := hex.DecodeString("2222222222222222")
	childID, _ := hex.DecodeString("3333333333333333")
	ns := uint64(start.UnixNano())
	req := &coltrace.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource: &resourcepb.Resource{Attributes: []*commonpb.KeyValue{
			{Key: "service.name", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "oh-my-pi"}}},
			{Key: "agenthost.room.id", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "someone-else"}}},
		}},
		ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{
			{TraceId: tid, SpanId: childID, ParentSpanId: rootID, Name: "chat m", StartTimeUnixNano: ns + 10, EndTimeUnixNano: ns + 20},
			{TraceId: tid, SpanId: rootID, Name: root, StartTimeUnixNano: ns, EndTimeUnixNano: ns + 30},
		}}},
	}}}
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func post(t *testing.T, url, ctype string, body []byte) int {
	t.Helper()
	resp, err := http.Post(url, ctype, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// The relay places an agent's own trace in the turn that ran when it
// began: its root becomes the turn span's child, the trace the turn's;
// the resource names the room the URL is for (whatever the agent says);
// the collector's headers go with the forward, never to the agent.
func TestRelayPlacesAgentSpans(t *testing.T) {
	col := newCollector(t)
	tr, exp := newTestTracer(t, Config{AgentRelay: col.srv.URL + "/v1/traces", AgentHeaders: ParseHeaders("authorization=Bearer%20s3cret,x-team=a")})
	f := &feed{room: "r1", at: time.Now()}
	tr.Observe([]room.Observed{f.ev(event.MessageAccepted{MessageID: "m1"}), f.ev(event.TurnStarted{TurnID: "t1", MessageID: "m1"})})
	flush(t, tr)
	url := tr.AgentURL("r1")
	if strings.Contains(url, "s3cret") || !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("agent URL %q", url)
	}
	if code := post(t, url, "application/x-protobuf", agentExport(t, f.at.Add(50*time.Millisecond), "invoke_agent")); code != http.StatusOK {
		t.Fatalf("relay: %d", code)
	}
	tr.Observe([]room.Observed{f.ev(event.TurnEnded{TurnID: "t1", MessageID: "m1", Outcome: "settled"})})
	flush(t, tr)
	stubs := exp.GetSpans()
	if len(stubs) != 1 {
		t.Fatalf("host spans %v", stubs)
	}
	tid, sid := stubs[0].SpanContext.TraceID(), stubs[0].SpanContext.SpanID()
	spans := col.spans()
	if len(spans) != 2 {
		t.Fatalf("forwarded %d spans", len(spans))
	}
	for _, s := range spans {
		if !bytes.Equal(s.TraceId, tid[:]) {
			t.Errorf("%s in trace %x, want the turn's %s", s.Name, s.TraceId, tid)
		}
		switch s.Name {
		case "invoke_agent":
			if !bytes.Equal(s.ParentSpanId, sid[:]) {
				t.Errorf("the agent's root hangs from %x, want the turn %s", s.ParentSpanId, sid)
			}
		case "chat m":
			if hex.EncodeToString(s.ParentSpanId) != "2222222222222222" {
				t.Errorf("the agent's child lost its parent: %x", s.ParentSpanId)
			}
		}
	}
	col.mu.Lock()
	h := col.headers[0]
	res := col.reqs[0].ResourceSpans[0].Resource
	col.mu.Unlock()
	if h.Get("Authorization") != "Bearer s3cret" || h.Get("X-Team") != "a" {
		t.Errorf("forwarded without the collector's headers: %v", h)
	}
	for _, kv := range res.Attributes {
		if kv.Key == "agenthost.room.id" && kv.Value.GetStringValue() != "r1" {
			t.Errorf("the resource names room %q, the URL is r1's", kv.Value.GetStringValue())
		}
	}
}

// A hostile agent: another room's URL, a made-up token, a path outside the
// relay's, a body that is not OTLP protobuf, an oversized body, a JSON
// body; none reaches the collector. Spans that began in no turn go on in
// a trace of their own, counted.
func TestRelayRefuses(t *testing.T) {
	col := newCollector(t)
	tr, _ := newTestTracer(t, Config{AgentRelay: col.srv.URL + "/v1/traces"})
	good := tr.AgentURL("r1")
	other := tr.AgentURL("r2")
	body := agentExport(t, time.Now(), "invoke_agent")
	forged := strings.Replace(other, "/r2/", "/r1/", 1)
	made := good[:len(good)-len("0123456789abcdef0123456789abcdef/v1/traces")] + strings.Repeat("0", 32) + "/v1/traces"
	for name, c := range map[string]struct {
		url, ctype string
		body       []byte
		want       int
	}{
		"another room's token": {forged, "application/x-protobuf", body, http.StatusNotFound},
		"a made-up token":      {made, "application/x-protobuf", body, http.StatusNotFound},
		"outside the relay":    {strings.Replace(good, "/rooms/", "/x/", 1), "application/x-protobuf", body, http.StatusNotFound},
		"json":                 {good, "application/json", []byte(`{}`), http.StatusUnsupportedMediaType},
		"not protobuf":         {good, "application/x-protobuf", []byte("\xff\xff\xff garbage"), http.StatusBadRequest},
		"oversized":            {good, "application/x-protobuf", bytes.Repeat([]byte{0}, maxRelayBody+1), http.StatusBadRequest},
	} {
		if code := post(t, c.url, c.ctype, c.body); code != c.want {
			t.Errorf("%s: %d, want %d", name, code, c.want)
		}
	}
	if n := len(col.spans()); n != 0 {
		t.Fatalf("%d spans reached the collector", n)
	}
	// No turn ran in r1: forwarded as the agent's own trace, counted.
	if code := post(t, good, "application/x-protobuf", body); code != http.StatusOK {
		t.Fatalf("relay: %d", code)
	}
	if st := tr.Stats(); st.AgentSpansUnplaced != 2 || st.AgentBatchesForwarded != 1 {
		t.Errorf("stats %+v", st)
	}
	for _, s := range col.spans() {
		if hex.EncodeToString(s.TraceId) != "11111111111111111111111111111111" {
			t.Errorf("an unplaced span was moved to trace %x", s.TraceId)
		}
	}
}

// A hostile agent opening many posts against a collector that hangs: at
// most maxRelayForwards are taken (their bodies read); the next is
// refused at once with 503 and counted; nothing waits for the collector
// past its release.
func TestRelayBoundsForwards(t *testing.T) {
	release, arrived := make(chan struct{}), make(chan struct{}, maxRelayForwards+1)
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		<-release
	}))
	defer hung.Close()
	tr, _ := newTestTracer(t, Config{AgentRelay: hung.URL + "/v1/traces"})
	url := tr.AgentURL("r1")
	body := agentExport(t, time.Now(), "invoke_agent")
	codes := make(chan int, maxRelayForwards)
	for range maxRelayForwards {
		go func() {
			resp, err := http.Post(url, "application/x-protobuf", bytes.NewReader(body))
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	for range maxRelayForwards {
		<-arrived // each forward waits at the collector, holding its slot
	}
	if code := post(t, url, "application/x-protobuf", body); code != http.StatusServiceUnavailable {
		t.Errorf("a post past the bound: %d, want 503", code)
	}
	close(release)
	for range maxRelayForwards {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("a forward the collector took: %d", code)
		}
	}
	if st := tr.Stats(); st.AgentBatchesRefused != 1 || st.AgentBatchesForwarded != maxRelayForwards {
		t.Errorf("stats %+v", st)
	}
}
