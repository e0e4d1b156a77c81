package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// scriptedAPI is a server for the client commands' fault tests: it
// accepts every message as m_1 (seq 3), and serves the room's event
// stream from a script of events, one connection at a time as the test
// says. It can go away and come back on the same address (a server
// restart).
type scriptedAPI struct {
	t    *testing.T
	addr string
	ts   *httptest.Server
	// gone is closed when the server stops: its streams end.
	gone chan struct{}

	mu     sync.Mutex
	events []string // frames, from seq 1
	ids    []string // the Last-Event-ID of each stream request
	// cutAfter, when > 0, ends a stream once it has written the event
	// with that seq (the connection drops).
	cutAfter int64
	// streams is told of each stream request.
	streams chan string
}

func newScriptedAPI(t *testing.T) *scriptedAPI {
	t.Helper()
	a := &scriptedAPI{t: t, streams: make(chan string, 100)}
	a.start()
	t.Cleanup(a.stop)
	return a
}

func (a *scriptedAPI) url() string { return "http://" + a.addr + "/" }

func (a *scriptedAPI) start() {
	a.t.Helper()
	addr := a.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		a.t.Fatal(err)
	}
	a.addr = ln.Addr().String()
	a.mu.Lock()
	a.gone = make(chan struct{})
	a.mu.Unlock()
	a.ts = httptest.NewUnstartedServer(http.HandlerFunc(a.serve))
	a.ts.Listener = ln
	a.ts.Start()
}

// stop closes the listener and every connection: the server is gone.
func (a *scriptedAPI) stop() {
	if a.ts != nil {
		close(a.gone)
		a.ts.CloseClientConnections()
		a.ts.Close()
		a.ts = nil
	}
}

// add appends an event of type typ with fields (JSON object members).
func (a *scriptedAPI) add(typ, fields string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	seq := len(a.events) + 1
	if fields != "" {
		fields = "," + fields
	}
	a.events = append(a.events, fmt.Sprintf("id: %d\nevent: %s\ndata: {\"seq\":%d,\"type\":%q,\"room\":\"r\",\"time\":\"2026-01-01T00:00:00Z\"%s}\n\n",
		seq, typ, seq, typ, fields))
}

func (a *scriptedAPI) serve(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/messages"):
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprint(w, `{"id":"m_1","seq":3}`)
	case r.Method == "GET" && strings.HasSuffix(r.URL.Path, "/events"):
		a.stream(w, r)
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"error":"approval %s: not found"}`, r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:])
	}
}

// stream writes the script after Last-Event-ID, then waits for more
// (a live stream) until the cut or the client leaves.
func (a *scriptedAPI) stream(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.ids = append(a.ids, r.Header.Get("Last-Event-ID"))
	gone := a.gone
	a.mu.Unlock()
	a.streams <- r.Header.Get("Last-Event-ID")
	var after int64
	fmt.Sscan(r.Header.Get("Last-Event-ID"), &after)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, "retry: 20\n\n")
	tick := time.NewTicker(5 * time.Millisecond) // the script grows as the test adds to it
	defer tick.Stop()
	for {
		a.mu.Lock()
		evs, cut := a.events, a.cutAfter
		a.mu.Unlock()
		for ; after < int64(len(evs)); after++ {
			fmt.Fprint(w, evs[after])
			if after+1 == cut {
				w.(http.Flusher).Flush()
				a.mu.Lock()
				a.cutAfter = 0
				a.mu.Unlock()
				panic(http.ErrAbortHandler) // the connection drops
			}
		}
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			return
		case <-gone:
			panic(http.ErrAbortHandler)
		case <-tick.C:
		}
	}
}

// cliRun is a client command running in this process: its stderr comes
// line by line.
type cliRun struct {
	out    syncBuf
	errs   *lines
	errAll syncBuf
	done   chan int
	cancel context.CancelFunc
}

func startCLI(t *testing.T, args ...string) *cliRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	c := &cliRun{errs: &lines{ch: make(chan string, 1000)}, done: make(chan int, 1), cancel: cancel}
	go func() {
		code, msg := exitStatus(ctx, run(ctx, args, &c.out, teeWriter{c.errs, &c.errAll}))
		if msg != "" {
			fmt.Fprintln(teeWriter{c.errs, &c.errAll}, "agenthost: "+msg)
		}
		c.done <- code
	}()
	t.Cleanup(func() {
		cancel()
		<-c.done
	})
	return c
}

type teeWriter struct {
	a, b interface{ Write([]byte) (int, error) }
}

func (w teeWriter) Write(p []byte) (int, error) {
	_, _ = w.a.Write(p)
	return w.b.Write(p)
}

// waitStream waits for the command's next stream request to api.
func (c *cliRun) waitStream(t *testing.T, api *scriptedAPI) {
	t.Helper()
	select {
	case <-api.streams:
	case code := <-c.done:
		c.done <- code
		t.Fatalf("the command ended (%d) before following; stderr:\n%s", code, c.errAll.String())
	}
}

// waitLine waits for a stderr line containing s.
func (c *cliRun) waitLine(t *testing.T, s string) {
	t.Helper()
	for {
		select {
		case l := <-c.errs.ch:
			if strings.Contains(l, s) {
				return
			}
		case code := <-c.done:
			c.done <- code
			t.Fatalf("the command ended (%d) before saying %q; stderr:\n%s", code, s, c.errAll.String())
		}
	}
}

func (c *cliRun) wait(t *testing.T) int {
	t.Helper()
	select {
	case code := <-c.done:
		c.done <- code
		return code
	case <-time.After(2 * time.Minute):
		t.Fatalf("the command did not end; stderr:\n%s", c.errAll.String())
		return -1
	}
}

// send --follow ends on the message.ended naming its message (not on a
// turn.ended, not on another message's end), through a server restart
// longer than the old client's ~2 s of retries: it says it reconnects,
// resumes with Last-Event-ID, and prints the question's options and the
// approval its deadline denied.
func TestSendFollow_MessageEndedAcrossRestart(t *testing.T) {
	t.Setenv(tokenEnv, "t0ken")
	api := newScriptedAPI(t)
	api.add("message.accepted", `"message_id":"m_0"`)
	api.add("turn.started", `"turn_id":"t_0","message_id":"m_0"`)
	api.add("message.accepted", `"message_id":"m_1"`)
	api.add("message.queued", `"message_id":"m_1"`)
	api.add("turn.ended", `"turn_id":"t_0","message_id":"m_0","outcome":"settled","text":"other"`)
	api.add("message.ended", `"message_id":"m_0","outcome":"settled","turn_id":"t_0"`)
	api.add("turn.started", `"turn_id":"t_1","message_id":"m_1"`)
	api.add("text.delta", `"turn_id":"t_1","text":"hel"`)
	api.mu.Lock()
	api.cutAfter = 8 // the server goes away mid-turn
	api.mu.Unlock()

	c := startCLI(t, "send", "r", "hello", "--follow", "--server", api.url(), "--timeout", "100s")
	c.waitStream(t, api)
	c.waitLine(t, "turn started")
	// The stream dropped: keep the server away until the follower has
	// retried three times (refused connections), then bring it back.
	api.stop()
	for range 3 {
		c.waitLine(t, "reconnecting in")
	}
	api.add("text.delta", `"turn_id":"t_1","text":"lo"`)
	api.add("approval.requested", `"approval_id":"a_1","turn_id":"t_1","tool":"bash","options":["Approve","Deny"]`)
	api.add("approval.resolved", `"approval_id":"a_1","decision":"deny","by":"deadline"`)
	api.add("question.asked", `"question_id":"q_1","turn_id":"t_1","title":"Which color?","options":["red","blue","Other"]`)
	api.add("question.answered", `"question_id":"q_1","answer":"blue","by":"person"`)
	api.add("turn.ended", `"turn_id":"t_1","message_id":"m_1","outcome":"settled","text":"hello"`)
	api.start()
	c.waitLine(t, "reconnected to room r's events, resuming after event 8")
	api.add("message.ended", `"message_id":"m_1","outcome":"settled","turn_id":"t_1"`)
	if code := c.wait(t); code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, c.errAll.String())
	}
	if out := c.out.String(); out != "hello\n" {
		t.Fatalf("stdout %q", out)
	}
	errs := c.errAll.String()
	for _, want := range []string{
		"approval a_1 requested for bash: agenthost approve r a_1 allow|deny",
		"approval a_1 denied: nobody decided before its deadline",
		"question q_1: Which color? [red | blue | Other] (agenthost answer r q_1 TEXT)",
		"question q_1 answered: blue",
	} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	if ids := strings.Join(api.ids, ","); ids != "2,8" {
		t.Fatalf("Last-Event-IDs %q: the resume must name the last event received", ids)
	}
}

// send --follow never says a tool started while its approval is pending:
// omp reports the tool before asking, so the follower says the tool was
// called, then the approval, its decision and the tool's end.
func TestSendFollow_ToolAwaitingApproval(t *testing.T) {
	t.Setenv(tokenEnv, "t0ken")
	api := newScriptedAPI(t)
	api.add("message.accepted", `"message_id":"m_0"`)
	api.add("message.ended", `"message_id":"m_0","outcome":"settled","turn_id":"t_0"`)
	api.add("message.accepted", `"message_id":"m_1"`) // seq 3, as the script's POST answers
	api.add("turn.started", `"turn_id":"t_1","message_id":"m_1"`)
	api.add("tool.started", `"turn_id":"t_1","call_id":"c_1","tool":"bash"`)
	api.add("approval.requested", `"approval_id":"a_1","turn_id":"t_1","tool":"bash","options":["Approve","Deny"]`)
	c := startCLI(t, "send", "r", "hello", "--follow", "--server", api.url())
	c.waitLine(t, "approval a_1 requested")
	if errs := c.errAll.String(); strings.Contains(errs, "tool bash started") {
		t.Fatalf("a tool said started while its approval is pending:\n%s", errs)
	}
	api.add("approval.resolved", `"approval_id":"a_1","decision":"deny","by":"person"`)
	api.add("tool.ended", `"turn_id":"t_1","call_id":"c_1","tool":"bash","is_error":true`)
	api.add("turn.ended", `"turn_id":"t_1","message_id":"m_1","outcome":"settled","text":"done"`)
	api.add("message.ended", `"message_id":"m_1","outcome":"settled","turn_id":"t_1"`)
	if code := c.wait(t); code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, c.errAll.String())
	}
	want := "turn started\n" +
		"tool bash called\n" +
		"approval a_1 requested for bash: agenthost approve r a_1 allow|deny\n" +
		"approval a_1 denied (by person)\n" +
		"tool bash ended with an error\n"
	if errs := c.errAll.String(); errs != want {
		t.Fatalf("stderr:\n%s\nwant:\n%s", errs, want)
	}
}

// A message that answered a pending question ends answered (exit 0); one
// that failed exits 1, one that timed out 3.
func TestSendFollow_Outcomes(t *testing.T) {
	t.Setenv(tokenEnv, "t0ken")
	for _, tc := range []struct {
		outcome, fields string
		code            int
		stderr          string
	}{
		{"answered", "", exitOK, "answered a pending question"},
		{"failed", `,"turn_id":"t_1","reason":"the store refused the write"`, exitFailed, "agenthost: message m_1 failed: the store refused the write"},
		{"cancelled", `,"turn_id":"t_1","reason":"cancelled on request"`, exitFailed, "agenthost: message m_1 cancelled: cancelled on request"},
		{"timed_out", `,"turn_id":"t_1","reason":"the turn ran past its deadline"`, exitTimedOut, "agenthost: message m_1 timed out: the turn ran past its deadline"},
	} {
		t.Run(tc.outcome, func(t *testing.T) {
			api := newScriptedAPI(t)
			api.add("message.accepted", `"message_id":"m_0"`)
			api.add("question.asked", `"question_id":"q_1","turn_id":"t_0","title":"Which color?","options":["red","blue"]`)
			api.add("message.accepted", `"message_id":"m_1"`)
			api.add("question.answered", `"question_id":"q_1","answer":"blue","by":"message"`)
			api.add("message.ended", fmt.Sprintf(`"message_id":"m_1","outcome":%q%s`, tc.outcome, tc.fields))
			out, errs, code := runCLI(t, "send", "r", "blue", "--follow", "--server", api.url())
			if code != tc.code || !strings.Contains(errs, tc.stderr) || out != "" {
				t.Fatalf("exit %d (want %d), stdout %q, stderr %q (want %q)", code, tc.code, out, errs, tc.stderr)
			}
		})
	}
}

// events --follow outlives a server restart: every event once, in order,
// and it says on stderr that it reconnects.
func TestEventsFollow_ReconnectsAcrossRestart(t *testing.T) {
	t.Setenv(tokenEnv, "t0ken")
	api := newScriptedAPI(t)
	for i := range 3 {
		api.add("text.delta", fmt.Sprintf(`"turn_id":"t_1","text":"%d"`, i))
	}
	c := startCLI(t, "events", "r", "--follow", "--server", api.url(), "--timeout", "100s")
	c.waitStream(t, api)
	api.stop()
	for range 3 {
		c.waitLine(t, "reconnecting in")
	}
	api.add("turn.ended", `"turn_id":"t_1","outcome":"settled"`)
	api.start()
	c.waitLine(t, "reconnected")
	for deadline := time.Now().Add(time.Minute); strings.Count(c.out.String(), "\n") < 4; {
		if time.Now().After(deadline) {
			t.Fatalf("stdout %q", c.out.String())
		}
		<-time.After(10 * time.Millisecond) // polling the command's output, which has no event of its own
	}
	c.cancel()
	var seqs []int64
	for _, l := range strings.Split(strings.TrimSpace(c.out.String()), "\n") {
		var ev struct{ Seq int64 }
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, ev.Seq)
	}
	if fmt.Sprint(seqs) != "[1 2 3 4]" {
		t.Fatalf("events %v", seqs)
	}
}

// TestExitCodes: one row of the README's table each, every error one line
// on stderr.
func TestExitCodes(t *testing.T) {
	t.Setenv(tokenEnv, "t0ken")
	api := newScriptedAPI(t)
	api.add("message.accepted", `"message_id":"m_1"`)
	dead := func() string { // an address nothing listens on
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return "http://" + ln.Addr().String()
	}()
	rows := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"ok: version", []string{"version"}, exitOK, ""},
		{"ok: --version", []string{"--version"}, exitOK, ""},
		{"failed: not found", []string{"approve", "r", "a_nope", "allow", "--server", api.url()}, exitFailed, "approval a_nope: not found (HTTP 404)"},
		{"failed: no server", []string{"rooms", "--server", dead}, exitFailed, "no answer from the server at " + dead},
		{"usage: unknown command", []string{"bogus"}, exitUsage, `unknown command "bogus" for "agenthost"`},
		{"usage: unknown proc subcommand", []string{"proc", "bogus"}, exitUsage, `unknown command "bogus" for "agenthost proc"`},
		{"usage: unknown flag", []string{"rooms", "--bogus"}, exitUsage, "rooms: unknown flag: --bogus"},
		{"usage: unknown flag of prompt", []string{"prompt", "--bogus", "x"}, exitUsage, "prompt: unknown flag: --bogus"},
		{"usage: arguments", []string{"send", "r"}, exitUsage, "send: accepts 2 arg(s), received 1"},
		{"usage: flag value", []string{"events", "r", "--after", "abc"}, exitUsage, `invalid argument "abc" for "--after"`},
		{"usage: negative --after", []string{"events", "r", "--after", "-5", "--server", api.url()}, exitUsage, "--after -5"},
		{"usage: delivery", []string{"send", "r", "x", "--delivery", "nope", "--server", api.url()}, exitUsage, `--delivery "nope"`},
		{"usage: decision", []string{"approve", "r", "a_1", "maybe", "--server", api.url()}, exitUsage, `decision "maybe"`},
		{"timed out: send --follow", []string{"send", "r", "x", "--follow", "--timeout", "200ms", "--server", api.url()}, exitTimedOut, "timed out after 200ms waiting for message m_1"},
		{"timed out: events --follow", []string{"events", "r", "--follow", "--timeout", "200ms", "--server", api.url()}, exitTimedOut, "timed out after 200ms following room r"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			out, errs, code := runCLI(t, row.args...)
			if code != row.code || !strings.Contains(errs, row.stderr) {
				t.Fatalf("exit %d (want %d), stderr %q (want %q)", code, row.code, errs, row.stderr)
			}
			if row.code != exitOK && strings.Count(errs, "\n") != 1 {
				t.Fatalf("stderr is not one line: %q", errs)
			}
			if row.code == exitOK && !strings.HasPrefix(out, "agenthost ") {
				t.Fatalf("stdout %q", out)
			}
		})
	}
	// Interrupted: a follower stopped by Ctrl-C exits 130, by SIGTERM 143,
	// saying so in one line (a process of its own, for the signal).
	for _, sig := range []struct {
		s    syscall.Signal
		code int
		msg  string
	}{{syscall.SIGINT, exitInterrupted, "agenthost: interrupted\n"}, {syscall.SIGTERM, exitTerminated, "agenthost: terminated\n"}} {
		t.Run("interrupted: "+sig.s.String(), func(t *testing.T) {
			for len(api.streams) > 0 { // the rows before followed too
				<-api.streams
			}
			cmd := exec.Command(os.Args[0], "events", "r", "--follow", "--server", api.url())
			cmd.Env = append(os.Environ(), serveHelperEnv+"=1")
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			select {
			case <-api.streams: // it follows
			case err := <-exited:
				t.Fatalf("ended before following: %v, stderr %q", err, stderr.String())
			}
			if err := cmd.Process.Signal(sig.s); err != nil {
				t.Fatal(err)
			}
			err := <-exited
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != sig.code || stderr.String() != sig.msg {
				t.Fatalf("exit %v (want %d), stderr %q", err, sig.code, stderr.String())
			}
		})
	}
}
