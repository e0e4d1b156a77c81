package confine

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// This test binary is the launcher of TestLaunch's commands, and
	// the confined agent of the probes (agentProbe) and the non-root
	// server of TestLaunch_NonRoot (nonRootServer).
	Launch()
	if testRole(m) {
		return
	}
	goleak.VerifyTestMain(m)
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"": ModeAuto, "auto": ModeAuto, "landlock": ModeLandlock, "off": ModeOff} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseMode("bwrap"); err == nil || !strings.Contains(err.Error(), "auto, landlock or off") {
		t.Errorf("ParseMode(bwrap): %v", err)
	}
}

func TestParseNet(t *testing.T) {
	if p, err := ParseNet("any"); err != nil || p != nil {
		t.Fatalf("any: %v %v", p, err)
	}
	if p, err := ParseNet(" 443, 80,443 "); err != nil || !slices.Equal(p, []uint16{80, 443}) {
		t.Fatalf("ports: %v %v", p, err)
	}
	for _, bad := range []string{"0", "65536", "http", "80,,443", "-1"} {
		if _, err := ParseNet(bad); err == nil {
			t.Errorf("ParseNet(%q) accepted", bad)
		}
	}
}

func abi(n int) func() int { return func() int { return n } }

// auto on a kernel without Landlock runs agents unconfined and says so;
// landlock refuses to start there.
func TestNew_KernelWithoutLandlock(t *testing.T) {
	c, err := New(Options{Mode: ModeAuto, KernelABI: abi(0), Tools: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if c.Enforced() || c.Warning() == "" {
		t.Fatalf("auto without Landlock: enforced %v, warning %q", c.Enforced(), c.Warning())
	}
	if r := c.Report(); r.Mode != ReportNone || r.ABI != 0 || r.Signals || r.Net != nil {
		t.Fatalf("report %+v", r)
	}
	ws := t.TempDir()
	p, err := c.Policy(AgentRoom(ws, t.TempDir(), []string{"sh"}, nil))
	if err != nil || p != nil {
		t.Fatalf("policy %v, %v; want none", p, err)
	}
	argv, env, err := p.Wrap([]string{"sh", "-c", "true"}, []string{"A=1"})
	if err != nil || !slices.Equal(argv, []string{"sh", "-c", "true"}) || !slices.Equal(env, []string{"A=1"}) {
		t.Fatalf("unconfined Wrap changed the command: %v %v %v", argv, env, err)
	}
	if _, err := New(Options{Mode: ModeLandlock, KernelABI: abi(0)}); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("landlock without Landlock: %v", err)
	}
}

// A network policy needs ABI 4: landlock refuses, auto warns and leaves
// the network open.
func TestNew_NetworkNeedsABI4(t *testing.T) {
	if _, err := New(Options{Mode: ModeLandlock, Net: []uint16{443}, KernelABI: abi(3)}); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("landlock, ABI 3, ports: %v", err)
	}
	c, err := New(Options{Mode: ModeAuto, Net: []uint16{443}, KernelABI: abi(3)})
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Report(); !c.Enforced() || c.Warning() == "" || r.Net != nil || r.ABI != 3 || r.Signals {
		t.Fatalf("auto, ABI 3, ports: %+v, warning %q", r, c.Warning())
	}
}

func TestNew_OffAndNewerKernels(t *testing.T) {
	c, err := New(Options{Mode: ModeOff, KernelABI: abi(7)})
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Report(); c.Enforced() || r.Mode != ReportNone || r.ABI != 7 {
		t.Fatalf("off: %+v", r)
	}
	c, err = New(Options{Mode: ModeAuto, KernelABI: abi(9), Net: []uint16{443}, Ports: []uint16{8080, 443}})
	if err != nil {
		t.Fatal(err)
	}
	// Rules of ABI 7 at most; the model's port joins the list once.
	if r := c.Report(); r.Mode != ReportLandlock || r.ABI != MaxABI || !r.Signals || !slices.Equal(r.Net, []uint16{443, 8080}) {
		t.Fatalf("auto on ABI 9: %+v", r)
	}
}

func TestPolicy(t *testing.T) {
	tools := t.TempDir()
	extra := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(extra, []byte("#!/bin/sh\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	inTools := filepath.Join(tools, "bun")
	if err := os.WriteFile(inTools, nil, 0o700); err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{Mode: ModeLandlock, KernelABI: abi(7), Net: []uint16{}, Ports: []uint16{9000}, Tools: tools, Exe: "/bin/launcher"})
	if err != nil {
		t.Fatal(err)
	}
	ws, home := t.TempDir(), t.TempDir()
	// The TMPDIR is beside the home, in its parent (the room's folder),
	// which the agent cannot write.
	tmp := filepath.Join(filepath.Dir(home), "tmp")
	if agentTmp(home) != tmp {
		t.Fatalf("agentTmp(%s) = %s", home, agentTmp(home))
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(tmp, "left-by-the-last-agent")
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := c.Policy(AgentRoom(ws, home, []string{extra, inTools, "sh"}, []uint16{9100}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("the TMPDIR was not emptied: %v", err)
	}
	if fi, err := os.Stat(tmp); err != nil || !fi.IsDir() {
		t.Fatalf("TMPDIR: %v", err)
	}
	rules := map[string]Access{}
	for _, r := range p.Rules {
		rules[r.Path] = r.Access
		if r.Optional && (r.Path == ws || r.Path == home || r.Path == tmp || r.Path == tools) {
			t.Errorf("the room's own %s is optional", r.Path)
		}
		// The room's own folders, and only they, are checked as the
		// agent's.
		if own := r.Path == ws || r.Path == home || r.Path == tmp; r.Own != own {
			t.Errorf("rule for %s: own %v", r.Path, r.Own)
		}
		// Canonical: the launcher refuses a link anywhere in a path.
		if real, err := filepath.EvalSymlinks(r.Path); err != nil || real != r.Path {
			t.Errorf("rule for %s is not canonical (%s, %v)", r.Path, real, err)
		}
	}
	want := map[string]Access{
		"/usr": AccessReadExec, "/etc": AccessReadExec, "/proc": AccessRead, "/sys": AccessRead, "/dev/null": AccessReadWrite,
		tools: AccessReadExec, extra: AccessReadExec, ws: AccessReadWrite, home: AccessReadWrite, tmp: AccessReadWrite,
	}
	for path, a := range want {
		if rules[path] != a {
			t.Errorf("rule for %s: %q, want %q", path, rules[path], a)
		}
	}
	// A command under the tools or the system needs no rule of its own;
	// nothing else of the machine is reachable.
	for path := range rules {
		if path == inTools || strings.HasPrefix(path, "/bin/sh") || path == "/tmp" || path == "/" || path == "/root" || path == "/home" || path == "/run" ||
			strings.HasPrefix(path, "/dev/pts") || path == "/dev/tty" || path == "/dev/ptmx" {
			t.Errorf("unexpected rule for %s", path)
		}
	}
	if !slices.Equal(p.Net, []uint16{9000, 9100}) || p.ABI != 7 || p.Tmp != tmp {
		t.Fatalf("policy: net %v abi %d tmp %s", p.Net, p.ABI, p.Tmp)
	}
	if r := p.Report(); r.Mode != ReportLandlock || !r.Signals || !slices.Equal(r.Net, []uint16{9000, 9100}) {
		t.Fatalf("report %+v", r)
	}

	// A relative folder (serve --data ./data) is the same folder, absolute.
	t.Chdir(filepath.Dir(ws))
	rel, err := c.Policy(AgentRoom(filepath.Base(ws), home, nil, nil))
	if err != nil || !slices.ContainsFunc(rel.Rules, func(r Rule) bool { return r.Path == ws && r.Access == AccessReadWrite }) {
		t.Fatalf("a relative workspace: %v", err)
	}
	if _, err := c.Policy(AgentRoom(filepath.Join(ws, "missing"), home, nil, nil)); err == nil {
		t.Fatal("a missing workspace was accepted")
	}
	if _, err := c.Policy(AgentRoom(ws, home, []string{"no-such-command-here"}, nil)); err == nil {
		t.Fatal("a command not on PATH was accepted")
	}
	private := filepath.Join(t.TempDir(), "id_key")
	if err := os.WriteFile(private, []byte("key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Policy(AgentRoom(ws, home, []string{private}, nil)); err == nil {
		t.Fatal("a file without an execute bit was made a command (and readable)")
	}

	// More folders to read (a git workspace's mirror): read only, and
	// absolute.
	mirror := t.TempDir()
	ro := AgentRoom(ws, home, nil, nil)
	ro.Read = []string{mirror}
	p, err = c.Policy(ro)
	if err != nil || !slices.ContainsFunc(p.Rules, func(r Rule) bool { return r.Path == mirror && r.Access == AccessRead && !r.Optional }) {
		t.Fatalf("a read-only folder: %+v, %v", p, err)
	}
	ro.Read = []string{"relative"}
	if _, err := c.Policy(ro); err == nil {
		t.Fatal("a relative read-only folder was accepted")
	}
}

func TestPolicy_Wrap(t *testing.T) {
	c, err := New(Options{Mode: ModeLandlock, KernelABI: abi(7), Exe: "/bin/launcher"})
	if err != nil {
		t.Fatal(err)
	}
	ws, home := t.TempDir(), t.TempDir()
	p, err := c.Policy(AgentRoom(ws, home, []string{"sh"}, nil))
	if err != nil {
		t.Fatal(err)
	}
	argv, env, err := p.Wrap([]string{"sh", "-c", "echo hi"}, []string{"TMPDIR=/tmp", "A=1", PolicyEnv + "=stale"})
	if err != nil {
		t.Fatal(err)
	}
	if len(argv) != 6 || argv[0] != "/bin/launcher" || argv[1] != LauncherArg || argv[2] != "--" || !filepath.IsAbs(argv[3]) ||
		!slices.Equal(argv[4:], []string{"-c", "echo hi"}) {
		t.Fatalf("argv %q", argv)
	}
	var got Policy
	n := 0
	for _, kv := range env {
		switch {
		case strings.HasPrefix(kv, "TMPDIR="):
			if kv != "TMPDIR="+agentTmp(home) {
				t.Errorf("env %s", kv)
			}
			n++
		case strings.HasPrefix(kv, PolicyEnv+"="):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(kv, PolicyEnv+"=")), &got); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	if n != 2 || !slices.Contains(env, "A=1") || got.ABI != 7 || len(got.Rules) != len(p.Rules) || got.Net != nil {
		t.Fatalf("env %q, policy %+v", env, got)
	}
}

func TestReport_JSON(t *testing.T) {
	for _, tc := range []struct {
		r    Report
		want string
	}{
		{Report{Mode: ReportLandlock, ABI: 7, Signals: true, Net: []uint16{80, 443}}, `{"mode":"landlock","abi":7,"signals":true,"net":[80,443]}`},
		{Report{Mode: ReportLandlock, ABI: 3}, `{"mode":"landlock","abi":3,"signals":false,"net":"any"}`},
		{Report{Mode: ReportNone}, `{"mode":"none","abi":0,"signals":false,"net":"any"}`},
	} {
		b, err := json.Marshal(tc.r)
		if err != nil || string(b) != tc.want {
			t.Errorf("%+v: %s %v, want %s", tc.r, b, err, tc.want)
		}
	}
}
