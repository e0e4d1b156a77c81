package startfail

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/internal/confine"
)

// What each runtime writes when it fails at start, and the line that says why.
var failures = []struct {
	name, stderr, cause string
}{
	{"node: a module missing", `node:internal/modules/cjs/loader:1228
  throw err;
  ^

Error: Cannot find module '/opt/agent/cli.js'
    at Module._resolveFilename (node:internal/modules/cjs/loader:1225:15)
    at node:internal/main/run_main_module:28:49 {
  code: 'MODULE_NOT_FOUND',
  requireStack: []
}

Node.js v20.20.2`, "Error: Cannot find module '/opt/agent/cli.js'"},
	{"bun: an exception in a bundle", `153 | var x=function(){throw new Error("no home")}
                          ^
error: ENOENT: no such file or directory, open '/root/.omp/agent/config.yml'
      at dRe (/x/cli.js:153:5412)
      at async main (/x/cli.js:1:1)`, "error: ENOENT: no such file or directory, open '/root/.omp/agent/config.yml'"},
	{"python without its library", `Python path configuration:
  PYTHONHOME = (not set)
  PYTHONPATH = (not set)
Fatal Python error: init_fs_encoding: failed to get the Python codec of the filesystem encoding
Python runtime state: core initialized
ModuleNotFoundError: No module named 'encodings'

Current thread 0x00007f (most recent call first):
  <no Python frame>`, "ModuleNotFoundError: No module named 'encodings'"},
	{"python traceback", `Traceback (most recent call last):
  File "/x/agent.py", line 3, in <module>
    import acp
ModuleNotFoundError: No module named 'acp'`, "ModuleNotFoundError: No module named 'acp'"},
	{"no error word", "starting\nbye", "bye"},
}

func TestCauseLine(t *testing.T) {
	for _, f := range failures {
		if got := CauseLine(f.stderr); got != f.cause {
			t.Errorf("%s: cause %q, want %q", f.name, got, f.cause)
		}
	}
}

// The error keeps the last lines of stderr, redacted and bounded; its
// first line is the start error and what to check.
func TestExplain_TailRedactedAndBounded(t *testing.T) {
	var b strings.Builder
	for i := range 40 {
		b.WriteString(strings.Repeat("x", i*20) + "\n")
	}
	b.WriteString("Error: bad key OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwxyz\n")
	err := Explain(errors.New("rpc: agent exited: exit status 1"), b.String(), Info{Command: []string{"omp"}})
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("not an *Error: %v", err)
	}
	if len(e.Tail) != MaxLines {
		t.Fatalf("%d lines kept, want %d", len(e.Tail), MaxLines)
	}
	for _, l := range e.Tail {
		if len(l) > MaxLine+len("…") {
			t.Fatalf("a line of %d bytes kept", len(l))
		}
	}
	if strings.Contains(err.Error(), "abcdefghijklmnop") || !strings.Contains(e.Cause, "[redacted]") {
		t.Fatalf("the key is not redacted: %s", err)
	}
	first, rest, _ := strings.Cut(err.Error(), "\n")
	if first != "rpc: agent exited: exit status 1; check what it says, and the installed agents with agenthost doctor" {
		t.Fatalf("first line %q", first)
	}
	if !strings.HasPrefix(rest, "the agent's stderr ended with:\n  ") || !strings.HasSuffix(rest, "[redacted]") {
		t.Fatalf("the tail: %q", rest)
	}
	if !errors.Is(err, e.Err) || Explain(err, "more", Info{}) != err {
		t.Fatal("wrapped twice, or the start error lost")
	}
}

func TestExplain_NothingOnStderr(t *testing.T) {
	err := Explain(errors.New("rpc: agent exited: exit status 1"), "", Info{Command: []string{"/bin/false"}, Custom: true})
	if want := `rpc: agent exited: exit status 1; it wrote nothing to stderr: check that "/bin/false" runs and speaks the agent's protocol on stdin and stdout`; err.Error() != want {
		t.Fatalf("%q\nwant %q", err, want)
	}
}

// A confined agent whose program lives outside what it may read (an
// interpreter installed in a home: bin/ beside lib/) is told confinement
// denied it and which flag allows it; one whose folder is readable is not.
func TestExplain_ConfinementDenied(t *testing.T) {
	root := t.TempDir()
	if real, err := filepath.EvalSymlinks(root); err == nil {
		root = real
	}
	prog := filepath.Join(root, "pyenv", "bin", "python3")
	if err := os.MkdirAll(filepath.Dir(prog), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	pol := &confine.Policy{Rules: []confine.Rule{{Path: "/usr", Access: confine.AccessReadExec}, {Path: prog, Access: confine.AccessReadExec}}}
	python := failures[2].stderr
	err := Explain(errors.New("rpc: agent exited: exit status 1"), python, Info{Command: []string{prog, "agent.py"}, Custom: true, Policy: pol, Allow: "serve --confine-read"})
	var e *Error
	if !errors.As(err, &e) || e.Denied != filepath.Join(root, "pyenv") {
		t.Fatalf("denied %q: %v", e.Denied, err)
	}
	if !strings.Contains(err.Error(), "confinement denied it") || !strings.Contains(err.Error(), "serve --confine-read "+filepath.Join(root, "pyenv")) {
		t.Fatalf("no way to allow it: %v", err)
	}
	// The same program failing for a reason of its own (Node's missing
	// module, elsewhere): not blamed on confinement.
	err = Explain(errors.New("x"), failures[0].stderr, Info{Command: []string{prog}, Custom: true, Policy: pol})
	if errors.As(err, &e); e.Denied != "" {
		t.Fatalf("blamed on confinement: %v", err)
	}
	pol.User = &confine.User{UID: 2000000001}
	if err := Explain(errors.New("x"), python, Info{Command: []string{prog}, Policy: pol}); !strings.Contains(err.Error(), "uid 2000000001") {
		t.Fatalf("the agent's own uid not named: %v", err)
	}
	pol.User = nil
	// A folder named in a refusal on stderr.
	data := filepath.Join(root, "share")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	err = Explain(errors.New("x"), "cat: "+data+"/lib.txt: Permission denied", Info{Command: []string{"/bin/sh"}, Policy: pol})
	if !errors.As(err, &e) || e.Denied != data {
		t.Fatalf("denied %q: %v", e.Denied, err)
	}
	// Written: no flag lets it write there.
	err = Explain(errors.New("x"), `SQLiteError: Database "`+data+`/agent.db": unable to open database file`, Info{Command: []string{"/bin/sh"}, Policy: pol})
	if !errors.As(err, &e) || e.Denied != data || !e.Write || strings.Contains(err.Error(), "--confine-read") || !strings.Contains(err.Error(), "may not write "+data) {
		t.Fatalf("a write denied: %v", err)
	}
	// Readable: the cause is something else.
	pol.Rules = append(pol.Rules, confine.Rule{Path: root, Access: confine.AccessRead})
	err = Explain(errors.New("x"), python, Info{Command: []string{prog}, Custom: true, Policy: pol})
	if errors.As(err, &e); e.Denied != "" || strings.Contains(err.Error(), "confinement") {
		t.Fatalf("blamed on confinement: %v", err)
	}
	// Unconfined: never blamed on confinement.
	err = Explain(errors.New("x"), python, Info{Command: []string{prog}, Custom: true})
	if strings.Contains(err.Error(), "confinement") {
		t.Fatalf("blamed on confinement: %v", err)
	}
}
