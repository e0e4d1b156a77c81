package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/buildinfo"
	"github.com/agenthost/agenthost/rpc"
	sdk "github.com/coder/acp-go-sdk"
)

// TestVersion builds agenthost as `make` does and checks that --version,
// `version`, /healthz and the OpenAPI document's info.version name the
// same build, with the VCS revision `go version -m` finds in the binary.
// (It builds the binary: the test binary carries no VCS information. The
// build inherits GOFLAGS: under make test, the race flags the test binaries
// were built with, so it links their compiled packages instead of
// compiling every package again.)
func TestVersion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "agenthost")
	if out, err := exec.CommandContext(ctx, "go", "build", "-buildvcs=auto", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out := func(args ...string) string {
		t.Helper()
		b, err := exec.CommandContext(ctx, bin, args...).Output()
		if err != nil {
			t.Fatalf("agenthost %s: %v", strings.Join(args, " "), err)
		}
		return string(b)
	}
	short := out("--version")
	var in buildinfo.Info
	if err := json.Unmarshal([]byte(out("version", "--json")), &in); err != nil {
		t.Fatal(err)
	}
	if short != "agenthost "+in.Version+"\n" || in.Version == "" {
		t.Fatalf("--version %q, version --json %+v", short, in)
	}
	long := out("version")
	if !strings.HasPrefix(long, short) {
		t.Fatalf("version %q does not start with --version's %q", long, short)
	}
	meta := out2(t, ctx, "go", "version", "-m", bin)
	if i := strings.Index(meta, "vcs.revision="); i >= 0 {
		rev := strings.Fields(meta[i+len("vcs.revision="):])[0]
		if in.Revision != rev || !strings.Contains(long, rev) || !strings.Contains(in.Version, rev[:12]) {
			t.Fatalf("revision %s: version %q, %+v", rev, long, in)
		}
	} else {
		t.Logf("no VCS information in this build (not a git checkout, or git missing): version %q", in.Version)
	}

	// The server says the same.
	serve := exec.CommandContext(ctx, bin, "serve", "--listen", "127.0.0.1:0", "--data", t.TempDir())
	serve.Env = append(serve.Environ(), tokenEnv+"=version-test-token")
	stdout, err := serve.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = serve.Process.Signal(syscall.SIGTERM)
		if err := serve.Wait(); err != nil {
			t.Errorf("serve after SIGTERM: %v", err)
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("no start line: %v", err)
	}
	url := strings.Fields(strings.TrimPrefix(line, "agenthost: serving rooms at "))[0]
	get := func(path string, v any) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "GET", url+path, nil)
		req.Header.Set("Authorization", "Bearer version-test-token")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v: %s", path, err, b)
		}
	}
	var hz struct{ Status, Version string }
	get("healthz", &hz)
	var doc struct {
		Info struct{ Version string } `json:"info"`
	}
	get("v1/openapi.json", &doc)
	if hz.Version != in.Version || doc.Info.Version != in.Version {
		t.Fatalf("/healthz %+v, info.version %q, want %q", hz, doc.Info.Version, in.Version)
	}
}

func out2(t *testing.T, ctx context.Context, name string, args ...string) string {
	t.Helper()
	b, err := exec.CommandContext(ctx, name, args...).Output()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return string(b)
}

// An agent's error reaches stderr as one line that says what failed: no
// interactive advice, no raw JSON-RPC object, no repeated prefixes.
func TestErrorLine(t *testing.T) {
	piNoKey := &rpc.ResponseError{Command: "prompt", Late: true,
		Message: "No API key found for anthropic.\n\nUse /login, set an API key environment variable, or create /data/agent.db\n/x/docs/providers.md\n/x/docs/models.md"}
	acpNoModel := &sdk.RequestError{Code: -32603, Message: "Internal error", Data: map[string]any{"details": "No model selected.\n\nUse /login to sign in"}}
	for _, c := range []struct {
		err  error
		want string
	}{
		{errors.New("agent exited:\n\n  stack line\n"), "agent exited"},
		{fmt.Errorf("%w: %w", rpc.ErrPromptFailed, piNoKey), "the agent refused the prompt: after accepting it: No API key found for anthropic. (set ANTHROPIC_API_KEY where agenthost runs; agents get their provider's key variables)"},
		// A room's reason, as send --follow gets it: the same words, the same hint.
		{&exitError{1, errors.New("message m_1 failed: rpc: prompt failed: rpc: prompt: failed after acknowledgement: No API key found for openai.")},
			"message m_1 failed: the agent refused the prompt: No API key found for openai. (set OPENAI_API_KEY where agenthost runs; agents get their provider's key variables)"},
		{&exitError{1, fmt.Errorf("starting the agent: %w", fmt.Errorf("acp: session/prompt: %w", acpNoModel))}, "starting the agent: acp: session/prompt: Internal error: No model selected."},
		{fmt.Errorf("serve: serve: listen tcp: bind: address already in use"), "serve: listen tcp: bind: address already in use"},
	} {
		if got := errorLine(c.err); got != c.want {
			t.Errorf("errorLine(%q)\n = %q\nwant %q", c.err, got, c.want)
		}
	}
}

// The real pi without a key for the model named: its multi-line refusal
// with TUI advice ("Use /login ...", doc paths) is one line on stderr.
func TestPrompt_AgentErrorIsOneLine(t *testing.T) {
	t.Setenv("ANTHROPIC_API_KEY", "")
	out, errs, code := runCLI(t, "prompt", "--agent", "pi", "--model", "anthropic/claude-sonnet-4-5", "explain this repo")
	if code != exitFailed || out != "" || errs != "agenthost: the agent refused the prompt: No API key found for anthropic. (set ANTHROPIC_API_KEY where agenthost runs; agents get their provider's key variables)\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
}
