package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/record"
	"github.com/agenthost/agenthost/room"
)

// openAPIPath is the document, relative to this package.
const openAPIPath = "openapi.json"

// eventDocs are the doc comments of package event's types and fields
// ("Type" and "Type.Field"), each on one line.
func eventDocs(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join("..", "..", "event", "event.go"), nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	line := func(g *ast.CommentGroup) string { return strings.Join(strings.Fields(g.Text()), " ") }
	docs := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.TYPE {
			continue
		}
		for _, s := range g.Specs {
			ts := s.(*ast.TypeSpec)
			if doc := ts.Doc; doc != nil {
				docs[ts.Name.Name] = line(doc)
			} else if g.Doc != nil {
				docs[ts.Name.Name] = line(g.Doc)
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				continue
			}
			for _, fl := range st.Fields.List {
				doc := fl.Doc
				if doc == nil {
					doc = fl.Comment
				}
				for _, n := range fl.Names {
					if doc != nil {
						docs[ts.Name.Name+"."+n.Name] = line(doc)
					}
				}
			}
		}
	}
	return docs
}

// eventSchemaName is the OpenAPI schema of an event type's payload.
func eventSchemaName(p event.Payload) string { return reflect.TypeOf(p).Name() + "Event" }

// eventEnvelope are the fields every event has.
var eventEnvelope = [][2]string{
	{"seq", `{"type":"integer","minimum":1,"description":"The room's sequence number: 1 for the first event, up by exactly one per event."}`},
	{"type", ``},
	{"room", `{"type":"string"}`},
	{"time", `{"type":"string","format":"date-time"}`},
}

const eventDescription = "One entry of a room's log, as the stream's data lines carry it: seq, type, room and time, then the type's own fields, which the schema named for the type lists (the Go package `event` defines one type per event). Every accepted message ends with exactly one message.ended. A reader should skip types it does not know: new ones may come."

// eventSchemas are the schemas package event defines: Event (any event,
// by its type) and one per type, in the order of event.Types.
func eventSchemas(t *testing.T) (names []string, schemas map[string]json.RawMessage) {
	t.Helper()
	docs := eventDocs(t)
	schemas = map[string]json.RawMessage{}
	enc := func(v any) json.RawMessage {
		var b bytes.Buffer
		e := json.NewEncoder(&b)
		e.SetEscapeHTML(false)
		if err := e.Encode(v); err != nil {
			t.Fatal(err)
		}
		return bytes.TrimSpace(b.Bytes())
	}
	var types []any
	var refs []any
	mapping := newObject()
	for _, p := range event.Types() {
		name := eventSchemaName(p)
		ref := "#/components/schemas/" + name
		types = append(types, p.EventType())
		refs = append(refs, map[string]string{"$ref": ref})
		mapping.set(p.EventType(), ref)
		schemas[name] = enc(payloadSchema(t, p, docs))
		names = append(names, name)
	}
	env := newObject()
	for _, f := range eventEnvelope {
		if f[0] == "type" {
			env.set("type", map[string]any{"type": "string", "enum": types})
			continue
		}
		env.set(f[0], json.RawMessage(f[1]))
	}
	ev := newObject()
	ev.set("type", "object")
	ev.set("description", eventDescription)
	ev.set("required", []string{"seq", "type", "room", "time"})
	ev.set("properties", env)
	ev.set("oneOf", refs)
	ev.set("discriminator", map[string]any{"propertyName": "type", "mapping": mapping})
	schemas["Event"] = enc(ev)
	return append([]string{"Event"}, names...), schemas
}

// payloadSchema is one event type's schema: the envelope, then the
// type's fields with their Go docs.
func payloadSchema(t *testing.T, p event.Payload, docs map[string]string) *object {
	rt := reflect.TypeOf(p)
	s := newObject()
	s.set("type", "object")
	s.set("description", goDoc(docs[rt.Name()], rt, rt.Name(), "`"+p.EventType()+"`"))
	required := []string{"seq", "type", "room", "time"}
	props := newObject()
	for _, f := range eventEnvelope {
		if f[0] == "type" {
			props.set("type", map[string]any{"const": p.EventType()})
			continue
		}
		props.set(f[0], json.RawMessage(f[1]))
	}
	for i := range rt.NumField() {
		f := rt.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		fs := fieldSchema(t, rt, f)
		if d := docs[rt.Name()+"."+f.Name]; d != "" {
			fs.set("description", goDoc(d, rt, f.Name, "`"+name+"`"))
		}
		props.set(name, fs)
		if !strings.Contains(opts, "omitempty") {
			required = append(required, name)
		}
	}
	s.set("required", required)
	s.set("properties", props)
	return s
}

// fieldSchema is a payload field's JSON Schema.
func fieldSchema(t *testing.T, parent reflect.Type, f reflect.StructField) *object {
	s := newObject()
	ref := func(name string) { s.set("$ref", "#/components/schemas/"+name) }
	switch f.Type {
	case reflect.TypeFor[time.Time]():
		s.set("type", "string")
		s.set("format", "date-time")
		return s
	case reflect.TypeFor[record.Usage]():
		ref("Usage")
		return s
	case reflect.TypeFor[event.Budget]():
		ref("Budget")
		return s
	case reflect.TypeFor[*event.Confinement]():
		ref("Confinement")
		return s
	case reflect.TypeFor[*event.Resources]():
		ref("Resources")
		return s
	case reflect.TypeFor[*record.Compute]():
		ref("Compute")
		return s
	case reflect.TypeFor[*event.TokenRef]():
		ref("TokenRef")
		return s
	case reflect.TypeFor[*event.Changes]():
		// Null when a snapshot failed (TurnEnded.MarshalJSON).
		s.set("oneOf", []any{map[string]string{"$ref": "#/components/schemas/Changes"}, map[string]string{"type": "null"}})
		return s
	case reflect.TypeFor[json.RawMessage]():
		s.set("type", "object")
		return s
	}
	switch f.Type.Kind() {
	case reflect.String:
		s.set("type", "string")
	case reflect.Bool:
		s.set("type", "boolean")
	case reflect.Int, reflect.Int64:
		s.set("type", "integer")
	case reflect.Float64:
		s.set("type", "number")
	case reflect.Slice:
		if f.Type.Elem().Kind() == reflect.String {
			s.set("type", "array")
			s.set("items", map[string]string{"type": "string"})
			break
		}
		fallthrough
	default:
		t.Fatalf("%s.%s: no schema for %v (add it to fieldSchema)", parent.Name(), f.Name, f.Type)
	}
	return s
}

var goIdent = regexp.MustCompile(`\b[A-Z][A-Za-z]*\b`)

// goDoc turns a Go doc comment into the API's words: the documented name
// becomes its JSON (or event type) name, and so do the other fields it
// mentions.
func goDoc(doc string, rt reflect.Type, name, apiName string) string {
	doc = strings.TrimPrefix(doc, name)
	doc = apiName + doc
	return goIdent.ReplaceAllStringFunc(doc, func(w string) string {
		if f, ok := rt.FieldByName(w); ok {
			n, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			return "`" + n + "`"
		}
		return w
	})
}

// object is a JSON object that keeps its keys' order.
type object struct {
	keys []string
	vals map[string]any
}

func newObject() *object { return &object{vals: map[string]any{}} }

func (o *object) set(k string, v any) {
	if _, ok := o.vals[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.vals[k] = v
}

func (o *object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		var vb bytes.Buffer
		e := json.NewEncoder(&vb)
		e.SetEscapeHTML(false)
		if err := e.Encode(o.vals[k]); err != nil {
			return nil, err
		}
		b.Write(bytes.TrimSpace(vb.Bytes()))
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// withEventSchemas returns doc with its event schemas replaced by names
// and schemas: Event where it was, the others right after it.
func withEventSchemas(doc []byte, names []string, schemas map[string]json.RawMessage) ([]byte, error) {
	var top ordered
	if err := json.Unmarshal(doc, &top); err != nil {
		return nil, err
	}
	var comps ordered
	if err := json.Unmarshal(top.vals["components"], &comps); err != nil {
		return nil, err
	}
	var old ordered
	if err := json.Unmarshal(comps.vals["schemas"], &old); err != nil {
		return nil, err
	}
	generated := map[string]bool{}
	for _, n := range names {
		generated[n] = true
	}
	out := newObject()
	for _, k := range old.keys {
		switch {
		case k == "Event":
			for _, n := range names {
				out.set(n, schemas[n])
			}
		case generated[k] || strings.HasSuffix(k, "Event") && isEventSchema(old.vals[k]):
			// replaced (or a type that is no more)
		default:
			out.set(k, old.vals[k])
		}
	}
	if _, ok := out.vals["Event"]; !ok {
		return nil, fmt.Errorf("the document has no Event schema")
	}
	rebuild := func(o ordered, key string, v any) *object {
		n := newObject()
		for _, k := range o.keys {
			n.set(k, o.vals[k])
		}
		n.set(key, v)
		return n
	}
	raw, err := json.Marshal(rebuild(top, "components", rebuild(comps, "schemas", out)))
	if err != nil {
		return nil, err
	}
	var ind bytes.Buffer
	if err := json.Indent(&ind, raw, "", " "); err != nil {
		return nil, err
	}
	ind.WriteByte('\n')
	return ind.Bytes(), nil
}

// isEventSchema: a schema whose type property is one event type's const.
func isEventSchema(raw json.RawMessage) bool {
	var s struct {
		Properties struct {
			Type struct {
				Const string `json:"const"`
			} `json:"type"`
		} `json:"properties"`
	}
	return json.Unmarshal(raw, &s) == nil && s.Properties.Type.Const != ""
}

// TestOpenAPIEvents: the OpenAPI document's event schemas are package
// event's types (one schema per type, fields and docs from the Go
// declarations); -update rewrites them (then regenerate docs/http.md).
func TestOpenAPIEvents(t *testing.T) {
	names, schemas := eventSchemas(t)
	want, err := withEventSchemas(openAPI, names, schemas)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(openAPIPath, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if !bytes.Equal(openAPI, want) {
		t.Fatalf("openapi.json's event schemas differ from package event: go test ./internal/server -run 'OpenAPIEvents|HTTPReference' -update")
	}
}

// checkEventTypes checks every event of every room in st: each decodes
// as its type strictly (no field the type lacks) and carries every field
// the type requires. Every test's harness runs it at its end.
func checkEventTypes(t *testing.T, st room.Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rooms, err := st.RoomIDs(ctx)
	if err != nil {
		t.Errorf("the rooms: %v", err)
		return
	}
	for _, rm := range rooms {
		for after := int64(0); ; {
			evs, err := st.Events(ctx, rm, after, 0)
			if err != nil {
				t.Errorf("room %s: %v", rm, err)
				return
			}
			for _, ev := range evs {
				if err := event.Validate(ev.Type, ev.Data); err != nil {
					t.Errorf("room %s, event %d: %v", rm, ev.Seq, err)
				}
				after = ev.Seq
			}
			if len(evs) < record.MaxPage {
				break
			}
		}
	}
}

func TestValidateEvent(t *testing.T) {
	for _, c := range []struct {
		typ, data string
		ok        bool
	}{
		{event.TypeTurnStarted, `{"message_id":"m","turn_id":"t"}`, true},
		{event.TypeTurnStarted, `{"message_id":"m"}`, false},
		{event.TypeTurnStarted, `{"message_id":"m","turn_id":"t","extra":1}`, false},
		{event.TypeMessageEnded, `{"message_id":"m","outcome":"settled"}`, true},
		{"no.such", `{}`, false},
	} {
		if err := event.Validate(c.typ, []byte(c.data)); (err == nil) != c.ok {
			t.Errorf("%s %s: %v", c.typ, c.data, err)
		}
	}
}
