package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// lines hands out what is written to it, line by line.
type lines struct {
	mu  sync.Mutex
	buf bytes.Buffer
	ch  chan string
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for {
		i := bytes.IndexByte(l.buf.Bytes(), '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(l.buf.Next(i + 1))
		select {
		case l.ch <- strings.TrimSuffix(line, "\n"):
		default:
		}
	}
}

// startServe runs serve in-process on a free port; stop ends it (as a
// signal would) and returns its error.
func startServe(t *testing.T, args ...string) (url, token string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &lines{ch: make(chan string, 16)}
	var errOut syncBuf
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...), out, &errOut)
	}()
	var stopped bool
	var stopErr error
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case stopErr = <-done:
			case <-time.After(60 * time.Second):
				t.Fatal("serve did not stop")
			}
		}
		return stopErr
	}
	t.Cleanup(func() { _ = stop() })
	select {
	case line := <-out.ch:
		const prefix = "agenthost: serving rooms at "
		if !strings.HasPrefix(line, prefix) {
			t.Fatalf("start line %q", line)
		}
		url, token, _ = strings.Cut(strings.TrimPrefix(line, prefix), "#token=")
		url = strings.Fields(url)[0]
		return url, token, stop
	case err := <-done:
		stopped, stopErr = true, err
		t.Fatalf("serve ended at start: %v\n%s", err, errOut.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("no start line; stderr:\n%s", errOut.String())
	}
	return "", "", stop
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func call(t *testing.T, method, url, token, body string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// waitTurnEnded follows the room's stream until a turn.ended event.
func waitTurnEnded(t *testing.T, url, token, room string) map[string]any {
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
			if ev["type"] == "turn.ended" {
				return ev
			}
		}
	}
	t.Fatalf("stream ended without turn.ended: %v", sc.Err())
	return nil
}

// The README's first command: serve on omp and the built-in model.
func TestServe_OMPBuiltInModel(t *testing.T) {
	data := t.TempDir()
	t.Setenv("AGENTHOST_TOKEN", "")
	url, token, stop := startServe(t, "--data", data)
	if b, err := os.ReadFile(filepath.Join(data, "token")); err != nil || strings.TrimSpace(string(b)) != token {
		t.Fatalf("token file: %q %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(data, "token")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode: %v %v", fi.Mode(), err)
	}
	if code, _ := call(t, "GET", url+"healthz", "", ""); code != 200 {
		t.Fatalf("healthz: %d", code)
	}
	if code, _ := call(t, "GET", url+"v1/rooms", "wrong", ""); code != 401 {
		t.Fatalf("wrong token: %d", code)
	}
	code, body := call(t, "POST", url+"v1/rooms/demo/messages", token, `{"text":"hello from serve"}`)
	if code != 202 {
		t.Fatalf("post: %d %s", code, body)
	}
	if ev := waitTurnEnded(t, url, token, "demo"); ev["outcome"] != "settled" || ev["text"] != "ok: hello from serve" {
		t.Fatalf("turn ended: %v", ev)
	}

	// A second server on the same data dir refuses.
	_, errs, rc := runCLI(t, "serve", "--listen", "127.0.0.1:0", "--data", data)
	if rc == 0 || !strings.Contains(errs, "already serving the data dir") {
		t.Fatalf("second serve: code %d, %q", rc, errs)
	}

	if err := stop(); err != nil {
		t.Fatalf("serve after the signal: %v", err)
	}
	if left := pgrep(t, data); len(left) > 0 {
		t.Fatalf("processes left running: %v", left)
	}
	// Restarted, the room and its conversation are there, with the same
	// token.
	url, token2, _ := startServe(t, "--data", data)
	if token2 != token {
		t.Fatal("the token changed across a restart")
	}
	code, body = call(t, "GET", url+"v1/rooms/demo/messages", token, "")
	if code != 200 || !strings.Contains(string(body), `"outcome":"settled"`) {
		t.Fatalf("messages after restart: %d %s", code, body)
	}
}

func TestServe_ConfigEnvAndFlags(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "agenthost.toml")
	if err := os.WriteFile(cfg, []byte("# settings\nlisten = \"127.0.0.1:1\"\napproval-mode = 'yolo'\nmax-resident = 3 # comment\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := newServeCmd(func() bool { return false })
	t.Setenv("AGENTHOST_MAX_RESIDENT", "5")
	if err := cmd.ParseFlags([]string{"--listen", "127.0.0.1:9"}); err != nil {
		t.Fatal(err)
	}
	if err := applyOverrides(cmd.Flags(), cfg); err != nil {
		t.Fatal(err)
	}
	get := func(n string) string { return cmd.Flags().Lookup(n).Value.String() }
	if get("listen") != "127.0.0.1:9" || get("max-resident") != "5" || get("approval-mode") != "yolo" {
		t.Fatalf("listen %s max-resident %s approval-mode %s", get("listen"), get("max-resident"), get("approval-mode"))
	}
	yml := filepath.Join(dir, "c.yaml")
	_ = os.WriteFile(yml, []byte("idle-after: 2m\nnope: 1\n"), 0o600)
	if err := applyOverrides(newServeCmd(func() bool { return false }).Flags(), yml); err == nil || !strings.Contains(err.Error(), `unknown setting "nope"`) {
		t.Fatalf("unknown key: %v", err)
	}
	_ = os.WriteFile(yml, []byte("idle-after: soon\n"), 0o600)
	if err := applyOverrides(newServeCmd(func() bool { return false }).Flags(), yml); err == nil || !strings.Contains(err.Error(), "idle-after") {
		t.Fatalf("bad value: %v", err)
	}
	_, errs, rc := runCLI(t, "serve", "--approval-mode", "sometimes", "--data", dir)
	if rc != 2 || !strings.Contains(errs, "approval-mode") {
		t.Fatalf("bad approval mode: %d %q", rc, errs)
	}
}

func TestClientCommands(t *testing.T) {
	data := t.TempDir()
	t.Setenv("AGENTHOST_TOKEN", "")
	url, _, _ := startServe(t, "--data", data)
	t.Setenv("AGENTHOST_URL", url)
	cli := func(args ...string) (string, string, int) {
		return runCLI(t, append(args, "--data", data)...)
	}
	out, errs, code := cli("send", "demo", "hello client", "--follow")
	if code != 0 || out != "ok: hello client\n" || !strings.Contains(errs, "turn started") {
		t.Fatalf("send --follow: code %d out %q err %q", code, out, errs)
	}
	out, errs, code = cli("send", "demo", "Run it: "+`[[tool:bash {"command":"echo approved-by-cli"}]]`)
	if code != 0 || !strings.Contains(out, `"seq":`) {
		t.Fatalf("send: code %d out %q err %q", code, out, errs)
	}
	// Find the approval in the room's events and allow it.
	var approval string
	for approval == "" {
		out, errs, code = cli("events", "demo")
		if code != 0 {
			t.Fatalf("events: %d %q", code, errs)
		}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var ev map[string]any
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				t.Fatalf("events line %q: %v", line, err)
			}
			if ev["type"] == "approval.requested" {
				approval = ev["approval_id"].(string)
			}
		}
		if approval == "" {
			// Wait for the next event rather than poll.
			last := strings.Count(out, "\n")
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			c, _ := (&clientFlags{server: url, data: data}).client()
			_ = c.events(ctx, "demo", int64(last), true, func(string, []byte) (bool, error) { return true, nil })
			cancel()
		}
	}
	if _, errs, code = cli("approve", "demo", approval, "allow"); code != 0 {
		t.Fatalf("approve: %d %q", code, errs)
	}
	if _, errs, code = cli("approve", "demo", approval, "deny"); code == 0 || !strings.Contains(errs, "409") {
		t.Fatalf("approve twice: %d %q", code, errs)
	}
	out, errs, code = cli("rooms")
	if code != 0 || !strings.HasPrefix(out, "demo ") {
		t.Fatalf("rooms: %d %q %q", code, out, errs)
	}
	if _, errs, code = cli("answer", "demo", "q_nope", "x"); code == 0 || !strings.Contains(errs, "404") {
		t.Fatalf("answer unknown: %d %q", code, errs)
	}
	out, errs, code = cli("send", "demo", "[[status:400 x50]] fail please", "--follow")
	if code == 0 {
		t.Fatalf("a failing turn exited 0: %q %q", out, errs)
	}
}

// TestServe_KilledMidTurnEveryMessageEnds: a server killed (SIGKILL)
// during a turn, with another message queued, is restarted on its data
// dir: the running turn ends failed ("host restarted"), the queued
// message runs and settles, and nothing of the dead server is left.
func TestServe_KilledMidTurnEveryMessageEnds(t *testing.T) {
	data := t.TempDir()
	t.Setenv("AGENTHOST_TOKEN", "")
	cmd := exec.Command(os.Args[0], "serve", "--listen", "127.0.0.1:0", "--data", data)
	cmd.Env = append(os.Environ(), serveHelperEnv+"=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errOut syncBuf
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			first <- sc.Text()
		}
		close(first)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var line string
	select {
	case line = <-first:
	case <-time.After(60 * time.Second):
		t.Fatalf("no start line; stderr:\n%s", errOut.String())
	}
	url, token, ok := strings.Cut(strings.TrimPrefix(line, "agenthost: serving rooms at "), "#token=")
	if !ok {
		t.Fatalf("start line %q", line)
	}
	code, body := call(t, "POST", url+"v1/rooms/k/messages", token, `{"text":"slow [[slow:2s]] answer"}`)
	if code != 202 {
		t.Fatalf("post: %d %s", code, body)
	}
	if code, body = call(t, "POST", url+"v1/rooms/k/messages", token, `{"text":"queued behind"}`); code != 202 {
		t.Fatalf("post: %d %s", code, body)
	}
	// Kill once the answer streams.
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := &client{base: url, token: token, hc: http.DefaultClient}
	err = c.events(ctx, "k", 0, true, func(typ string, _ []byte) (bool, error) { return typ == "text.delta", nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true

	url, token2, stop := startServe(t, "--data", data)
	if token2 != token {
		t.Fatal("the token changed")
	}
	c.base = url
	var ended map[string]any
	err = c.events(ctx, "k", 0, true, func(typ string, raw []byte) (bool, error) {
		var d map[string]any
		_ = json.Unmarshal(raw, &d)
		if typ == "turn.ended" && d["outcome"] == "settled" {
			ended = d
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	code, body = call(t, "GET", url+"v1/rooms/k/messages", token, "")
	var msgs struct {
		Messages []struct {
			Text, Status, Outcome, Reason string
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &msgs); code != 200 || err != nil || len(msgs.Messages) != 2 {
		t.Fatalf("messages: %d %s", code, body)
	}
	if m := msgs.Messages[0]; m.Status != "ended" || m.Outcome != "failed" || m.Reason != "host restarted" {
		t.Fatalf("the killed turn's message: %+v", m)
	}
	// The answer may open with the room's transcript: killed during its
	// first turn, the agent may not have written its session file yet, and
	// then the restart starts a fresh session (context.lost).
	if m := msgs.Messages[1]; m.Status != "ended" || m.Outcome != "settled" || !strings.HasPrefix(ended["text"].(string), "ok: ") ||
		!strings.HasSuffix(ended["text"].(string), "queued behind") {
		t.Fatalf("the queued message: %+v, turn %v", m, ended)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if left := pgrep(t, data); len(left) > 0 {
		t.Fatalf("processes left running: %v", left)
	}
}
