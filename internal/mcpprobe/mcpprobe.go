// Package mcpprobe is a minimal MCP server on stdio with one tool,
// echo_upper, for the tests that check an agent starts a room's own MCP
// servers (and only those): a test binary runs Serve when an environment
// variable it sets for the agent says so.
package mcpprobe

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"strings"
)

// Serve answers MCP requests from in on out until in ends, and returns the
// exit code for the process. It first creates the file started (when not
// ""), so a test can tell whether the agent started this server, and
// started+".listed" once it has answered tools/list (the agent knows its
// tools).
// echo_upper answers "probe:" and its text argument in upper case.
func Serve(in io.Reader, out io.Writer, started string) int {
	if started != "" {
		_ = os.WriteFile(started, []byte("started"), 0o600)
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	enc := json.NewEncoder(out)
	for sc.Scan() {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				ProtocolVersion string `json:"protocolVersion"`
				Arguments       struct {
					Text string `json:"text"`
				} `json:"arguments"`
			} `json:"params"`
		}
		if json.Unmarshal(sc.Bytes(), &req) != nil || len(req.ID) == 0 {
			continue // a notification
		}
		var result any
		switch req.Method {
		case "initialize":
			// The client's own version is answered back: agents differ in
			// the versions they accept.
			pv := req.Params.ProtocolVersion
			if pv == "" {
				pv = "2025-06-18"
			}
			result = map[string]any{"protocolVersion": pv, "capabilities": map[string]any{"tools": map[string]any{}},
				"serverInfo": map[string]any{"name": "probe", "version": "1"}}
		case "tools/list":
			result = map[string]any{"tools": []any{map[string]any{
				"name": "echo_upper", "description": "Upper-cases text",
				"inputSchema": map[string]any{"type": "object", "properties": map[string]any{"text": map[string]any{"type": "string"}}},
			}}}
		case "tools/call":
			result = map[string]any{"content": []any{map[string]any{"type": "text", "text": "probe:" + strings.ToUpper(req.Params.Arguments.Text)}}}
		case "ping":
			result = map[string]any{}
		default:
			_ = enc.Encode(map[string]any{"jsonrpc": "2.0", "id": req.ID, "error": map[string]any{"code": -32601, "message": "unknown method"}})
			continue
		}
		_ = enc.Encode(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": result})
		if req.Method == "tools/list" && started != "" {
			_ = os.WriteFile(started+".listed", []byte("listed"), 0o600)
		}
	}
	return 0
}
