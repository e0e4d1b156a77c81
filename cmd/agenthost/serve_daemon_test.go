package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/client"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/store"
)

// daemonServer is `agenthost serve --daemon` run as a process of its own
// (the test binary as agenthost), so that signals reach it as they would.
type daemonServer struct {
	t      testing.TB
	cmd    *exec.Cmd
	url    string
	token  string
	errOut *syncBuf
	out    chan string // stdout lines after the start line
	exited chan error
}

// freeAddr is a loopback address free a moment ago: both servers of a
// restart listen on it, as an operator's would.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func startDaemonServer(t testing.TB, data, addr string, args ...string) *daemonServer {
	t.Helper()
	return startDaemonServerEnv(t, data, addr, nil, args...)
}

// startDaemonServerEnv is startDaemonServer with env added to the
// server's environment.
func startDaemonServerEnv(t testing.TB, data, addr string, env []string, args ...string) *daemonServer {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"serve", "--daemon", "--listen", addr, "--data", data}, args...)...)
	cmd.Env = append(append(os.Environ(), serveHelperEnv+"=1", "AGENTHOST_TOKEN="), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &daemonServer{t: t, cmd: cmd, errOut: &syncBuf{}, out: make(chan string, 16), exited: make(chan error, 1)}
	cmd.Stderr = s.errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for n := 0; sc.Scan(); n++ {
			if n == 0 {
				first <- sc.Text()
				continue
			}
			select {
			case s.out <- sc.Text():
			default:
			}
		}
		close(first)
		s.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
		}
	})
	select {
	case line, ok := <-first:
		if !ok {
			t.Fatalf("serve --daemon ended at start; stderr:\n%s", s.errOut.String())
		}
		u, tok, found := strings.Cut(strings.TrimPrefix(line, "agenthost: serving rooms at "), "#token=")
		if !found {
			t.Fatalf("start line %q", line)
		}
		s.url, s.token = u, tok
	case <-time.After(120 * time.Second):
		t.Fatalf("no start line; stderr:\n%s", s.errOut.String())
	}
	return s
}

// signal sends sig and waits for the server's exit, which must be 0.
func (s *daemonServer) stop(sig syscall.Signal) {
	s.t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatal(err)
	}
	select {
	case err := <-s.exited:
		s.exited <- err // for Cleanup
		if err != nil {
			s.t.Fatalf("serve exited after %v: %v; stderr:\n%s", sig, err, s.errOut.String())
		}
	case <-time.After(120 * time.Second):
		s.t.Fatalf("serve did not exit after %v; stderr:\n%s", sig, s.errOut.String())
	}
}

func (s *daemonServer) post(room, text string) {
	s.t.Helper()
	b, _ := json.Marshal(map[string]string{"text": text})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"v1/rooms/"+room+"/messages", strings.NewReader(string(b)))
	req.Header.Set("Authorization", "Bearer "+s.token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 202 {
		s.t.Fatalf("post: %d", res.StatusCode)
	}
}

// sseEvent is one event of a room's stream.
type sseEvent struct {
	id   int64
	typ  string
	data map[string]any
}

// follow reads the room's stream from url as an SSE client does across a
// server restart (the client package's Follow: it reconnects with
// Last-Event-ID while no server answers) until until says stop.
// deltaOfTurn is true at the first text.delta of the room's n-th turn:
// the agent is streaming that turn (the log also holds earlier turns'
// deltas, which say nothing of it).
func deltaOfTurn(n int) func(sseEvent) bool {
	started := 0
	return func(ev sseEvent) bool {
		if ev.typ == "turn.started" {
			started++
		}
		return ev.typ == "text.delta" && started == n
	}
}

func follow(ctx context.Context, url, token, room string, until func(sseEvent) bool) ([]sseEvent, error) {
	c, err := client.New(url, client.Options{Token: token, MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	var got []sseEvent
	for ev, err := range c.Follow(ctx, room, 0) {
		if err != nil {
			return got, fmt.Errorf("following %s: %w (%d events)", room, err, len(got))
		}
		e := sseEvent{id: ev.Seq, typ: ev.Type}
		_ = json.Unmarshal(ev.Data, &e.data)
		got = append(got, e)
		if until(e) {
			return got, nil
		}
	}
	return got, ctx.Err()
}

// A planned restart mid-turn (SIGUSR2, then serve --daemon again on the
// same data dir) on the real omp: the old server exits 0 leaving the agent
// running, the new one claims the daemon and re-attaches the room without
// starting an agent, the turn completes, and an SSE client that reconnects
// with Last-Event-ID sees every event exactly once.
func TestServeDaemon_RestartMidTurn(t *testing.T) {
	data := t.TempDir()
	addr := freeAddr(t)
	s1 := startDaemonServer(t, data, addr)
	words := "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
	s1.post("r", "[[slow:300ms]] [[say:"+words+"]]")

	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	streaming := make(chan struct{}, 1)
	var evs []sseEvent
	var ferr error
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		evs, ferr = follow(ctx, s1.url, s1.token, "r", func(ev sseEvent) bool {
			if ev.typ == "text.delta" {
				// Restart once the answer streams.
				select {
				case streaming <- struct{}{}:
				default:
				}
			}
			return ev.typ == "turn.ended"
		})
	}()
	select {
	case <-streaming:
	case <-time.After(120 * time.Second):
		t.Fatal("the answer did not stream")
	}
	s1.stop(syscall.SIGUSR2)
	for said := false; !said; {
		select {
		case line := <-s1.out:
			said = strings.HasPrefix(line, "agenthost: restarting")
		default:
			t.Fatal("no restart line")
		}
	}
	s2 := startDaemonServer(t, data, addr)
	if s2.url != s1.url {
		t.Fatalf("the new server serves %s, not %s", s2.url, s1.url)
	}
	<-followed
	if ferr != nil {
		t.Fatal(ferr)
	}
	var text strings.Builder
	starts, attaches := 0, 0
	var ended map[string]any
	for i, ev := range evs {
		if ev.id != int64(i+1) {
			t.Fatalf("event %d has id %d: the stream skipped or repeated (%v)", i+1, ev.id, evs)
		}
		switch ev.typ {
		case "text.delta":
			text.WriteString(ev.data["text"].(string))
		case "agent.started":
			starts++
			// serve's default (auto) confines the agent the daemon starts.
			if c, _ := ev.data["confinement"].(map[string]any); confine.KernelABI() > 0 && (c == nil || c["mode"] != "landlock") {
				t.Fatalf("agent.started %v: the daemon's agent is not confined", ev.data)
			}
		case "agent.attached":
			attaches++
		case "turn.ended":
			ended = ev.data
		}
	}
	if ended["outcome"] != "settled" || ended["text"] != words {
		t.Fatalf("turn ended %v", ended)
	}
	if text.String() != words {
		t.Fatalf("the deltas add up to %q, want %q: each exactly once", text.String(), words)
	}
	if starts != 1 || attaches != 1 {
		t.Fatalf("agent.started %d, agent.attached %d: want 1 and 1 (no agent start at the restart)", starts, attaches)
	}
	s2.stop(syscall.SIGTERM)
	checkNothingLeft(t, data, "r")
}

// checkNothingLeft: no process of the data dir runs (the daemon, its
// agents, the built-in model), and the room's agent left a receipt.
func checkNothingLeft(t *testing.T, data, room string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		left := pgrep(t, data)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left running: %v", left)
		}
		time.Sleep(50 * time.Millisecond) // the daemon exits after its last receipt: bounded poll of /proc
	}
	db, err := store.Open(t.Context(), filepath.Join(data, "agenthost.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rs, err := db.Receipts(t.Context(), room)
	if err != nil || len(rs) == 0 {
		t.Fatalf("no receipt for room %s: %v", room, err)
	}
	var rec struct {
		Processes []json.RawMessage `json:"processes"`
	}
	if err := json.Unmarshal(rs[len(rs)-1].Receipt, &rec); err != nil || len(rec.Processes) == 0 {
		t.Fatalf("receipt %s", rs[len(rs)-1].Receipt)
	}
}

// SIGTERM to serve --daemon stops everything as without --daemon: the
// agents end with custody receipts, the daemon exits, nothing is left.
func TestServeDaemon_SIGTERMStopsEverything(t *testing.T) {
	data := t.TempDir()
	s := startDaemonServer(t, data, "127.0.0.1:0")
	s.post("r", `Run it: [[tool:bash {"command":"sleep 300 & echo started"}]]`)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	_, err := follow(ctx, s.url, s.token, "r", func(ev sseEvent) bool {
		if ev.typ == "approval.requested" {
			id := ev.data["approval_id"].(string)
			if code, body := call(t, "POST", s.url+"v1/rooms/r/approvals/"+id, s.token, `{"decision":"allow"}`); code != 200 {
				t.Errorf("approve: %d %s", code, body)
			}
		}
		return ev.typ == "turn.ended"
	})
	if err != nil {
		t.Fatal(err)
	}
	s.stop(syscall.SIGTERM)
	checkNothingLeft(t, data, "r")
}

// A lost handoff (the ticket gone before the next server starts) is not a
// failed restart: the next server ends the old daemon (receipts), starts a
// fresh one, and the room recovers through the normal ladder: the turn cut
// short ends failed, the next message resumes the session, and the old
// agent's output files are removed.
func TestServeDaemon_LostHandoffStartsFresh(t *testing.T) {
	data := t.TempDir()
	addr := freeAddr(t)
	s1 := startDaemonServer(t, data, addr)
	s1.post("r", "[[say:first]]")
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	if _, err := follow(ctx, s1.url, s1.token, "r", func(ev sseEvent) bool { return ev.typ == "turn.ended" }); err != nil {
		t.Fatal(err)
	}
	s1.post("r", "[[slow:500ms]] [[say:a b c d e f g h i j]]")
	if _, err := follow(ctx, s1.url, s1.token, "r", deltaOfTurn(2)); err != nil {
		t.Fatal(err)
	}
	s1.stop(syscall.SIGUSR2)
	if err := os.Remove(filepath.Join(data, "procd", "handoff.json")); err != nil {
		t.Fatal(err)
	}
	s2 := startDaemonServer(t, data, addr)
	s2.post("r", "[[say:after]]")
	var ends []map[string]any
	_, err := follow(ctx, s2.url, s2.token, "r", func(ev sseEvent) bool {
		if ev.typ == "turn.ended" {
			ends = append(ends, ev.data)
		}
		return len(ends) == 3
	})
	if err != nil {
		t.Fatal(err)
	}
	if ends[1]["outcome"] != "failed" || ends[1]["reason"] != "host restarted" {
		t.Fatalf("the turn cut short ended %v", ends[1])
	}
	if ends[2]["outcome"] != "settled" || ends[2]["text"] != "after" {
		t.Fatalf("the next turn ended %v", ends[2])
	}
	// The old agent's output files went with it; only the new agent's
	// are there (they were kept for good).
	for _, ext := range []string{"out", "err"} {
		if m, _ := filepath.Glob(filepath.Join(data, "rooms", "*", "agent-output", "agent-*."+ext)); len(m) != 1 {
			t.Fatalf("agent .%s files in the room's folder: %v, want the running agent's only", ext, m)
		}
	}
	s2.stop(syscall.SIGTERM)
	checkNothingLeft(t, data, "r")
}

// BenchmarkServeDaemon_Restart20Rooms: SIGUSR2 to a server with 20
// resident rooms (omp on the built-in model, each after one turn), until
// the next server serves with every room re-attached (its start line is
// printed after the rooms are). No agent starts: checked at the end.
//
//	go test -run '^$' -bench ServeDaemon_Restart20Rooms -benchtime 5x ./cmd/agenthost
func BenchmarkServeDaemon_Restart20Rooms(b *testing.B) {
	const rooms = 20
	data := b.TempDir()
	addr := freeAddr(b)
	args := []string{"--max-resident", strconv.Itoa(rooms)}
	s := startDaemonServer(b, data, addr, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 900*time.Second)
	defer cancel()
	// Rooms start a few at a time: 20 omp starting at once on a small
	// machine outlast the start timeout. Setup is not measured.
	for i := range rooms {
		s.post(fmt.Sprintf("r%02d", i), "[[say:hi]]")
		if i%4 != 3 && i != rooms-1 {
			continue
		}
		for j := i - i%4; j <= i; j++ {
			evs, err := follow(ctx, s.url, s.token, fmt.Sprintf("r%02d", j), func(ev sseEvent) bool { return ev.typ == "turn.ended" })
			if err != nil {
				b.Fatal(err)
			}
			if end := evs[len(evs)-1].data; end["outcome"] != "settled" {
				b.Fatalf("room r%02d: the turn ended %v", j, end)
			}
		}
	}
	var exit, serve time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		s.stop(syscall.SIGUSR2)
		t1 := time.Now()
		s = startDaemonServer(b, data, addr, args...)
		t2 := time.Now()
		exit += t1.Sub(t0)
		serve += t2.Sub(t1)
	}
	b.StopTimer()
	b.ReportMetric(float64(exit.Microseconds())/1e3/float64(b.N), "ms-old-exit/op")
	b.ReportMetric(float64(serve.Microseconds())/1e3/float64(b.N), "ms-new-serving/op")
	s.stop(syscall.SIGTERM)
	// Every room was re-attached each time, and no agent started again.
	db, err := store.Open(ctx, filepath.Join(data, "agenthost.db"), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	for i := range rooms {
		room := fmt.Sprintf("r%02d", i)
		evs, err := db.Events(ctx, room, 0, 0)
		if err != nil {
			b.Fatal(err)
		}
		starts, attaches := 0, 0
		for _, ev := range evs {
			switch ev.Type {
			case "agent.started":
				starts++
			case "agent.attached":
				attaches++
			}
		}
		if starts != 1 || attaches != b.N {
			ids, _ := db.RoomIDs(ctx)
			b.Fatalf("room %s: agent.started %d, agent.attached %d (want 1 and %d); %d events; rooms %v", room, starts, attaches, b.N, len(evs), ids)
		}
	}
}

// postID posts a message and returns its id.
func (s *daemonServer) postID(room, text string) string {
	s.t.Helper()
	b, _ := json.Marshal(map[string]string{"text": text})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"v1/rooms/"+room+"/messages", strings.NewReader(string(b)))
	req.Header.Set("Authorization", "Bearer "+s.token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer res.Body.Close()
	var acc struct{ ID string }
	if res.StatusCode != 202 || json.NewDecoder(res.Body).Decode(&acc) != nil || acc.ID == "" {
		s.t.Fatalf("post: %d", res.StatusCode)
	}
	return acc.ID
}

// restartWithAQueue (issue 47, usr2-drain.sh): a room's turn streams and
// queued messages wait behind it; SIGUSR2 restarts the server restarts
// times, each while the turn of the next of the first messages streams.
// The detaching server starts nothing (no agent, no turn); each next
// server attaches the agent (never timing out, never starting one) and
// runs the queue in order; every message ends once, settled, with the
// answer the agent gave it (answer), none "failed: host restarted".
func restartWithAQueue(t *testing.T, args []string, restarts int, texts []string, answer func(text string) string) {
	data := t.TempDir()
	addr := freeAddr(t)
	s := startDaemonServer(t, data, addr, args...)
	const room = "q"
	ids := make([]string, len(texts))
	textOf := map[string]string{}
	for i, text := range texts {
		ids[i] = s.postID(room, text)
		textOf[ids[i]] = text
	}
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Second)
	defer cancel()
	for k := range restarts {
		// The k-th message's turn streams: its agent runs it, the rest wait.
		msgOf := map[string]string{} // turn id -> its message id
		streaming := func(ev sseEvent) bool {
			tid, _ := ev.data["turn_id"].(string)
			if ev.typ == "turn.started" {
				msgOf[tid], _ = ev.data["message_id"].(string)
			}
			return ev.typ == "text.delta" && msgOf[tid] == ids[k]
		}
		if _, err := follow(ctx, s.url, s.token, room, streaming); err != nil {
			t.Fatalf("restart %d: %v; stderr:\n%s", k, err, s.errOut.String())
		}
		s.stop(syscall.SIGUSR2)
		s = startDaemonServer(t, data, addr, args...)
		if e := s.errOut.String(); strings.Contains(e, "could not be attached") {
			t.Fatalf("restart %d: the next server did not attach the agent:\n%s", k, e)
		}
	}
	ended := map[string]map[string]any{}
	evs, err := follow(ctx, s.url, s.token, room, func(ev sseEvent) bool {
		if ev.typ == "message.ended" {
			ended[ev.data["message_id"].(string)] = ev.data
		}
		return len(ended) == len(texts)
	})
	if err != nil {
		t.Fatalf("%v; stderr:\n%s", err, s.errOut.String())
	}
	s.stop(syscall.SIGTERM)
	starts, attaches, open := 0, 0, ""
	endsOf := map[string]int{}
	turnEnd := map[string]map[string]any{}
	seqOf := map[string]int64{}
	var last int64
	for i, ev := range evs {
		if ev.id != int64(i+1) {
			t.Fatalf("event %d has id %d", i+1, ev.id)
		}
		mid, _ := ev.data["message_id"].(string)
		tid, _ := ev.data["turn_id"].(string)
		switch ev.typ {
		case "agent.started":
			starts++
		case "agent.attached":
			attaches++
		case "message.accepted":
			seqOf[mid] = ev.id
		case "message.ended":
			endsOf[mid]++
		case "turn.started":
			if open != "" {
				t.Fatalf("seq %d: turn %s started while %s was open", ev.id, tid, open)
			}
			if seqOf[mid] < last {
				t.Fatalf("seq %d: a turn of the message accepted at seq %d started after one of seq %d", ev.id, seqOf[mid], last)
			}
			open, last = tid, seqOf[mid]
		case "turn.ended":
			if tid != open {
				t.Fatalf("seq %d: turn.ended of %s while %q was open", ev.id, tid, open)
			}
			open = ""
			turnEnd[tid] = ev.data
		}
	}
	for _, id := range ids {
		e := ended[id]
		if endsOf[id] != 1 || e["outcome"] != "settled" {
			t.Fatalf("message %s (%q): %d message.ended, the last %v; want one, settled", id, textOf[id], endsOf[id], e)
		}
		tid, _ := e["turn_id"].(string)
		if got := turnEnd[tid]["text"]; got != answer(textOf[id]) {
			t.Fatalf("message %q's turn answered %q, want %q", textOf[id], got, answer(textOf[id]))
		}
	}
	if starts != 1 || attaches != restarts {
		t.Fatalf("agent.started %d, agent.attached %d: want 1 and %d (no agent started across the restarts)", starts, attaches, restarts)
	}
	checkNothingLeft(t, data, room)
}

// Planned restarts of a room with a queue, on the fake agent: three
// restarts, each while one of the first turns streams, 30 messages
// queued behind them.
func TestServeDaemon_RestartWithAQueue_FakeAgent(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{"m0 [slow]", "m1 [slow]", "m2 [slow]"}
	for i := 3; i < 33; i++ {
		texts = append(texts, fmt.Sprintf("m%d [few]", i))
	}
	restartWithAQueue(t, []string{"--confine", "off", "--", exe, fakeAgentArg}, 3, texts,
		func(text string) string { return "answer to " + text })
}

// The same on the real omp and the built-in model: two restarts, 8
// messages queued.
func TestServeDaemon_RestartWithAQueue_OMP(t *testing.T) {
	words := "one two three four five six seven eight"
	texts := []string{"[[slow:300ms]] [[say:first " + words + "]]", "[[slow:300ms]] [[say:second " + words + "]]"}
	for i := range 8 {
		texts = append(texts, fmt.Sprintf("[[say:queued %d]]", i))
	}
	restartWithAQueue(t, nil, 2, texts, func(text string) string {
		return strings.TrimSuffix(text[strings.Index(text, "[[say:")+len("[[say:"):], "]]")
	})
}
