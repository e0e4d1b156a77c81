package rpcagent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/mcpprobe"
	"github.com/agenthost/agenthost/internal/roomsqlite"
	"github.com/agenthost/agenthost/room"
)

// mcpHelperEnv makes the test binary a minimal MCP server on stdio with
// one tool, echo_upper; the variable's value is a file it creates when it
// starts (so a test can tell whether omp started it).
const mcpHelperEnv = "RPCAGENT_TEST_MCP"

func mcpHelper() int { return mcpprobe.Serve(os.Stdin, os.Stdout, os.Getenv(mcpHelperEnv)) }

func TestRealRoomToolsAndMCP(t *testing.T) {
	dir := t.TempDir()
	started := filepath.Join(dir, "probe-started")
	injected := filepath.Join(dir, "injected-started")
	lookup := room.Tool{
		Name: "lookup", Description: "Look a key up.",
		Run: func(ctx context.Context, call room.ToolCall) (string, error) {
			return fmt.Sprintf("value-42 for room %s", call.Room), nil
		},
	}
	h := startHost(t, "", nil, room.Options{
		Tools: []room.Tool{lookup},
		Config: room.Config{ApprovalMode: room.ApprovalYolo, MCP: map[string]room.MCPServer{
			"probe": {Command: []string{os.Args[0], "-test.run=^$"}, Env: map[string]string{mcpHelperEnv: started}},
		}},
	})
	acc := h.Submit("r", `[[tool:room_post {"text":"hello people"}]]`)
	h.Settled("r", acc)
	_, post := h.Wait("r", acc.Seq, "room.post", nil)
	if post["text"] != "hello people" || post["turn_id"] == "" {
		t.Fatalf("room.post: %v", post)
	}
	for _, tc := range []struct{ call, want string }{
		{`[[tool:room_info {}]]`, `"room":"r"`},
		{`[[tool:lookup {}]]`, "value-42 for room r"},
		{`[[tool:mcp__probe_echo_upper {"text":"hi"}]]`, "probe:HI"},
	} {
		acc := h.Submit("r", tc.call)
		_, tool := h.Wait("r", acc.Seq, "tool.ended", nil)
		if !strings.Contains(tool["output"].(string), tc.want) {
			t.Fatalf("%s: output %q, want %q", tc.call, tool["output"], tc.want)
		}
		h.Settled("r", acc)
	}
	if _, err := os.Stat(started); err != nil {
		t.Fatalf("the room's MCP server never started: %v", err)
	}
	// The workspace's own MCP file is ignored, also after a restart.
	files, _ := filepath.Glob(filepath.Join(h.Root, "*", "workspace"))
	if len(files) != 1 {
		t.Fatalf("workspaces: %v", files)
	}
	evil, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{"injected": map[string]any{
		"command": os.Args[0], "args": []string{"-test.run=^$"}, "env": map[string]string{mcpHelperEnv: injected},
	}}})
	for _, name := range []string{".mcp.json", "mcp.json"} {
		if err := os.WriteFile(filepath.Join(files[0], name), evil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	listed := started + ".listed"
	if err := os.Remove(listed); err != nil {
		t.Fatal(err)
	}
	if err := h.M.Release(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	// omp waits 250 ms for MCP servers as it starts, then connects them
	// in the background (the README says so): a turn started sooner may
	// not have the tool yet. The restarted agent's first turn starts it;
	// the MCP call comes once the server has listed its tools to it.
	acc = h.Submit("r", `[[tool:room_info {}]]`)
	h.Settled("r", acc)
	waitFile(t, listed)
	acc = h.Submit("r", `[[tool:mcp__probe_echo_upper {"text":"again"}]]`)
	_, tool := h.Wait("r", acc.Seq, "tool.ended", nil)
	if !strings.Contains(tool["output"].(string), "probe:AGAIN") {
		t.Fatalf("after restart: %q", tool["output"])
	}
	h.Settled("r", acc)
	if _, err := os.Stat(injected); err == nil {
		t.Fatal("omp started an MCP server from the workspace's own configuration")
	}
}

func TestRoomMCPNamesAreChecked(t *testing.T) {
	for _, name := range []string{"agenthost", "AgentHost", "bad name", ""} {
		_, err := room.New(room.Options{Store: roomsqlite.New(nil), Transport: &Transport{}, Root: t.TempDir(),
			Config: room.Config{MCP: map[string]room.MCPServer{name: {URL: "http://127.0.0.1:1/mcp"}}}})
		if err == nil {
			t.Errorf("MCP server name %q accepted", name)
		}
	}
	_, err := room.New(room.Options{Store: roomsqlite.New(nil), Transport: &Transport{}, Root: t.TempDir(),
		Tools: []room.Tool{{Name: "room_post", Run: func(context.Context, room.ToolCall) (string, error) { return "", nil }}}})
	if err == nil {
		t.Error("a tool named like a built-in was accepted")
	}
}

// waitFile waits for a file a helper process writes (no event says so).
func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s never appeared", filepath.Base(path))
		}
	}
}
