package transport

import (
	"testing"

	"github.com/agenthost/agenthost/internal/agents"
)

// TestConstants: the values spelled out for go doc are the internal ones.
func TestConstants(t *testing.T) {
	if ToolsEnv != agents.ToolsEnv {
		t.Errorf("ToolsEnv %q, internal/agents says %q", ToolsEnv, agents.ToolsEnv)
	}
}
