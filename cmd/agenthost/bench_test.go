package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

// isProfile: a pprof CPU profile is a gzipped protocol buffer.
func isProfile(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 64 || !bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
		t.Fatalf("%s is no CPU profile (%d bytes)", path, len(b))
	}
}

// TestCPUProfile: --cpuprofile, on any command, writes a CPU profile of
// the whole command; the command's own output is unchanged.
func TestCPUProfile(t *testing.T) {
	prof := filepath.Join(t.TempDir(), "prompt.pprof")
	args := append([]string{"--cpuprofile", prof, "prompt", "go"}, fakeAgentArgs(t)...)
	out, errs, code := runCLI(t, args...)
	if code != 0 || out != "flooded\n" {
		t.Fatalf("code %d out %q err %q", code, out, errs)
	}
	isProfile(t, prof)

	_, errs, code = runCLI(t, "--cpuprofile", filepath.Join(t.TempDir(), "no", "such", "dir"), "prompt", "go")
	if code != 2 || !strings.Contains(errs, "--cpuprofile") {
		t.Fatalf("an unwritable profile: code %d, stderr %q", code, errs)
	}
}

// TestBench runs agenthost bench on a small flood: the four consumers
// (floor, agenthost prompt, the RPC client alone, pi's TypeScript client)
// each see the whole flood; it prints wall and CPU medians and agenthost
// prompt's ratios to the floor and to pi's client, and --cpuprofile leaves
// a profile of each agenthost prompt run. The test binary plays agenthost
// for the consumers bench starts.
func TestBench(t *testing.T) {
	t.Setenv(serveHelperEnv, "1")
	t.Setenv("GORACE", "atexit_sleep_ms=0")
	prof := filepath.Join(t.TempDir(), "flood.pprof")
	out, errs, code := runCLI(t, "bench", "--frames", "300", "--runs", "2", "--cpuprofile", prof)
	if code != 0 {
		t.Fatalf("code %d\n%s\n%s", code, out, errs)
	}
	for _, arm := range []string{"floor (split lines only, Go)", "agenthost prompt ", "agenthost rpc client alone", "pi TypeScript RpcClient"} {
		if !regexp.MustCompile(regexp.QuoteMeta(arm) + `.*\d+\.\d{3}s .*\d+\.\d{3}s .*\d+\.\d{3}s`).MatchString(out) {
			t.Errorf("no wall, CPU and agent CPU figures for %q:\n%s", arm, out)
		}
	}
	if !regexp.MustCompile(`agenthost prompt: wall \d+\.\d\dx the floor, \d+\.\d\dx pi's TypeScript client; CPU \d+\.\d\dx the floor's, \d+\.\d\dx pi's`).MatchString(out) {
		t.Errorf("no ratios:\n%s", out)
	}
	ext := filepath.Ext(prof)
	for _, n := range []string{"1", "2"} {
		isProfile(t, strings.TrimSuffix(prof, ext)+"."+n+ext)
	}
	// The consumers read the node agent too (internal/bench's test);
	// another agent is refused.
	if _, errs, code := runCLI(t, "bench", "--frames", "300", "--runs", "1", "--agent", "python"); code == 0 || !strings.Contains(errs, `unknown flood agent "python"`) {
		t.Fatalf("--agent python: code %d\n%s", code, errs)
	}
}

// TestFloodGC: prompt's collector setting is restored after the turn, and
// GOGC in the environment wins over it.
func TestFloodGC(t *testing.T) {
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	before := debug.SetGCPercent(100)
	debug.SetGCPercent(before)
	restore := floodGC()
	if p := debug.SetGCPercent(400); p != 400 {
		t.Errorf("during the turn GC percent %d, want 400", p)
	}
	restore()
	if p := debug.SetGCPercent(before); p != before {
		t.Errorf("after the turn GC percent %d, want %d again", p, before)
	}
	t.Setenv("GOGC", "100")
	restore = floodGC()
	if p := debug.SetGCPercent(before); p != before {
		t.Errorf("with GOGC set GC percent %d, want %d untouched", p, before)
	}
	restore()
}
