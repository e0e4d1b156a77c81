package acp

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// fakeEnv switches the test binary into a small ACP agent (fakeAgent) for
// the faults the real agents cannot show. The prompt's text picks what the
// turn does.
const fakeEnv = "ACP_FAKE_AGENT"

type fakeMsg struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  json.RawMessage `json:"error,omitempty"`
}

func fakeAgent() int {
	out := bufio.NewWriter(os.Stdout)
	send := func(v any) {
		b, _ := json.Marshal(v)
		out.Write(append(b, '\n'))
		out.Flush()
	}
	raw := func(s string) {
		out.WriteString(s + "\n")
		out.Flush()
	}
	reply := func(id json.RawMessage, result any) {
		send(map[string]any{"jsonrpc": "2.0", "id": id, "result": result})
	}
	chunk := func(session, text string) {
		send(map[string]any{"jsonrpc": "2.0", "method": "session/update", "params": map[string]any{
			"sessionId": session, "update": map[string]any{"sessionUpdate": "agent_message_chunk", "content": map[string]any{"type": "text", "text": text}}}})
	}
	in := make(chan fakeMsg, 16)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for n := 0; sc.Scan(); n++ {
			if n == 2 && os.Getenv(fakeEnv) == "deaf" {
				// After initialize and session/new it stops reading its
				// stdin: the host's writes fill the pipe.
				time.Sleep(time.Hour)
			}
			var m fakeMsg
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				// omp acp exits on a malformed line; so does the fake,
				// which proves the host never sends one.
				fmt.Fprintln(os.Stderr, "fake: malformed line from the host")
				os.Exit(9)
			}
			in <- m
		}
		close(in)
	}()
	// call sends a request with id 0 (as the real agents do first) and
	// waits for its answer.
	call := func(method string, params any) fakeMsg {
		send(map[string]any{"jsonrpc": "2.0", "id": 0, "method": method, "params": params})
		for m := range in {
			if m.Method == "" && string(m.ID) == "0" {
				return m
			}
		}
		os.Exit(0)
		return fakeMsg{}
	}
	var meta json.RawMessage // the _meta of the last session/new or session/load
	for m := range in {
		var p struct {
			Meta      json.RawMessage `json:"_meta"`
			SessionID string          `json:"sessionId"`
			Prompt    []struct {
				Text string `json:"text"`
			} `json:"prompt"`
		}
		_ = json.Unmarshal(m.Params, &p)
		switch m.Method {
		case "initialize":
			reply(m.ID, map[string]any{"protocolVersion": 1, "agentCapabilities": map[string]any{"loadSession": true}, "authMethods": []any{}})
		case "session/new":
			meta = p.Meta
			reply(m.ID, map[string]any{"sessionId": "s-1"})
		case "session/load":
			meta = p.Meta
			if code, ok := map[string]int{"busy": -32003, "internal": -32603}[p.SessionID]; ok {
				send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": code, "message": p.SessionID + " for now"}})
				continue
			}
			// How omp and codex answer an id they do not know.
			if details, ok := map[string]string{"omp-gone": "ACP session not found: omp-gone", "codex-gone": "no rollout found for thread id codex-gone"}[p.SessionID]; ok {
				send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": -32603, "message": "Internal error", "data": map[string]any{"details": details}}})
				continue
			}
			if p.SessionID != "s-1" {
				send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": -32002, "message": "Session not found"}})
				continue
			}
			chunk(p.SessionID, "replayed")
			reply(m.ID, map[string]any{})
		case "session/cancel":
		case "session/prompt":
			text := ""
			if len(p.Prompt) > 0 {
				text = p.Prompt[0].Text
			}
			cmd, arg, _ := strings.Cut(text, ":")
			s := p.SessionID
			switch cmd {
			case "meta":
				chunk(s, string(meta))
			case "hello":
				chunk(s, "hi ")
				chunk(s, "there")
			case "malformed":
				raw("this is not json")
				raw(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":`)
				raw(`{"jsonrpc":"2.0"}`)
				raw("[1,2,3]")
				chunk(s, "after")
			case "unknown":
				send(map[string]any{"jsonrpc": "2.0", "method": "session/update", "params": map[string]any{
					"sessionId": s, "update": map[string]any{"sessionUpdate": "future_thing", "x": 1}}})
				// Shaped like a known kind: the SDK alone would decode it as
				// a message chunk.
				send(map[string]any{"jsonrpc": "2.0", "method": "session/update", "params": map[string]any{
					"sessionId": s, "update": map[string]any{"sessionUpdate": "future_chunk", "content": map[string]any{"type": "text", "text": "not a reply"}}}})
				send(map[string]any{"jsonrpc": "2.0", "method": "_vendor/status", "params": map[string]any{"ok": true}})
				chunk(s, "after")
			case "long":
				raw(`{"jsonrpc":"2.0","method":"session/update","params":{"x":"` + strings.Repeat("a", 2<<20) + `"}}`)
				chunk(s, "after")
			case "exit":
				chunk(s, "bye")
				fmt.Fprintln(os.Stderr, "fake: exiting mid-turn")
				os.Exit(3)
			case "permission":
				r := call("session/request_permission", map[string]any{"sessionId": s,
					"toolCall": map[string]any{"toolCallId": "t1", "title": "bash", "kind": "execute", "rawInput": map[string]any{"command": "echo hi"}},
					"options": []any{
						map[string]any{"optionId": "yes", "name": "Allow", "kind": "allow_once"},
						map[string]any{"optionId": "no", "name": "Reject", "kind": "reject_once"},
					}})
				chunk(s, string(r.Result))
			case "flood":
				// 40 permission requests at once; then every answer.
				for i := range 40 {
					send(map[string]any{"jsonrpc": "2.0", "id": 100 + i, "method": "session/request_permission", "params": map[string]any{"sessionId": s,
						"toolCall": map[string]any{"toolCallId": fmt.Sprint(i)},
						"options":  []any{map[string]any{"optionId": "yes", "name": "Allow", "kind": "allow_once"}, map[string]any{"optionId": "no", "name": "Reject", "kind": "reject_once"}}}})
				}
				got := 0
				for m := range in {
					if m.Method == "" && m.Result != nil {
						if got++; got == 40 {
							break
						}
					}
				}
				chunk(s, fmt.Sprint(got))
			case "read", "write":
				params := map[string]any{"sessionId": s, "path": arg}
				method := "fs/read_text_file"
				if cmd == "write" {
					method = "fs/write_text_file"
					params["content"] = "written"
				}
				r := call(method, params)
				if r.Error != nil {
					chunk(s, "error")
				} else {
					chunk(s, "ok "+string(r.Result))
				}
			case "limit":
				// A range whose end overflows an int.
				r := call("fs/read_text_file", map[string]any{"sessionId": s, "path": arg, "line": 1000, "limit": int64(9223372036854775000)})
				if r.Error != nil {
					chunk(s, "error "+string(r.Error))
				} else {
					chunk(s, "ok "+string(r.Result))
				}
			case "fifo", "fifow":
				if err := syscall.Mkfifo(arg, 0o600); err != nil {
					chunk(s, "mkfifo: "+err.Error())
					break
				}
				params := map[string]any{"sessionId": s, "path": arg}
				method := "fs/read_text_file"
				if cmd == "fifow" {
					method = "fs/write_text_file"
					params["content"] = "x"
				}
				if r := call(method, params); r.Error != nil {
					chunk(s, "error")
				} else {
					chunk(s, "ok "+string(r.Result))
				}
			case "permnotify":
				// A request method sent as a notification, then a flood of
				// notifications the client does not act on.
				send(map[string]any{"jsonrpc": "2.0", "method": "session/request_permission", "params": map[string]any{"sessionId": s,
					"toolCall": map[string]any{"toolCallId": "t1"}, "options": []any{map[string]any{"optionId": "yes", "name": "Allow", "kind": "allow_once"}}}})
				for i := range 1100 {
					send(map[string]any{"jsonrpc": "2.0", "method": "_vendor/noise", "params": map[string]any{"i": i}})
				}
				chunk(s, "after")
			case "dupid":
				r := call("session/request_permission", map[string]any{"sessionId": s,
					"toolCall": map[string]any{"toolCallId": "t1", "title": "bash", "kind": "execute"},
					"options": []any{
						map[string]any{"optionId": "x", "name": "Allow", "kind": "allow_once"},
						map[string]any{"optionId": "x", "name": "Reject", "kind": "reject_once"},
					}})
				chunk(s, string(r.Result))
			case "errstr":
				// An error that is not an object: the SDK cannot parse it.
				raw(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"error":"boom secret-in-error"}`)
				continue
			case "idnull":
				raw(`{"jsonrpc":"2.0","id":null,"method":"session/update","params":{"sessionId":"` + s +
					`","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"from-null"}}}}`)
			case "after":
				// Updates after the answer: they belong to no turn.
				reply(m.ID, map[string]any{"stopReason": "end_turn"})
				chunk(s, "late")
				send(map[string]any{"jsonrpc": "2.0", "method": "session/update", "params": map[string]any{
					"sessionId": s, "update": map[string]any{"sessionUpdate": "tool_call", "toolCallId": "late-1", "title": "late"}}})
				continue
			case "setsid":
				// A tool shell in a session of its own (as claude and
				// copilot run theirs), still running when the turn ends.
				c := exec.Command("sleep", "300")
				c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
				if err := c.Start(); err != nil {
					chunk(s, "error "+err.Error())
				} else {
					chunk(s, fmt.Sprint(c.Process.Pid))
				}
			case "hang":
				// Never answers, ignores session/cancel, keeps reading.
				for range in {
				}
				time.Sleep(time.Hour)
			case "cancel":
				for m := range in {
					if m.Method == "session/cancel" {
						break
					}
				}
				reply(m.ID, map[string]any{"stopReason": "cancelled"})
				continue
			}
			reply(m.ID, map[string]any{"stopReason": "end_turn"})
		default:
			if m.ID != nil && m.Method != "" {
				send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": -32601, "message": "method not found"}})
			}
		}
	}
	return 0
}
