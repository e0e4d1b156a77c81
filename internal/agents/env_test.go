package agents_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/internal/agents"
)

// serverEnv is a server's environment as an operator might start it: its token and cluster
// settings, keys of several providers, cloud credentials, and what a shell has.
var serverEnv = []string{
	"AGENTHOST_TOKEN=operator-secret", "AGENTHOST_DATA=/srv/agenthost", "AGENTHOST_CONFINE_POLICY=forged",
	"AGENTHOST_SCOPE=forged", "HOME=/root", "PATH=/usr/bin:/bin", "TERM=xterm", "LANG=C.UTF-8",
	"LC_ALL=C.UTF-8", "LC_CTYPE=C.UTF-8", "TZ=UTC", "SHELL=/bin/bash", "TMPDIR=/tmp/server",
	"ANTHROPIC_API_KEY=sk-ant", "OPENAI_API_KEY=sk-openai", "GEMINI_API_KEY=g-key",
	"DEEPSEEK_API_KEY=ds-key", "GITHUB_TOKEN=ghp", "AWS_SECRET_ACCESS_KEY=aws", "AWS_ACCESS_KEY_ID=akid",
	"DATABASE_URL=postgres://u:p@db/x", "HTTPS_PROXY=http://proxy:3128", "no_proxy=corp.example",
	"NODE_EXTRA_CA_CERTS=/etc/ca.pem", "GOPATH=/root/go", "LD_PRELOAD=/evil.so", "NODE_OPTIONS=--require=/x.js",
	"PATH=/second/path", // a duplicate: the first wins, as getenv's
	"BROKEN",            // no "=": not a variable
}

func TestEnv(t *testing.T) {
	base := []string{"PATH", "TMPDIR", "TERM", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "SHELL", "HTTPS_PROXY", "no_proxy", "NODE_EXTRA_CA_CERTS"}
	for _, tc := range []struct {
		name string
		opts agents.EnvOptions
		want []string // besides base and HOME
	}{
		{"built-in model", agents.EnvOptions{Home: "/rooms/r/home"}, nil},
		{"anthropic", agents.EnvOptions{Home: "/h", Model: "anthropic/claude-sonnet-4-5"}, []string{"ANTHROPIC_API_KEY"}},
		{"openai", agents.EnvOptions{Home: "/h", Model: "openai/gpt-5"}, []string{"OPENAI_API_KEY"}},
		{"google", agents.EnvOptions{Home: "/h", Model: "google/gemini-2.5-pro"}, []string{"GEMINI_API_KEY"}},
		{"a provider by the pattern", agents.EnvOptions{Home: "/h", Model: "deepseek/deepseek-chat"}, []string{"DEEPSEEK_API_KEY"}},
		{"bedrock", agents.EnvOptions{Home: "/h", Model: "amazon-bedrock/x"}, []string{"AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID"}},
		{"a model with no provider", agents.EnvOptions{Home: "/h", Model: "gpt-5"}, nil},
		{"an agent's own provider", agents.EnvOptions{Home: "/h", Providers: []string{"copilot"}}, []string{"GITHUB_TOKEN"}},
		{"passed by name", agents.EnvOptions{Home: "/h", Pass: []string{"GOPATH", "DATABASE_URL", "NOT_SET"}}, []string{"GOPATH", "DATABASE_URL"}},
		{"AGENTHOST_* and HOME are never passed", agents.EnvOptions{Home: "/h", Pass: []string{"AGENTHOST_TOKEN", "HOME", "TMPDIR", "bad name"}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := agents.Env(serverEnv, tc.opts)
			got := map[string]string{}
			for _, kv := range env {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					t.Fatalf("%q is not a variable", kv)
				}
				if _, dup := got[k]; dup {
					t.Errorf("%s set twice", k)
				}
				got[k] = v
			}
			want := append(append([]string{"HOME"}, base...), tc.want...)
			for _, k := range want {
				if _, ok := got[k]; !ok {
					t.Errorf("%s missing from %q", k, env)
				}
			}
			for k := range got {
				if !slices.Contains(want, k) {
					t.Errorf("%s=%s given to the agent", k, got[k])
				}
			}
			if got["HOME"] != tc.opts.Home || got["PATH"] != "/usr/bin:/bin" {
				t.Errorf("HOME=%q PATH=%q", got["HOME"], got["PATH"])
			}
		})
	}
}

func TestEnvNames(t *testing.T) {
	given, left := agents.EnvNames(serverEnv, agents.EnvOptions{Home: "/h", Model: "openai/gpt-5"})
	if !slices.Contains(given, "OPENAI_API_KEY") || slices.Contains(given, "ANTHROPIC_API_KEY") || !slices.IsSorted(given) {
		t.Errorf("given %v", given)
	}
	for _, k := range []string{"AGENTHOST_TOKEN", "ANTHROPIC_API_KEY", "LD_PRELOAD", "DATABASE_URL"} {
		if !slices.Contains(left, k) {
			t.Errorf("%s not among the names left out: %v", k, left)
		}
	}
	for _, s := range append(given, left...) {
		if strings.Contains(s, "=") || strings.Contains(s, "secret") {
			t.Errorf("a value in the names: %q", s)
		}
	}
}

func TestCheckEnvNames(t *testing.T) {
	if err := agents.CheckEnvNames([]string{"GOPATH", "_X", "a1"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"AGENTHOST_TOKEN", "AGENTHOST_", "HOME", "TMPDIR", "", "1X", "A-B", "A=B", "A B"} {
		if err := agents.CheckEnvNames([]string{"OK", bad}); !errors.Is(err, agents.ErrEnvName) {
			t.Errorf("%q: %v, want ErrEnvName", bad, err)
		}
	}
}

func TestProviderKeys(t *testing.T) {
	for p, want := range map[string][]string{
		"anthropic": {"ANTHROPIC_API_KEY", "ANTHROPIC_OAUTH_TOKEN"}, "openrouter": {"OPENROUTER_API_KEY"},
		"vercel-ai-gateway": {"AI_GATEWAY_API_KEY", "VERCEL_AI_GATEWAY_API_KEY"}, "my-llm.v2": {"MY_LLM_V2_API_KEY"}, "": nil,
	} {
		if got := agents.ProviderKeys(p); !slices.Equal(got, want) {
			t.Errorf("ProviderKeys(%q) = %v, want %v", p, got, want)
		}
	}
}
