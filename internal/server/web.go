package server

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"github.com/agenthost/agenthost/event"
)

// The page's files live in web/ so they can be edited (and opened) as
// plain files; Page inlines style.css and app.js into index.html so that
// one document at GET / is the whole page and the API keeps its routes.
//
//go:embed web/index.html web/app.js web/style.css
var webFiles embed.FS

const (
	styleTag  = `<link rel="stylesheet" href="style.css">`
	scriptTag = `<script src="app.js"></script>`
)

// page is the inlined document and its Content-Security-Policy: only the
// inlined script and style run, and the page talks to its own origin only
// (the token it holds goes nowhere else).
type page struct {
	html []byte
	csp  string
	err  error
}

var buildPage = sync.OnceValue(func() page {
	var files [3][]byte
	for i, name := range []string{"index.html", "app.js", "style.css"} {
		b, err := webFiles.ReadFile("web/" + name)
		if err != nil {
			return page{err: fmt.Errorf("server: the page: %w", err)}
		}
		files[i] = b
	}
	html, js, css := string(files[0]), files[1], files[2]
	if !strings.Contains(html, styleTag) || !strings.Contains(html, scriptTag) {
		return page{err: fmt.Errorf("server: web/index.html lacks %s or %s", styleTag, scriptTag)}
	}
	if bytes.Contains(bytes.ToLower(js), []byte("</script")) || bytes.Contains(bytes.ToLower(css), []byte("</style")) {
		return page{err: fmt.Errorf("server: web/app.js or style.css would end its inline element")}
	}
	hash := func(b []byte) string {
		h := sha256.Sum256(b)
		return "'sha256-" + base64.StdEncoding.EncodeToString(h[:]) + "'"
	}
	html = strings.Replace(html, styleTag, "<style>"+string(css)+"</style>", 1)
	js = append(eventNames(), js...)
	html = strings.Replace(html, scriptTag, "<script>"+string(js)+"</script>", 1)
	csp := "default-src 'none'; script-src " + hash(js) + "; style-src " + hash(css) +
		"; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
	return page{html: []byte(html), csp: csp}
})

// eventNames is the page's table of event types, EV, made from package
// event (EV.TurnEnded is "turn.ended"), so the page names events as the
// server writes them; app.js uses no other.
func eventNames() []byte {
	var b bytes.Buffer
	b.WriteString("\"use strict\";\n// Event types, from the Go package event.\nconst EV = Object.freeze({")
	for i, p := range event.Types() {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s: %q", reflect.TypeOf(p).Name(), p.EventType())
	}
	b.WriteString("});\n")
	return b.Bytes()
}

// Page returns the handler of the web page, for Options.Index.
func Page() http.Handler {
	p := buildPage()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.err != nil {
			writeError(w, http.StatusInternalServerError, p.err.Error())
			return
		}
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Content-Security-Policy", p.csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		h.Set("Content-Length", strconv.Itoa(len(p.html)))
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			_, _ = w.Write(p.html)
		}
	})
}
