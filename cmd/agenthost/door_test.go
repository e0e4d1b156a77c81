package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// postKeyed posts a message with an Idempotency-Key and returns the
// status and the answer.
func postKeyed(t *testing.T, url, token, rm, key, text string) (int, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"v1/rooms/"+rm+"/messages", strings.NewReader(`{"text":`+fmt.Sprintf("%q", text)+`}`))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return res.StatusCode, m
}

// countTypes counts the room's events by type (a whole replay).
func countTypes(t *testing.T, url, token, rm string) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out := map[string]int{}
	err := newTestClient(t, url, token).events(ctx, rm, 0, false, func(typ string, raw []byte) (bool, error) {
		out[typ]++
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A message sent with an Idempotency-Key, and again with it after serve
// restarted on the same data: the same answer, one message, one turn.
func TestServe_IdempotentSubmitAcrossARestart(t *testing.T) {
	data := t.TempDir()
	t.Setenv(tokenEnv, "t0ken-idem")
	args := append([]string{"--data", data, "--confine", "off"}, fakeAgentArgs(t)...)
	url, _, stop := startServe(t, args...)
	token := "t0ken-idem"
	code, first := postKeyed(t, url, token, "k", "key-across", "hello")
	if code != http.StatusAccepted {
		t.Fatalf("first: %d %v", code, first)
	}
	waitTurnEnded(t, url, token, "k")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	url, _, _ = startServe(t, args...)
	code, again := postKeyed(t, url, token, "k", "key-across", "hello")
	if code != http.StatusAccepted || fmt.Sprint(again) != fmt.Sprint(first) {
		t.Fatalf("after the restart: %d %v, first %v", code, again, first)
	}
	if n := countTypes(t, url, token, "k"); n["message.accepted"] != 1 || n["turn.started"] != 1 {
		t.Fatalf("events %v: want one message and one turn", n)
	}
	if code, other := postKeyed(t, url, token, "k", "key-across", "bye"); code != http.StatusUnprocessableEntity {
		t.Fatalf("the key with another message: %d %v", code, other)
	}
}

// purge_follow_cli (review-api F7): agenthost events --follow across a
// purge and the id's new room: the old room's events, a reset line, then
// every event of the new room once, from 1 (before, it went on at the old
// room's last seq, skipping the new room's first events).
func TestEventsFollow_AcrossPurgeAndRecreate(t *testing.T) {
	t.Setenv(tokenEnv, "t0ken-follow")
	url, _, _ := startServe(t, append([]string{"--data", t.TempDir(), "--confine", "off"}, fakeAgentArgs(t)...)...)
	token := "t0ken-follow"
	for _, text := range []string{"first OLD message", "second OLD message"} {
		if _, errs, code := runCLI(t, "send", "r", text, "--follow", "--server", url); code != 0 {
			t.Fatalf("send: %d %s", code, errs)
		}
	}
	lines := func(c *cliRun) []map[string]any {
		var out []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(c.out.String()), "\n") {
			if l == "" {
				continue
			}
			var ev map[string]any
			if err := json.Unmarshal([]byte(l), &ev); err != nil {
				t.Fatalf("line %q: %v", l, err)
			}
			out = append(out, ev)
		}
		return out
	}
	waitLines := func(c *cliRun, n int) []map[string]any {
		for deadline := time.Now().Add(time.Minute); ; {
			if evs := lines(c); len(evs) >= n {
				return evs
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d lines of %d; stderr:\n%s", len(lines(c)), n, c.errAll.String())
			}
			<-time.After(10 * time.Millisecond) // polling the command's output, which has no event of its own
		}
	}
	_, body := call(t, "GET", url+"v1/rooms/r", token, "")
	var old struct {
		LastSeq     int64 `json:"last_seq"`
		Incarnation string
	}
	_ = json.Unmarshal(body, &old)
	c := startCLI(t, "events", "r", "--follow", "--server", url, "--timeout", "100s")
	waitLines(c, int(old.LastSeq))
	if code, b := call(t, "DELETE", url+"v1/rooms/r?purge=true", token, ""); code != http.StatusOK {
		t.Fatalf("purge: %d %s", code, b)
	}
	for _, text := range []string{"NEW room message one", "NEW room message two", "NEW room message three"} {
		if _, errs, code := runCLI(t, "send", "r", text, "--follow", "--server", url); code != 0 {
			t.Fatalf("send: %d %s", code, errs)
		}
	}
	_, body = call(t, "GET", url+"v1/rooms/r", token, "")
	var now struct {
		LastSeq     int64 `json:"last_seq"`
		Incarnation string
	}
	_ = json.Unmarshal(body, &now)
	if now.LastSeq <= old.LastSeq || now.Incarnation == old.Incarnation {
		t.Fatalf("the new room %+v, the old %+v", now, old)
	}
	evs := waitLines(c, int(old.LastSeq+now.LastSeq)+1)
	c.cancel()
	var seqs []string
	for _, ev := range evs {
		seqs = append(seqs, fmt.Sprintf("%v:%v", ev["seq"], ev["type"]))
	}
	i := int(old.LastSeq)
	if evs[i]["type"] != "reset" {
		t.Fatalf("no reset after the old room's %d events: %v", old.LastSeq, seqs)
	}
	rest := evs[i+1:]
	for len(rest) > 0 && rest[0]["type"] == "reset" {
		rest = rest[1:] // a second, naming the new room, when it came back after it was made
	}
	if int64(len(rest)) != now.LastSeq {
		t.Fatalf("%d of the new room's %d events: %v", len(rest), now.LastSeq, seqs)
	}
	for j, ev := range rest {
		if ev["seq"] != float64(j+1) {
			t.Fatalf("the new room's events out of order: %v", seqs)
		}
	}
	if !strings.Contains(c.errAll.String(), "room r's events start again: the room was deleted") {
		t.Fatalf("stderr says nothing of the reset:\n%s", c.errAll.String())
	}
}

// In a cluster: one message sent with one Idempotency-Key through two
// nodes at once, then through the third: the same answer everywhere, one
// message and one turn in the room.
func TestServe_NATSClusterIdempotentSubmit(t *testing.T) {
	if os.Getenv("AGENTHOST_CLUSTER_TESTS") == "" {
		t.Skip("set AGENTHOST_CLUSTER_TESTS=1 (make test does) to run the cluster process tests")
	}
	token := "cluster-idem-token"
	nodes := startServeCluster(t, token, false, [3]string{})
	type answer struct {
		code int
		body map[string]any
	}
	answers := make([]answer, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			code, body := postKeyed(t, nodes[i].url, token, "ik", "cluster-key", "hello")
			answers[i] = answer{code, body}
		})
	}
	wg.Wait()
	for i, a := range answers {
		if a.code != http.StatusAccepted || a.body["id"] != answers[0].body["id"] {
			t.Fatalf("through n%d: %d %v (n1: %v)", i+1, a.code, a.body, answers[0].body)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := answers[0].body["id"]
	err := newTestClient(t, nodes[2].url, token).events(ctx, "ik", 0, true, func(typ string, raw []byte) (bool, error) {
		var d map[string]any
		_ = json.Unmarshal(raw, &d)
		return typ == "message.ended" && d["message_id"] == id, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	code, third := postKeyed(t, nodes[2].url, token, "ik", "cluster-key", "hello")
	if code != http.StatusAccepted || third["id"] != id || third["seq"] == 0.0 || third["seq"] == nil {
		t.Fatalf("through n3, after: %d %v", code, third)
	}
	for _, a := range answers {
		if a.body["seq"] != nil && a.body["seq"] != 0.0 && a.body["seq"] != third["seq"] {
			t.Fatalf("seqs differ: %v and %v", a.body, third)
		}
	}
	if n := countTypes(t, nodes[0].url, token, "ik"); n["message.accepted"] != 1 || n["turn.started"] != 1 {
		t.Fatalf("events %v: want one message and one turn", n)
	}
	if code, other := postKeyed(t, nodes[1].url, token, "ik", "cluster-key", "bye"); code != http.StatusUnprocessableEntity {
		t.Fatalf("the key with another message: %d %v", code, other)
	}
}

// agenthost send sends its message with an Idempotency-Key and, after a
// 503, sends it again with the same key.
func TestSend_SentAgainWithOneKey(t *testing.T) {
	t.Setenv(tokenEnv, "t0ken")
	var mu sync.Mutex
	var keys []string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		n := len(keys)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"error":"the server is shutting down"}`)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprint(w, `{"id":"m_1","seq":3}`)
	}))
	defer ts.Close()
	out, errs, code := runCLI(t, "send", "r", "hello", "--server", ts.URL)
	if code != 0 || strings.TrimSpace(out) != "m_1 3" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] {
		t.Fatalf("Idempotency-Keys %q", keys)
	}
}

// The page of a room that is purged and made again under its id starts
// over (issue 47 item 3): it shows the new room's conversation and none of
// the old one's, though the new room's events start at 1 again.
func TestServePagePurgedRoomStartsOver_Chromium(t *testing.T) {
	ctx := newBrowser(t)
	t.Setenv(tokenEnv, "t0ken-page")
	url, _, _ := startServe(t, append([]string{"--data", t.TempDir(), "--confine", "off"}, fakeAgentArgs(t)...)...)
	token := "t0ken-page"
	for _, text := range []string{"old one", "old two"} {
		if code, b := call(t, "POST", url+"v1/rooms/pg/messages", token, `{"text":"`+text+`"}`); code != http.StatusAccepted {
			t.Fatalf("post: %d %s", code, b)
		}
	}
	users := `[...document.querySelectorAll("#log .msg.user .text")].map(e => e.textContent).join("|")`
	act(t, ctx, "opening the room", chromedp.Navigate(url+"#token="+token+"&room=pg"))
	waitFor(t, ctx, "the old room's messages and answers", users+` === "old one|old two" && document.querySelectorAll("#log .msg.assistant[data-outcome=settled]").length === 2`)
	if code, b := call(t, "DELETE", url+"v1/rooms/pg?purge=true", token, ""); code != http.StatusOK {
		t.Fatalf("purge: %d %s", code, b)
	}
	// The page hears of the purge and starts over on an empty room.
	waitFor(t, ctx, "the page to forget the purged room", users+` === ""`)
	if code, b := call(t, "POST", url+"v1/rooms/pg/messages", token, `{"text":"new one"}`); code != http.StatusAccepted {
		t.Fatalf("post: %d %s", code, b)
	}
	waitFor(t, ctx, "the new room's message and answer", users+` === "new one" && document.querySelectorAll("#log .msg.assistant[data-outcome=settled]").length === 1`)
}
