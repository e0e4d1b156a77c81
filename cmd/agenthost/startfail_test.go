package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/internal/confine"
)

// nodeFailure is what Node writes when the agent's script is missing: the
// cause is in the middle, its last words are its version.
const nodeFailure = `#!/bin/sh
cat >&2 <<'X'
node:internal/modules/cjs/loader:1228
  throw err;
  ^

Error: Cannot find module '/opt/agent/cli.js'
    at Module._resolveFilename (node:internal/modules/cjs/loader:1225:15)
    at node:internal/main/run_main_module:28:49 {
  code: 'MODULE_NOT_FOUND',
  requireStack: []
}

Node.js v20.20.2
X
exit 1
`

// interpreterAgent is an interpreter installed outside the system's folders
// (a pyenv or nvm one in a user's home: DIR/bin/agent beside DIR/lib): it
// fails as Python does when it cannot read its library, and, when it can,
// tries to write there and says whether it could.
const interpreterAgent = `#!/bin/sh
d=$(dirname "$0")/..
if ! cat "$d/lib/stdlib.txt" >/dev/null; then
  echo "Python path configuration:" >&2
  echo "  PYTHONHOME = (not set)" >&2
  echo "Fatal Python error: init_fs_encoding: failed to get the Python codec of the filesystem encoding" >&2
  echo "ModuleNotFoundError: No module named 'encodings'" >&2
  exit 1
fi
if touch "$d/lib/written" 2>/dev/null; then echo "Error: the library was writable" >&2; else echo "Error: read the library, could not write it" >&2; fi
exit 3
`

// writeAgent writes script as DIR/bin/agent under a new folder and returns
// the folder and the program, links resolved.
func writeAgent(t *testing.T, script string) (dir, prog string) {
	t.Helper()
	dir = t.TempDir()
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	prog = filepath.Join(dir, "bin", "agent")
	for _, d := range []string{filepath.Dir(prog), filepath.Join(dir, "lib")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "lib", "stdlib.txt"), []byte("codecs"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(prog, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, prog
}

// An agent that fails to start says why, in one line: the line of its
// stderr that names the cause (not Node's version banner), what to check,
// and with -v the last lines of its stderr.
func TestPrompt_StartFailureSaysWhy(t *testing.T) {
	_, prog := writeAgent(t, nodeFailure)
	_, errs, code := runCLI(t, "prompt", "x", "--", prog)
	want := `agenthost: starting the agent: rpc: agent exited: exit status 1 (stderr: Error: Cannot find module '/opt/agent/cli.js'); check what it says by running "` + prog + `" yourself` + "\n"
	if code != exitFailed || errs != want {
		t.Fatalf("exit %d, stderr %q\nwant %q", code, errs, want)
	}
	_, errs, code = runCLI(t, "-v", "prompt", "x", "--", prog)
	if code != exitFailed || !strings.Contains(errs, "agenthost: the agent's stderr ended with:\n  node:internal/modules/cjs/loader:1228\n") ||
		!strings.Contains(errs, "\n  Node.js v20.20.2\n") {
		t.Fatalf("-v: exit %d, stderr %q", code, errs)
	}
	_, errs, code = runCLI(t, "prompt", "x", "--", "/bin/false")
	want = `agenthost: starting the agent: rpc: agent exited: exit status 1; it wrote nothing to stderr: check that "/bin/false" runs and speaks the agent's protocol on stdin and stdout` + "\n"
	if code != exitFailed || errs != want {
		t.Fatalf("exit %d, stderr %q\nwant %q", code, errs, want)
	}
}

// A confined custom agent that cannot read its interpreter's files is told
// that confinement denied it and how to allow it; --confine-read lets it
// read them, never write them.
func TestPrompt_StartFailureConfinementDenied(t *testing.T) {
	if !(confineFlags{mode: "auto"}).enforced() {
		t.Skip("this kernel has no Landlock: nothing is confined to deny")
	}
	dir, prog := writeAgent(t, interpreterAgent)
	_, errs, code := runCLI(t, "prompt", "x", "--", prog)
	if code != exitFailed || !strings.Contains(errs, "(stderr: ModuleNotFoundError: No module named 'encodings')") ||
		!strings.Contains(errs, "confinement denied it") || !strings.Contains(errs, "give prompt --confine-read "+dir+"\n") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	_, errs, code = runCLI(t, "prompt", "--confine-read", dir, "x", "--", prog)
	if code != exitFailed || !strings.Contains(errs, "Error: read the library, could not write it") || strings.Contains(errs, "confinement") {
		t.Fatalf("with --confine-read: exit %d, stderr %q", code, errs)
	}
	if _, err := os.Stat(filepath.Join(dir, "lib", "written")); err == nil {
		t.Fatal("--confine-read let the agent write")
	}
	_, errs, code = runCLI(t, "prompt", "--confine-read", "lib", "x", "--", prog)
	if code != exitUsage || !strings.Contains(errs, "not absolute") {
		t.Fatalf("a relative --confine-read: exit %d, stderr %q", code, errs)
	}
}

// A room's agent that fails to start: the turn's reason (the event) holds
// the cause, what to check and the last lines of the agent's stderr.
func TestServe_StartFailureInTheEvent(t *testing.T) {
	if !(confineFlags{mode: "auto"}).enforced() {
		t.Skip("this kernel has no Landlock: nothing is confined to deny")
	}
	dir, prog := writeAgent(t, interpreterAgent)
	url, token, _ := startServe(t, "--data", t.TempDir(), "--agent-uids", "off", "--", prog)
	if code, body := call(t, "POST", url+"v1/rooms/a/messages", token, `{"text":"hello"}`); code != 202 {
		t.Fatalf("post: %d %s", code, body)
	}
	ev := waitTurnEnded(t, url, token, "a")
	reason, _ := ev["reason"].(string)
	for _, want := range []string{"(stderr: ModuleNotFoundError: No module named 'encodings')", "confinement denied it",
		"give serve --confine-read " + dir, "\nthe agent's stderr ended with:\n", "\n  Python path configuration:\n"} {
		if ev["outcome"] != "failed" || !strings.Contains(reason, want) {
			b, _ := json.Marshal(ev)
			t.Fatalf("turn.ended %s\nwant %q in its reason", b, want)
		}
	}
}

// --confine-read never reaches the server's own folders: the data dir, the
// workspaces, a folder holding either or within either is refused (exit 2)
// before anything is created.
func TestServe_ConfineReadRefusesPrivateFolders(t *testing.T) {
	root := t.TempDir()
	data := filepath.Join(root, "data")
	ws := filepath.Join(root, "ws")
	if err := os.MkdirAll(filepath.Join(ws, "room"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{root, ws, filepath.Join(ws, "room"), "/"} {
		_, errs, code := runCLI(t, "serve", "--listen", "127.0.0.1:0", "--data", data, "--workspaces", ws, "--confine-read", dir)
		if code != exitUsage || !strings.Contains(errs, "--confine-read") {
			t.Fatalf("--confine-read %s: exit %d, stderr %q", dir, code, errs)
		}
		if _, err := os.Stat(data); err == nil {
			t.Fatalf("--confine-read %s: the data dir was created", dir)
		}
	}
	if err := confine.CheckRead([]string{filepath.Join(root, "ws-other")}, []string{data, ws}); err == nil {
		t.Fatal("a missing folder accepted")
	}
}
