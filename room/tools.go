package room

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/agenthost/agenthost/event"
)

// Tool is a tool the host offers a room's agent (omp's host tools; pi's
// through agenthost's extension). Run's result text goes back to the
// model; its error becomes an error result.
type Tool struct {
	Name        string
	Description string
	// Parameters is the tool's JSON Schema (an object schema); nil means
	// no parameters.
	Parameters json.RawMessage
	Run        func(ctx context.Context, call ToolCall) (string, error)
}

// ToolCall is one call of a room tool.
type ToolCall struct {
	Room   string
	TurnID string // "" in a run the agent started by itself
	Args   json.RawMessage
}

// MCPServer is a room-scoped MCP server: a command (stdio) or a URL.
type MCPServer struct {
	Command []string          `json:"command,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// ReservedName is kept for agenthost's own tools and MCP server.
const ReservedName = "agenthost"

// Built-in room tools.
const (
	ToolRoomPost = "room_post"
	ToolRoomInfo = "room_info"
)

var (
	toolNameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,63}$`)
	mcpNameRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)
)

// validateTools checks names: valid, unique, not reserved or built in.
func validateTools(tools []Tool) error {
	seen := map[string]bool{ToolRoomPost: true, ToolRoomInfo: true}
	for _, t := range tools {
		switch {
		case !toolNameRE.MatchString(t.Name):
			return fmt.Errorf("room: tool name %q: want a letter, then letters, digits or _ (at most 64)", t.Name)
		case strings.HasPrefix(strings.ToLower(t.Name), ReservedName):
			return fmt.Errorf("room: tool name %q: the prefix %q is reserved", t.Name, ReservedName)
		case seen[t.Name]:
			return fmt.Errorf("room: tool name %q is taken", t.Name)
		case t.Run == nil:
			return fmt.Errorf("room: tool %q has no Run function", t.Name)
		}
		seen[t.Name] = true
	}
	return nil
}

// validateMCP checks a room's MCP servers.
func validateMCP(servers map[string]MCPServer) error {
	for name, s := range servers {
		switch {
		case strings.EqualFold(name, ReservedName):
			return fmt.Errorf("room: MCP server name %q is reserved for agenthost", name)
		case !mcpNameRE.MatchString(name):
			return fmt.Errorf("room: MCP server name %q: want letters, digits, _ or - (at most 64)", name)
		case (len(s.Command) > 0) == (s.URL != ""):
			return fmt.Errorf("room: MCP server %q needs exactly one of a command or a URL", name)
		case len(s.Command) > 0 && strings.TrimSpace(s.Command[0]) == "":
			return fmt.Errorf("room: MCP server %q: its command names no program (command[0] is empty)", name)
		}
		// Its command line, environment and configuration file can carry
		// no NUL byte, and a variable's name no "=".
		nul := func(v string) bool { return strings.IndexByte(v, 0) >= 0 }
		if slices.ContainsFunc(s.Command, nul) || nul(s.URL) {
			return fmt.Errorf("room: MCP server %q: its command or URL holds a NUL byte", name)
		}
		for k, v := range s.Env {
			if k == "" || strings.ContainsAny(k, "=\x00") || nul(v) {
				return fmt.Errorf("room: MCP server %q: environment variable %q: want a name without \"=\" and values without NUL bytes", name, k)
			}
		}
		for k, v := range s.Headers {
			if k == "" || nul(k) || nul(v) {
				return fmt.Errorf("room: MCP server %q: header %q: want a name, and no NUL byte", name, k)
			}
		}
	}
	return nil
}

// roomTools are the built-ins and the registered tools, bound to room r.
// ToolDefs are the tools every room's agent is given, without their Run:
// a transport's warm pool starts agents that load them ahead of any room.
func (m *Manager) ToolDefs() []Tool {
	tools := m.roomTools(&roomState{})
	for i := range tools {
		tools[i].Run = nil
	}
	return tools
}

func (m *Manager) roomTools(r *roomState) []Tool {
	bind := func(t Tool) Tool {
		run := t.Run
		t.Run = func(ctx context.Context, call ToolCall) (string, error) {
			call.Room = r.id
			r.mu.Lock()
			if r.turn != nil {
				call.TurnID = r.turn.id
			}
			r.mu.Unlock()
			return run(ctx, call)
		}
		return t
	}
	tools := []Tool{
		bind(Tool{
			Name:        ToolRoomPost,
			Description: "Post a message to the conversation's room, for the people in it to read.",
			Parameters:  json.RawMessage(`{"type":"object","properties":{"text":{"type":"string","description":"the message"}},"required":["text"]}`),
			Run: func(ctx context.Context, call ToolCall) (string, error) {
				var a struct {
					Text string `json:"text"`
				}
				if err := json.Unmarshal(call.Args, &a); err != nil || a.Text == "" {
					return "", fmt.Errorf("room_post needs a text")
				}
				if len(a.Text) > MaxMessageBytes {
					return "", fmt.Errorf("room_post: text over %d bytes", MaxMessageBytes)
				}
				err := m.stWrite(ctx, func(tx Tx) error {
					_, err := appendEvent(tx, call.Room, event.RoomPost{TurnID: call.TurnID, Text: a.Text})
					return err
				})
				if err != nil {
					return "", err
				}
				return "posted", nil
			},
		}),
		bind(Tool{
			Name:        ToolRoomInfo,
			Description: "Describe the conversation's room: its id, session, queue and what waits on people.",
			Run: func(ctx context.Context, call ToolCall) (string, error) {
				st, err := m.State(ctx, call.Room)
				if err != nil {
					return "", err
				}
				b, err := json.Marshal(map[string]any{
					"room": st.ID, "session_id": st.SessionID, "queued": st.Queued,
					"pending_approvals": len(st.Approvals), "pending_questions": len(st.Questions),
				})
				return string(b), err
			},
		}),
	}
	for _, t := range m.opts.Tools {
		tools = append(tools, bind(t))
	}
	return tools
}
