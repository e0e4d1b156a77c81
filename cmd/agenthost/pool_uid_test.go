package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// serve --pool 1 as root with agent uids (pi over rpc, codex over acp):
// the start line says the pool's agents run as uids of their own, a new
// room is bound to the pool's agent, and the room holds that agent's uid
// (its record, the file its tool wrote).
func TestServePoolAgentUIDs(t *testing.T) {
	t.Run("pi", func(t *testing.T) {
		testServePoolAgentUIDs(t, []string{"--agent", "pi"}, `[[tool:bash {\"command\":\"echo hi > mine.txt && id -u\"}]]`)
	})
	t.Run("codex-acp", func(t *testing.T) {
		testServePoolAgentUIDs(t, []string{"--transport", "acp", "--agent", "codex"}, `[[tool:exec_command {\"cmd\":\"echo hi > mine.txt && id -u\"}]]`)
	})
}

func testServePoolAgentUIDs(t *testing.T, agent []string, tool string) {
	if os.Geteuid() != 0 {
		t.Skip("agents run as uids of their own only when serve runs as root")
	}
	t.Setenv("AGENTHOST_TOKEN", "")
	data := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &lines{ch: make(chan string, 64)}
	var errOut syncBuf
	done := make(chan error, 1)
	go func() {
		args := append(append([]string{"serve", "--listen", "127.0.0.1:0", "--data", data}, agent...), "--approval-mode", "yolo",
			"--pool", "1", "--agent-uids", "3200100-3200119")
		done <- run(ctx, args, out, &errOut)
	}()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Error("serve did not stop")
		}
	}()
	var url, token string
	deadline := time.After(60 * time.Second)
	for poolLine := false; !poolLine; {
		select {
		case line := <-out.ch:
			if rest, ok := strings.CutPrefix(line, "agenthost: serving rooms at "); ok {
				url, token, _ = strings.Cut(rest, "#token=")
				url = strings.Fields(url)[0]
			}
			if strings.HasPrefix(line, "agenthost: warm pool") {
				if !strings.Contains(line, "each as a uid of its own") {
					t.Fatalf("the pool's start line %q", line)
				}
				poolLine = true
			}
		case err := <-done:
			t.Fatalf("serve ended at start: %v\n%s", err, errOut.String())
		case <-deadline:
			t.Fatalf("no pool line; stderr:\n%s", errOut.String())
		}
	}
	wait, stop := context.WithTimeout(t.Context(), 3*time.Minute)
	defer stop()
	for metric(t, url, token, `agenthost_pool_agents{state="idle"}`) != "1" {
		select {
		case <-wait.Done():
			t.Fatal("the pool's agent never became ready")
		case <-time.After(100 * time.Millisecond):
		}
	}
	if code, body := call(t, "POST", url+"v1/rooms/demo/messages", token, `{"text":"`+tool+`"}`); code != 202 {
		t.Fatalf("post: %d %s", code, body)
	}
	if started := followEvents(t, url, token, "demo", "agent.started"); started["pooled"] != true {
		t.Fatalf("agent.started %v", started)
	}
	if ev := waitTurnEnded(t, url, token, "demo"); ev["outcome"] != "settled" {
		t.Fatalf("turn ended: %v", ev)
	}
	dirs, _ := filepath.Glob(filepath.Join(data, "rooms", "demo-*"))
	if len(dirs) != 1 {
		t.Fatalf("the room's folder: %v", dirs)
	}
	var rec struct {
		UID int `json:"uid"`
	}
	b, err := os.ReadFile(filepath.Join(dirs[0], "agent-uid"))
	if err != nil || json.Unmarshal(b, &rec) != nil || rec.UID < 3200100 || rec.UID > 3200119 {
		t.Fatalf("the room's agent-uid: %q, %v", b, err)
	}
	mine, _ := filepath.Glob(filepath.Join(data, "workspaces", "demo*", "mine.txt"))
	if len(mine) != 1 {
		t.Fatalf("the tool's file in the room's workspace: %v", mine)
	}
	fi, err := os.Lstat(mine[0])
	if err != nil {
		t.Fatal(err)
	}
	if got := int(fi.Sys().(*syscall.Stat_t).Uid); got != rec.UID {
		t.Fatalf("the tool's file is uid %d's, the room's record names %d", got, rec.UID)
	}
}
