package server

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/room"
)

var update = flag.Bool("update", false, "rewrite docs/http.md from openapi.json")

// referencePath is the generated reference, relative to this package.
var referencePath = filepath.Join("..", "..", "docs", "http.md")

// TestHTTPReference fails when docs/http.md differs from what openapi.json
// says; -update rewrites it.
func TestHTTPReference(t *testing.T) {
	want, err := renderReference(openAPI)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(referencePath, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(referencePath)
	if err != nil {
		t.Fatalf("%v (generate it: go test ./internal/server -run HTTPReference -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from openapi.json: regenerate it with go test ./internal/server -run HTTPReference -update", referencePath)
	}
}

// TestOpenAPIValid: the document is OpenAPI 3.1 as third-party tools read
// it (no OpenAPI 3.2 field such as itemSchema, a servers entry), and the
// server names its build in info.version, as in /healthz.
func TestOpenAPIValid(t *testing.T) {
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if k == "itemSchema" || k == "itemEncoding" || k == "prefixEncoding" {
					t.Errorf("%s/%s: an OpenAPI 3.2 field", path, k)
				}
				walk(path+"/"+k, x)
			}
		case []any:
			for i, x := range v {
				walk(path+"/"+strconv.Itoa(i), x)
			}
		}
	}
	var doc map[string]any
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatal(err)
	}
	walk("#", doc)
	if doc["openapi"] != "3.1.0" {
		t.Errorf("openapi %v", doc["openapi"])
	}
	if s, _ := doc["servers"].([]any); len(s) == 0 {
		t.Error("no servers entry")
	}

	h := newHarness(t, room.Options{}, Options{Version: "v9.9.9+abc"})
	var served struct {
		Info struct{ Version string } `json:"info"`
	}
	if err := json.Unmarshal(h.do("GET", "/v1/openapi.json", nil).body, &served); err != nil || served.Info.Version != "v9.9.9+abc" {
		t.Errorf("served info.version %q %v", served.Info.Version, err)
	}
	if hz := h.do("GET", "/healthz", nil, "Authorization", "").json(t); hz["version"] != "v9.9.9+abc" || hz["status"] != "ok" {
		t.Errorf("/healthz %v", hz)
	}
}

// ordered is a JSON object whose keys keep their order.
type ordered struct {
	keys []string
	vals map[string]json.RawMessage
}

func (o *ordered) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return fmt.Errorf("want an object: %v", err)
	}
	o.vals = map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		k := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return err
		}
		o.keys = append(o.keys, k)
		o.vals[k] = v
	}
	return nil
}

// schema is the part of a JSON Schema the reference shows.
type schema struct {
	Ref         string   `json:"$ref"`
	Type        string   `json:"type"`
	Const       any      `json:"const"`
	Enum        []any    `json:"enum"`
	Items       *schema  `json:"items"`
	OneOf       []schema `json:"oneOf"`
	Properties  ordered  `json:"properties"`
	Required    []string `json:"required"`
	Format      string   `json:"format"`
	Description string   `json:"description"`
	MinLength   *int     `json:"minLength"`
	MaxLength   *int     `json:"maxLength"`
	Minimum     *int     `json:"minimum"`
	Maximum     *int     `json:"maximum"`
	Default     any      `json:"default"`
	Pattern     string   `json:"pattern"`
	Examples    []any    `json:"examples"`
}

type parameter struct {
	Name        string `json:"name"`
	In          string `json:"in"`
	Required    bool   `json:"required"`
	Description string `json:"description"`
	Schema      schema `json:"schema"`
}

type mediaTypes map[string]struct {
	Schema schema `json:"schema"`
	// SSEData is the schema of an event stream's data lines.
	SSEData *schema `json:"x-sse-data"`
}

type operation struct {
	Summary     string      `json:"summary"`
	Security    *[]any      `json:"security"`
	Parameters  []parameter `json:"parameters"`
	RequestBody *struct {
		Required bool       `json:"required"`
		Content  mediaTypes `json:"content"`
	} `json:"requestBody"`
	Responses map[string]struct {
		Description string     `json:"description"`
		Content     mediaTypes `json:"content"`
	} `json:"responses"`
}

// renderReference writes the HTTP reference from the OpenAPI document.
func renderReference(raw []byte) ([]byte, error) {
	var doc struct {
		Info struct {
			Title, Description string
		} `json:"info"`
		Servers []struct {
			URL, Description string
		} `json:"servers"`
		Paths      ordered `json:"paths"`
		Components struct {
			Schemas ordered `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString("# HTTP API reference\n\n")
	b.WriteString("<!-- Generated from internal/server/openapi.json by `go test ./internal/server -run HTTPReference -update`; do not edit. -->\n\n")
	b.WriteString(doc.Info.Description + "\n\n")
	for _, s := range doc.Servers {
		fmt.Fprintf(&b, "Server: `%s`: %s. ", s.URL, s.Description)
	}
	b.WriteString("The document itself is `GET /v1/openapi.json` (OpenAPI 3.1); the Go client is the package `client`.\n\n")

	type op struct {
		method, path string
		op           operation
		params       []parameter
	}
	var ops []op
	paths := slices.Clone(doc.Paths.keys)
	slices.Sort(paths)
	for _, path := range paths {
		var item ordered
		if err := json.Unmarshal(doc.Paths.vals[path], &item); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		var shared []parameter
		if p, ok := item.vals["parameters"]; ok {
			if err := json.Unmarshal(p, &shared); err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
		}
		for _, method := range []string{"get", "post", "put", "patch", "delete"} {
			rawOp, ok := item.vals[method]
			if !ok {
				continue
			}
			var o operation
			if err := json.Unmarshal(rawOp, &o); err != nil {
				return nil, fmt.Errorf("%s %s: %w", method, path, err)
			}
			ops = append(ops, op{strings.ToUpper(method), path, o, append(slices.Clone(shared), o.Parameters...)})
		}
	}

	b.WriteString("## Routes\n\n| method | path | what | success | errors |\n|---|---|---|---|---|\n")
	for _, o := range ops {
		ok, bad := statuses(o.op)
		fmt.Fprintf(&b, "| `%s` | [`%s`](#%s) | %s | %s | %s |\n", o.method, o.path, anchor(o.method+" "+o.path),
			cell(firstSentence(o.op.Summary)), strings.Join(ok, ", "), orDash(strings.Join(bad, ", ")))
	}
	b.WriteString("\n")

	for _, o := range ops {
		fmt.Fprintf(&b, "### `%s %s`\n\n%s\n\n", o.method, o.path, o.op.Summary)
		if o.op.Security != nil && len(*o.op.Security) == 0 {
			b.WriteString("No token needed.\n\n")
		}
		if len(o.params) > 0 {
			b.WriteString("| parameter | in | type | description |\n|---|---|---|---|\n")
			for _, p := range o.params {
				name := "`" + p.Name + "`"
				if p.Required {
					name += " (required)"
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", name, p.In, cell(typeOf(p.Schema)), cell(p.Description))
			}
			b.WriteString("\n")
		}
		if rb := o.op.RequestBody; rb != nil {
			for _, mt := range sortedKeys(rb.Content) {
				fmt.Fprintf(&b, "Body (`%s`): %s\n\n", mt, typeOf(rb.Content[mt].Schema))
			}
		}
		b.WriteString("| status | meaning | body |\n|---|---|---|\n")
		codes := sortedKeys(o.op.Responses)
		for _, code := range codes {
			r := o.op.Responses[code]
			var bodies []string
			for _, mt := range sortedKeys(r.Content) {
				m := r.Content[mt]
				desc := typeOf(m.Schema)
				if m.SSEData != nil {
					desc = "Server-Sent Events, each `data:` line an " + typeOf(*m.SSEData)
				}
				bodies = append(bodies, fmt.Sprintf("`%s`: %s", mt, desc))
			}
			fmt.Fprintf(&b, "| %s | %s | %s |\n", code, cell(r.Description), cell(orDash(strings.Join(bodies, "; "))))
		}
		b.WriteString("\n")
	}

	b.WriteString("## Schemas\n\n")
	for _, name := range doc.Components.Schemas.keys {
		var s schema
		if err := json.Unmarshal(doc.Components.Schemas.vals[name], &s); err != nil {
			return nil, fmt.Errorf("schema %s: %w", name, err)
		}
		fmt.Fprintf(&b, "### %s\n\n", name)
		if s.Description != "" {
			b.WriteString(s.Description + "\n\n")
		}
		if len(s.Properties.keys) == 0 {
			fmt.Fprintf(&b, "%s\n\n", typeOf(s))
			continue
		}
		if len(s.OneOf) > 0 {
			fmt.Fprintf(&b, "By its `type`, one of: %s.\n\n", strings.ReplaceAll(typeOf(schema{OneOf: s.OneOf}), " or ", ", "))
		}
		b.WriteString("| field | type | description |\n|---|---|---|\n")
		for _, k := range s.Properties.keys {
			var p schema
			if err := json.Unmarshal(s.Properties.vals[k], &p); err != nil {
				return nil, fmt.Errorf("schema %s.%s: %w", name, k, err)
			}
			field := "`" + k + "`"
			if slices.Contains(s.Required, k) {
				field += " (always)"
			}
			desc := p.Description
			if len(p.Examples) > 0 {
				var ex []string
				for _, e := range p.Examples {
					ex = append(ex, fmt.Sprintf("`%v`", e))
				}
				desc = strings.TrimSpace(desc + " One of " + strings.Join(ex, ", ") + ".")
			}
			fmt.Fprintf(&b, "| %s | %s | %s |\n", field, cell(typeOf(p)), cell(orDash(desc)))
		}
		b.WriteString("\n")
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

// statuses splits an operation's statuses into successes and errors.
func statuses(o operation) (ok, bad []string) {
	for _, code := range sortedKeys(o.Responses) {
		if code < "400" {
			ok = append(ok, code)
		} else {
			bad = append(bad, code)
		}
	}
	return ok, bad
}

// typeOf says what a schema is, in a few words.
func typeOf(s schema) string {
	switch {
	case s.Ref != "":
		name := s.Ref[strings.LastIndexByte(s.Ref, '/')+1:]
		return fmt.Sprintf("[`%s`](#%s)", name, strings.ToLower(name))
	case s.Const != nil:
		return fmt.Sprintf("`%q`", s.Const)
	case len(s.Enum) > 0:
		var vs []string
		for _, v := range s.Enum {
			vs = append(vs, fmt.Sprintf("`%q`", v))
		}
		out := "one of " + strings.Join(vs, ", ")
		if s.Default != nil {
			out += fmt.Sprintf(" (default `%q`)", s.Default)
		}
		return out
	case len(s.OneOf) > 0:
		var alts []string
		for _, a := range s.OneOf {
			alts = append(alts, typeOf(a))
		}
		return strings.Join(alts, " or ")
	case s.Type == "array" && s.Items != nil:
		return "array of " + typeOf(*s.Items)
	case s.Type == "object" && len(s.Properties.keys) > 0:
		var fields []string
		for _, k := range s.Properties.keys {
			var p schema
			_ = json.Unmarshal(s.Properties.vals[k], &p)
			f := "`" + k + "`"
			if slices.Contains(s.Required, k) {
				f += " (always)"
			}
			fields = append(fields, f+": "+typeOf(p))
		}
		return "object: " + strings.Join(fields, ", ")
	}
	out := s.Type
	if out == "" {
		out = "any"
	}
	var notes []string
	if s.Format != "" {
		notes = append(notes, s.Format)
	}
	if s.MinLength != nil || s.MaxLength != nil {
		notes = append(notes, bounds(s.MinLength, s.MaxLength)+" bytes")
	}
	if s.Minimum != nil || s.Maximum != nil {
		notes = append(notes, bounds(s.Minimum, s.Maximum))
	}
	if s.Default != nil {
		notes = append(notes, fmt.Sprintf("default %v", s.Default))
	}
	if s.Pattern != "" {
		notes = append(notes, "`"+s.Pattern+"`")
	}
	if len(notes) > 0 {
		out += " (" + strings.Join(notes, ", ") + ")"
	}
	return out
}

func bounds(lo, hi *int) string {
	switch {
	case lo != nil && hi != nil:
		return fmt.Sprintf("%d to %d", *lo, *hi)
	case lo != nil:
		return fmt.Sprintf("at least %d", *lo)
	default:
		return fmt.Sprintf("at most %d", *hi)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// anchor is GitHub's heading anchor of a "### `METHOD /path`" heading.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

func firstSentence(s string) string {
	if i := strings.Index(s, ". "); i >= 0 {
		return s[:i+1]
	}
	return s
}

// cell makes s safe in a table cell.
func cell(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ") }

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}
