package natsroom

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// A node waiting for its peers: the NATS server says "Waiting for routing
// to be established..." every 2 s or so; the log gets it once per 10 s, and
// a different warning at once.
func TestLoggerWarnsOncePer10s(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := &logger{l: slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: &buf}, nil)), now: func() time.Time { return now }}
	for range 330 { // 11 minutes at one every 2 s
		l.Warnf("%s", "Waiting for routing to be established...")
		now = now.Add(2 * time.Second)
	}
	l.Warnf("route %s down", "a")
	l.Warnf("route %s down", "b")
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if n := strings.Count(out, "Waiting for routing"); n != 66 {
		t.Fatalf("%d waiting lines in 11 minutes, want 66 (one per 10 s)", n)
	}
	if !strings.Contains(out, "route a down") || !strings.Contains(out, "route b down") {
		t.Fatalf("a different warning was held back:\n%s", out)
	}
	// Many distinct warnings: the memory of them stays bounded.
	for i := range 1000 {
		l.Warnf("%s", fmt.Sprint("warning ", i))
	}
	if len(l.warned) > maxRepeatKeys {
		t.Fatalf("%d warnings remembered", len(l.warned))
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}
