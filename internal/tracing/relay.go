package tracing

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/protobuf/proto"

	"github.com/agenthost/agenthost/room"
)

// The relay takes the spans a room's agent exports (serve --otlp-agents)
// and forwards them to the collector inside the trace of the turn they
// belong to: an agent that reads no parent from its environment (omp
// 18.2.3 reads none, and one agent serves many turns) starts a trace of
// its own for every run; the relay gives each of those traces the id of
// the room's turn that ran when its spans began, and makes its roots
// children of the turn's span. One trace then holds the host's turn with
// the agent's model calls and tools nested in it.
//
// Each room's agent is given a URL of its own, with a token only the
// server can make (an HMAC of the room's id): an agent can post spans
// into its own room's turns only. Bodies are bounded, and forwards are
// bounded in number (the agent's exporter gets 503 past that, before its
// body is read): nothing waits in the server's memory for a slow
// collector.

const (
	maxRelayBody     = 4 << 20  // a request's body, as sent
	maxRelayInflated = 16 << 20 // and gzip-inflated
	maxRelayForwards = 4        // forwards under way at once
	maxRelayTraces   = 4096     // agents' trace ids remembered
	maxRoomWindows   = 16       // turns remembered per room
	maxWindowRooms   = 4096     // rooms whose turns are remembered
	// windowSlack is how far before a turn's start (or past its end) an
	// agent's span may begin and still be the turn's: clocks of one host.
	windowSlack = time.Second
)

// turnWindow is a turn as the relay places agents' spans in it.
type turnWindow struct {
	traceID, spanID []byte
	start, end      time.Time // end zero: running
}

// windows are rooms' recent turns, written by the Tracer's goroutine and
// read by the relay's handlers.
type windows struct {
	mu    sync.Mutex
	rooms map[string][]turnWindow
	order []string // rooms, oldest first (bound)
}

func (w *windows) started(rm string, tw turnWindow) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.rooms == nil {
		w.rooms = map[string][]turnWindow{}
	}
	ts, ok := w.rooms[rm]
	if !ok {
		w.order = append(w.order, rm)
		for len(w.order) > maxWindowRooms {
			delete(w.rooms, w.order[0])
			w.order = w.order[1:]
		}
	}
	ts = append(ts, tw)
	if len(ts) > maxRoomWindows {
		ts = ts[len(ts)-maxRoomWindows:]
	}
	w.rooms[rm] = ts
}

func (w *windows) ended(rm string, spanID []byte, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ts := w.rooms[rm]
	for i := range ts {
		if bytes.Equal(ts[i].spanID, spanID) {
			ts[i].end = at
		}
	}
}

// at is the room's turn that ran at t, the latest one when several could.
func (w *windows) at(rm string, t time.Time) (turnWindow, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ts := w.rooms[rm]
	for i := len(ts) - 1; i >= 0; i-- {
		tw := ts[i]
		if t.Before(tw.start.Add(-windowSlack)) {
			continue
		}
		if tw.end.IsZero() || !t.After(tw.end.Add(windowSlack)) {
			return tw, true
		}
	}
	return turnWindow{}, false
}

// relay is the agents' OTLP endpoint.
type relay struct {
	t       *Tracer
	key     []byte
	target  string            // the collector's traces URL
	headers map[string]string // the collector's headers
	client  *http.Client
	srv     *http.Server
	ln      net.Listener
	slots   chan struct{}
	served  chan struct{}

	mu     sync.Mutex
	traces map[string]turnWindow // by room and the agent's trace id
	order  []string

	forwarded, refused, unplaced atomic.Uint64
}

func newRelay(t *Tracer, target string, headers map[string]string) (*relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("tracing: the agents' relay: %w", err)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	r := &relay{
		t: t, key: key, target: target, headers: headers, ln: ln,
		client: &http.Client{Timeout: exportTimeout},
		slots:  make(chan struct{}, maxRelayForwards), served: make(chan struct{}),
		traces: map[string]turnWindow{},
	}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second}
	go func() {
		defer close(r.served)
		_ = r.srv.Serve(ln)
	}()
	return r, nil
}

func (r *relay) token(rm string) string {
	m := hmac.New(sha256.New, r.key)
	m.Write([]byte(rm))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// url is the traces endpoint of the room's agent.
func (r *relay) url(rm string) string {
	return "http://" + r.ln.Addr().String() + "/rooms/" + url.PathEscape(rm) + "/" + r.token(rm) + "/v1/traces"
}

// port is the relay's loopback port (a confined agent must reach it).
func (r *relay) port() int { return r.ln.Addr().(*net.TCPAddr).Port }

func (r *relay) close(ctx context.Context) error {
	err := r.srv.Shutdown(ctx)
	<-r.served
	return err
}

var errRelayBody = errors.New("tracing: the agent's spans could not be read")

func (r *relay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	parts := strings.Split(strings.TrimPrefix(req.URL.Path, "/"), "/")
	if len(parts) != 5 || parts[0] != "rooms" || parts[3] != "v1" || parts[4] != "traces" {
		http.NotFound(w, req)
		return
	}
	rm, tok := parts[1], parts[2]
	if room.ValidateID(rm) != nil || !hmac.Equal([]byte(tok), []byte(r.token(rm))) {
		http.NotFound(w, req)
		return
	}
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	if ct := req.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/x-protobuf") {
		http.Error(w, "OTLP/HTTP with protobuf only", http.StatusUnsupportedMediaType)
		return
	}
	// A slot before the body is read: at most maxRelayForwards bodies
	// are in memory, however many posts an agent opens.
	select {
	case r.slots <- struct{}{}:
	default:
		// The collector is slow: the agent's exporter drops or retries.
		r.refused.Add(1)
		w.Header().Set("Retry-After", "5")
		http.Error(w, "the collector is busy", http.StatusServiceUnavailable)
		return
	}
	defer func() { <-r.slots }()
	var msg coltrace.ExportTraceServiceRequest
	if err := readOTLP(w, req, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.place(rm, &msg)
	body, err := proto.Marshal(&msg)
	if err != nil {
		http.Error(w, "encoding the spans failed", http.StatusInternalServerError)
		return
	}
	code := r.forward(req.Context(), body)
	if code/100 == 2 {
		r.forwarded.Add(1)
	} else {
		r.refused.Add(1)
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(code)
	if code/100 == 2 {
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}
}

// readOTLP reads a bounded, maybe gzipped, protobuf export request.
func readOTLP(w http.ResponseWriter, req *http.Request, msg *coltrace.ExportTraceServiceRequest) error {
	body := io.Reader(http.MaxBytesReader(w, req.Body, maxRelayBody))
	switch req.Header.Get("Content-Encoding") {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(body)
		if err != nil {
			return errRelayBody
		}
		defer zr.Close()
		body = io.LimitReader(zr, maxRelayInflated+1)
	default:
		return errRelayBody
	}
	b, err := io.ReadAll(body)
	if err != nil || len(b) > maxRelayInflated {
		return errRelayBody
	}
	if proto.Unmarshal(b, msg) != nil {
		return errRelayBody
	}
	return nil
}

// place moves the agent's spans into the room's turns: a trace of the
// agent's whose first span seen began during a turn becomes that turn's,
// its roots the turn span's children, and the resource names the room.
func (r *relay) place(rm string, msg *coltrace.ExportTraceServiceRequest) {
	for _, rs := range msg.ResourceSpans {
		if rs.Resource == nil {
			rs.Resource = &resourcepb.Resource{}
		}
		setAttr(rs.Resource, "agenthost.room.id", rm)
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				tw, ok := r.turnOf(rm, s.TraceId, time.Unix(0, int64(s.StartTimeUnixNano)))
				if !ok {
					r.unplaced.Add(1)
					continue
				}
				s.TraceId = tw.traceID
				if len(s.ParentSpanId) == 0 {
					s.ParentSpanId = tw.spanID
				}
				for _, l := range s.Links {
					if t2, ok := r.known(rm, l.TraceId); ok {
						l.TraceId = t2.traceID
					}
				}
			}
		}
	}
}

func (r *relay) turnOf(rm string, traceID []byte, start time.Time) (turnWindow, bool) {
	if tw, ok := r.known(rm, traceID); ok {
		return tw, true
	}
	tw, ok := r.t.windows.at(rm, start)
	if !ok {
		return tw, false
	}
	k := rm + "/" + hex.EncodeToString(traceID)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, seen := r.traces[k]; !seen {
		r.order = append(r.order, k)
		for len(r.order) > maxRelayTraces {
			delete(r.traces, r.order[0])
			r.order = r.order[1:]
		}
	}
	r.traces[k] = tw
	return tw, true
}

func (r *relay) known(rm string, traceID []byte) (turnWindow, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tw, ok := r.traces[rm+"/"+hex.EncodeToString(traceID)]
	return tw, ok
}

func setAttr(res *resourcepb.Resource, k, v string) {
	val := &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}
	for _, kv := range res.Attributes {
		if kv.Key == k {
			kv.Value = val
			return
		}
	}
	res.Attributes = append(res.Attributes, &commonpb.KeyValue{Key: k, Value: val})
}

// forward posts body to the collector; its status (502 when it did not
// answer).
func (r *relay) forward(ctx context.Context, body []byte) int {
	ctx, cancel := context.WithTimeout(ctx, exportTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.target, bytes.NewReader(body))
	if err != nil {
		return http.StatusBadGateway
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	for k, v := range r.headers {
		req.Header.Set(k, v)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return http.StatusBadGateway
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp.StatusCode
}

// ParseHeaders reads OTEL_EXPORTER_OTLP_HEADERS' form: k=v pairs,
// comma-separated, values URL-encoded.
func ParseHeaders(s string) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			continue
		}
		if d, err := url.QueryUnescape(strings.TrimSpace(v)); err == nil {
			v = d
		}
		out[strings.TrimSpace(k)] = v
	}
	return out
}
