package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// Flood agents: what writes the flood every consumer reads.
const (
	// AgentGo copies the frames from the file to the pipe as each prompt
	// asks for them: about 0.1 s of CPU for 240 MB.
	AgentGo = "go"
	// AgentNode is the small node agent (flood.js) the bench used first.
	// It reads the whole file into fresh memory as it starts, which costs
	// about 1 s of system time for 240 MB (page faults) that every
	// consumer then waits for: its figures are comparable with the
	// earlier ones, not with the Go agent's.
	AgentNode = "node"
)

// FloodAgent is the Go flood agent: it reads RPC commands from in, answers
// each, and on "prompt" writes agent_start, the frames in $FLOOD_FILE, a
// message_end and an agent_end to out, as fast as the pipe takes them. At
// in's end it writes its own CPU time to $FLOOD_CPU_FILE (as node's
// process.cpuUsage() does, in microseconds).
func FloodAgent(in io.Reader, out io.Writer) error {
	frames := os.Getenv(FloodEnv)
	if _, err := os.Stat(frames); err != nil {
		return fmt.Errorf("bench: flood agent: %w", err)
	}
	tail := []byte(`{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"` + endText + `"}],"stopReason":"stop"}}` + "\n" +
		`{"type":"agent_end","messages":[]}` + "\n")
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var cmd struct {
			ID   string `json:"id"`
			Type string `json:"type"`
		}
		if json.Unmarshal(sc.Bytes(), &cmd) != nil {
			continue
		}
		var data any
		if cmd.Type == "get_state" {
			data = map[string]any{"isStreaming": false, "sessionId": "flood", "messageCount": 0, "pendingMessageCount": 0}
		}
		reply, err := json.Marshal(struct {
			ID      string `json:"id,omitempty"`
			Type    string `json:"type"`
			Command string `json:"command"`
			Success bool   `json:"success"`
			Data    any    `json:"data,omitempty"`
		}{cmd.ID, "response", cmd.Type, true, data})
		if err != nil {
			return err
		}
		var b bytes.Buffer
		b.Write(reply)
		b.WriteByte('\n')
		if cmd.Type == "prompt" {
			b.WriteString(`{"type":"agent_start"}` + "\n")
		}
		if _, err := out.Write(b.Bytes()); err != nil {
			return err
		}
		if cmd.Type == "prompt" {
			if err := copyFrames(out, frames); err != nil {
				return err
			}
			if _, err := out.Write(tail); err != nil {
				return err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return WriteAgentCPU()
}

// copyFrames copies the file of frames to out: from the page cache, through
// a small buffer or splice(2) when out is a pipe, never the whole file in
// memory.
func copyFrames(out io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(out, f)
	return err
}

// WriteAgentCPU writes this process's CPU time to $FLOOD_CPU_FILE, if set.
func WriteAgentCPU() error {
	path := os.Getenv(FloodCPUEnv)
	if path == "" {
		return nil
	}
	user, sys := selfCPU()
	b, err := json.Marshal(map[string]int64{"user": user.Microseconds(), "system": sys.Microseconds()})
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
