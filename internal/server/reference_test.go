package server

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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

// TestOpenAPIValid: the document is OpenAPI 3.2 (the event stream's items
// in itemSchema, which Redocly and Spectral take, and no vendor extension
// for them), its one server is relative (the server that serves it, on
// whatever --listen says), and the server names its build in
// info.version, as in /healthz.
func TestOpenAPIValid(t *testing.T) {
	var walk func(path string, v any)
	items := 0
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if strings.HasPrefix(k, "x-") && !strings.Contains(path, "/properties") {
					t.Errorf("%s/%s: a vendor extension", path, k)
				}
				if k == "itemSchema" {
					items++
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
	if doc["openapi"] != "3.2.0" || items != 1 {
		t.Errorf("openapi %v, %d itemSchema", doc["openapi"], items)
	}
	if s, _ := doc["servers"].([]any); len(s) != 1 || s[0].(map[string]any)["url"] != "/" {
		t.Errorf("servers %v, want the one relative entry /", doc["servers"])
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
	Ref   string   `json:"$ref"`
	Type  string   `json:"type"`
	Const any      `json:"const"`
	Enum  []any    `json:"enum"`
	Items *schema  `json:"items"`
	OneOf []schema `json:"oneOf"`
	AllOf []schema `json:"allOf"`
	Not   *schema  `json:"not"`
	// AdditionalProperties is a schema (a map's values) or a bool.
	AdditionalProperties json.RawMessage `json:"additionalProperties"`
	// ContentSchema is a string's content, once parsed (an SSE data line).
	ContentSchema *schema  `json:"contentSchema"`
	Properties    ordered  `json:"properties"`
	Required      []string `json:"required"`
	Format        string   `json:"format"`
	Description   string   `json:"description"`
	MinLength     *int     `json:"minLength"`
	MaxLength     *int     `json:"maxLength"`
	Minimum       *int     `json:"minimum"`
	Maximum       *int     `json:"maximum"`
	Default       any      `json:"default"`
	Pattern       string   `json:"pattern"`
	Examples      []any    `json:"examples"`
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
	// ItemSchema is the schema of each item of a sequential media type
	// (OpenAPI 3.2): one server-sent event.
	ItemSchema *schema `json:"itemSchema"`
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
	b.WriteString("The document itself is `GET /v1/openapi.json` (OpenAPI 3.2); the Go client is the package `client`.\n\n")

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
				if it := m.ItemSchema; it != nil {
					desc = "Server-Sent Events"
					if data, ok := it.Properties.vals["data"]; ok {
						var d schema
						if err := json.Unmarshal(data, &d); err != nil {
							return nil, fmt.Errorf("%s %s: itemSchema: %w", o.method, o.path, err)
						}
						if d.ContentSchema != nil {
							desc += ", each `data:` line one " + typeOf(*d.ContentSchema)
						}
					}
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
		return "`" + jsonText(s.Const) + "`"
	case len(s.Enum) > 0:
		var vs []string
		for _, v := range s.Enum {
			vs = append(vs, "`"+jsonText(v)+"`")
		}
		out := "one of " + strings.Join(vs, ", ")
		if s.Default != nil {
			out += " (default `" + jsonText(s.Default) + "`)"
		}
		return out
	case len(s.OneOf) > 0:
		var alts []string
		for _, a := range s.OneOf {
			alts = append(alts, typeOf(a))
		}
		return strings.Join(alts, " or ")
	case len(s.AllOf) > 0:
		var parts []string
		for _, a := range s.AllOf {
			parts = append(parts, typeOf(a))
		}
		return "all of " + strings.Join(parts, " and ")
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
	case s.Type == "object" && len(s.AdditionalProperties) > 0 && s.AdditionalProperties[0] == '{':
		var vals schema
		_ = json.Unmarshal(s.AdditionalProperties, &vals)
		return "object: string keys to " + typeOf(vals)
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
		notes = append(notes, bounds(s.MinLength, s.MaxLength)+" characters")
	}
	if s.Minimum != nil || s.Maximum != nil {
		notes = append(notes, bounds(s.Minimum, s.Maximum))
	}
	if s.Default != nil {
		notes = append(notes, "default "+jsonText(s.Default))
	}
	if s.Pattern != "" {
		notes = append(notes, "`"+printable(s.Pattern)+"`")
	}
	if s.Not != nil {
		notes = append(notes, "not "+typeOf(*s.Not))
	}
	if len(notes) > 0 {
		out += " (" + strings.Join(notes, ", ") + ")"
	}
	return out
}

// jsonText is v as JSON (a const, an enum value, a default).
func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// printable writes the characters of s that are not printable ASCII as
// \uXXXX, as in the JSON of the document (a pattern's ranges of control
// and format characters).
func printable(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 0x20 || r > 0x7e {
			fmt.Fprintf(&b, "\\u%04x", r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
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

// TestHTTPReferenceSchemas checks what the generator makes of every schema
// of the document: a section of its own that renders the schema whole
// (each property a row, each part of an allOf, each const and enum value
// as its JSON), and no Go formatting error or bare "any" anywhere.
func TestHTTPReferenceSchemas(t *testing.T) {
	out, err := renderReference(openAPI)
	if err != nil {
		t.Fatal(err)
	}
	md := string(out)
	if i := strings.Index(md, "%!"); i >= 0 {
		t.Errorf("a Go formatting error: %q", md[max(0, i-80):min(len(md), i+40)])
	}
	var doc struct {
		Components struct {
			Schemas ordered `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{}
	for _, part := range strings.Split(md, "\n### ")[1:] {
		name, body, _ := strings.Cut(part, "\n")
		sections[name] = body
	}
	for _, name := range doc.Components.Schemas.keys {
		sec, ok := sections[name]
		if !ok {
			t.Errorf("schema %s has no section", name)
			continue
		}
		if strings.Contains("\n"+sec+"\n", "\nany\n") || strings.Contains(sec, "| any |") {
			t.Errorf("schema %s renders as any:\n%s", name, sec)
		}
		var s schema
		if err := json.Unmarshal(doc.Components.Schemas.vals[name], &s); err != nil {
			t.Fatal(err)
		}
		for _, k := range s.Properties.keys {
			if !strings.Contains(sec, "| `"+k+"`") {
				t.Errorf("schema %s: no row for %s", name, k)
			}
			var p schema
			_ = json.Unmarshal(s.Properties.vals[k], &p)
			if p.Const != nil && !strings.Contains(sec, "`"+jsonText(p.Const)+"`") {
				t.Errorf("schema %s.%s: const %s not shown", name, k, jsonText(p.Const))
			}
			for _, e := range p.Enum {
				if !strings.Contains(sec, "`"+jsonText(e)+"`") {
					t.Errorf("schema %s.%s: enum value %s not shown", name, k, jsonText(e))
				}
			}
		}
		for _, part := range append(s.AllOf, s.OneOf...) {
			if part.Ref != "" && !strings.Contains(sec, "(#"+strings.ToLower(part.Ref[strings.LastIndexByte(part.Ref, '/')+1:])+")") {
				t.Errorf("schema %s: part %s not linked", name, part.Ref)
			}
			for _, k := range part.Properties.keys {
				if !strings.Contains(sec, "`"+k+"`") {
					t.Errorf("schema %s: the field %s of a part is not shown", name, k)
				}
			}
		}
	}
	// The values the review found rendered wrong.
	for _, want := range []string{"| `purged` (always) | `true` |", "all of [`Usage`](#usage) and object: `turns` (always): integer",
		"object: string keys to [`SenderUsage`](#senderusage)"} {
		if !strings.Contains(md, want) {
			t.Errorf("the reference lacks %q", want)
		}
	}
}

// TestOpenAPIRedocly lints the served document with Redocly CLI and its
// recommended rules (installed by make setup-test into .tools/lint; about
// 4 s): no error, and no warning but two the API means (the project names
// no license; / and /healthz fail no request, so they have no 4xx).
func TestOpenAPIRedocly(t *testing.T) {
	bin, err := filepath.Abs(filepath.Join("..", "..", ".tools", "lint", "node_modules", ".bin", "redocly"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("Redocly CLI is needed (make setup-test installs it): %v", err)
	}
	h := newHarness(t, room.Options{}, Options{})
	doc := filepath.Join(t.TempDir(), "openapi.json")
	if err := os.WriteFile(doc, h.do("GET", "/v1/openapi.json", nil).body, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "lint", doc, "--format=json")
	cmd.Dir = filepath.Dir(doc) // no redocly.yaml of ours: the recommended rules
	cmd.Env = append(os.Environ(), "REDOCLY_TELEMETRY=off", "REDOCLY_SUPPRESS_UPDATE_NOTICE=true")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var report struct {
		Totals struct {
			Errors, Warnings int
		} `json:"totals"`
		Problems []struct {
			RuleID   string `json:"ruleId"`
			Severity string `json:"severity"`
			Message  string `json:"message"`
			Location []struct {
				Pointer string `json:"pointer"`
			} `json:"location"`
		} `json:"problems"`
	}
	if jerr := json.Unmarshal(out, &report); jerr != nil {
		t.Fatalf("redocly lint: %v, %v\n%s\n%s", err, jerr, out, stderr.String())
	}
	meant := map[string]bool{
		"info-license #/info":                                    true,
		"operation-4xx-response #/paths/~1/get/responses":        true,
		"operation-4xx-response #/paths/~1healthz/get/responses": true,
	}
	for _, p := range report.Problems {
		where := ""
		if len(p.Location) > 0 {
			where = p.Location[0].Pointer
		}
		if p.Severity == "error" || !meant[p.RuleID+" "+where] {
			t.Errorf("redocly: %s %s at %s: %s", p.Severity, p.RuleID, where, p.Message)
		}
	}
	if report.Totals.Errors != 0 || err != nil {
		t.Errorf("redocly lint: %d errors, %v", report.Totals.Errors, err)
	}
}
