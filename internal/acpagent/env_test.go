package acpagent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/roomtest"
	"github.com/agenthost/agenthost/room"
)

// envDumpEnv makes the test binary write its environment (one variable a line) to the file the
// variable names, relative to its working directory, before anything else (see TestMain).
const envDumpEnv = "ACPAGENT_TEST_ENV_DUMP"

// A custom ACP agent gets the allowlisted environment: none of the server's AGENTHOST_* (custody's
// scope marker is custody's own), the --agent-env names, and no key or other variable of the
// server's (a room whose model names a provider gets its key: agents.Env's table test).
func TestAgentEnv_CustomACP(t *testing.T) {
	for k, v := range map[string]string{
		"AGENTHOST_TOKEN": "operator-secret-token", "ANTHROPIC_API_KEY": "sk-ant-server", "OPENAI_API_KEY": "sk-openai",
		"DATABASE_URL": "postgres://u:p@db/x", "GOPATH": "/srv/go",
	} {
		t.Setenv(k, v)
	}
	h := roomtest.Start(t, "", nil, room.Options{Config: room.Config{
		Command: []string{os.Args[0], "-test.run=^$"},
		Env:     []string{fakePeerEnv + "=1", envDumpEnv + "=env.txt"},
	}}, func(cust *custody.Custodian, in *agents.Install, url string) (room.Transport, error) {
		return New(Options{Custodian: cust, Install: in, ModelURL: url, AgentEnv: []string{"GOPATH"}})
	})
	if got := h.Settled("r", h.Submit("r", "hello")); got != "after" {
		t.Fatalf("turn text %q", got)
	}
	ws, _ := filepath.Glob(filepath.Join(h.Root, "r-*", "workspace"))
	if len(ws) != 1 {
		t.Fatalf("workspaces %v", ws)
	}
	data, err := os.ReadFile(filepath.Join(ws[0], "env.txt"))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	for k := range env {
		if strings.HasPrefix(k, "AGENTHOST_") && k != custody.MarkerEnv {
			t.Errorf("the server's %s reached the agent", k)
		}
	}
	for _, k := range []string{"PATH", "HOME", "GOPATH", custody.MarkerEnv} {
		if _, ok := env[k]; !ok {
			t.Errorf("%s missing", k)
		}
	}
	for _, k := range []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "DATABASE_URL"} {
		if _, ok := env[k]; ok {
			t.Errorf("%s given", k)
		}
	}
}
