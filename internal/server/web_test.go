package server

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/event"
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

// The page names events only through EV, the table made from package
// event, so a type the server renames cannot be missed by the page.
func TestPage_EventNamesFromTheGoTypes(t *testing.T) {
	js, err := webFiles.ReadFile("web/app.js")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range event.Types() {
		if typ := p.EventType(); strings.Contains(string(js), `"`+typ+`"`) || strings.Contains(string(js), `'`+typ+`'`) {
			t.Errorf("app.js names %s as a string: use EV.%s", typ, reflect.TypeOf(p).Name())
		}
	}
	used := regexp.MustCompile(`\bEV\.([A-Za-z]+)`).FindAllStringSubmatch(string(js), -1)
	if len(used) == 0 {
		t.Fatal("app.js uses no EV entry")
	}
	for _, u := range used {
		if !strings.Contains(string(eventNames()), " "+u[1]+": ") && !strings.Contains(string(eventNames()), "{"+u[1]+": ") {
			t.Errorf("app.js uses EV.%s, which package event does not define", u[1])
		}
	}
}
