package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// asAgentEnv has the test binary run as the Go flood agent.
const asAgentEnv = "BENCH_TEST_AS_FLOOD_AGENT"

func TestMain(m *testing.M) {
	if os.Getenv(asAgentEnv) == "1" {
		if err := FloodAgent(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func TestWriteFrames(t *testing.T) {
	var b bytes.Buffer
	n, err := WriteFrames(&b, 500)
	if err != nil || n != int64(b.Len()) {
		t.Fatalf("%d %v", n, err)
	}
	lines := bytes.Split(bytes.TrimSpace(b.Bytes()), []byte("\n"))
	if len(lines) != 500 {
		t.Fatalf("%d lines", len(lines))
	}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil || m["type"] != "message_update" {
			t.Fatalf("bad frame %q", l)
		}
	}
	if avg := b.Len() / 500; avg < 700 || avg > 1400 {
		t.Fatalf("frames average %d bytes, want about 1 KB", avg)
	}
}

// Both Go consumers see every frame each flood agent writes, and the agent
// leaves its CPU time for the bench as it exits.
func TestConsumers(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is needed: %v", err)
	}
	dir := t.TempDir()
	frames := filepath.Join(dir, "frames.jsonl")
	f, err := os.Create(frames)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WriteFrames(f, 3000); err != nil {
		t.Fatal(err)
	}
	f.Close()
	flood := filepath.Join(dir, "flood.js")
	if err := os.WriteFile(flood, floodJS, 0o644); err != nil {
		t.Fatal(err)
	}
	goFlood := filepath.Join(dir, "floodgo.js")
	if err := os.WriteFile(goFlood, floodGoJS, 0o644); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(FloodEnv, frames)
	cpu := filepath.Join(dir, "cpu.json")
	t.Setenv(FloodCPUEnv, cpu)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	agents := map[string][]string{
		"node agent": {node, flood},
		// The test binary runs as the Go agent, directly and through
		// the node file every consumer starts it with.
		"go agent":         {self},
		"go agent by node": {node, goFlood},
	}
	t.Setenv(asAgentEnv, "1")
	t.Setenv(AgentEnv, self) // floodgo.js runs it with arguments it ignores as the agent
	for agent, argv := range agents {
		for name, consume := range map[string]func(context.Context, []string) (int, error){"floor": ConsumeFloor, "client": ConsumeClient} {
			os.Remove(cpu)
			n, err := consume(ctx, argv)
			if err != nil || n != 3000 {
				t.Fatalf("%s, %s: %d frames, %v", agent, name, n, err)
			}
			if d, err := readAgentCPU(cpu); err != nil || d <= 0 {
				t.Fatalf("%s, %s: the agent's CPU time: %v, %v", agent, name, d, err)
			}
		}
	}
}
