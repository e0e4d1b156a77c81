package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// readmeStep is one console block of the README's "First ten minutes":
// a command and the output it shows, or (cmd "") more output of a command
// still running.
type readmeStep struct {
	cmd string
	out []string
}

// readmeSteps parses the console blocks of the README section titled
// heading: "$ " starts a command (a trailing backslash continues it on the
// next line), other lines are its output.
func readmeSteps(t *testing.T, heading string) []readmeStep {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("README has no section %q", heading)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	var steps []readmeStep
	for _, block := range strings.Split(sec, "```console\n")[1:] {
		block, _, _ = strings.Cut(block, "```")
		lines := strings.Split(strings.TrimSuffix(block, "\n"), "\n")
		cur := -1
		if !strings.HasPrefix(lines[0], "$ ") {
			steps = append(steps, readmeStep{})
			cur = len(steps) - 1
		}
		for i := 0; i < len(lines); i++ {
			l := lines[i]
			if c, ok := strings.CutPrefix(l, "$ "); ok {
				for strings.HasSuffix(c, `\`) && i+1 < len(lines) {
					i++
					c = strings.TrimSuffix(c, `\`) + " " + strings.TrimSpace(lines[i])
				}
				steps = append(steps, readmeStep{cmd: c})
				cur = len(steps) - 1
				continue
			}
			steps[cur].out = append(steps[cur].out, l)
		}
	}
	return steps
}

// shellWords splits a command line as sh would, for the quoting the
// README uses: single quotes, and double quotes without expansions.
func shellWords(t *testing.T, s string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	in, quote := false, byte(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0 && c == quote:
			quote = 0
		case quote != 0:
			if quote == '"' && strings.ContainsRune("$`\\", rune(c)) {
				t.Fatalf("%q: the test does not expand %q inside double quotes", s, c)
			}
			w.WriteByte(c)
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == ' ':
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		default:
			if strings.ContainsRune("$`\\|&;<>()*?", rune(c)) {
				t.Fatalf("%q: %q needs a shell", s, c)
			}
			w.WriteByte(c)
			in = true
		}
	}
	if quote != 0 {
		t.Fatalf("%q: unterminated quote", s)
	}
	if in {
		words = append(words, w.String())
	}
	return words
}

// readmeIDs are the ids of messages, turns, approvals and questions: they
// differ from run to run.
var readmeIDs = regexp.MustCompile(`\b[amqt]_[0-9a-f]{8,}\b`)

// idMatcher matches README lines to real ones, learning which real id
// each README id stands for (one for one).
type idMatcher struct{ ids, back map[string]string }

// canon drops what differs between runs other than ids: an event's time,
// a room's incarnation (its creation time), a turn's token counts and
// cost (the agent's system prompt names the workspace, whose path
// differs), of which the fields are kept, and its compute.
func canon(l string) string {
	var m map[string]any
	if !strings.HasPrefix(l, "{") || json.Unmarshal([]byte(l), &m) != nil {
		return l
	}
	delete(m, "time")
	if _, ok := m["incarnation"]; ok {
		m["incarnation"] = "I"
	}
	if u, ok := m["usage"].(map[string]any); ok {
		for k := range u {
			u[k] = "N"
		}
	}
	// What the turn's processes used: measured where the machine has
	// cgroups, absent where it has none.
	delete(m, "compute")
	b, _ := json.Marshal(m)
	return string(b)
}

// match says whether README line want is got but for ids consistent with
// those learned, and learns the new ones.
func (m *idMatcher) match(want, got string) bool {
	want, got = canon(want), canon(got)
	if readmeIDs.ReplaceAllString(want, "ID") != readmeIDs.ReplaceAllString(got, "ID") {
		return false
	}
	w, g := readmeIDs.FindAllString(want, -1), readmeIDs.FindAllString(got, -1)
	learn := map[string]string{}
	for i := range w {
		if r, ok := m.ids[w[i]]; ok && r != g[i] {
			return false
		}
		if r, ok := learn[w[i]]; ok && r != g[i] {
			return false
		}
		if o, ok := m.back[g[i]]; ok && o != w[i] {
			return false
		}
		learn[w[i]] = g[i]
	}
	for k, v := range learn {
		m.ids[k], m.back[v] = v, k
	}
	return true
}

// matchAll matches every README line to a distinct real line (progress
// lines may come in another order: an agent reports a tool call and asks
// for its approval at about the same moment); complete also wants no real
// line left over.
func (m *idMatcher) matchAll(want, got []string, complete bool) error {
	used := make([]bool, len(got))
next:
	for _, w := range want {
		for i, g := range got {
			if !used[i] && m.match(w, g) {
				used[i] = true
				continue next
			}
		}
		return fmt.Errorf("no line like %q", w)
	}
	if complete {
		for i, g := range got {
			if !used[i] {
				return fmt.Errorf("a line the README does not show: %q", g)
			}
		}
	}
	return nil
}

// outBuf is a command's stdout and stderr together, in order, telling a
// waiter of each write.
type outBuf struct {
	mu     sync.Mutex
	b      bytes.Buffer
	wrote  chan struct{}
	exited chan int
}

func (o *outBuf) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.b.Write(p)
	select {
	case o.wrote <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (o *outBuf) lines() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := strings.TrimSuffix(o.b.String(), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// The README's "First ten minutes", then its "Changes and undo" (which goes
// on in the same room), walked against a real server (omp on the built-in
// model): every command of the sections is run as written (agenthost
// in-process, curl through sh), and its output must be the README's but for
// ids and times: every line shown, and none more. The server runs on the
// default data dir (XDG_DATA_HOME, for the token the curl line reads) and,
// as the section's last paragraph says, a port of its own given to the
// clients in AGENTHOST_URL. About 40 s: five turns of a real agent.
func TestReadme_FirstTenMinutes(t *testing.T) {
	steps := append(readmeSteps(t, "First ten minutes"), readmeSteps(t, "Changes and undo")...)
	var seen []string
	for _, st := range steps {
		seen = append(seen, st.cmd)
	}
	for _, want := range []string{"agenthost send demo \"hello\" --follow", "agenthost approve ", "agenthost answer ", "agenthost events demo --after ", "curl ",
		"[[tool:write ", "agenthost diff demo", "agenthost diff demo t_", "agenthost revert demo t_"} {
		if !strings.Contains(strings.Join(seen, "\n"), want) {
			t.Fatalf("the section runs no %q: %q", want, seen)
		}
	}
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Fatalf("the README's curl step needs curl: %v", err)
	}

	xdg := t.TempDir()
	t.Setenv("XDG_DATA_HOME", xdg)
	t.Setenv(tokenEnv, "")
	t.Setenv("AGENTHOST_DATA", "")
	url, _, _ := startServe(t)
	t.Setenv("AGENTHOST_URL", url)
	const readmeURL = "http://127.0.0.1:7420"

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	var started []*outBuf
	t.Cleanup(func() { // every command ended, on a failure too
		cancel()
		for _, o := range started {
			o.exited <- <-o.exited
		}
	})
	m := &idMatcher{ids: map[string]string{}, back: map[string]string{}}
	start := func(c string) *outBuf {
		o := &outBuf{wrote: make(chan struct{}, 1), exited: make(chan int, 1)}
		started = append(started, o)
		for k, v := range m.ids {
			c = strings.ReplaceAll(c, k, v)
		}
		switch {
		case strings.HasPrefix(c, "agenthost "):
			args := shellWords(t, c)[1:]
			go func() {
				code, msg := exitStatus(ctx, run(ctx, args, o, o))
				if msg != "" {
					fmt.Fprintln(o, "agenthost: "+msg)
				}
				o.exited <- code
			}()
		case strings.HasPrefix(c, "curl "):
			cmd := exec.CommandContext(ctx, "sh", "-c", strings.Replace(c, "curl ", curl+" ", 1))
			cmd.Args[2] = strings.ReplaceAll(cmd.Args[2], readmeURL, strings.TrimSuffix(url, "/"))
			cmd.Stdout, cmd.Stderr = o, o
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			go func() {
				_ = cmd.Wait()
				o.exited <- cmd.ProcessState.ExitCode()
			}()
		default:
			t.Fatalf("the test does not know how to run %q", c)
		}
		return o
	}
	// until waits for o to show want (complete: and to exit 0 with nothing
	// more).
	until := func(c string, o *outBuf, want []string, complete bool) {
		t.Helper()
		step := time.NewTimer(90 * time.Second) // a turn of the built-in model takes seconds
		defer step.Stop()
		for {
			exited := false
			select {
			case code := <-o.exited:
				o.exited <- code
				if code != 0 {
					t.Fatalf("%s: exit %d:\n%s", c, code, strings.Join(o.lines(), "\n"))
				}
				exited = true
			default:
			}
			snap := &idMatcher{ids: clone(m.ids), back: clone(m.back)}
			err := snap.matchAll(want, o.lines(), complete)
			if err == nil && (!complete || exited) {
				m.ids, m.back = snap.ids, snap.back
				return
			}
			if exited {
				t.Fatalf("%s: %v; its output:\n%s", c, err, strings.Join(o.lines(), "\n"))
			}
			select {
			case <-o.wrote:
			case code := <-o.exited:
				o.exited <- code
			case <-step.C:
				t.Fatalf("%s: after 90s: %v; its output so far:\n%s", c, err, strings.Join(o.lines(), "\n"))
			case <-ctx.Done():
				t.Fatalf("%s: %v; its output so far:\n%s", c, err, strings.Join(o.lines(), "\n"))
			}
		}
	}

	// A command followed by another and then by more of its output (the
	// approval, the question) waits there while the other runs.
	var waiting *outBuf
	var waitingCmd string
	var waitingOut []string
	for i, st := range steps {
		switch {
		case st.cmd == "export PATH=\"$PWD/bin:$PATH\"":
			// agenthost runs in-process here.
		case st.cmd == "":
			if waiting == nil {
				t.Fatalf("step %d: output with no command waiting", i)
			}
			waitingOut = append(waitingOut, st.out...)
			until(waitingCmd, waiting, waitingOut, true)
			waiting = nil
		case i+2 < len(steps) && steps[i+2].cmd == "":
			o := start(st.cmd)
			until(st.cmd, o, st.out, false)
			waiting, waitingCmd, waitingOut = o, st.cmd, st.out
		default:
			until(st.cmd, start(st.cmd), st.out, true)
		}
	}
	if waiting != nil {
		t.Fatalf("%s: the README never shows its end", waitingCmd)
	}
}

func clone(m map[string]string) map[string]string {
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}
