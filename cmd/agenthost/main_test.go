package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// serveHelperEnv makes the test binary run agenthost itself (the SIGKILL
// test kills it as a separate process).
const serveHelperEnv = "AGENTHOST_TEST_RUN_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(serveHelperEnv) != "" {
		if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "agenthost:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var o, e bytes.Buffer
	err := run(ctx, args, &o, &e)
	if err != nil {
		code = 1
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.code
		}
		e.WriteString(err.Error())
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

func TestPrompt_JSON(t *testing.T) {
	out, errs, code := runCLI(t, "prompt", "--json", "--agent", "pi", "hello")
	if code != 0 {
		t.Fatalf("code %d err %q", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	types := map[string]bool{}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not JSON: %q", l)
		}
		types[m["type"].(string)] = true
	}
	for _, want := range []string{"response", "agent_start", "message_end", "agent_end"} {
		if !types[want] {
			t.Errorf("no %s frame in --json output", want)
		}
	}
	if !strings.Contains(lines[len(lines)-1], `"type":"agenthost_receipt"`) {
		t.Fatalf("last line is not the receipt: %s", lines[len(lines)-1])
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
		{"two messages", []string{"prompt", "a", "b"}, 2, "exactly one MESSAGE"},
		{"custom command fails", []string{"prompt", "x", "--", "/bin/false"}, 1, "agent exited"},
		{"custom command not JSON", []string{"prompt", "x", "--", "/bin/echo", "not json"}, 1, "not a JSON object"},
		{"timeout", []string{"prompt", "--agent", "pi", "--timeout", "2s", "[[slow:1m]] [[big:100]]"}, 3, "timed out"},
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

func TestDoctor(t *testing.T) {
	out, errs, code := runCLI(t, "doctor")
	if code != 0 || !strings.Contains(out, "omp 18.2.3") || !strings.Contains(out, "pi  0.73.1") || !strings.Contains(out, "all good") {
		t.Fatalf("code %d\n%s\n%s", code, out, errs)
	}
}

func TestReap_DryRun(t *testing.T) {
	out, errs, code := runCLI(t, "reap")
	if code != 0 || !(strings.Contains(out, "no orphaned") || strings.Contains(out, "--kill")) {
		t.Fatalf("code %d out %q err %q", code, out, errs)
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
