//go:build unix

package rpc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func init() {
	// crash-held-stdout: starts a background child that inherits stdout and
	// stderr, then on a prompt starts a turn, writes to stderr and exits 7.
	fakeAgents["crash-held-stdout"] = func() {
		child := exec.Command("/bin/sleep", "60")
		child.Stdout, child.Stderr = os.Stdout, os.Stderr
		if err := child.Start(); err != nil {
			os.Exit(3)
		}
		f := newFakeIO()
		f.serve(func(cmd map[string]any) bool {
			if cmd["type"] == "prompt" {
				f.send(map[string]any{"id": cmd["id"], "type": "response", "command": "prompt", "success": true})
				f.send(map[string]any{"type": "agent_start"})
				fmt.Fprintln(os.Stderr, "fatal: model exploded")
				os.Exit(7)
			}
			return false
		})
	}
	// term-ignorer: starts a group member that ignores SIGTERM (and holds
	// none of the agent's stdio); "where" answers its pid. Exits on stdin
	// EOF at once.
	fakeAgents["term-ignorer"] = func() {
		child := exec.Command("/bin/sh", "-c", `trap "" TERM; echo ready; exec /bin/sleep 30`)
		out, err := child.StdoutPipe()
		if err != nil {
			os.Exit(3)
		}
		if err := child.Start(); err != nil {
			os.Exit(3)
		}
		// The trap is set once it says ready.
		if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
			os.Exit(3)
		}
		f := newFakeIO()
		f.serve(func(c map[string]any) bool {
			if c["type"] == "where" {
				f.send(map[string]any{"id": c["id"], "type": "response", "command": "where", "success": true, "data": map[string]any{"pid": child.Process.Pid}})
				return true
			}
			return false
		})
	}
}

// An agent that crashes while a background child still holds its stdout:
// the turn ends with the exit status and stderr, well before its context.
func TestSpawn_CrashWithDescendantHoldingStdout(t *testing.T) {
	c := spawnFake(t, "crash-held-stdout", SpawnOptions{Grace: 200 * time.Millisecond})
	ctx := ctxT(t, 60*time.Second)
	start := time.Now()
	_, err := c.Run(ctx, "x", nil)
	if !errors.Is(err, ErrAgentExited) || !strings.Contains(err.Error(), "exit status 7") || !strings.Contains(err.Error(), "model exploded") {
		t.Fatalf("err = %v (after %v)", err, time.Since(start))
	}
	var ee *ExitError
	if !errors.As(err, &ee) || !strings.Contains(ee.Stderr, "model exploded") {
		t.Fatalf("exit error = %#v", ee)
	}
	t.Logf("the crash was reported %v after the prompt", time.Since(start))
	select {
	case <-c.Done():
	default:
		t.Fatal("the transport still runs after the crash was reported")
	}
}

// GroupStarter: a group member that ignores SIGTERM is killed after the
// grace even when the leader exited at once.
func TestSpawn_GroupMemberIgnoringTermKilled(t *testing.T) {
	c := spawnFake(t, "term-ignorer", SpawnOptions{Grace: 200 * time.Millisecond})
	resp, err := c.Request(ctxT(t, 30*time.Second), "where", nil)
	if err != nil {
		t.Fatal(err)
	}
	var m struct{ Pid int }
	if err := json.Unmarshal(resp.Data, &m); err != nil || m.Pid == 0 {
		t.Fatalf("where: %s %v", resp.Data, err)
	}
	defer syscall.Kill(m.Pid, syscall.SIGKILL)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for processLive(m.Pid) {
		if time.Now().After(deadline) {
			t.Fatalf("group member %d (ignores SIGTERM) still runs 10 s after Close", m.Pid)
		}
		time.Sleep(20 * time.Millisecond) // polling: no event tells a stranger's exit
	}
}

// processLive reports whether pid runs (a zombie has ended).
func processLive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !os.IsNotExist(err) && syscall.Kill(pid, 0) == nil
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}
