package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"go.uber.org/goleak"
)

// fakeAgentEnv makes the test binary a small fake RPC agent (see fakeAgent),
// for `prompt -- COMMAND`; so does fakeAgentArg as its only argument (for
// a server run as a process of its own, whose environment its agents
// inherit: the env would make the server a fake agent too).
const (
	fakeAgentEnv = "AGENTHOST_CLI_FAKE_AGENT"
	fakeAgentArg = "agenthost-test-fake-agent"
)

// serveHelperEnv makes the test binary run agenthost itself (the SIGKILL
// test kills it as a separate process).
const serveHelperEnv = "AGENTHOST_TEST_RUN_CLI"

// blockProcdEnv names a file: while it exists, agenthost procd run by the
// test binary fails to start (a daemon that cannot be replaced yet).
const blockProcdEnv = "AGENTHOST_TEST_BLOCK_PROCD"

func TestMain(m *testing.M) {
	// The tests' servers keep no warm pool unless a test asks (--pool):
	// a pool agent booting beside every test's rooms would change what
	// they count (agents, processes, receipts) and load the machine.
	if os.Getenv("AGENTHOST_POOL") == "" {
		os.Setenv("AGENTHOST_POOL", "0")
	}
	// The launcher of the confined agents the tests start.
	confine.Launch()
	// By its variable or, where the environment is an agent's (prompt's own -- COMMAND gets no
	// variable of the caller's), by its last argument, or fakeAgentArg as its only one.
	if os.Getenv(fakeAgentEnv) != "" || os.Args[len(os.Args)-1] == fakeAgentEnv || len(os.Args) == 2 && os.Args[1] == fakeAgentArg {
		fakeAgent()
		os.Exit(0)
	}
	// The bench's flood agent runs as "agenthost bench flood-agent" under prompt, which gives it
	// no variable of the test's.
	floodAgent := len(os.Args) == 3 && os.Args[1] == "bench" && os.Args[2] == "flood-agent"
	if os.Getenv(serveHelperEnv) != "" || floodAgent {
		if f := os.Getenv(blockProcdEnv); f != "" && len(os.Args) > 1 && os.Args[1] == "procd" {
			if _, err := os.Stat(f); err == nil {
				// A test keeps new daemons from starting while f exists.
				fmt.Fprintln(os.Stderr, "agenthost: procd: blocked by the test")
				os.Exit(1)
			}
		}
		// As main: SIGINT and SIGTERM end the command gracefully, and
		// the exit code is main's.
		os.Exit(mainRun(os.Args[1:], os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(closingBrowser{m})
}

// closingBrowser runs the tests, then ends the page tests' shared browser
// before goleak looks for goroutines left behind.
type closingBrowser struct{ m *testing.M }

func (c closingBrowser) Run() int {
	defer closeBrowser()
	return c.m.Run()
}

// fakeFloodUpdates is how many message_updates the fake agent streams.
const fakeFloodUpdates = 800

// fakeAgent announces itself with a ready frame (as omp does), answers
// get_state, and answers a prompt with a turn of fakeFloodUpdates
// message_updates of about 1 KB ("flooded"). A prompt ending in "hang"
// never ends, one ending in "eat memory" makes it allocate 4 GiB first;
// one holding "[few]" has 3 small updates, and "[slow]" 20 of them 25 ms
// apart; both answer "answer to " and the prompt. It reads its next
// command once a turn is over, as a busy agent would answer it.
func fakeAgent() {
	out := bufio.NewWriter(os.Stdout)
	send := func(s string) {
		out.WriteString(s)
		out.WriteByte('\n')
		out.Flush()
	}
	send(`{"type":"ready","supportedProtocolVersions":[1]}`)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var cmd struct{ ID, Type, Message string }
		if json.Unmarshal(in.Bytes(), &cmd) != nil {
			continue
		}
		id, _ := json.Marshal(cmd.ID)
		switch cmd.Type {
		case "get_state":
			send(`{"id":` + string(id) + `,"type":"response","command":"get_state","success":true,"data":{"isStreaming":false}}`)
		case "prompt":
			send(`{"id":` + string(id) + `,"type":"response","command":"prompt","success":true}`)
			send(`{"type":"agent_start"}`)
			if strings.HasSuffix(cmd.Message, "hang") {
				// Mid-turn until killed (the cluster test kills its host).
				continue
			}
			if strings.HasSuffix(cmd.Message, "eat memory") {
				// The agent itself allocates 4 GiB, each page touched (a
				// room's memory limit kills it first).
				var keep [][]byte
				for range 512 {
					b := make([]byte, 8<<20)
					for i := 0; i < len(b); i += 4096 {
						b[i] = 1
					}
					keep = append(keep, b)
				}
				send(`{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"survived ` + strconv.Itoa(len(keep)) + `"}],"stopReason":"stop"}}`)
				send(`{"type":"agent_end","messages":[]}`)
				continue
			}
			update := `{"type":"message_update","message":{"role":"assistant","content":[{"type":"text","text":"` + strings.Repeat("y", 1000) + `"}]}}`
			n, pause, answer := fakeFloodUpdates, time.Duration(0), "flooded"
			switch {
			case strings.Contains(cmd.Message, "[few]"):
				n = 3
			case strings.Contains(cmd.Message, "[slow]"):
				n, pause = 20, 25*time.Millisecond
			}
			if n < fakeFloodUpdates {
				// Text deltas, as omp streams them.
				update = `{"type":"message_update","assistantMessageEvent":{"type":"text_delta","delta":"z"}}`
				a, _ := json.Marshal("answer to " + cmd.Message)
				answer = strings.Trim(string(a), `"`)
			}
			for i := 0; i < n; i++ {
				time.Sleep(pause) // the agent's own pace
				send(update)
			}
			send(`{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"` + answer + `"}],"stopReason":"stop"}}`)
			send(`{"type":"agent_end","messages":[]}`)
		}
	}
}

// fakeAgentArgs runs the test binary as fakeAgent after "--".
func fakeAgentArgs(t *testing.T) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{"--", exe, "-test.run=^$", "--", fakeAgentEnv}
}

func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var o, e bytes.Buffer
	code, msg := exitStatus(ctx, run(ctx, args, &o, &e))
	if msg != "" {
		e.WriteString("agenthost: " + msg + "\n")
	}
	return o.String(), e.String(), code
}

// The README's first command runs exactly this against omp.
func TestPrompt_OMPBuiltInModel(t *testing.T) {
	out, errs, code := runCLI(t, "prompt", "--agent", "omp", `Run this: [[tool:bash {"command":"echo hello from omp"}]]`)
	if code != 0 || out != "done\n" {
		t.Fatalf("code %d out %q err %q", code, out, errs)
	}
}

func TestPrompt_ReceiptAndNothingLeft(t *testing.T) {
	out, errs, code := runCLI(t, "prompt", "-v", "--agent", "pi", `[[tool:bash {"command":"/bin/sleep 3998 >/dev/null 2>&1 & echo child=$!"}]]`)
	if code != 0 || out != "done\n" {
		t.Fatalf("code %d out %q err %q", code, out, errs)
	}
	if !strings.Contains(errs, "custody receipt") {
		t.Fatalf("no receipt on stderr:\n%s", errs)
	}
	// Receipt lines are "pid PID FOUND ENDED CMDLINE". The shell that
	// started the child may be listed too (if a scan saw it alive); it
	// exits by itself, so only the sleep's own entry is checked.
	sleeps := 0
	for _, line := range strings.Split(errs, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[0] != "pid" || f[4] != "/bin/sleep" || f[5] != "3998" {
			continue
		}
		sleeps++
		if ended := f[3]; ended != "term" && ended != "kill" {
			t.Fatalf("the background child was not ended by custody: %s", line)
		}
	}
	if sleeps != 1 {
		t.Fatalf("want the background child on the receipt once, found %d:\n%s", sleeps, errs)
	}
	if pids := pgrep(t, "/bin/sleep 3998"); len(pids) > 0 {
		t.Fatalf("left behind: %v", pids)
	}
}

// prompt confines the agent to --cwd: its tool writes there and reads the
// system, and is denied another folder and signalling agenthost; --confine
// off lets the same tool call through.
func TestPrompt_Confine(t *testing.T) {
	ws, other := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "secret"), []byte("the other folder's content"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, _ := json.Marshal(map[string]string{"command": fmt.Sprintf(
		"echo mine > own && cat own; head -c 4 /etc/passwd; echo; cat %s/secret; echo; kill -0 %d && echo signalled", other, os.Getpid())})
	for mode, confined := range map[string]bool{"landlock": true, "off": false} {
		out, errs, code := runCLI(t, "prompt", "--agent", "pi", "--json", "--confine", mode, "--cwd", ws, "[[tool:bash "+string(cmd)+"]]")
		if code != 0 {
			t.Fatalf("%s: code %d, %s", mode, code, errs)
		}
		var result string
		for _, line := range strings.Split(out, "\n") {
			var f struct {
				Type   string
				Result struct{ Content []struct{ Text string } }
			}
			if json.Unmarshal([]byte(line), &f) == nil && f.Type == "tool_execution_end" && len(f.Result.Content) > 0 {
				result = f.Result.Content[0].Text
			}
		}
		if !strings.Contains(result, "mine\nroot\n") {
			t.Fatalf("%s: the tool did not write its folder and read the system: %q", mode, result)
		}
		read, signalled := strings.Contains(result, "the other folder's content"), strings.Contains(result, "signalled")
		if confined && (read || signalled || !strings.Contains(result, "Permission denied")) || !confined && (!read || !signalled) {
			t.Fatalf("%s: read the other folder %v, signalled agenthost %v: %q", mode, read, signalled, result)
		}
	}
}

// TestPrompt_JSON: every frame, from the agent's first: omp's ready and
// the start handshake's get_state response are printed too.
func TestPrompt_JSON(t *testing.T) {
	for _, agent := range []string{"pi", "omp"} {
		t.Run(agent, func(t *testing.T) {
			out, errs, code := runCLI(t, "prompt", "--json", "--agent", agent, "hello")
			if code != 0 {
				t.Fatalf("code %d err %q", code, errs)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			types := map[string]bool{}
			for _, l := range lines {
				var m struct{ Type, Command string }
				if err := json.Unmarshal([]byte(l), &m); err != nil {
					t.Fatalf("not JSON: %q", l)
				}
				types[m.Type] = true
				types[m.Type+" "+m.Command] = true
			}
			for _, want := range []string{"response get_state", "response prompt", "agent_start", "message_end", "agent_end"} {
				if !types[want] {
					t.Errorf("no %s frame in --json output", want)
				}
			}
			if agent == "omp" && !strings.Contains(lines[0], `"type":"ready"`) {
				t.Errorf("omp's first frame is not its ready: %.200s", lines[0])
			}
			if !strings.Contains(lines[len(lines)-1], `"type":"agenthost_receipt"`) {
				t.Fatalf("last line is not the receipt: %s", lines[len(lines)-1])
			}
		})
	}
}

func TestPrompt_Errors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"unknown agent", []string{"prompt", "--agent", "nope", "x"}, 2, "unknown agent"},
		{"an ACP agent over RPC", []string{"prompt", "--agent", "claude", "x"}, 2, `agent "claude" runs over ACP: add --transport acp`},
		{"serve: an ACP agent over RPC", []string{"serve", "--agent", "codex", "--data", "/nonexistent/agenthost"}, 2, `agent "codex" runs over ACP: add --transport acp`},
		{"no message", []string{"prompt"}, 2, "MESSAGE"},
		{"unknown flag", []string{"prompt", "--nope", "x"}, 2, "nope"},
		{"cwd missing", []string{"prompt", "--cwd", "/nonexistent/agenthost", "x", "--", "/bin/true"}, 2, "--cwd /nonexistent/agenthost: no such file or directory"},
		{"cwd is a file", []string{"prompt", "--cwd", "/dev/null", "x", "--", "/bin/true"}, 2, "--cwd /dev/null: not a directory"},
		{"two messages", []string{"prompt", "a", "b"}, 2, "exactly one MESSAGE"},
		{"custom command fails", []string{"prompt", "x", "--", "/bin/false"}, 1, "agent exited"},
		{"custom command not JSON", []string{"prompt", "x", "--", "/bin/echo", "not json"}, 1, "not a JSON object"},
		{"timeout", []string{"prompt", "--agent", "pi", "--timeout", "2s", "[[slow:1m]] [[big:100]]"}, 3, "timed out"},
		{"bad confine", []string{"prompt", "--confine", "sandbox", "x", "--", "/bin/true"}, 2, "auto, landlock or off"},
		{"bad confine-net", []string{"prompt", "--confine-net", "http", "x", "--", "/bin/true"}, 2, "TCP ports"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errs, code := runCLI(t, tt.args...)
			if code != tt.code || !strings.Contains(errs, tt.msg) {
				t.Fatalf("code %d (want %d), stderr %q (want %q)", code, tt.code, errs, tt.msg)
			}
			if strings.Count(strings.TrimSpace(errs), "\n") > 0 {
				t.Fatalf("more than one line on stderr: %q", errs)
			}
		})
	}
}

// TestPrompt_JSONSlowReader: --json into a reader that pauses longer than
// the backlog's stall timeout, then reads slowly: the agent is slowed down
// through the pipes, no line is lost, and the turn succeeds. Every frame is
// printed, from the agent's first (ready) and the start handshake's response.
func TestPrompt_JSONSlowReader(t *testing.T) {
	args := append([]string{"prompt", "--json", "--timeout", "60s", "go"}, fakeAgentArgs(t)...)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	lines := make(chan []string, 1)
	go func() {
		<-time.After(3 * time.Second) // the slow reader under test: (sleep 3; ...)
		var got []string
		br := bufio.NewReaderSize(r, 4096)
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				lines <- got
				return
			}
			got = append(got, l)
			if len(got)%50 == 0 {
				<-time.After(20 * time.Millisecond) // and then reads slowly
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var errs bytes.Buffer
	rerr := run(ctx, args, w, &errs)
	w.Close()
	got := <-lines
	if rerr != nil {
		t.Fatalf("run: %v (%d lines read; stderr %q)", rerr, len(got), errs.String())
	}
	count := map[string]int{}
	for _, l := range got {
		var m struct{ Type, Command string }
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not JSON: %q", l)
		}
		count[m.Type+" "+m.Command]++
	}
	if len(got) == 0 || !strings.Contains(got[0], `"type":"ready"`) {
		t.Fatalf("first line is not the agent's ready frame: %.100q", got)
	}
	if count["response get_state"] != 1 || count["response prompt"] != 1 || count["message_update "] != fakeFloodUpdates ||
		count["agent_end "] != 1 || count["agenthost_receipt "] != 1 || len(got) != fakeFloodUpdates+7 {
		t.Fatalf("%d lines: %v", len(got), count)
	}
}

func TestDoctor(t *testing.T) {
	out, errs, code := runCLI(t, "doctor", "--json")
	var rep doctorReport
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || rep.Problems != 0 {
		t.Fatalf("code %d\n%s\n%s", code, out, errs)
	}
	// The text is the same report.
	var text strings.Builder
	rep.print(&text)
	out = text.String()
	if !strings.Contains(out, "  ok       omp 18.2.3") || !strings.Contains(out, "  ok       pi  0.73.1") ||
		!strings.Contains(out, "oh-my-pi 18.2.3, protocol v1, loadSession") || !strings.HasSuffix(out, "\nall good.\n") {
		t.Fatalf("doctor:\n%s", out)
	}
	// The ACP agents: installed version and initialize answered, each on the built-in model.
	confined := []string{fmt.Sprintf("kernel Landlock ABI %d", confine.KernelABI()), "launcher: a confined shell wrote its workspace and was denied another folder",
		// The launcher's probe in each mode: what the agent holds.
		fmt.Sprintf("ok       launcher, agents as the server's user (uid %d): uid %[1]d ", os.Geteuid()),
		"capabilities effective 0 permitted 0 inheritable 0 ambient 0", "NoNewPrivs 1; Seccomp 2 (filter)"}
	if os.Geteuid() == 0 {
		// A uid past serve's default range, never a room's of a server on it.
		if doctorAgentUID() <= confine.DefaultAgentUIDs.Last || doctorAgentUID() > 1<<31-1 {
			t.Errorf("doctor probes as uid %d, within serve's default range %s or past 2^31-1", doctorAgentUID(), confine.DefaultAgentUIDs)
		}
		confined = append(confined, fmt.Sprintf("ok       launcher, agents as a uid of their own (serve --agent-uids; probed as uid %d): uid %[1]d gid %[1]d; capabilities effective 0 permitted 0 inheritable 0 ambient 0 bounding 0;", doctorAgentUID()))
	}
	if confine.KernelABI() < 1 {
		confined = []string{"the kernel has no Landlock"}
	}
	// The warm pool of each RPC agent starts and binds a new room.
	for _, want := range []string{"  ok       omp ready in ", "  ok       pi  ready in "} {
		if i := strings.Index(out, want); i < 0 || !strings.Contains(out[i:strings.IndexByte(out[i:], '\n')+i], ", bound to a room in ") {
			t.Errorf("doctor output lacks %q with a bind:\n%s", want, out)
		}
	}
	// So does the ACP pool of codex and copilot, in the same one section
	// (the only ACP agents it pools; the others' rooms start cold).
	const pools = "warm pool (serve --pool: an agent started in a slot, then bound to a new room)"
	if n := strings.Count(out, "\n"+pools+":\n"); n != 1 {
		t.Errorf("the warm pool section is printed %d times:\n%s", n, out)
	}
	var lines []string
	for _, c := range rep.Checks {
		if c.Section == pools {
			lines = append(lines, c.Detail)
		}
	}
	for _, want := range []string{"codex ready in ", "copilot ready in ", "omp acp, claude acp: not pooled: "} {
		if !slices.ContainsFunc(lines, func(l string) bool {
			return strings.HasPrefix(l, want) && (strings.Contains(want, "not pooled") || strings.Contains(l, ", bound to a room in "))
		}) {
			t.Errorf("the warm pool section lacks %q (with a bind):\n%s", want, strings.Join(lines, "\n"))
		}
	}
	for _, want := range append([]string{"omp     18.2.3   initialize answered", "claude  0.101.0  initialize answered",
		"codex   2.6.0    initialize answered", "copilot 1.0.102  initialize answered"}, confined...) {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
	if _, errs, code = runCLI(t, "doctor", "--transport", "ipc"); code != exitUsage || !strings.Contains(errs, `--transport "ipc"`) {
		t.Fatalf("doctor --transport ipc: %d %q", code, errs)
	}
}

// make run's doctor (--transport rpc) never installs the ACP agents; the
// whole doctor does, when they are missing. (A tools folder with nothing
// in it: every check fails fast, and npm is a fake that records its runs.)
func TestDoctor_InstallsACPOnlyForACP(t *testing.T) {
	tools := t.TempDir()
	for _, dir := range []string{"node_modules", "acp"} {
		if err := os.MkdirAll(filepath.Join(tools, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pj, err := os.ReadFile(filepath.Join("..", "..", ".tools", "acp", "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tools, "acp", "package.json"), pj, 0o644); err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	log := filepath.Join(t.TempDir(), "npm.log")
	if err := os.WriteFile(filepath.Join(bin, "npm"), []byte("#!/bin/sh\necho run >> "+log+"\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv(agents.ToolsEnv, tools)
	runs := func() int {
		b, _ := os.ReadFile(log)
		return strings.Count(string(b), "run")
	}
	if _, errs, code := runCLI(t, "doctor", "--transport", "rpc"); code != exitFailed || runs() != 0 {
		t.Fatalf("doctor --transport rpc: exit %d, npm ran %d times, stderr %q", code, runs(), errs)
	}
	out, errs, code := runCLI(t, "doctor")
	if code != exitFailed || runs() != 1 || !strings.Contains(errs, "installing the ACP agents") || !strings.Contains(out, "PROBLEM  agents: install failed") {
		t.Fatalf("doctor: exit %d, npm ran %d times\n%s\n%s", code, runs(), out, errs)
	}
	// No agent started, so no pool is probed (neither rpc nor acp).
	if strings.Contains(out, "warm pool") {
		t.Fatalf("doctor probed a pool of an agent that did not start:\n%s", out)
	}
}

func TestReap_DryRun(t *testing.T) {
	out, errs, code := runCLI(t, "reap")
	if code != 0 || !(strings.Contains(out, "no orphaned") || strings.Contains(out, "--kill")) {
		t.Fatalf("code %d out %q err %q", code, out, errs)
	}
	out, errs, code = runCLI(t, "reap", "--json")
	var res struct {
		Orphans []json.RawMessage `json:"orphans"`
		Ended   *int              `json:"ended"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.Orphans == nil || res.Ended == nil || *res.Ended != 0 {
		t.Fatalf("reap --json: code %d out %q err %q", code, out, errs)
	}
}

// pgrep lists pids whose command line contains s.
func pgrep(t *testing.T, s string) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), s) {
			out = append(out, pid)
		}
	}
	return out
}
