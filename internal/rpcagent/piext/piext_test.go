package piext

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/agents"
)

// The constants the extension and the host share are the same on both
// sides.
func TestWireMatchesTheExtension(t *testing.T) {
	src := string(source)
	for _, decl := range []string{
		`const FLAG = "` + Flag + `";`,
		`const TOOL_PREFIX = "` + ToolPrefix + `";`,
		`const YOLO = "` + ModeYolo + `";`,
		`const APPROVAL_PREFIX = "Allow tool: ";`,
		`const APPROVE = "Approve";`,
		`const DENY = "Deny";`,
	} {
		if !strings.Contains(src, decl) {
			t.Errorf("agenthost.ts lacks %s", decl)
		}
	}
}

func TestToolCallAndResult(t *testing.T) {
	for _, tc := range []struct {
		method, title, placeholder string
		name, args                 string
		ok                         bool
	}{
		{"input", ToolPrefix + "room_post", `{"text":"hi"}`, "room_post", `{"text":"hi"}`, true},
		{"input", ToolPrefix + "room_info", "", "room_info", `{}`, true},
		{"input", ToolPrefix, "{}", "", "", false},
		{"select", ToolPrefix + "room_post", "{}", "", "", false},
		{"input", "Which color?", "", "", "", false},
	} {
		name, args, ok := ToolCall(tc.method, tc.title, tc.placeholder)
		if name != tc.name || string(args) != tc.args || ok != tc.ok {
			t.Errorf("ToolCall(%q, %q, %q) = %q, %q, %v", tc.method, tc.title, tc.placeholder, name, args, ok)
		}
	}
	if got := ToolResult("posted", nil); got != `{"text":"posted"}` {
		t.Errorf("result %s", got)
	}
	if got := ToolResult("ignored", errors.New("no <room>")); got != `{"error":"no \u003croom\u003e"}` {
		t.Errorf("error result %s", got)
	}
}

// piPackage is the installed agents and pi's package folder.
func piPackage(t *testing.T) (*agents.Install, string) {
	t.Helper()
	in, err := agents.Find()
	if err != nil {
		t.Fatalf("the real agents are needed (run make setup): %v", err)
	}
	pkg, err := in.PackageDir(agents.Pi)
	if err != nil {
		t.Fatal(err)
	}
	return in, pkg
}

// Write leaves a home that names the extension, the room file and a
// package manifest whose project folder no repository has, rewritten at
// every call.
func TestWrite(t *testing.T) {
	in, pkg := piPackage(t)
	home := t.TempDir()
	room := Room{ApprovalMode: "always-ask", Tools: []Tool{{Name: "room_post", Description: "Post.", Parameters: json.RawMessage(`{"type":"object"}`)}}}
	setups, manifests := make([]Setup, 2), make([]map[string]any, 2)
	manifest := func(s Setup) map[string]any {
		var pkgEnv string
		for _, kv := range s.Env {
			if v, ok := strings.CutPrefix(kv, "PI_PACKAGE_DIR="); ok {
				pkgEnv = v
			}
		}
		b, err := os.ReadFile(filepath.Join(pkgEnv, "package.json"))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(pkgEnv, "dist", "cli.js")); err != nil {
			t.Errorf("the package copy does not reach pi's files: %v", err)
		}
		return m
	}
	for i := range setups {
		if i > 0 {
			// Left from an earlier run: gone after the next Write.
			if err := os.WriteFile(filepath.Join(home, dirName, "planted.ts"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		s, err := Write(home, pkg, room)
		if err != nil {
			t.Fatal(err)
		}
		setups[i], manifests[i] = s, manifest(s)
	}
	if _, err := os.Stat(filepath.Join(home, dirName, "planted.ts")); err == nil {
		t.Error("a file planted in the extension's folder survived a Write")
	}
	s := setups[1]
	env := map[string]string{}
	for _, kv := range s.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	if env["PI_CODING_AGENT_DIR"] != filepath.Join(home, ".pi", "agent") {
		t.Errorf("agent dir %q", env["PI_CODING_AGENT_DIR"])
	}
	m0, m1 := manifests[0], manifests[1]
	dir0 := m0["piConfig"].(map[string]any)["configDir"].(string)
	dir1 := m1["piConfig"].(map[string]any)["configDir"].(string)
	if dir0 == ".pi" || !strings.HasPrefix(dir0, ".agenthost-no-project-") || dir0 == dir1 {
		t.Errorf("project folders %q then %q: want a fresh unguessable name each time", dir0, dir1)
	}
	want, _ := in.Version(agents.Pi)
	if m1["version"] != want || m1["name"] != "@mariozechner/pi-coding-agent" {
		t.Errorf("manifest %v %v", m1["name"], m1["version"])
	}
	var roomArg string
	for _, a := range s.Args {
		if v, ok := strings.CutPrefix(a, "--"+Flag+"="); ok {
			roomArg = v
		}
	}
	b, err := os.ReadFile(roomArg)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"approval_mode":"always-ask","tools":[{"name":"room_post","description":"Post.","parameters":{"type":"object"}}]}` {
		t.Errorf("room file %s", b)
	}
	for _, flag := range []string{"--no-extensions", "--no-skills", "--no-prompt-templates", "--no-themes", "--extension"} {
		if !strings.Contains(strings.Join(s.Args, " "), flag) {
			t.Errorf("args %v lack %s", s.Args, flag)
		}
	}
}

// pi refuses to start when the extension cannot read its room (fails
// closed, never runs unguarded), and when the extension is not loaded at
// all (its flag is then unknown).
func TestPiRefusesToStartWithoutItsRoom(t *testing.T) {
	in, pkg := piPackage(t)
	argv, err := in.Argv(agents.Pi)
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	s, err := Write(home, pkg, Room{ApprovalMode: "always-ask"})
	if err != nil {
		t.Fatal(err)
	}
	run := func(args []string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, argv[0], append(append(argv[1:], "--mode", "rpc", "--no-session"), args...)...)
		cmd.Dir = t.TempDir()
		cmd.Env = append(os.Environ(), "HOME="+home, "PI_OFFLINE=1")
		cmd.Env = append(cmd.Env, s.Env...)
		// stdin is empty: a pi that started would exit 0 at its EOF.
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	noRoom := make([]string, 0, len(s.Args))
	noExt := make([]string, 0, len(s.Args))
	for i, a := range s.Args {
		switch {
		case strings.HasPrefix(a, "--"+Flag+"="):
			noRoom = append(noRoom, "--"+Flag+"="+filepath.Join(home, "missing.json"))
			noExt = append(noExt, a)
		case a == "--extension" || i > 0 && s.Args[i-1] == "--extension":
			noRoom = append(noRoom, a)
		default:
			noRoom = append(noRoom, a)
			noExt = append(noExt, a)
		}
	}
	for name, args := range map[string][]string{"no room file": noRoom, "no extension": noExt} {
		out, err := run(args)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Errorf("%s: pi did not refuse to start (%v): %s", name, err, out)
			continue
		}
		if want := map[string]string{"no room file": "missing.json", "no extension": "--" + Flag}[name]; !strings.Contains(out, want) {
			t.Errorf("%s: pi's error does not name %s: %s", name, want, out)
		}
	}
}

// The extension's folder replaced by a link to another room's folder (or
// the home's own planted there): Write removes the link itself, never what
// it names, and writes its files into a folder of its own.
func TestWriteReplacesAPlantedLink(t *testing.T) {
	_, pkg := piPackage(t)
	base := t.TempDir()
	victim := filepath.Join(base, "victim")
	if err := os.MkdirAll(victim, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{roomName, extName, "notes.txt"} {
		if err := os.WriteFile(filepath.Join(victim, n), []byte("the victim's"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	home := filepath.Join(base, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(home, dirName)); err != nil {
		t.Fatal(err)
	}
	if _, err := Write(home, pkg, Room{ApprovalMode: "always-ask"}); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(victim)
	for _, e := range ents {
		if b, _ := os.ReadFile(filepath.Join(victim, e.Name())); string(b) != "the victim's" {
			t.Errorf("the victim's %s: %q", e.Name(), b)
		}
	}
	if len(ents) != 3 {
		t.Errorf("the victim's folder holds %d entries", len(ents))
	}
	for _, n := range []string{dirName, filepath.Join(dirName, roomName), filepath.Join(dirName, packageName, "package.json")} {
		fi, err := os.Lstat(filepath.Join(home, n))
		if err != nil || fi.Mode()&os.ModeSymlink != 0 {
			t.Fatalf("%s: %v, %v", n, fi, err)
		}
	}
}
