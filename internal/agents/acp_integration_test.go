//go:build linux

package agents_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
)

// acpTimeout bounds each JSON-RPC call of the driver; the agents answer in well under a second
// each, so this only catches a hang on a loaded machine.
const acpTimeout = 60 * time.Second

// acpTool is, per agent, a model tool call that writes out.txt in the workspace and makes the
// agent ask permission first (codex asks only for a command that requests escalation).
var acpTool = map[agents.Kind]string{
	agents.OMP:     `[[tool:bash {"command":"echo hi > out.txt"}]]`,
	agents.Claude:  `[[tool:Bash {"command":"echo hi > out.txt","description":"write out.txt"}]]`,
	agents.Codex:   `[[tool:exec_command {"cmd":"echo hi > out.txt","sandbox_permissions":"require_escalated","justification":"write out.txt"}]]`,
	agents.Copilot: `[[tool:bash {"command":"echo hi > out.txt","description":"write out.txt","mode":"sync","initial_wait":30}]]`,
}

// TestACPRecipes runs each real ACP agent through its recipe with a raw JSON-RPC line driver:
// initialize, session/new in a workspace, one prompt whose tool call asks permission (allowed)
// and writes a file, then stdin EOF and exit. It proves the recipes without the acp package.
func TestACPRecipes(t *testing.T) {
	in, err := agents.Find()
	if err != nil {
		t.Skipf("agents not installed (run `make setup`; CI always does): %v", err)
	}
	for _, k := range agents.ACPKinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			runACPRecipe(t, in, k)
		})
	}
}

func runACPRecipe(t *testing.T, in *agents.Install, k agents.Kind) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	sim := modelsim.New(modelsim.Options{})
	if err := sim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })

	r, err := in.ACP(k, agents.ACPOptions{Home: t.TempDir(), ModelURL: sim.URL()})
	if err != nil {
		t.Fatal(err)
	}
	ws := t.TempDir()
	d := startACP(t, r, ws)

	start := time.Now()
	var initRes struct {
		ProtocolVersion int             `json:"protocolVersion"`
		AgentInfo       json.RawMessage `json:"agentInfo"`
	}
	d.call(t, "initialize", map[string]any{
		"protocolVersion":    1,
		"clientCapabilities": map[string]any{"fs": map[string]any{"readTextFile": false, "writeTextFile": false}, "terminal": false},
		"clientInfo":         map[string]any{"name": "agenthost-test", "version": "0"},
	}, &initRes)
	initT := time.Since(start)
	if initRes.ProtocolVersion != 1 {
		t.Errorf("protocolVersion = %d", initRes.ProtocolVersion)
	}
	var sess struct {
		SessionID string `json:"sessionId"`
	}
	d.call(t, "session/new", map[string]any{"cwd": ws, "mcpServers": []any{}}, &sess)
	newT := time.Since(start)
	if sess.SessionID == "" {
		t.Fatal("session/new gave no sessionId")
	}
	if r.Mode != "" {
		d.call(t, "session/set_mode", map[string]any{"sessionId": sess.SessionID, "modeId": r.Mode}, nil)
	}
	promptStart := time.Now()
	var res struct {
		StopReason string `json:"stopReason"`
	}
	d.call(t, "session/prompt", map[string]any{
		"sessionId": sess.SessionID,
		"prompt":    []any{map[string]any{"type": "text", "text": "Write it: " + acpTool[k]}},
	}, &res)
	promptT := time.Since(promptStart)
	if res.StopReason != "end_turn" {
		t.Errorf("stopReason = %q, want end_turn", res.StopReason)
	}
	if got, err := os.ReadFile(filepath.Join(ws, "out.txt")); err != nil || strings.TrimSpace(string(got)) != "hi" {
		t.Errorf("out.txt = %q, %v; want hi", got, err)
	}
	if n := d.permissions(); n != 1 {
		t.Errorf("%d permission requests, want 1", n)
	}
	if !strings.Contains(d.text(), "done") {
		t.Errorf("agent_message_chunk text %q has no %q", d.text(), "done")
	}
	// The claude CLI outlives its adapter for a few seconds after EOF: remember the tree now so
	// the cleanup can end what the exit leaves behind.
	d.tree = descendants(d.cmd.Process.Pid)
	exitT := d.closeAndWait(t)
	t.Logf("%s: initialize %v, session/new %v (from spawn), prompt %v, stdin EOF → exit %v",
		k, initT.Round(time.Millisecond), newT.Round(time.Millisecond), promptT.Round(time.Millisecond), exitT)
}

// acpDriver speaks newline-delimited JSON-RPC 2.0 to one agent process. It answers
// session/request_permission with the first allow option and every other agent request with
// "method not found"; it records message text and counts permissions.
type acpDriver struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *tailBuffer
	done   chan struct{} // closed once stdout hit EOF and the process was reaped
	wmu    sync.Mutex

	mu      sync.Mutex
	nextID  int
	waiting map[string]chan json.RawMessage // result or error, by request id
	msg     strings.Builder
	perms   int
	tree    []proc // the agent's descendants just before stdin EOF
}

type rpcFrame struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   json.RawMessage `json:"error,omitempty"`
}

func startACP(t *testing.T, r agents.ACPRecipe, cwd string) *acpDriver {
	t.Helper()
	cmd := exec.Command(r.Argv[0], r.Argv[1:]...)
	cmd.Env = r.Env
	cmd.Dir = cwd
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	d := &acpDriver{cmd: cmd, stdin: stdin, stderr: &tailBuffer{max: 16 << 10}, done: make(chan struct{}),
		waiting: make(map[string]chan json.RawMessage)}
	cmd.Stderr = d.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go d.read(stdout)
	t.Cleanup(func() {
		// Claude and copilot run tools in sessions of their own, and claude's CLI outlives its
		// adapter: end everything still below the agent, then the agent's group.
		killTree(cmd.Process.Pid, d.tree)
		select {
		case <-d.done:
		case <-time.After(exitTimeout):
			t.Errorf("agent not reaped within %v of the kill", exitTimeout)
		}
	})
	return d
}

func (d *acpDriver) read(stdout io.Reader) {
	defer close(d.done)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		var f rpcFrame
		if json.Unmarshal(sc.Bytes(), &f) != nil {
			continue
		}
		switch {
		case f.Method != "" && len(f.ID) > 0:
			d.answer(f)
		case f.Method == "session/update":
			var p struct {
				Update struct {
					SessionUpdate string `json:"sessionUpdate"`
					Content       struct {
						Type string `json:"type"`
						Text string `json:"text"`
					} `json:"content"`
				} `json:"update"`
			}
			if json.Unmarshal(f.Params, &p) == nil && p.Update.SessionUpdate == "agent_message_chunk" {
				d.mu.Lock()
				d.msg.WriteString(p.Update.Content.Text)
				d.mu.Unlock()
			}
		case f.Method == "" && len(f.ID) > 0:
			d.mu.Lock()
			ch := d.waiting[string(f.ID)]
			delete(d.waiting, string(f.ID))
			d.mu.Unlock()
			if ch != nil {
				if len(f.Error) > 0 {
					ch <- append(json.RawMessage(`{"error":`), append(f.Error, '}')...)
				} else {
					ch <- append(json.RawMessage(`{"result":`), append(f.Result, '}')...)
				}
			}
		}
	}
	_ = d.cmd.Wait()
}

// answer replies to an agent→client request (whose id may be 0).
func (d *acpDriver) answer(f rpcFrame) {
	if f.Method != "session/request_permission" {
		d.write(map[string]any{"jsonrpc": "2.0", "id": f.ID, "error": map[string]any{"code": -32601, "message": "method not found"}})
		return
	}
	var p struct {
		Options []struct {
			OptionID string `json:"optionId"`
			Kind     string `json:"kind"`
		} `json:"options"`
	}
	_ = json.Unmarshal(f.Params, &p)
	d.mu.Lock()
	d.perms++
	d.mu.Unlock()
	for _, o := range p.Options {
		if o.Kind == "allow_once" || o.Kind == "allow_always" {
			d.write(map[string]any{"jsonrpc": "2.0", "id": f.ID,
				"result": map[string]any{"outcome": map[string]any{"outcome": "selected", "optionId": o.OptionID}}})
			return
		}
	}
	d.write(map[string]any{"jsonrpc": "2.0", "id": f.ID, "result": map[string]any{"outcome": map[string]any{"outcome": "cancelled"}}})
}

func (d *acpDriver) write(v any) {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // only the driver's own maps reach here
	}
	d.wmu.Lock()
	defer d.wmu.Unlock()
	_, _ = d.stdin.Write(append(data, '\n'))
}

// call sends a request and decodes its result into out (if not nil); an error answer, the
// agent's exit or acpTimeout fails the test.
func (d *acpDriver) call(t *testing.T, method string, params, out any) {
	t.Helper()
	d.mu.Lock()
	d.nextID++
	id := strconv.Itoa(d.nextID)
	ch := make(chan json.RawMessage, 1)
	d.waiting[id] = ch
	d.mu.Unlock()
	d.write(map[string]any{"jsonrpc": "2.0", "id": d.nextID, "method": method, "params": params})
	select {
	case raw := <-ch:
		var r struct {
			Result json.RawMessage `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		_ = json.Unmarshal(raw, &r)
		if len(r.Error) > 0 {
			t.Fatalf("%s: error %s; stderr:\n%s", method, r.Error, d.stderr)
		}
		if out != nil {
			if err := json.Unmarshal(r.Result, out); err != nil {
				t.Fatalf("%s: result %s: %v", method, r.Result, err)
			}
		}
	case <-d.done:
		t.Fatalf("%s: the agent exited; stderr:\n%s", method, d.stderr)
	case <-time.After(acpTimeout):
		t.Fatalf("%s: no answer within %v; stderr:\n%s", method, acpTimeout, d.stderr)
	}
}

func (d *acpDriver) text() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.msg.String()
}

func (d *acpDriver) permissions() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.perms
}

// closeAndWait closes stdin (the agents exit on EOF) and returns how long the agent took to exit.
func (d *acpDriver) closeAndWait(t *testing.T) time.Duration {
	t.Helper()
	start := time.Now()
	_ = d.stdin.Close()
	select {
	case <-d.done:
		return time.Since(start).Round(time.Millisecond)
	case <-time.After(exitTimeout):
		t.Errorf("agent did not exit within %v of stdin EOF", exitTimeout)
		return exitTimeout
	}
}

// proc is a process identified by pid and start time, so a reused pid is never hit.
type proc struct{ pid, start int }

// killTree SIGKILLs every live descendant of pid (found through /proc, whatever session it
// moved to), the processes of earlier that still live (reparented away), and pid's group.
func killTree(pid int, earlier []proc) {
	for _, p := range append(descendants(pid), earlier...) {
		if startTime(p.pid) == p.start {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
}

// statFields returns the fields of /proc/PID/stat after the command name, or nil.
func statFields(pid int) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

// startTime is field 22 of /proc/PID/stat (clock ticks since boot), or -1.
func startTime(pid int) int {
	f := statFields(pid)
	if len(f) < 20 {
		return -1
	}
	n, err := strconv.Atoi(f[19])
	if err != nil {
		return -1
	}
	return n
}

// descendants lists the processes below pid by parent links in /proc.
func descendants(pid int) []proc {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// The parent pid is the second field after the command name.
		f := statFields(p)
		if len(f) < 2 {
			continue
		}
		pp, _ := strconv.Atoi(f[1])
		children[pp] = append(children[pp], p)
	}
	var out []proc
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, proc{c, startTime(c)})
			queue = append(queue, c)
		}
	}
	return out
}
