package detail

import (
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
