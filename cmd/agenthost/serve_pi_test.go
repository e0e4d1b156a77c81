package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// followEvents follows the room's stream from the start until an event of
// type typ and returns it.
func followEvents(t *testing.T, url, token, room, typ string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"v1/rooms/"+room+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var ev map[string]any
			if err := json.Unmarshal([]byte(d), &ev); err != nil {
				t.Fatal(err)
			}
			if ev["type"] == typ {
				return ev
			}
		}
	}
	t.Fatalf("stream ended without %s: %v", typ, sc.Err())
	return nil
}

// serve --agent pi asks before pi runs a tool (the default always-ask), as
// it does on omp, and says at start what pi rooms cannot do.
func TestServe_PiAsksAndNamesItsGaps(t *testing.T) {
	data := t.TempDir()
	t.Setenv("AGENTHOST_TOKEN", "")
	ctx, cancel := context.WithCancel(context.Background())
	out := &lines{ch: make(chan string, 16)}
	var errOut syncBuf
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0", "--data", data, "--agent", "pi"}, out, &errOut)
	}()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Error("serve did not stop")
		}
	}()
	next := func() string {
		select {
		case line := <-out.ch:
			return line
		case err := <-done:
			done <- err
			t.Fatalf("serve ended: %v\n%s", err, errOut.String())
		case <-time.After(60 * time.Second):
			t.Fatalf("no line from serve; stderr:\n%s", errOut.String())
		}
		return ""
	}
	start := next()
	url, token, ok := strings.Cut(strings.TrimPrefix(start, "agenthost: serving rooms at "), "#token=")
	if !ok {
		t.Fatalf("start line %q", start)
	}
	for line := next(); ; line = next() {
		if strings.HasPrefix(line, "agenthost: pi rooms cannot keep ") {
			if !strings.Contains(line, `"mcp": pi has no MCP client`) {
				t.Fatalf("gap line %q", line)
			}
			break
		}
		if !strings.HasPrefix(line, "agenthost: the API token") {
			t.Fatalf("unexpected line %q", line)
		}
	}

	code, body := call(t, "POST", url+"v1/rooms/demo/messages", token,
		`{"text":"Run it: [[tool:bash {\"command\":\"echo ran > denied.txt\"}]]"}`)
	if code != 202 {
		t.Fatalf("post: %d %s", code, body)
	}
	req := followEvents(t, url, token, "demo", "approval.requested")
	if req["tool"] != "bash" || !strings.Contains(req["input"].(string), "denied.txt") {
		t.Fatalf("approval: %v", req)
	}
	if code, body := call(t, "POST", url+"v1/rooms/demo/approvals/"+req["approval_id"].(string), token, `{"decision":"deny"}`); code != 200 {
		t.Fatalf("deny: %d %s", code, body)
	}
	if ev := waitTurnEnded(t, url, token, "demo"); ev["outcome"] != "settled" {
		t.Fatalf("turn ended: %v", ev)
	}
	if ran, _ := filepath.Glob(filepath.Join(data, "workspaces", "*", "denied.txt")); len(ran) != 0 {
		t.Fatalf("the denied command ran: %v", ran)
	}
}
