package server

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// The page is one self-contained document: its script and style inlined,
// nothing loaded from elsewhere, and a CSP that allows exactly those.
func TestPage_SelfContained(t *testing.T) {
	rec := httptest.NewRecorder()
	Page().ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("GET /: %d %q %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	body := rec.Body.String()
	if strings.Contains(body, `src="app.js"`) || strings.Contains(body, `href="style.css"`) {
		t.Fatal("the page still links its files instead of inlining them")
	}
	if regexp.MustCompile(`(?i)(src|href)\s*=\s*"(https?:)?//`).MatchString(body) {
		t.Fatal("the page loads something from another origin")
	}
	csp := rec.Header().Get("Content-Security-Policy")
	for _, tc := range []struct{ open, close, directive string }{
		{"<script>", "</script>", "script-src"},
		{"<style>", "</style>", "style-src"},
	} {
		if strings.Count(body, tc.open) != 1 || strings.Count(body, tc.close) != 1 {
			t.Fatalf("want one %s element", tc.open)
		}
		_, rest, _ := strings.Cut(body, tc.open)
		inline, _, _ := strings.Cut(rest, tc.close)
		sum := sha256.Sum256([]byte(inline))
		want := tc.directive + " 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
		if !strings.Contains(csp, want) {
			t.Fatalf("CSP %q lacks %q", csp, want)
		}
	}
	if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
		t.Fatalf("CSP %q", csp)
	}
}
