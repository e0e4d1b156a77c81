package modelsim

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestParseDirectives(t *testing.T) {
	t.Parallel()
	str := func(s string) *string { return &s }
	tests := []struct {
		name string
		in   string
		want directives
	}{
		{"none", "just text", directives{big: -1}},
		{"tool with args", `[[tool:bash {"command":"echo hi"}]]`,
			directives{big: -1, calls: []plannedCall{{"bash", `{"command":"echo hi"}`}}}},
		{"tool args are compacted", "[[tool:bash {\n  \"a\" : [1, 2]\n} ]]",
			directives{big: -1, calls: []plannedCall{{"bash", `{"a":[1,2]}`}}}},
		{"tool without args", `[[tool:todo]]`, directives{big: -1, calls: []plannedCall{{"todo", "{}"}}}},
		{"tool args containing ]]", `[[tool:bash {"command":"echo ]]"}]]`,
			directives{big: -1, calls: []plannedCall{{"bash", `{"command":"echo ]]"}`}}}},
		{"several tools", `[[tool:a {"x":1}]][[tool:b]] text [[tool:c {}]]`,
			directives{big: -1, calls: []plannedCall{{"a", `{"x":1}`}, {"b", "{}"}, {"c", "{}"}}}},
		{"say and after, first wins", "[[say:one]] [[say:two]] [[after:three]] [[after:four]]",
			directives{big: -1, say: str("one"), after: str("three")}},
		{"say keeps spaces and colons", "[[say: a: b ]]", directives{big: -1, say: str(" a: b ")}},
		{"big", "[[big:1024]]", directives{big: 1024}},
		{"slow", "[[slow:150ms]]", directives{big: -1, slow: 150 * time.Millisecond}},
		{"status", "[[status:429]]", directives{big: -1, status: 429, statusN: 1}},
		{"status times", "[[status:503 x3]]", directives{big: -1, status: 503, statusN: 3}},
		{"unknown and colonless brackets are text", "[[foo:bar]] [[baz]] [[ tool:x]]", directives{big: -1}},
		{"everything", `[[slow:1ms]][[status:500]][[say:hi]][[tool:bash {"c":1}]]`,
			directives{big: -1, slow: time.Millisecond, status: 500, statusN: 1, say: str("hi"), calls: []plannedCall{{"bash", `{"c":1}`}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseDirectives(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !equalDirectives(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseDirectives_Errors(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		"[[tool:]]",
		"[[tool: {}]]",
		"[[tool:bash {bad json}]]",
		"[[tool:bash [1,2]]]",
		`[[tool:bash {"a":1}`,
		`[[tool:bash {"a":1} extra]]`,
		"[[say:unterminated",
		"[[big:-1]]",
		"[[big:lots]]",
		"[[big:67108865]]",
		"[[slow:forever]]",
		"[[slow:-1s]]",
		"[[status:200]]",
		"[[status:abc]]",
		"[[status:429 x0]]",
		"[[status:429 3]]",
	} {
		if _, err := parseDirectives(in); !errors.Is(err, errBadRequest) {
			t.Errorf("%q: err = %v, want errBadRequest", in, err)
		}
	}
}

func equalDirectives(a, b directives) bool {
	eqPtr := func(x, y *string) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	if len(a.calls) != len(b.calls) {
		return false
	}
	for i := range a.calls {
		if a.calls[i] != b.calls[i] {
			return false
		}
	}
	return eqPtr(a.say, b.say) && eqPtr(a.after, b.after) && a.big == b.big && a.slow == b.slow &&
		a.status == b.status && a.statusN == b.statusN
}

func TestSplit(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "a", "done", "ok: hello there", "ééééé", "日本語のテキスト", strings.Repeat("x", 100_000), strings.Repeat("é", 20_000)} {
		pieces := split(s)
		if strings.Join(pieces, "") != s {
			t.Errorf("split(%.20q) does not join back", s)
		}
		if len(s) >= 4 && len(pieces) < 2 {
			t.Errorf("split(%.20q) gave %d piece(s)", s, len(pieces))
		}
		for _, p := range pieces {
			if !utf8.ValidString(p) || len(p) > chunkMax || p == "" {
				t.Errorf("split(%.20q): bad piece of %d bytes", s, len(p))
			}
		}
	}
}

func TestStripReminders(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"plain": "plain",
		"<system-reminder>x</system-reminder>\nhi":                                        "hi",
		"\n<system-reminder>a</system-reminder>\n<system-reminder>b</system-reminder> hi": "hi",
		"<system-reminder>unclosed hi":                                                    "<system-reminder>unclosed hi",
		"hi <system-reminder>x</system-reminder>":                                         "hi <system-reminder>x</system-reminder>",
		"<system-reminder>x</system-reminder>[[say:a]]":                                   "[[say:a]]",
		// copilot dates every message after its first.
		"<current_datetime>2026-12-01T05:35:13Z</current_datetime>\n\nwhich word?":      "which word?",
		"<current_datetime>t</current_datetime><system-reminder>x</system-reminder> hi": "hi",
		"<current_datetime>unclosed hi":                                                 "<current_datetime>unclosed hi",
	}
	for in, want := range tests {
		if got := stripReminders(in); got != want {
			t.Errorf("stripReminders(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestBigText(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, 12, 13, 1000} {
		if got := bigText(n); len(got) != n || got != bigText(n) || !strings.HasPrefix(bigText(n+100), got) {
			t.Errorf("bigText(%d) = %.30q", n, got)
		}
	}
	// No word after the filler repeats, so there is no exact cycle for a loop guard to find.
	words := strings.Fields(strings.TrimPrefix(bigText(1<<20), bigFiller))
	seen := map[string]bool{}
	for _, w := range words[:len(words)-1] { // the last word may be cut
		if seen[w] {
			t.Fatalf("word %q repeats", w)
		}
		seen[w] = true
	}
}

// FuzzParseDirectives checks the parser never panics and that what it accepts is sane.
func FuzzParseDirectives(f *testing.F) {
	for _, seed := range []string{
		`[[tool:bash {"command":"echo hi"}]]`, `[[tool:a {"x":"]]"}]][[tool:b]]`, "[[say:x]] [[after:y]]",
		"[[big:10]]", "[[slow:1ms]]", "[[status:429 x2]]", "[[tool:", "[[say:", "[[[[tool:x]]]]", "[[tool:x {}",
		"<system-reminder>\nToday\n</system-reminder>\n[[tool:bash {}]]",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		d, err := parseDirectives(in)
		if err != nil {
			return
		}
		for _, c := range d.calls {
			if c.name == "" || !strings.HasPrefix(c.args, "{") {
				t.Errorf("accepted call %+v", c)
			}
		}
		if d.big > maxBig || d.slow < 0 || (d.status != 0 && (d.status < 400 || d.statusN < 1)) {
			t.Errorf("accepted %+v", d)
		}
	})
}

// FuzzSplit checks pieces always join back and stay within the chunk limit.
func FuzzSplit(f *testing.F) {
	f.Add("done")
	f.Add("héllo wörld")
	f.Add(strings.Repeat("日本", 10000))
	f.Fuzz(func(t *testing.T, s string) {
		pieces := split(s)
		if strings.Join(pieces, "") != s {
			t.Fatalf("pieces do not join back")
		}
		for _, p := range pieces {
			if p == "" || len(p) > chunkMax+utf8.UTFMax {
				t.Fatalf("piece of %d bytes", len(p))
			}
		}
	})
}
