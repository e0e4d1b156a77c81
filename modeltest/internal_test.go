package modeltest

import (
	"testing"

	"github.com/agenthost/agenthost/internal/agents"
)

// TestModelID: the model the agents' homes select is the one spelled out
// for go doc.
func TestModelID(t *testing.T) {
	if ModelID != agents.ModelID {
		t.Errorf("ModelID %q, internal/agents says %q", ModelID, agents.ModelID)
	}
}
