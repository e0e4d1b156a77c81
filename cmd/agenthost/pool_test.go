package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// metric is the value line of name{labels} in /metrics ("" when absent).
func metric(t *testing.T, url, token, series string) string {
	t.Helper()
	code, body := call(t, "GET", url+"metrics", token, "")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			return v
		}
	}
	return ""
}

// serve --pool 1 on pi: a new room is bound to the pool's agent
// (agent.started pooled, with its bind time) and its turn runs; /metrics
// counts the pool's agents, the hit and the bind's duration.
func TestServePool(t *testing.T) {
	t.Setenv("AGENTHOST_TOKEN", "")
	data := t.TempDir()
	url, token, stop := startServe(t, "--data", data, "--agent", "pi", "--approval-mode", "yolo", "--pool", "1", "--agent-uids", "off")
	// The pool's agent boots in the background: /metrics says when it is
	// ready (no event does).
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	for metric(t, url, token, `agenthost_pool_agents{state="idle"}`) != "1" {
		select {
		case <-ctx.Done():
			t.Fatal("the pool's agent never became ready")
		case <-time.After(100 * time.Millisecond):
		}
	}
	if code, body := call(t, "POST", url+"v1/rooms/demo/messages", token, `{"text":"[[say:hello from the pool]]"}`); code != 202 {
		t.Fatalf("post: %d %s", code, body)
	}
	started := followEvents(t, url, token, "demo", "agent.started")
	if started["pooled"] != true || started["bind_ms"] == nil {
		t.Fatalf("agent.started %v", started)
	}
	if ev := waitTurnEnded(t, url, token, "demo"); ev["outcome"] != "settled" || ev["text"] != "hello from the pool" {
		t.Fatalf("turn ended: %v", ev)
	}
	if got := metric(t, url, token, "agenthost_pool_hits_total"); got != "1" {
		t.Fatalf("agenthost_pool_hits_total %q", got)
	}
	if got := metric(t, url, token, "agenthost_pool_bind_seconds_count"); got != "1" {
		t.Fatalf("agenthost_pool_bind_seconds_count %q", got)
	}
	if got := metric(t, url, token, `agenthost_pool_misses_total{reason="empty"}`); got != "0" {
		t.Fatalf("misses %q", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// serve --transport acp --pool 1 on codex: a new room is bound to the
// pool's agent and its turn runs; once released, the room's next message
// starts its agent cold (a miss, resume), and /metrics counts both.
func TestServePoolACP(t *testing.T) {
	t.Setenv("AGENTHOST_TOKEN", "")
	data := t.TempDir()
	url, token, stop := startServe(t, "--data", data, "--transport", "acp", "--agent", "codex", "--approval-mode", "yolo", "--pool", "1", "--agent-uids", "off")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	waitMetric := func(series, want string) {
		t.Helper()
		for metric(t, url, token, series) != want {
			select {
			case <-ctx.Done():
				t.Fatalf("%s never became %s", series, want)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	// The pool's agent boots in the background: /metrics says when it
	// is ready (no event does).
	waitMetric(`agenthost_pool_agents{state="idle"}`, "1")
	if code, body := call(t, "POST", url+"v1/rooms/demo/messages", token, `{"text":"[[say:hello from the pool]]"}`); code != 202 {
		t.Fatalf("post: %d %s", code, body)
	}
	started := followEvents(t, url, token, "demo", "agent.started")
	if started["pooled"] != true || started["bind_ms"] == nil {
		t.Fatalf("agent.started %v", started)
	}
	if ev := waitTurnEnded(t, url, token, "demo"); ev["outcome"] != "settled" || !strings.Contains(ev["text"].(string), "hello from the pool") {
		t.Fatalf("turn ended: %v", ev)
	}
	if got := metric(t, url, token, "agenthost_pool_hits_total"); got != "1" {
		t.Fatalf("agenthost_pool_hits_total %q", got)
	}
	if code, body := call(t, "DELETE", url+"v1/rooms/demo", token, ""); code != 200 {
		t.Fatalf("release: %d %s", code, body)
	}
	if code, body := call(t, "POST", url+"v1/rooms/demo/messages", token, `{"text":"[[say:again]]"}`); code != 202 {
		t.Fatalf("post: %d %s", code, body)
	}
	waitMetric(`agenthost_pool_misses_total{reason="resume"}`, "1")
	if got := metric(t, url, token, "agenthost_pool_hits_total"); got != "1" {
		t.Fatalf("agenthost_pool_hits_total %q after the woken room", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
