package acpagent

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/agenthost/agenthost/acp"
	"github.com/agenthost/agenthost/room"
	sdk "github.com/coder/acp-go-sdk"
)

// recHandler records what an agent reports to its room.
type recHandler struct {
	mu        sync.Mutex
	events    []room.AgentEvent
	approvals []room.ApprovalRequest
	questions []room.QuestionRequest
	allow     bool
	answer    string
}

func (h *recHandler) Event(ev room.AgentEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, ev)
}

func (h *recHandler) Approve(_ context.Context, req room.ApprovalRequest) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.approvals = append(h.approvals, req)
	return h.allow
}

func (h *recHandler) Ask(_ context.Context, req room.QuestionRequest) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.questions = append(h.questions, req)
	return h.answer, true
}

const secret = "sk-live-0123456789abcdefXYZ"

// longTitle is a tool title of about 10 KB carrying a credential.
var longTitle = "$ curl -H 'Authorization: Bearer " + secret + "' " + strings.Repeat("x", 10<<10)

func toolCall(id, title string, raw any) acp.Event {
	return acp.Event{Type: "tool_call", Known: true, Update: sdk.SessionUpdate{ToolCall: &sdk.SessionUpdateToolCall{
		ToolCallId: sdk.ToolCallId(id), Title: title, Kind: sdk.ToolKindExecute, RawInput: raw}}}
}

// TestAgent_ToolCallsBoundedPerTurn: a turn's uncompleted tool calls are
// kept up to maxCalls, by their short kind (never the title), and forgotten
// when the next turn begins.
func TestAgent_ToolCallsBoundedPerTurn(t *testing.T) {
	h := &recHandler{}
	a := &agent{h: h}
	for i := range maxCalls + 500 {
		a.event(toolCall(fmt.Sprint("call-", i), longTitle, nil))
	}
	a.mu.Lock()
	n := len(a.calls)
	for _, name := range a.calls {
		if name != "execute" {
			t.Fatalf("a call kept as %q, want its kind", name)
		}
	}
	a.mu.Unlock()
	if n != maxCalls {
		t.Fatalf("%d calls kept, want %d", n, maxCalls)
	}
	a.beginTurn()
	a.mu.Lock()
	n = len(a.calls)
	a.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d calls of the last turn kept", n)
	}
	// A call of an earlier turn that ends now is named by its kind, or none.
	st := sdk.ToolCallStatusCompleted
	a.event(acp.Event{Type: "tool_call_update", Known: true, Update: sdk.SessionUpdate{ToolCallUpdate: &sdk.SessionToolCallUpdate{
		ToolCallId: "call-1", Status: &st}}})
	if last := h.events[len(h.events)-1]; last.Kind != room.KindToolEnded || last.Tool != "tool" {
		t.Fatalf("late end %+v", last)
	}
}

// TestAgent_AgentStringsRedactedAndBounded: titles, inputs, outputs, option
// labels and question titles reach the room redacted and bounded.
func TestAgent_AgentStringsRedactedAndBounded(t *testing.T) {
	h := &recHandler{answer: "token=[redacted]"}
	a := &agent{h: h}
	a.event(toolCall("c1", longTitle, nil))
	a.event(toolCall("c2", longTitle, map[string]any{"command": longTitle}))
	st := sdk.ToolCallStatusCompleted
	a.event(acp.Event{Type: "tool_call_update", Known: true, Update: sdk.SessionUpdate{ToolCallUpdate: &sdk.SessionToolCallUpdate{
		ToolCallId: "c2", Status: &st, Content: []sdk.ToolCallContent{sdk.ToolContent(sdk.TextBlock(longTitle))}}}})
	a.permission(t.Context(), acp.PermissionRequest{ToolCallID: "c3", Title: longTitle, Kind: "execute",
		Options: []sdk.PermissionOption{{OptionId: "y", Name: "Allow " + longTitle, Kind: sdk.PermissionOptionKindAllowOnce}}})
	ans, _ := a.ask(t.Context(), acp.Question{Title: longTitle, Options: []string{"token=" + secret, "no"}})
	if ans != "token="+secret {
		t.Fatalf("the option the room showed redacted went back as %q", ans)
	}
	var all []string
	for _, ev := range h.events {
		all = append(all, ev.Tool, ev.CallID, ev.Input, ev.Output)
	}
	for _, r := range h.approvals {
		all = append(append(all, r.Tool, r.Input), r.Options...)
	}
	for _, q := range h.questions {
		all = append(append(all, q.Title), q.Options...)
	}
	for _, s := range all {
		if strings.Contains(s, secret) {
			t.Fatalf("a credential reached the room: %.200q", s)
		}
		if len(s) > MaxDetail+64 {
			t.Fatalf("an unbounded string (%d bytes) reached the room", len(s))
		}
	}
	if h.events[0].Tool != "execute" || !strings.Contains(h.events[0].Input, "Bearer [redacted]") {
		t.Fatalf("tool.started %+v: want the kind as tool, the redacted title as input", h.events[0])
	}
}

// TestAgent_OMPApprovalFormIsAnApproval: omp acp asks for its write and
// edit tools with an elicitation form "Allow tool: ..." of Approve and
// Deny; the room gets an approval (not a question anyone's next message
// could answer), and the agent the chosen value.
func TestAgent_OMPApprovalFormIsAnApproval(t *testing.T) {
	for _, allow := range []bool{true, false} {
		h := &recHandler{allow: allow}
		a := &agent{h: h}
		ans, ok := a.ask(t.Context(), acp.Question{Title: "Allow tool: write\nPath: notes.txt\nContent:\ntoken=" + secret, Options: []string{"Approve", "Deny"}})
		want := map[bool]string{true: "Approve", false: "Deny"}[allow]
		if !ok || ans != want || len(h.questions) != 0 || len(h.approvals) != 1 {
			t.Fatalf("allow %v: answered %q %v; %d questions, %d approvals", allow, ans, ok, len(h.questions), len(h.approvals))
		}
		if r := h.approvals[0]; r.Tool != "write" || strings.Contains(r.Input, secret) || !strings.Contains(r.Input, "notes.txt") {
			t.Fatalf("approval %+v", r)
		}
	}
}
