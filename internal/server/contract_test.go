package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/agenthost/agenthost/room"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// contract checks a server's traffic against the OpenAPI document it
// serves, with a JSON Schema 2020-12 validator of its own (not the
// server's code): every request body against its operation's, every
// answer against its status's and media type's schema, and every
// server-sent event's data against the stream's itemSchema. It loads the
// document from the server's own answer to GET /v1/openapi.json.
type contract struct {
	mu      sync.Mutex
	doc     map[string]any
	c       *jsonschema.Compiler
	schemas map[string]*jsonschema.Schema
	errs    []string
	// answers counts the answers validated, by route pattern and status;
	// events the events, by type.
	answers map[string]int
	events  map[string]int
}

// docURL names the document as a schema resource.
const docURL = "urn:agenthost:openapi.json"

func newContract() *contract {
	return &contract{answers: map[string]int{}, events: map[string]int{}}
}

// load takes the served document.
func (ct *contract) load(raw []byte) error {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource(docURL, doc); err != nil {
		return err
	}
	ct.doc, ct.c, ct.schemas = doc.(map[string]any), c, map[string]*jsonschema.Schema{}
	return nil
}

// ptr is a JSON pointer of the document's parts.
func ptr(parts ...string) string {
	var b strings.Builder
	b.WriteString("#")
	for _, p := range parts {
		b.WriteString("/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(p))
	}
	return b.String()
}

// lookup returns the document's value at parts (nil if none).
func (ct *contract) lookup(parts ...string) any {
	var v any = ct.doc
	for _, p := range parts {
		switch x := v.(type) {
		case map[string]any:
			v = x[p]
		case []any:
			i, err := strconv.Atoi(p)
			if err != nil || i < 0 || i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

// validate checks the JSON instance raw against the schema at parts.
func (ct *contract) validate(raw []byte, parts ...string) error {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("not JSON: %v: %.200s", err, raw)
	}
	return ct.validateValue(inst, parts...)
}

func (ct *contract) validateValue(inst any, parts ...string) error {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	if ct.c == nil {
		return fmt.Errorf("no document loaded (GET /v1/openapi.json first)")
	}
	p := ptr(parts...)
	sch, ok := ct.schemas[p]
	if !ok {
		var err error
		if sch, err = ct.c.Compile(docURL + p); err != nil {
			return fmt.Errorf("compiling %s: %v", p, err)
		}
		ct.schemas[p] = sch
	}
	if err := sch.Validate(inst); err != nil {
		return fmt.Errorf("against %s: %v", p, err)
	}
	return nil
}

// fail records a finding of the middleware.
func (ct *contract) fail(format string, a ...any) {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	// The same finding on every event of a stream is told once.
	msg := fmt.Sprintf(format, a...)
	for _, e := range ct.errs {
		if e[:min(len(e), 60)] == msg[:min(len(msg), 60)] {
			return
		}
	}
	ct.errs = append(ct.errs, msg)
}

// check reports the findings (call it once the server is closed).
func (ct *contract) check(t *testing.T) {
	t.Helper()
	ct.mu.Lock()
	defer ct.mu.Unlock()
	for _, e := range ct.errs {
		t.Error(e)
	}
}

// opPath is the document's path and method of a route pattern.
func opPath(pattern string) (path, method string) {
	method, path, _ = strings.Cut(pattern, " ")
	if path == "/{$}" {
		path = "/"
	}
	return path, strings.ToLower(method)
}

// wrap is the middleware: srv is the API (its mux names each request's
// route).
func (ct *contract) wrap(srv *Server) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, pattern := srv.mux.Handler(r)
			path, method := opPath(pattern)
			valid := false
			if r.Body != nil && pattern != "" && strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
				body, _ := io.ReadAll(io.LimitReader(r.Body, 4<<20))
				r.Body = io.NopCloser(bytes.NewReader(body))
				if ct.lookup("paths", path, method, "requestBody") != nil && len(body) < int(DefaultMaxBodyBytes) {
					// The tests send valid requests where they expect a
					// success: a request the schema refuses must fail.
					valid = ct.validate(body, "paths", path, method, "requestBody", "content", "application/json", "schema") == nil
				}
			}
			rec := &recorder{ResponseWriter: w}
			next.ServeHTTP(rec, r)
			if valid && rec.status == http.StatusBadRequest {
				ct.fail("%s: a request the schema takes was answered 400: %s", pattern, rec.body.String())
			}
			if pattern == "" {
				return // no route: 404 and 405, described in the info
			}
			if pattern == "GET /v1/openapi.json" && rec.status == http.StatusOK {
				if err := ct.load(rec.body.Bytes()); err != nil {
					ct.fail("the served document: %v", err)
				}
			}
			ct.answer(pattern, path, method, rec)
		})
	}
}

// answer validates one answer.
func (ct *contract) answer(pattern, path, method string, rec *recorder) {
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	code := strconv.Itoa(status)
	if ct.lookup("paths", path, method, "responses", code) == nil {
		ct.fail("%s answered %d, which the document does not list", pattern, status)
		return
	}
	mt, _, _ := mime.ParseMediaType(rec.Header().Get("Content-Type"))
	content, _ := ct.lookup("paths", path, method, "responses", code, "content").(map[string]any)
	if _, ok := content[mt]; !ok {
		ct.fail("%s %d: content type %q is not among the document's %v", pattern, status, mt, keys(content))
		return
	}
	ct.mu.Lock()
	ct.answers[pattern+" "+code]++
	ct.mu.Unlock()
	switch mt {
	case "application/json":
		if err := ct.validate(rec.body.Bytes(), "paths", path, method, "responses", code, "content", mt, "schema"); err != nil {
			ct.fail("%s %d: %v", pattern, status, err)
		}
	case "text/event-stream":
		ct.stream(pattern, path, method, code, rec.body.Bytes(), rec.Header().Get("Room-Incarnation"))
	}
}

// stream validates each event of an event stream whose Room-Incarnation
// is inc: each event's id is its seq and inc.
func (ct *contract) stream(pattern, path, method, code string, body []byte, inc string) {
	item := []string{"paths", path, method, "responses", code, "content", "text/event-stream", "itemSchema"}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	fields := map[string]any{}
	flush := func() {
		defer clear(fields)
		data, ok := fields["data"].(string)
		if !ok {
			return // the retry block, or a cut-off tail
		}
		if err := ct.validateValue(fieldsObject(fields), item...); err != nil {
			ct.fail("%s: event %v: %v", pattern, fields["id"], err)
			return
		}
		if err := ct.validate([]byte(data), append(item, "properties", "data", "contentSchema")...); err != nil {
			ct.fail("%s: event %v: %v", pattern, fields["id"], err)
			return
		}
		var ev struct {
			Seq  int64  `json:"seq"`
			Type string `json:"type"`
		}
		_ = json.Unmarshal([]byte(data), &ev)
		wantID := strconv.FormatInt(ev.Seq, 10)
		if ev.Type != "reset" {
			wantID += "." + inc
		}
		if fields["id"] != wantID || fields["event"] != ev.Type {
			ct.fail("%s: event frame id %v event %v, data seq %d type %s", pattern, fields["id"], fields["event"], ev.Seq, ev.Type)
		}
		ct.mu.Lock()
		ct.events[ev.Type]++
		ct.mu.Unlock()
	}
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			flush()
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue
		}
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimPrefix(v, " ")
		if k == "retry" {
			n, err := strconv.Atoi(v)
			if err != nil {
				ct.fail("%s: retry %q", pattern, v)
			}
			fields[k] = json.Number(strconv.Itoa(n))
			continue
		}
		if old, ok := fields[k].(string); ok && k == "data" {
			v = old + "\n" + v
		}
		fields[k] = v
	}
}

// fieldsObject copies an event's fields as a JSON object instance.
func fieldsObject(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// recorder keeps an answer's status and body (a stream's too, whole).
type recorder struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	r.body.Write(b)
	return r.ResponseWriter.Write(b)
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// TestContractRealRoom runs a room on omp (the built-in scripted model)
// through every part of the API: settings, turns, an approval, a question,
// a cancel, a diff, a revert, the listings, a release and a purge, with
// answers that fail (404, 409, 400) among them. A validator of its own
// (JSON Schema 2020-12) checks every request the test sends, every answer
// and every event the server streams against the document the server
// serves: what a client generated from the document (or validating its
// traffic by it) meets.
func TestContractRealRoom(t *testing.T) {
	ct := newContract()
	// Registered first, so it runs last: after the server closed, when
	// every stream's handler has returned and been checked.
	t.Cleanup(func() { ct.check(t); ct.covered(t) })
	h := newRealHarnessWith(t, room.Options{Config: room.Config{Agent: "omp"}, Snapshots: snapshots(t)}, harnessOption{wrap: ct.wrap})
	must := func(r resp, status int) resp {
		t.Helper()
		if r.status != status {
			t.Fatalf("%d %s, want %d", r.status, r.body, status)
		}
		return r
	}
	must(h.do("GET", "/v1/openapi.json", nil), http.StatusOK)
	must(h.do("GET", "/healthz", nil), http.StatusOK)
	const rm = "contract-é"
	p := "/v1/rooms/" + url.PathEscape(rm)
	must(h.do("GET", p, nil), http.StatusNotFound)
	must(h.do("PUT", p+"/config", map[string]any{"instructions": "Be brief.", "turn_timeout": "5m", "budget": map[string]any{"turns": 0}}), http.StatusOK)
	must(h.do("GET", p+"/config", nil), http.StatusOK)

	// A turn, then one that waits on an approval and writes a file.
	acc := h.post(rm, "hello there")
	if d := h.endedWithin(rm, acc, 120*time.Second); d["outcome"] != "settled" {
		t.Fatalf("turn: %v", d)
	}
	acc = h.post(rm, "Write it: "+bashCall("echo approved > out.txt"))
	req := h.untilWithin(rm, acc.Seq, 120*time.Second, func(ev sse) bool { return ev.typ == "approval.requested" })
	must(h.do("GET", p, nil), http.StatusOK) // a pending approval, a running turn
	must(h.do("GET", "/v1/rooms", nil), http.StatusOK)
	must(h.do("GET", p+"/turns", nil), http.StatusOK) // a turn without outcome
	must(h.do("GET", p+"/messages", nil), http.StatusOK)
	must(h.do("DELETE", p, nil), http.StatusConflict) // a turn runs
	aid := req.data["approval_id"].(string)
	must(h.do("POST", p+"/approvals/"+aid, map[string]string{"decision": "allow"}), http.StatusOK)
	must(h.do("POST", p+"/approvals/"+aid, map[string]string{"decision": "deny"}), http.StatusConflict)
	wrote := h.endedWithin(rm, acc, 120*time.Second)
	if wrote["outcome"] != "settled" {
		t.Fatalf("the approved turn: %v", wrote)
	}
	turn := wrote["turn_id"].(string)
	must(h.do("GET", p+"/turns/"+turn+"/diff", nil), http.StatusOK)
	must(h.do("GET", p+"/turns/no-such-turn/diff", nil), http.StatusNotFound)
	must(h.do("POST", p+"/turns/"+turn+"/revert", nil), http.StatusOK)

	// A question, answered through the API.
	acc = h.post(rm, `[[tool:ask {"questions":[{"id":"c","question":"Which color?","options":[{"label":"red"},{"label":"blue"}]}]}]]`)
	q := h.untilWithin(rm, acc.Seq, 120*time.Second, func(ev sse) bool { return ev.typ == "question.asked" })
	must(h.do("GET", p, nil), http.StatusOK) // a pending question
	must(h.do("POST", p+"/questions/"+q.data["question_id"].(string), map[string]string{"answer": "blue"}), http.StatusOK)
	if d := h.endedWithin(rm, acc, 120*time.Second); d["outcome"] != "settled" {
		t.Fatalf("the asking turn: %v", d)
	}

	// A turn cancelled while it waits on an approval; then nothing to cancel.
	acc = h.post(rm, "Wait: "+bashCall("sleep 1"))
	h.untilWithin(rm, acc.Seq, 120*time.Second, func(ev sse) bool { return ev.typ == "approval.requested" })
	must(h.do("POST", p+"/cancel", nil), http.StatusAccepted)
	if d := h.endedWithin(rm, acc, 120*time.Second); d["outcome"] != "cancelled" {
		t.Fatalf("the cancelled turn: %v", d)
	}
	must(h.do("POST", p+"/cancel", nil), http.StatusConflict)

	// Refusals: each an Error.
	must(h.do("POST", p+"/messages", map[string]any{"text": "x", "delivery": nil}), http.StatusBadRequest)
	must(h.do("POST", p+"/messages", `[]`), http.StatusBadRequest)
	must(h.do("PUT", p+"/config", map[string]any{"budget": []int{}}), http.StatusBadRequest)
	must(h.do("GET", "/v1/rooms/%20a", nil), http.StatusBadRequest)
	must(h.do("GET", p, nil, "Authorization", "Bearer wrong"), http.StatusUnauthorized)

	// The listings and the whole log, replayed.
	for _, path := range []string{p, "/v1/rooms", "/v1/rooms?limit=1", p + "/messages", p + "/turns", p + "/config", p + "/events?follow=0"} {
		must(h.do("GET", path, nil), http.StatusOK)
	}
	must(h.do("GET", "/metrics", nil), http.StatusOK)

	// Release (a receipt), an idle release, then a purge of a resident
	// agent (a receipt again) and what follows it.
	must(h.do("DELETE", p, nil), http.StatusOK)
	must(h.do("DELETE", p, nil), http.StatusOK)
	acc = h.post(rm, "once more") // starts the agent again
	h.endedWithin(rm, acc, 120*time.Second)
	inc := must(h.do("GET", p, nil), http.StatusOK).json(t)["incarnation"].(string)
	must(h.do("GET", p+"/events?follow=0", nil), http.StatusOK)
	purged := must(h.do("DELETE", p+"?purge=true", nil), http.StatusOK).json(t)
	if purged["purged"] != true || purged["released"] != true || purged["receipt"] == nil {
		t.Fatalf("purge: %v", purged)
	}
	must(h.do("DELETE", p+"?purge=true", nil), http.StatusNotFound)
	// A stream resuming into the purged incarnation gets a reset.
	acc = h.post(rm, "a new room")
	h.endedWithin(rm, acc, 120*time.Second)
	must(h.do("GET", p+"/events?follow=0&after=3&incarnation="+url.QueryEscape(inc), nil), http.StatusOK)
	must(h.do("DELETE", p, nil), http.StatusOK)
	if purged := must(h.do("DELETE", p+"?purge=true", nil), http.StatusOK).json(t); purged["released"] != false {
		t.Fatalf("purge with no agent: %v", purged)
	}
}

// covered fails unless the answers and events of a whole room were
// validated.
func (ct *contract) covered(t *testing.T) {
	t.Helper()
	ct.mu.Lock()
	defer ct.mu.Unlock()
	for _, want := range []string{
		"GET /v1/rooms/{room} 200", "GET /v1/rooms/{room} 404", "PUT /v1/rooms/{room}/config 200", "PUT /v1/rooms/{room}/config 400",
		"POST /v1/rooms/{room}/messages 202", "POST /v1/rooms/{room}/messages 400", "POST /v1/rooms/{room}/approvals/{id} 200",
		"POST /v1/rooms/{room}/approvals/{id} 409", "POST /v1/rooms/{room}/questions/{id} 200", "POST /v1/rooms/{room}/cancel 202",
		"POST /v1/rooms/{room}/cancel 409", "GET /v1/rooms/{room}/turns/{turn}/diff 200", "POST /v1/rooms/{room}/turns/{turn}/revert 200",
		"DELETE /v1/rooms/{room} 200", "DELETE /v1/rooms/{room} 409", "DELETE /v1/rooms/{room} 404", "GET /v1/rooms/{room}/events 200",
		"GET /v1/rooms/{room}/turns 200", "GET /v1/rooms/{room}/messages 200", "GET /v1/rooms 200", "GET /v1/rooms/{room}/config 200",
	} {
		if ct.answers[want] == 0 {
			t.Errorf("no answer %s was validated", want)
		}
	}
	for _, typ := range []string{"message.accepted", "message.ended", "turn.started", "turn.ended", "text.delta", "tool.started", "tool.ended",
		"approval.requested", "approval.resolved", "question.asked", "question.answered", "workspace.reverted", "agent.started",
		"agent.released", "reset"} {
		if ct.events[typ] == 0 {
			t.Errorf("no %s event was validated", typ)
		}
	}
	t.Logf("validated %d answers and %d events", sum(ct.answers), sum(ct.events))
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// TestSchemaAgreesWithServer: for the kinds of requests the review found
// the document and the server disagreeing on (room ids in bytes, a space
// at an id's end, durations, nested unknown fields, the rooms' cursor,
// object ids, nulls), the schema takes a request exactly when the server
// does; and the server's error texts speak JSON, never Go.
func TestSchemaAgreesWithServer(t *testing.T) {
	h := newHarness(t, room.Options{}, Options{})
	ct := newContract()
	if err := ct.load(h.do("GET", "/v1/openapi.json", nil).body); err != nil {
		t.Fatal(err)
	}
	roomID := []string{"components", "schemas", "RoomID"}
	body := func(path, method string) []string {
		return []string{"paths", path, method, "requestBody", "content", "application/json", "schema"}
	}
	config, message := body("/v1/rooms/{room}/config", "put"), body("/v1/rooms/{room}/messages", "post")
	approvalID := []string{"paths", "/v1/rooms/{room}/approvals/{id}", "parameters", "1", "schema"}
	type check struct {
		value string // JSON, or a string parameter
		json  bool
		at    []string
	}
	str := func(v string, at []string) check { return check{value: v, at: at} }
	js := func(v string, at []string) check { return check{value: v, json: true, at: at} }
	for _, c := range []struct {
		name, method, path, body string
		checks                   []check
		status                   int
		msg                      string
	}{
		{"128 characters of 2 bytes", "PUT", "/v1/rooms/" + strings.Repeat("é", 128) + "/config", `{}`,
			[]check{str(strings.Repeat("é", 128), roomID), js(`{}`, config)}, 200, ""},
		{"129 characters", "PUT", "/v1/rooms/" + strings.Repeat("é", 129) + "/config", `{}`,
			[]check{str(strings.Repeat("é", 129), roomID)}, 400, "longer than 128 characters"},
		{"a space first", "PUT", "/v1/rooms/%20a/config", `{}`, []check{str(" a", roomID)}, 400, "leading or trailing space"},
		{"a space inside", "PUT", "/v1/rooms/a%20b/config", `{}`, []check{str("a b", roomID), js(`{}`, config)}, 200, ""},
		{"a no-break space", "PUT", "/v1/rooms/a%C2%A0b/config", `{}`, []check{str("a\u00a0b", roomID)}, 400, "U+00A0"},
		{"a zero-width space", "PUT", "/v1/rooms/a%E2%80%8Bb/config", `{}`, []check{str("a\u200bb", roomID)}, 400, "U+200B"},
		{"dot dot", "GET", "/v1/rooms?after=..", ``, []check{str("..", roomID)}, 400, "after must be a room id"},
		{"a dotted id", "PUT", "/v1/rooms/..a/config", `{}`, []check{str("..a", roomID), js(`{}`, config)}, 200, ""},
		{"cursor with a space", "GET", "/v1/rooms?after=%20a", ``, []check{str(" a", roomID)}, 400, "after must be a room id"},
		{"cursor", "GET", "/v1/rooms?after=b", ``, []check{str("b", roomID)}, 200, ""},
		{"a duration", "PUT", "/v1/rooms/d/config", `{"turn_timeout":"1h30m","idle_after":"90s","approval_timeout":"0"}`,
			[]check{js(`{"turn_timeout":"1h30m","idle_after":"90s","approval_timeout":"0"}`, config)}, 200, ""},
		{"not a duration", "PUT", "/v1/rooms/d/config", `{"turn_timeout":"soon"}`, []check{js(`{"turn_timeout":"soon"}`, config)}, 400, `duration "soon"`},
		{"a budget's unknown field", "PUT", "/v1/rooms/d/config", `{"budget":{"zz":1}}`, []check{js(`{"budget":{"zz":1}}`, config)}, 400, `unknown field "zz"`},
		{"an MCP server's unknown field", "PUT", "/v1/rooms/d/config", `{"mcp":{"x":{"command":["x"],"zz":1}}}`,
			[]check{js(`{"mcp":{"x":{"command":["x"],"zz":1}}}`, config)}, 400, `unknown field "zz"`},
		{"a workspace's unknown field", "PUT", "/v1/rooms/d/config", `{"workspace":{"git":"file:///x","ref":"main","zz":1}}`,
			[]check{js(`{"workspace":{"git":"file:///x","ref":"main","zz":1}}`, config)}, 400, `unknown field "zz"`},
		{"an MCP server", "PUT", "/v1/rooms/d/config", `{"mcp":{"a":{"command":["x"]}}}`, []check{js(`{"mcp":{"a":{"command":["x"]}}}`, config)}, 200, ""},
		{"an MCP server's name", "PUT", "/v1/rooms/d/config", `{"mcp":{" a":{"command":["x"]}}}`, []check{js(`{"mcp":{" a":{"command":["x"]}}}`, config)}, 400, "want letters"},
		{"the reserved MCP name", "PUT", "/v1/rooms/d/config", `{"mcp":{"AgentHost":{"command":["x"]}}}`, []check{js(`{"mcp":{"AgentHost":{"command":["x"]}}}`, config)}, 400, "reserved"},
		{"an MCP server of nothing", "PUT", "/v1/rooms/d/config", `{"mcp":{"a":{"command":[]}}}`, []check{js(`{"mcp":{"a":{"command":[]}}}`, config)}, 400, "exactly one"},
		{"an MCP server of both", "PUT", "/v1/rooms/d/config", `{"mcp":{"a":{"command":["x"],"url":"http://127.0.0.1:9/"}}}`,
			[]check{js(`{"mcp":{"a":{"command":["x"],"url":"http://127.0.0.1:9/"}}}`, config)}, 400, "exactly one"},
		{"no workspace", "PUT", "/v1/rooms/d/config", `{"workspace":null}`, []check{js(`{"workspace":null}`, config)}, 200, ""},
		{"a null model", "PUT", "/v1/rooms/d/config", `{"model":null}`, []check{js(`{"model":null}`, config)}, 400, "model must not be null"},
		{"a null budget", "PUT", "/v1/rooms/d/config", `{"budget":null}`, []check{js(`{"budget":null}`, config)}, 400, "budget must not be null"},
		{"a null delivery", "POST", "/v1/rooms/d/messages", `{"text":"x","delivery":null}`,
			[]check{js(`{"text":"x","delivery":null}`, message)}, 400, "delivery must not be null"},
		{"a null sender", "POST", "/v1/rooms/d/messages", `{"text":"x","sender":null}`,
			[]check{js(`{"text":"x","sender":null}`, message)}, 400, "sender must not be null"},
		{"a sender of 256 characters", "POST", "/v1/rooms/d/messages", `{"text":"x","sender":"` + strings.Repeat("é", 256) + `"}`,
			[]check{js(`{"text":"x","sender":"`+strings.Repeat("é", 256)+`"}`, message)}, 202, ""},
		{"a sender of 257", "POST", "/v1/rooms/d/messages", `{"text":"x","sender":"` + strings.Repeat("é", 257) + `"}`,
			[]check{js(`{"text":"x","sender":"`+strings.Repeat("é", 257)+`"}`, message)}, 400, "sender is over 256 characters"},
		{"a message", "POST", "/v1/rooms/d/messages", `{"text":"x","delivery":"queue"}`,
			[]check{js(`{"text":"x","delivery":"queue"}`, message)}, 202, ""},
		{"an approval id not ASCII", "POST", "/v1/rooms/d/approvals/%C3%A9", `{"decision":"allow"}`,
			[]check{str("é", approvalID)}, 400, "printable ASCII"},
		// Error texts in JSON's words.
		{"an array body", "POST", "/v1/rooms/d/messages", `[]`, []check{js(`[]`, message)}, 400, "the body must be a JSON object"},
		{"a number body", "POST", "/v1/rooms/d/approvals/a_1", `5`, []check{js(`5`, body("/v1/rooms/{room}/approvals/{id}", "post"))}, 400, "the body must be a JSON object"},
		{"an array budget", "PUT", "/v1/rooms/d/config", `{"budget":[]}`, []check{js(`{"budget":[]}`, config)}, 400, "budget must be an object, not array"},
		{"a fraction of a token", "PUT", "/v1/rooms/d/config", `{"budget":{"tokens":1.5}}`,
			[]check{js(`{"budget":{"tokens":1.5}}`, config)}, 400, "budget.tokens must be an integer, not number 1.5"},
		{"a number text", "POST", "/v1/rooms/d/messages", `{"text":5}`, []check{js(`{"text":5}`, message)}, 400, "text must be a string, not number"},
	} {
		valid := true
		for _, ch := range c.checks {
			var err error
			if ch.json {
				err = ct.validate([]byte(ch.value), ch.at...)
			} else {
				err = ct.validateValue(ch.value, ch.at...)
			}
			valid = valid && err == nil
		}
		r := h.do(c.method, c.path, c.body)
		if r.status != c.status || (r.status/100 == 2) != valid {
			t.Errorf("%s: %d %s (schema takes it: %v), want %d", c.name, r.status, r.body, valid, c.status)
			continue
		}
		if c.msg == "" {
			continue
		}
		msg, _ := r.json(t)["error"].(string)
		if !strings.Contains(msg, c.msg) {
			t.Errorf("%s: error %q, want it to say %q", c.name, msg, c.msg)
		}
		for _, goWord := range []string{"Go struct", "Go value", "server.", "room.", "int64", "float64", "json:"} {
			if strings.Contains(msg, goWord) {
				t.Errorf("%s: error %q names Go (%q)", c.name, msg, goWord)
			}
		}
	}
}

// TestEmptyIdempotencyKey: an Idempotency-Key header sent empty is 400, as
// the schema says (minLength 1), not a message without a key.
func TestEmptyIdempotencyKey(t *testing.T) {
	h := newHarness(t, room.Options{}, Options{})
	ct := newContract()
	if err := ct.load(openAPI); err != nil {
		t.Fatal(err)
	}
	if err := ct.validateValue("", "paths", "/v1/rooms/{room}/messages", "post", "parameters", "0", "schema"); err == nil {
		t.Fatal("the schema takes an empty key")
	}
	req, _ := http.NewRequestWithContext(t.Context(), "POST", h.ts.URL+"/v1/rooms/k/messages", strings.NewReader(`{"text":"x"}`))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header["Idempotency-Key"] = []string{""}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "Idempotency-Key header is empty") {
		t.Fatalf("an empty key: %d %s", res.StatusCode, body)
	}
}

// TestRoomIDSchema: the RoomID schema refuses every character of the
// Basic Multilingual Plane the server refuses, and takes every one it
// takes (as an id's first, middle and last character).
func TestRoomIDSchema(t *testing.T) {
	ct := newContract()
	if err := ct.load(openAPI); err != nil {
		t.Fatal(err)
	}
	at := []string{"components", "schemas", "RoomID"}
	bad := 0
	for r := rune(0); r < 0x10000; r++ {
		if r >= 0xd800 && r <= 0xdfff {
			continue // no UTF-8 string holds a surrogate
		}
		assigned := unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z, unicode.Cc, unicode.Cf, unicode.Co)
		for _, id := range []string{string(r) + "a", "a" + string(r) + "a", "a" + string(r)} {
			server := room.ValidateID(id) == nil
			schema := ct.validateValue(id, at...) == nil
			if server != schema && (assigned || schema == false) {
				if bad++; bad < 20 {
					t.Errorf("id %q (%U): server takes it %v, schema %v", id, r, server, schema)
				}
			}
		}
	}
	for _, id := range []string{".", "..", strings.Repeat("x", 128), "ünïcødé 房间"} {
		if server, schema := room.ValidateID(id) == nil, ct.validateValue(id, at...) == nil; server != schema {
			t.Errorf("id %q: server takes it %v, schema %v", id, server, schema)
		}
	}
}

// TestRoomBudgetZeroIsNoLimit: on a server with a default budget, a room's
// limit of 0 is no limit (as the schema says), a limit left out is the
// server's, and the effective settings PUT back change nothing.
func TestRoomBudgetZeroIsNoLimit(t *testing.T) {
	h := newHarness(t, room.Options{Budget: room.Budget{Tokens: 100000, CostUSD: 2.5, Turns: 1}}, Options{})
	budget := func(r resp) map[string]any {
		t.Helper()
		if r.status != http.StatusOK {
			t.Fatalf("%d %s", r.status, r.body)
		}
		return r.json(t)["budget"].(map[string]any)
	}
	same := func(got map[string]any, tokens, usd, turns float64) {
		t.Helper()
		if got["tokens"] != tokens || got["cost_usd"] != usd || got["turns"] != turns {
			t.Fatalf("budget %v, want %v %v %v", got, tokens, usd, turns)
		}
	}
	same(budget(h.do("PUT", "/v1/rooms/b/config", `{}`)), 100000, 2.5, 1)
	same(budget(h.do("PUT", "/v1/rooms/b/config", `{"budget":{"turns":5}}`)), 100000, 2.5, 5)
	same(budget(h.do("PUT", "/v1/rooms/b/config", `{"budget":{"tokens":0,"cost_usd":0,"turns":0}}`)), 0, 0, 0)
	same(budget(h.do("GET", "/v1/rooms/b/config", nil)), 0, 0, 0)
	// No limit: more turns than the server's default allows.
	for _, text := range []string{"one", "two"} {
		if d := h.ended("b", h.post("b", text)); d["outcome"] != "settled" {
			t.Fatalf("turn %s: %v", text, d)
		}
	}
	// The effective settings sent back as they are: nothing changes.
	got := h.do("GET", "/v1/rooms/b/config", nil)
	same(budget(h.do("PUT", "/v1/rooms/b/config", got.body)), 0, 0, 0)
	// Back to the server's default: two turns are over its one.
	same(budget(h.do("PUT", "/v1/rooms/b/config", `{"budget":{}}`)), 100000, 2.5, 1)
	if r := h.do("POST", "/v1/rooms/b/messages", map[string]string{"text": "three"}); r.status != http.StatusTooManyRequests {
		t.Fatalf("over the default budget: %d %s", r.status, r.body)
	}
	if r := h.do("PUT", "/v1/rooms/b/config", `{"budget":{"turns":-1}}`); r.status != http.StatusBadRequest {
		t.Fatalf("a negative limit: %d %s", r.status, r.body)
	}
}
