package detail

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"curl -H 'Authorization: Bearer sk-live-0123456789abcdefXYZ' http://x": "curl -H 'Authorization: Bearer [redacted]' http://x",
		`{"api_key":"abc123"}`:                                       `{"api_key":"[redacted]"}`,
		"token=abc password: hunter2":                                "token=[redacted] password: [redacted]",
		"use ghp_0123456789abcdefABCD now":                           "use [redacted] now",
		"nothing to see, sk-short":                                   "nothing to see, sk-short",
		"$ echo 'Authorization: Bearer sk-live-0123456789abcdefXYZ'": "$ echo 'Authorization: Bearer [redacted]'",
		// ſ folds to s, but is no word character: a key starts at it.
		// (Matched again alone, this used to panic.)
		"aſk-0123456789abcdef": "a[redacted]",
		// What it must catch.
		"AGENTHOST_TOKEN=operator-secret-1894513586":          "AGENTHOST_TOKEN=[redacted]",
		"export OPENAI_API_KEY='sk-proj-abc'":                 "export OPENAI_API_KEY='[redacted]'",
		"ANTHROPIC_API_KEY: sk-ant-api03-0123456789":          "ANTHROPIC_API_KEY: [redacted]",
		`"access_token": "ya29.a0AfH6S"`:                      `"access_token": "[redacted]"`,
		"authorization: basic dXNlcjpwYXNz":                   "authorization: basic [redacted]",
		"Authorization:Bearer abc":                            "Authorization:Bearer [redacted]",
		"git clone https://x-token:ghs_abc123@github.com/o/r": "git clone https://[redacted]@github.com/o/r",
		"postgres://app:s3cr3t@db:5432/x and more":            "postgres://[redacted]@db:5432/x and more",
		"gh auth: github_pat_11ABCDEFG0123456789_abc":         "gh auth: [redacted]",
		"secret: 'letmein'":                                   "secret: '[redacted]'",
		"password=letmein":                                    "password=[redacted]",
		// What it must leave alone: prose after a name and a colon, a value on the next line.
		"open /root/.config/token: Permission denied": "open /root/.config/token: Permission denied",
		"token: permission denied.":                   "token: permission denied.",
		"reading the token:\nWall time: 0.15 seconds": "reading the token:\nWall time: 0.15 seconds",
		"secret:\n  Wall time":                        "secret:\n  Wall time",
		"password: incorrect, 2 attempts left":        "password: incorrect, 2 attempts left",
		"max_tokens: 4096, tokens: 12":                "max_tokens: 4096, tokens: 12",
		"see https://example.com/a:b@c":               "see https://example.com/a:b@c",
		"mailto user@example.com http://host:8080/":   "mailto user@example.com http://host:8080/",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestText(t *testing.T) {
	const secret = "sk-live-0123456789abcdefXYZ"
	if got := Text("short token="+secret, 100); got != "short token=[redacted]" {
		t.Fatalf("short: %q", got)
	}
	// A credential past the bound is cut, one at the start redacted; the
	// note says how long the text was.
	long := "Authorization: Bearer " + secret + " " + strings.Repeat("é", 5000) + " token=" + secret
	got := Text(long, 200)
	if strings.Contains(got, secret) || !strings.HasPrefix(got, "Authorization: Bearer [redacted] ") ||
		!strings.Contains(got, "bytes in all]") || len(got) > 200+40 || !utf8.ValidString(got) {
		t.Fatalf("long: %q (%d bytes)", got, len(got))
	}
	// Megabytes are not scanned whole.
	huge := strings.Repeat("a", 8<<20)
	if got := Text(huge, 100); len(got) > 140 || !strings.Contains(got, "8388608 bytes in all") {
		t.Fatalf("huge: %q", got)
	}
}

func TestName(t *testing.T) {
	if got := Name("bash\n--rm -rf\t/"); got != "bash --rm -rf /" {
		t.Fatalf("control characters: %q", got)
	}
	if got := Name(strings.Repeat("n", 1000)); len(got) > MaxName+40 {
		t.Fatalf("not bounded: %d bytes", len(got))
	}
	if got := Name("token=sk-live-0123456789abcdefXYZ"); got != "token=[redacted]" {
		t.Fatalf("not redacted: %q", got)
	}
	many := make([]string, MaxNames+10)
	if got := Names(many); len(got) != MaxNames {
		t.Fatalf("%d names kept", len(got))
	}
	if Names(nil) != nil {
		t.Fatal("Names(nil) is not nil")
	}
}

func TestBound(t *testing.T) {
	if got := Bound("héllo", 2); got != "h… [5 bytes cut]" {
		t.Fatalf("%q", got)
	}
	if got := Bound("ok", 10); got != "ok" {
		t.Fatalf("%q", got)
	}
}

// Redact matches what the regular expression replaces over the whole
// text, which it runs only where a keyword starts.
func TestRedact_SameAsWholeScan(t *testing.T) {
	parts := []string{"api", "API", "_", "-", "key", "Key", "token", "TOKEN", "secret", "password", "Passwd", "authorization",
		"sk", "SK", "ghp", "gho", "xoxb", "xoxp", "ſ", "\u212a", "é", " ", "\t", "\n", "=", ":", "\"", "'", "bearer ", "Bearer  ",
		"abcdefghijklmnop", "0123456789", "x", "a", "_z", "/", "\xff", "://", "@", "access", "basic ", "github_pat", "glpat", "Permission"}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 50000 {
		var b strings.Builder
		for range r.IntN(12) {
			b.WriteString(parts[r.IntN(len(parts))])
		}
		s := b.String()
		if got, want := Redact(s), redact(s, wholeScan(s)); got != want {
			t.Fatalf("case %d: Redact(%q) = %q, the whole scan %q", i, s, got, want)
		}
	}
}

func FuzzRedact(f *testing.F) {
	f.Add("curl -H 'Authorization: Bearer sk-live-0123456789abcdefXYZ' http://x token=abc")
	f.Add("xsk-0123456789abcdef ſk-0123456789abcdef")
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := Redact(s), redact(s, wholeScan(s)); got != want {
			t.Fatalf("Redact(%q) = %q, the whole scan %q", s, got, want)
		}
	})
}

func BenchmarkText(b *testing.B) {
	for name, s := range map[string]string{
		"plain":  strings.Repeat("lorem ipsum dolor sit amet ", 400),
		"bearer": "$ curl -H 'Authorization: Bearer sk-live-0123456789abcdefXYZ' " + strings.Repeat("x", 10<<10),
	} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				Text(s, 4<<10)
			}
		})
	}
}
