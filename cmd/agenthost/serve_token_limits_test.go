package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// serve's token limits take effect: --token-messages-per-minute 2 makes
// a room token's third message of the minute 429 with Retry-After, and
// AGENTHOST_TOKEN_STREAMS=1 (the variable of --token-streams) its second
// open stream; a negative limit is refused (exit 2).
func TestServe_TokenLimitFlags(t *testing.T) {
	t.Setenv("AGENTHOST_TOKEN_STREAMS", "1")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	url, admin, _ := startServe(t, "--data", t.TempDir(), "--token-messages-per-minute", "2",
		"--confine", "off", "--", "/usr/bin/env", fakeAgentEnv+"=1", "GORACE=atexit_sleep_ms=0", exe, "-test.run=^$")
	code, body := call(t, "POST", url+"v1/tokens", admin, `{"rooms":["r"],"can":["read","send"],"label":"limited"}`)
	var tok struct{ Token string }
	if code != http.StatusCreated || json.Unmarshal(body, &tok) != nil {
		t.Fatalf("token: %d %s", code, body)
	}
	for i := range 2 {
		if code, body := call(t, "POST", url+"v1/rooms/r/messages", tok.Token, `{"text":"hi"}`); code != http.StatusAccepted {
			t.Fatalf("message %d: %d %s", i, code, body)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	send := func() *http.Response {
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"v1/rooms/r/messages", strings.NewReader(`{"text":"hi"}`))
		req.Header.Set("Authorization", "Bearer "+tok.Token)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		return res
	}
	res := send()
	if ra, _ := strconv.Atoi(res.Header.Get("Retry-After")); res.StatusCode != http.StatusTooManyRequests || ra < 1 || ra > 60 {
		t.Fatalf("the third message: %d Retry-After %q", res.StatusCode, res.Header.Get("Retry-After"))
	}
	// The admin token has no limit.
	if code, body := call(t, "POST", url+"v1/rooms/r/messages", admin, `{"text":"hi"}`); code != http.StatusAccepted {
		t.Fatalf("the admin's message: %d %s", code, body)
	}
	stream := func() *http.Response {
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"v1/rooms/r/events", nil)
		req.Header.Set("Authorization", "Bearer "+tok.Token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = res.Body.Close() })
		return res
	}
	if res := stream(); res.StatusCode != 200 {
		t.Fatalf("the first stream: %d", res.StatusCode)
	}
	if res := stream(); res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" {
		t.Fatalf("the second stream: %d Retry-After %q", res.StatusCode, res.Header.Get("Retry-After"))
	}
	cancel()

	if _, errs, code := runCLI(t, "serve", "--data", t.TempDir(), "--token-streams", "-1"); code != 2 || !strings.Contains(errs, "--token-streams") {
		t.Fatalf("a negative limit: code %d err %q", code, errs)
	}
}
