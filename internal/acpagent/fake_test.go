package acpagent

import (
	"bufio"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/room"
)

// fakePeerEnv switches the test binary into a small ACP agent for the
// faults the real agents cannot show: a prompt "malformed:N" makes it send
// N malformed lines, then a reply; "work" and "eat memory" are the limits'
// (peerLimitPrompt).
const fakePeerEnv = "ACPAGENT_FAKE_PEER"

// fakePayload is in every malformed line: it must never reach the room.
const fakePayload = "secret-payload-xyz"

func fakePeer() int {
	out := bufio.NewWriter(os.Stdout)
	send := func(v any) {
		b, _ := json.Marshal(v)
		out.Write(append(b, '\n'))
		out.Flush()
	}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				SessionID string `json:"sessionId"`
				Prompt    []struct {
					Text string `json:"text"`
				} `json:"prompt"`
			} `json:"params"`
		}
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			return 9
		}
		reply := func(result any) { send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": result}) }
		switch m.Method {
		case "initialize":
			reply(map[string]any{"protocolVersion": 1, "agentCapabilities": map[string]any{}, "authMethods": []any{}})
		case "session/new":
			reply(map[string]any{"sessionId": "s-1"})
		case "session/prompt":
			text := ""
			if len(m.Params.Prompt) > 0 {
				text = m.Params.Prompt[0].Text
			}
			if arg, ok := strings.CutPrefix(text, "malformed:"); ok {
				n, _ := strconv.Atoi(arg)
				for range n {
					out.WriteString("not json " + fakePayload + "\n")
				}
				out.Flush()
			}
			answer := "after"
			if a, ok := peerLimitPrompt(text); ok {
				answer = a
			}
			send(map[string]any{"jsonrpc": "2.0", "method": "session/update", "params": map[string]any{"sessionId": m.Params.SessionID,
				"update": map[string]any{"sessionUpdate": "agent_message_chunk", "content": map[string]any{"type": "text", "text": answer}}}})
			reply(map[string]any{"stopReason": "end_turn"})
		default:
			if m.ID != nil && m.Method != "" {
				send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": -32601, "message": "method not found"}})
			}
		}
	}
	return 0
}

// TestMalformedLinesBecomeRoomEvents: a malformed line from the agent is
// an agent.malformed room event of the turn (line number, length, reason,
// never the payload) and reading goes on; a flood gets at most
// maxMalformedPerTurn events a turn, then one with the count of the rest.
func TestMalformedLinesBecomeRoomEvents(t *testing.T) {
	t.Parallel()
	h := startHost(t, "", nil, room.Options{Config: room.Config{
		Command: []string{os.Args[0], "-test.run=^$"}, Env: []string{fakePeerEnv + "=1"},
	}})
	const flood = maxMalformedPerTurn + 15
	a1 := h.Submit("r", "malformed:"+strconv.Itoa(flood))
	if got := h.Settled("r", a1); got != "after" {
		t.Fatalf("turn 1: %q (reading did not go on)", got)
	}
	a2 := h.Submit("r", "malformed:2")
	if got := h.Settled("r", a2); got != "after" {
		t.Fatalf("turn 2: %q", got)
	}
	evs, err := h.DB.Events(t.Context(), "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	turns := map[string]string{} // turn id -> message id
	perTurn := map[string][]map[string]any{}
	for _, ev := range evs {
		if strings.Contains(string(ev.Data), fakePayload) {
			t.Fatalf("the payload reached the room in %s: %s", ev.Type, ev.Data)
		}
		var d map[string]any
		_ = json.Unmarshal(ev.Data, &d)
		id, _ := d["turn_id"].(string)
		switch ev.Type {
		case "turn.started":
			turns[id], _ = d["message_id"].(string)
		case room.KindMalformed:
			if turns[id] == "" {
				t.Fatalf("agent.malformed outside a known turn: %s", ev.Data)
			}
			perTurn[turns[id]] = append(perTurn[turns[id]], d)
		}
	}
	check := func(msg string, lines int, suppressed float64) {
		t.Helper()
		got := perTurn[msg]
		want := lines
		if suppressed > 0 {
			want++
		}
		if len(got) != want {
			t.Fatalf("turn of %s: %d agent.malformed events, want %d: %v", msg, len(got), want, got)
		}
		prev := 0.0
		for _, d := range got[:lines] {
			line, _ := d["line"].(float64)
			if line <= prev || d["length"] != float64(len("not json "+fakePayload)) || d["reason"] == "" || d["reason"] == nil {
				t.Fatalf("agent.malformed %v (previous line %v)", d, prev)
			}
			prev = line
		}
		if suppressed > 0 && got[lines]["suppressed"] != suppressed {
			t.Fatalf("last agent.malformed %v, want suppressed %v", got[lines], suppressed)
		}
	}
	check(a1.ID, maxMalformedPerTurn, flood-maxMalformedPerTurn)
	check(a2.ID, 2, 0)
}
