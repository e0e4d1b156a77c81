package acpagent

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/mcpprobe"
	"github.com/agenthost/agenthost/room"
)

// mcpHelperEnv makes the test binary a minimal MCP server on stdio with
// one tool, echo_upper; the variable's value is a file it creates when it
// starts (so a test can tell whether the agent started it).
const mcpHelperEnv = "ACPAGENT_TEST_MCP"

func init() {
	if os.Getenv(mcpHelperEnv) != "" {
		os.Exit(mcpHelper())
	}
}

func mcpHelper() int { return mcpprobe.Serve(os.Stdin, os.Stdout, os.Getenv(mcpHelperEnv)) }

// The room's tools reach omp acp as an MCP server over http on loopback;
// a room's own stdio MCP server through session/new; one in the
// workspace's files not at all.
func TestRealACPRoomToolsAndMCP(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	started := filepath.Join(dir, "probe-started")
	injected := filepath.Join(dir, "injected-started")
	h := startHost(t, "", nil, room.Options{Config: room.Config{ApprovalMode: room.ApprovalYolo, MCP: map[string]room.MCPServer{
		"probe": {Command: []string{os.Args[0], "-test.run=^$"}, Env: map[string]string{mcpHelperEnv: started}},
	}}})
	acc := h.Submit("r", `[[tool:mcp__agenthost_room_info {}]]`)
	_, tool := h.Wait("r", acc.Seq, room.KindToolEnded, nil)
	h.Settled("r", acc)
	if out, _ := tool["output"].(string); !strings.Contains(out, `"room":"r"`) || tool["is_error"] == true {
		t.Fatalf("room_info over MCP: %v", tool)
	}
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
	if err := h.M.Release(t.Context(), "r"); err != nil {
		t.Fatal(err)
	}
	// omp acp answers session/new before it has connected the room's
	// stdio MCP servers, so a call in the first turn can find the tool
	// missing (seen under load: "Tool mcp__probe_echo_upper not found"; a
	// gap of omp's, named in the README). The next agent is started with
	// a turn of its own first, and the call waits for its probe to have
	// listed its tools.
	listed := started + ".listed"
	if err := os.Remove(listed); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	h.Settled("r", h.Submit("r", "[[say:started]]"))
	for deadline := time.Now().Add(time.Minute); ; {
		if _, err := os.Stat(listed); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the next agent's MCP server never listed its tools")
		}
		time.Sleep(50 * time.Millisecond) // the probe's file: no event says it listed
	}
	acc = h.Submit("r", `[[tool:mcp__probe_echo_upper {"text":"hi"}]]`)
	_, tool = h.Wait("r", acc.Seq, room.KindToolEnded, nil)
	if !strings.Contains(tool["output"].(string), "probe:HI") {
		t.Fatalf("room MCP tool: %v", tool)
	}
	h.Settled("r", acc)
	if _, err := os.Stat(injected); err == nil {
		t.Fatal("omp acp started an MCP server from the workspace's own configuration")
	}
}

// The room tools' MCP server answers only the agent it was made for.
func TestToolServerNeedsItsToken(t *testing.T) {
	ts, err := serveTools(nil, discard())
	if err != nil {
		t.Fatal(err)
	}
	defer ts.close()
	for _, auth := range []string{"", "Bearer wrong"} {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", ts.url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("auth %q: status %d", auth, resp.StatusCode)
		}
	}
}
