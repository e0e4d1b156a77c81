package main

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// fakeACPEnv makes the test binary a small ACP agent (fakeACPAgent) for
// `prompt --transport acp -- COMMAND`.
const fakeACPEnv = "AGENTHOST_CLI_FAKE_ACP"

func init() {
	// By its variable or, where the environment is an agent's (prompt's own -- COMMAND gets no
	// variable of the caller's), by its last argument.
	if os.Getenv(fakeACPEnv) != "" || os.Args[len(os.Args)-1] == fakeACPEnv {
		fakeACPAgent()
		os.Exit(0)
	}
}

// fakeACPAgent answers initialize and session/new; a prompt "hang" is never
// answered, any other asks permission first (id 0) and answers with the
// option it got.
func fakeACPAgent() {
	out := bufio.NewWriter(os.Stdout)
	send := func(v any) {
		b, _ := json.Marshal(v)
		out.Write(append(b, '\n'))
		out.Flush()
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Prompt []struct{ Text string } `json:"prompt"`
			} `json:"params"`
			Result json.RawMessage `json:"result"`
		}
		if json.Unmarshal(in.Bytes(), &m) != nil {
			os.Exit(9) // as omp acp does on a malformed line
		}
		switch m.Method {
		case "initialize":
			send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": map[string]any{"protocolVersion": 1, "agentCapabilities": map[string]any{}, "authMethods": []any{}}})
		case "session/new":
			send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": map[string]any{"sessionId": "fake"}})
		case "session/prompt":
			if len(m.Params.Prompt) > 0 && m.Params.Prompt[0].Text == "hang" {
				continue
			}
			send(map[string]any{"jsonrpc": "2.0", "id": 0, "method": "session/request_permission", "params": map[string]any{
				"sessionId": "fake", "toolCall": map[string]any{"toolCallId": "t", "title": "bash"},
				"options": []any{map[string]any{"optionId": "allow", "name": "Allow", "kind": "allow_once"}, map[string]any{"optionId": "reject", "name": "Reject", "kind": "reject_once"}}}})
			var answer string
			for in.Scan() {
				var r struct {
					ID     json.RawMessage `json:"id"`
					Result struct {
						Outcome struct {
							OptionID string `json:"optionId"`
						} `json:"outcome"`
					} `json:"result"`
				}
				if json.Unmarshal(in.Bytes(), &r) == nil && string(r.ID) == "0" {
					answer = r.Result.Outcome.OptionID
					break
				}
			}
			send(map[string]any{"jsonrpc": "2.0", "method": "session/update", "params": map[string]any{"sessionId": "fake",
				"update": map[string]any{"sessionUpdate": "agent_message_chunk", "content": map[string]any{"type": "text", "text": "permission: " + answer}}}})
			send(map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": map[string]any{"stopReason": "end_turn"}})
		}
	}
}

func fakeACPArgs(t *testing.T) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{"--", exe, "-test.run=^$", "--", fakeACPEnv}
}

// A permission nobody can answer is denied; the agent runs verbatim.
func TestPromptACP_VerbatimCommandDeniesPermission(t *testing.T) {
	args := append([]string{"prompt", "--transport", "acp", "hello"}, fakeACPArgs(t)...)
	out, errs, code := runCLI(t, args...)
	if code != 0 || out != "permission: reject\n" {
		t.Fatalf("code %d out %q err %q", code, out, errs)
	}
}

func TestPromptACP_TimeoutExits3(t *testing.T) {
	args := append([]string{"prompt", "--transport", "acp", "--timeout", "2s", "hang"}, fakeACPArgs(t)...)
	_, errs, code := runCLI(t, args...)
	if code != 3 {
		t.Fatalf("code %d err %q", code, errs)
	}
}

func TestPromptACP_Usage(t *testing.T) {
	for _, args := range [][]string{
		{"prompt", "--transport", "acp", "--agent", "pi", "hi"},
		{"prompt", "--transport", "nope", "hi"},
	} {
		if _, errs, code := runCLI(t, args...); code != 2 {
			t.Errorf("%v: code %d err %q", args, code, errs)
		}
	}
}

// The README's ACP command on omp: the bash call asks permission, which
// is denied, and the scripted model then answers "done".
func TestPromptACP_OMPBuiltInModel(t *testing.T) {
	out, errs, code := runCLI(t, "prompt", "--transport", "acp", "--agent", "omp", "--json",
		`Run this: [[tool:bash {"command":"echo hello over acp"}]]`)
	if code != 0 {
		t.Fatalf("code %d err %q", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var rejected, text bool
	for _, l := range lines {
		rejected = rejected || strings.Contains(l, `"status":"failed"`) && strings.Contains(l, "rejected")
		text = text || strings.Contains(l, `"agent_message_chunk"`)
	}
	if !rejected || !text {
		t.Fatalf("no denied tool call or no text in %s", out)
	}
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, `{"receipt":`) || !strings.Contains(last, `"type":"agenthost_receipt"`) {
		t.Fatalf("--json does not end with the receipt: %s", last)
	}
	out, errs, code = runCLI(t, "prompt", "--transport", "acp", "[[say:plain over acp]]")
	if code != 0 || out != "plain over acp\n" {
		t.Fatalf("code %d out %q err %q", code, out, errs)
	}
}

// serve --transport acp hosts rooms on omp acp: a turn settles, an
// unknown ACP agent is a usage error.
func TestServe_ACPOnOMP(t *testing.T) {
	data := t.TempDir()
	t.Setenv("AGENTHOST_TOKEN", "")
	url, token, stop := startServe(t, "--data", data, "--transport", "acp", "--agent", "omp")
	code, body := call(t, "POST", url+"v1/rooms/demo/messages", token, `{"text":"hello over acp"}`)
	if code != 202 {
		t.Fatalf("post: %d %s", code, body)
	}
	if ev := waitTurnEnded(t, url, token, "demo"); ev["outcome"] != "settled" || ev["text"] != "ok: hello over acp" {
		t.Fatalf("turn ended: %v", ev)
	}
	if err := stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	if _, errs, rc := runCLI(t, "serve", "--transport", "acp", "--agent", "pi", "--data", t.TempDir()); rc != 2 {
		t.Fatalf("serve --transport acp --agent pi: code %d %q", rc, errs)
	}
}
