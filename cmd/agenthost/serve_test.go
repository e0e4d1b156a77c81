package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/roomtest"
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
func startServe(t testing.TB, args ...string) (url, token string, stop func() error) {
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
	// The confinement's keys, confine_net as the issue spells it.
	_ = os.WriteFile(yml, []byte("confine: \"off\"\nconfine_net: 443,80\n"), 0o600)
	cmd = newServeCmd(func() bool { return false })
	if err := applyOverrides(cmd.Flags(), yml); err != nil {
		t.Fatal(err)
	}
	if get := cmd.Flags().Lookup; get("confine").Value.String() != "off" || get("confine-net").Value.String() != "443,80" {
		t.Fatalf("confine %s, confine-net %s", get("confine").Value, get("confine-net").Value)
	}
	_ = os.WriteFile(yml, []byte("confine_net: 443\nconfine-net: 80\n"), 0o600)
	if err := applyOverrides(newServeCmd(func() bool { return false }).Flags(), yml); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("a key given twice: %v", err)
	}
	// The git workspaces' file roots: a list, from a config file or the environment.
	_ = os.WriteFile(yml, []byte("git_file_roots: /srv/a,/srv/b\n"), 0o600)
	cmd = newServeCmd(func() bool { return false })
	if err := applyOverrides(cmd.Flags(), yml); err != nil || cmd.Flags().Lookup("git-file-roots").Value.String() != "[/srv/a,/srv/b]" {
		t.Fatalf("git_file_roots: %v %s", err, cmd.Flags().Lookup("git-file-roots").Value)
	}
	t.Setenv("AGENTHOST_GIT_FILE_ROOTS", "/srv/c")
	cmd = newServeCmd(func() bool { return false })
	if err := applyOverrides(cmd.Flags(), yml); err != nil || cmd.Flags().Lookup("git-file-roots").Value.String() != "[/srv/c]" {
		t.Fatalf("AGENTHOST_GIT_FILE_ROOTS: %v %s", err, cmd.Flags().Lookup("git-file-roots").Value)
	}
	t.Setenv("AGENTHOST_CONFINE", "landlock")
	cmd = newServeCmd(func() bool { return false })
	if err := applyOverrides(cmd.Flags(), ""); err != nil || cmd.Flags().Lookup("confine").Value.String() != "landlock" {
		t.Fatalf("AGENTHOST_CONFINE: %v %s", err, cmd.Flags().Lookup("confine").Value)
	}
	for _, bad := range [][]string{{"--confine", "sandbox"}, {"--confine-net", "http"}} {
		_, errs, rc := runCLI(t, append([]string{"serve", "--data", dir}, bad...)...)
		if rc != 2 || !strings.Contains(errs, "confine") {
			t.Fatalf("%v: %d %q", bad, rc, errs)
		}
	}
	// --agent-uids: the default range, the key agent_uids, AGENTHOST_AGENT_UIDS, off.
	cmd = newServeCmd(func() bool { return false })
	if got := cmd.Flags().Lookup("agent-uids").Value.String(); got != "2000000000-2000999999" {
		t.Fatalf("agent-uids default %s", got)
	}
	_ = os.WriteFile(yml, []byte("agent_uids: 100000-100999\n"), 0o600)
	if err := applyOverrides(cmd.Flags(), yml); err != nil || cmd.Flags().Lookup("agent-uids").Value.String() != "100000-100999" {
		t.Fatalf("agent_uids: %v %s", err, cmd.Flags().Lookup("agent-uids").Value)
	}
	t.Setenv("AGENTHOST_AGENT_UIDS", "off")
	cmd = newServeCmd(func() bool { return false })
	if err := applyOverrides(cmd.Flags(), yml); err != nil || cmd.Flags().Lookup("agent-uids").Value.String() != "off" {
		t.Fatalf("AGENTHOST_AGENT_UIDS: %v %s", err, cmd.Flags().Lookup("agent-uids").Value)
	}
	for _, bad := range []string{"1000-2000", "7-", "many"} {
		_, errs, rc := runCLI(t, "serve", "--data", dir, "--agent-uids", bad)
		if rc != 2 || !strings.Contains(errs, "agent uids") {
			t.Fatalf("--agent-uids %s: %d %q", bad, rc, errs)
		}
	}
}

// serve --confine landlock --confine-net PORTS: the room's agent (pi) and
// its tools reach only the room's own folders and the listed ports plus the
// built-in model's; the room's state and agent.started say so.
func TestServe_Confinement(t *testing.T) {
	data := t.TempDir()
	url, token, _ := startServe(t, "--data", data, "--agent", "pi", "--approval-mode", "yolo", "--confine", "landlock", "--confine-net", "1")
	if code, body := call(t, "POST", url+"v1/rooms/a/messages", token, `{"text":"hello"}`); code != 202 {
		t.Fatalf("post: %d %s", code, body)
	}
	if ev := waitTurnEnded(t, url, token, "a"); ev["outcome"] != "settled" {
		t.Fatalf("turn ended: %v", ev)
	}
	ws, _ := filepath.Glob(filepath.Join(data, "workspaces", "a-*"))
	if len(ws) != 1 {
		t.Fatalf("room a's workspace: %v", ws)
	}
	other := filepath.Join(data, "workspaces", "b-0000")
	if err := os.MkdirAll(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "secret.txt"), []byte("room b's secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	probe := roomtest.Probe{Other: filepath.Join(other, "secret.txt"), Store: filepath.Join(data, "agenthost.db"), PID: os.Getpid(),
		Port: ln.Addr().(*net.TCPAddr).Port}
	probe.WriteProbe(t, ws[0])
	body, _ := json.Marshal(map[string]string{"text": "Probe: " + roomtest.BashCall("bash "+roomtest.ProbeScript)})
	if code, b := call(t, "POST", url+"v1/rooms/a/messages", token, string(body)); code != 202 {
		t.Fatalf("post: %d %s", code, b)
	}
	var started, state struct{ Confinement json.RawMessage }
	var output, outcome string
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	c := newTestClient(t, url, token)
	err = c.events(ctx, "a", 0, true, func(typ string, data []byte) (bool, error) {
		var ev struct {
			Output, Outcome string
		}
		_ = json.Unmarshal(data, &ev)
		switch {
		case typ == "agent.started":
			_ = json.Unmarshal(data, &started)
		case typ == "tool.ended" && strings.Contains(ev.Output, "own="):
			output = ev.Output
		case typ == "turn.ended" && output != "":
			outcome = ev.Outcome
		}
		return outcome != "", nil
	})
	if err != nil || outcome != "settled" {
		t.Fatalf("the probe's turn ended %q: %v", outcome, err)
	}
	roomtest.CheckConfined(t, roomtest.ParseProbe(output), true)
	code, b := call(t, "GET", url+"v1/rooms/a", token, "")
	if code != 200 || json.Unmarshal(b, &state) != nil {
		t.Fatalf("room: %d %s", code, b)
	}
	abi := min(confine.KernelABI(), confine.MaxABI)
	want := fmt.Sprintf(`{"mode":"landlock","abi":%d,"signals":%v,"net":[1,`, abi, abi >= 6)
	if !strings.HasPrefix(string(state.Confinement), want) || string(started.Confinement) != string(state.Confinement) {
		t.Fatalf("the room's confinement %s, agent.started's %s, want %s<the model's port>]}", state.Confinement, started.Confinement, want)
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
	c := newTestClient(t, url, token)
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
	c = newTestClient(t, url, token)
	var ended map[string]any
	lost := false
	err = c.events(ctx, "k", 0, true, func(typ string, raw []byte) (bool, error) {
		var d map[string]any
		_ = json.Unmarshal(raw, &d)
		lost = lost || typ == "context.lost"
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
	// The prompt may open with the room's transcript: killed during its
	// first turn, the agent may not have written its session file yet, and
	// then the restart starts a fresh session (context.lost). The model
	// echoes the prompt's first 40 bytes: the transcript's opening then.
	text, _ := ended["text"].(string)
	echoed := strings.HasSuffix(text, "queued behind") ||
		lost && strings.HasPrefix(text, "ok: [The previous agent session")
	if m := msgs.Messages[1]; m.Status != "ended" || m.Outcome != "settled" || !strings.HasPrefix(text, "ok: ") || !echoed {
		t.Fatalf("the queued message: %+v, turn %v (context.lost: %v)", m, ended, lost)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if left := pgrep(t, data); len(left) > 0 {
		t.Fatalf("processes left running: %v", left)
	}
}

// serve --git-file-roots: file:// workspaces only under the listed
// folders, never into the data dir (another room's workspace or
// snapshots) even when a root holds it, and none by default.
func TestServe_GitFileRoots(t *testing.T) {
	root := t.TempDir()
	repo := filepath.Join(root, "repo")
	for _, args := range [][]string{{"init", "-q", "-b", "main", repo},
		{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "--allow-empty", "-m", "x"}} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	other := t.TempDir()
	data := filepath.Join(root, "data")
	put := func(url, tok, rm, git string) (int, string) {
		code, body := call(t, "PUT", url+"v1/rooms/"+rm+"/config", tok, `{"workspace":{"git":"file://`+git+`","ref":"main"}}`)
		return code, string(body)
	}
	t.Setenv("AGENTHOST_GIT_FILE_ROOTS", root)
	url, tok, stop := startServe(t, append([]string{"--data", data}, fakeAgentArgs(t)...)...)
	if code, body := put(url, tok, "a", repo); code != 200 {
		t.Fatalf("a repository under the root: %d %s", code, body)
	}
	for _, p := range []string{data, filepath.Join(data, "workspaces"), filepath.Join(data, "rooms"), filepath.Join(data, "git", "mirrors")} {
		if code, body := put(url, tok, "b", p); code != 400 || !strings.Contains(body, "server's own folders") {
			t.Errorf("file://%s: %d %s", p, code, body)
		}
	}
	if code, body := put(url, tok, "c", other); code != 400 || !strings.Contains(body, "allowed only under "+root) {
		t.Errorf("a folder outside the root: %d %s", code, body)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AGENTHOST_GIT_FILE_ROOTS", "")
	url, tok, _ = startServe(t, append([]string{"--data", data}, fakeAgentArgs(t)...)...)
	if code, body := put(url, tok, "d", repo); code != 400 || !strings.Contains(body, "not allowed on this server") {
		t.Errorf("file:// with no --git-file-roots: %d %s", code, body)
	}
}

// The data dir and what the server keeps there are the server's alone
// (0700; the token and the store's files 0600), a looser data dir narrowed
// at start: what an agent of a server sharing its uid can chmod by path
// is then all another user could read. A server run as root gives each
// room's agent a uid of its own from --agent-uids: each room's folder
// records it (agent-uid, 0600, the server's), no two rooms share one, and
// it owns the room's workspace and home.
func TestServe_AgentUIDsAndPrivateData(t *testing.T) {
	data := t.TempDir()
	if err := os.Chmod(data, 0o755); err != nil {
		t.Fatal(err)
	}
	url, token, stop := startServe(t, "--data", data, "--agent", "pi", "--approval-mode", "yolo", "--confine", "landlock",
		"--agent-uids", "3000000-3000009")
	for _, r := range []string{"a", "b"} {
		if code, body := call(t, "POST", url+"v1/rooms/"+r+"/messages", token, `{"text":"hello"}`); code != 202 {
			t.Fatalf("post: %d %s", code, body)
		}
		if ev := waitTurnEnded(t, url, token, r); ev["outcome"] != "settled" {
			t.Fatalf("room %s: turn ended %v", r, ev)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mode := func(p string) os.FileMode {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	if m := mode(data); m != 0o700 {
		t.Errorf("the data dir: %v", m)
	}
	for _, n := range []string{"token", "agenthost.db", "agenthost.db-wal", "agenthost.db-shm", "agenthost.db.lock"} {
		if _, err := os.Stat(filepath.Join(data, n)); err == nil && mode(filepath.Join(data, n)) != 0o600 {
			t.Errorf("%s: %v", n, mode(filepath.Join(data, n)))
		}
	}
	// Rooms get uids where the server runs as root and the launcher runs
	// agents as them.
	cf, err := confine.New(confine.Options{Mode: confine.ModeLandlock, AgentUIDs: confine.DefaultAgentUIDs})
	if err != nil {
		t.Fatal(err)
	}
	inForce := !cf.AgentUsers().Empty()
	if !inForce {
		t.Log("rooms get no uid of their own here (not root, or the launcher does not switch users): the rooms' folders are checked to have none")
	}
	uids := map[int]string{}
	for _, r := range []string{"a", "b"} {
		dirs, _ := filepath.Glob(filepath.Join(data, "rooms", r+"-*"))
		ws, _ := filepath.Glob(filepath.Join(data, "workspaces", r+"-*"))
		if len(dirs) != 1 || len(ws) != 1 {
			t.Fatalf("room %s: %v %v", r, dirs, ws)
		}
		b, err := os.ReadFile(filepath.Join(dirs[0], "agent-uid"))
		if !inForce {
			if err == nil {
				t.Fatalf("room %s has a uid it does not run as: %s", r, b)
			}
			continue
		}
		var rec struct{ UID, GID int }
		if err != nil || json.Unmarshal(b, &rec) != nil || rec.UID < 3000000 || rec.UID > 3000009 || rec.GID != rec.UID {
			t.Fatalf("room %s's agent-uid: %s, %v", r, b, err)
		}
		if other, dup := uids[rec.UID]; dup {
			t.Fatalf("rooms %s and %s share uid %d", other, r, rec.UID)
		}
		uids[rec.UID] = r
		if m := mode(filepath.Join(dirs[0], "agent-uid")); m != 0o600 {
			t.Errorf("room %s's agent-uid: %v", r, m)
		}
		for _, p := range []string{filepath.Join(dirs[0], "home"), ws[0], filepath.Join(dirs[0], "home", "sessions"), filepath.Join(dirs[0], "home", ".pi", "agent", "models.json")} {
			fi, err := os.Lstat(p)
			if err != nil {
				t.Fatal(err)
			}
			if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != rec.UID {
				t.Errorf("room %s: %s owned by %d, want %d", r, p, st.Uid, rec.UID)
			}
		}
		for _, p := range []string{dirs[0], filepath.Join(dirs[0], "agent-uid")} {
			fi, _ := os.Lstat(p)
			if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 {
				t.Errorf("room %s: %s owned by %d, want the server", r, p, st.Uid)
			}
		}
	}
}

// --question-timeout is every room's question deadline (a room's
// question_timeout replaces it); the config file takes it as
// question_timeout, and a bad value is a usage error.
func TestServe_QuestionTimeout(t *testing.T) {
	url, token, _ := startServe(t, "--data", t.TempDir(), "--question-timeout", "90s")
	code, b := call(t, "PUT", url+"v1/rooms/q/config", token, `{}`)
	if code != 200 || !strings.Contains(string(b), `"question_timeout":"1m30s"`) {
		t.Fatalf("the server's default: %d %s", code, b)
	}
	code, b = call(t, "PUT", url+"v1/rooms/q/config", token, `{"question_timeout":"2h"}`)
	if code != 200 || !strings.Contains(string(b), `"question_timeout":"2h0m0s"`) {
		t.Fatalf("the room's own: %d %s", code, b)
	}
	yml := filepath.Join(t.TempDir(), "c.yaml")
	_ = os.WriteFile(yml, []byte("question_timeout: 3m\n"), 0o600)
	cmd := newServeCmd(func() bool { return false })
	if err := applyOverrides(cmd.Flags(), yml); err != nil || cmd.Flags().Lookup("question-timeout").Value.String() != "3m0s" {
		t.Fatalf("from the config file: %v", err)
	}
	if _, errs, rc := runCLI(t, "serve", "--question-timeout", "soon", "--data", t.TempDir()); rc != exitUsage || !strings.Contains(errs, "question-timeout") {
		t.Fatalf("a bad value: %d %q", rc, errs)
	}
}

// serve on a port already taken fails at once, says what to do, and
// creates nothing: no data dir, no token.
func TestServe_BusyPortCreatesNothing(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	data := filepath.Join(t.TempDir(), "data")
	_, errs, code := runCLI(t, "serve", "--listen", busy.Addr().String(), "--data", data)
	if code != exitFailed || !strings.Contains(errs, "address already in use (give another --listen, or stop what serves there)") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	if _, err := os.Stat(data); err == nil {
		t.Fatal("the data dir was created")
	}
}
