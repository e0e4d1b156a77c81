// Package bench measures agenthost's RPC client on a frame flood, side by
// side with pi's own TypeScript RpcClient and a floor that only splits lines,
// each as a whole process reading the same stream from the same flood
// agent (a Go program by default, started through a node file as pi's
// client requires).
package bench

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agenthost/agenthost/rpc"
)

//go:embed flood.js
var floodJS []byte

//go:embed floodgo.js
var floodGoJS []byte

// AgentEnv names the Go flood agent's executable, for floodgo.js.
const AgentEnv = "FLOOD_AGENT"

//go:embed piclient.mjs
var piClientJS []byte

// FloodEnv names the file of frames the flood agent writes.
const FloodEnv = "FLOOD_FILE"

type textBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type floodFrame struct {
	Type    string `json:"type"`
	Message struct {
		Role       string         `json:"role"`
		Content    []textBlock    `json:"content"`
		API        string         `json:"api"`
		Provider   string         `json:"provider"`
		Model      string         `json:"model"`
		Usage      map[string]int `json:"usage"`
		StopReason string         `json:"stopReason"`
		Timestamp  int64          `json:"timestamp"`
	} `json:"message"`
	Event struct {
		Type         string `json:"type"`
		ContentIndex int    `json:"contentIndex"`
		Delta        string `json:"delta"`
	} `json:"assistantMessageEvent"`
}

// WriteFrames writes n message_update frames of about 1 KB each, the shape
// omp streams, and returns the bytes written.
func WriteFrames(w io.Writer, n int) (int64, error) {
	const word = "lorem ipsum dolor sit amet "
	text := ""
	var total int64
	var buf bytes.Buffer
	for i := 0; i < n; i++ {
		text += word
		if len(text) > 800 {
			text = text[len(text)-800:]
		}
		// A struct, not a map: "type" first, as the agents write it.
		frame := floodFrame{Type: "message_update"}
		frame.Message.Role = "assistant"
		frame.Message.Content = []textBlock{{Type: "text", Text: text}}
		frame.Message.API, frame.Message.Provider, frame.Message.Model = "openai-completions", "fake", "fake-model"
		frame.Message.Usage = map[string]int{"input": 10, "output": i, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 10 + i}
		frame.Message.StopReason, frame.Message.Timestamp = "stop", 1764400000000
		frame.Event.Type, frame.Event.Delta = "text_delta", word
		b, err := json.Marshal(frame)
		if err != nil {
			return total, err
		}
		buf.Write(b)
		buf.WriteByte('\n')
		if buf.Len() > 1<<20 {
			m, err := w.Write(buf.Bytes())
			total += int64(m)
			if err != nil {
				return total, err
			}
			buf.Reset()
		}
	}
	m, err := w.Write(buf.Bytes())
	return total + int64(m), err
}

// Config is one bench run.
type Config struct {
	Frames   int
	Runs     int
	Self     string // this executable, run as the agenthost and floor consumers
	PiClient string // pi's dist/modes/rpc/rpc-client.js
	Node     string
	// Agent is the flood agent: AgentGo (the default) or AgentNode.
	Agent string
	// CPUProfile, when set, is where each run of the agenthost prompt
	// consumer writes a CPU profile of its whole process: FILE for one
	// run, FILE with the run's number before its extension for several
	// (go tool pprof merges them).
	CPUProfile string
}

// Arms, in the order Run returns them.
const (
	ArmFloor = iota
	ArmPrompt
	ArmClient
	ArmTS
)

// Result is one consumer's figures, one entry per run.
type Result struct {
	Name  string
	Walls []time.Duration
	// CPUs is the consumer's own CPU time (user+sys of its process and of
	// what it waited for, less the flood agent's own).
	CPUs []time.Duration
	// AgentCPUs is the flood agent's CPU time in the same run, the same
	// work for every consumer.
	AgentCPUs []time.Duration
	Updates   int
}

// Median wall time.
func (r Result) Median() time.Duration { return median(r.Walls) }

// MedianCPU is the median of the consumer's own CPU time.
func (r Result) MedianCPU() time.Duration { return median(r.CPUs) }

// MedianAgentCPU is the median of the flood agent's CPU time.
func (r Result) MedianAgentCPU() time.Duration { return median(r.AgentCPUs) }

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// ProfilePath is the profile file of run (0-based) of runs.
func ProfilePath(file string, run, runs int) string {
	if runs <= 1 {
		return file
	}
	ext := filepath.Ext(file)
	return fmt.Sprintf("%s.%d%s", strings.TrimSuffix(file, ext), run+1, ext)
}

// endText is the final assistant text the flood agent ends with: the
// prompt consumer must print it.
const endText = "done"

// Run writes the frames and the node scripts to a temporary folder, then
// times each consumer Runs times, interleaved: the floor, agenthost prompt
// (the whole CLI: custody, the client, the turn), the agenthost RPC client
// alone (a listener counting events) and pi's TypeScript RpcClient.
func Run(ctx context.Context, cfg Config) ([]Result, int64, error) {
	dir, err := os.MkdirTemp("", "agenthost-bench-")
	if err != nil {
		return nil, 0, err
	}
	defer os.RemoveAll(dir)
	framesPath := filepath.Join(dir, "frames.jsonl")
	f, err := os.Create(framesPath)
	if err != nil {
		return nil, 0, err
	}
	size, err := WriteFrames(f, cfg.Frames)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, 0, err
	}
	pic := filepath.Join(dir, "piclient.mjs")
	if err := os.WriteFile(pic, piClientJS, 0o644); err != nil {
		return nil, 0, err
	}
	agentCPU := filepath.Join(dir, "agent-cpu.json")
	env := append(os.Environ(), FloodEnv+"="+framesPath, FloodCPUEnv+"="+agentCPU)
	var flood string
	switch cfg.Agent {
	case AgentGo, "":
		// A copy in the bench's folder: prompt confines its agent to
		// that folder, where it may execute files; elsewhere only the
		// system's and the agents' own.
		exe := filepath.Join(dir, "flood-agent")
		if err := copyFile(exe, cfg.Self); err != nil {
			return nil, 0, err
		}
		flood = filepath.Join(dir, "floodgo.js")
		if err := os.WriteFile(flood, floodGoJS, 0o644); err != nil {
			return nil, 0, err
		}
		env = append(env, AgentEnv+"="+exe)
	case AgentNode:
		flood = filepath.Join(dir, "flood.js")
		if err := os.WriteFile(flood, floodJS, 0o644); err != nil {
			return nil, 0, err
		}
	default:
		return nil, 0, fmt.Errorf("bench: unknown flood agent %q (%s or %s)", cfg.Agent, AgentGo, AgentNode)
	}
	type consumer struct {
		name string
		argv func(run int) []string
	}
	fixed := func(argv ...string) func(int) []string { return func(int) []string { return argv } }
	consumers := []consumer{
		ArmFloor: {"floor (split lines only, Go)", fixed(cfg.Self, "bench", "consume", "--floor", "--", cfg.Node, flood)},
		ArmPrompt: {"agenthost prompt", func(run int) []string {
			argv := []string{cfg.Self}
			if cfg.CPUProfile != "" {
				argv = append(argv, "--cpuprofile", ProfilePath(cfg.CPUProfile, run, cfg.Runs))
			}
			// The agent runs confined (Landlock, prompt's default) to
			// its working directory: the bench's folder holds its frames.
			// prompt gives its agent no variable of its own caller's (an
			// agent's environment is an allowlist): the flood's settings
			// go on node's command line, set before the flood file runs.
			vars, _ := json.Marshal(floodVars(env))
			return append(argv, "prompt", "--cwd", dir, "go", "--", cfg.Node, "-e",
				"Object.assign(process.env, JSON.parse(process.argv[1])); require(process.argv[2])", string(vars), flood)
		}},
		ArmClient: {"agenthost rpc client alone", fixed(cfg.Self, "bench", "consume", "--", cfg.Node, flood)},
		ArmTS:     {"pi TypeScript RpcClient", fixed(cfg.Node, pic, cfg.PiClient, flood)},
	}
	results := make([]Result, len(consumers))
	for i, c := range consumers {
		results[i].Name = c.name
	}
	for run := 0; run < cfg.Runs; run++ {
		for i, c := range consumers {
			argv := c.argv(run)
			_ = os.Remove(agentCPU)
			cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
			cmd.Env = env
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			t0 := time.Now()
			err := cmd.Run()
			wall := time.Since(t0)
			if err != nil {
				return nil, size, fmt.Errorf("bench: %s: %w: %s", c.name, err, lastLine(errb.String()))
			}
			if i == ArmPrompt {
				// prompt prints the final text, which the agent writes
				// after every frame; it exits 0 only for a turn that
				// settled with every frame read in order.
				if got := strings.TrimSpace(out.String()); got != endText {
					return nil, size, fmt.Errorf("bench: %s printed %q, want %q", c.name, got, endText)
				}
			} else {
				var got struct {
					Updates int `json:"updates"`
				}
				if err := json.Unmarshal(bytes.TrimSpace(out.Bytes()), &got); err != nil {
					return nil, size, fmt.Errorf("bench: %s printed no count: %q", c.name, out.String())
				}
				if got.Updates != cfg.Frames {
					return nil, size, fmt.Errorf("bench: %s saw %d of %d frames", c.name, got.Updates, cfg.Frames)
				}
				results[i].Updates = got.Updates
			}
			agent, err := readAgentCPU(agentCPU)
			if err != nil {
				return nil, size, fmt.Errorf("bench: %s: the flood agent's CPU time: %w", c.name, err)
			}
			tree := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
			results[i].Walls = append(results[i].Walls, wall)
			results[i].CPUs = append(results[i].CPUs, max(tree-agent, 0))
			results[i].AgentCPUs = append(results[i].AgentCPUs, agent)
		}
	}
	return results, size, nil
}

// copyFile copies the executable src to dst.
func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// floodVars are the flood's own variables of env.
func floodVars(env []string) map[string]string {
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && (k == FloodEnv || k == FloodCPUEnv || k == AgentEnv) {
			vars[k] = v
		}
	}
	return vars
}

// FloodCPUEnv names the file the flood agent writes its own CPU time to
// as it exits, so a consumer's figure can leave it out.
const FloodCPUEnv = "FLOOD_CPU_FILE"

// readAgentCPU reads the flood agent's CPU time (microseconds, in the shape
// of node's process.cpuUsage()).
func readAgentCPU(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var u struct {
		User   int64 `json:"user"`
		System int64 `json:"system"`
	}
	if err := json.Unmarshal(b, &u); err != nil {
		return 0, err
	}
	return time.Duration(u.User+u.System) * time.Microsecond, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// ConsumeClient is the agenthost consumer: the real client, spawning the
// agent, running one turn, counting message_update events on a listener.
func ConsumeClient(ctx context.Context, argv []string) (int, error) {
	c, err := rpc.Spawn(ctx, rpc.Spec{Argv: argv, Verbatim: true}, rpc.SpawnOptions{})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	updates := 0
	c.On(rpc.EventMessageUpdate, func(rpc.Event) { updates++ })
	if _, err := c.Run(ctx, "go", nil); err != nil {
		return 0, err
	}
	if err := c.Close(); err != nil {
		return 0, err
	}
	if err := c.Wait(ctx); err != nil {
		return 0, err
	}
	return updates, nil // Wait joined the dispatcher: every listener call is done
}

// ConsumeFloor is the floor: it starts the agent, sends the prompt, and only
// splits stdout into lines, counting those that start like a message_update,
// until agent_end.
func ConsumeFloor(ctx context.Context, argv []string) (int, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 0, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer cmd.Wait()
	defer stdin.Close()
	if _, err := io.WriteString(stdin, `{"id":"1","type":"prompt","message":"go"}`+"\n"); err != nil {
		return 0, err
	}
	update := []byte(`{"type":"message_update"`)
	end := []byte(`{"type":"agent_end"`)
	buf := make([]byte, 1<<20)
	start, stop, n := 0, 0, 0
	for {
		i := bytes.IndexByte(buf[start:stop], '\n')
		if i < 0 {
			if start > 0 {
				copy(buf, buf[start:stop])
				stop -= start
				start = 0
			}
			if stop == len(buf) {
				buf = append(buf, make([]byte, len(buf))...)
			}
			m, err := stdout.Read(buf[stop:])
			stop += m
			if err != nil {
				return n, errors.New("bench: floor: stream ended before agent_end")
			}
			continue
		}
		line := buf[start : start+i]
		start += i + 1
		if bytes.HasPrefix(line, update) {
			n++
		} else if bytes.HasPrefix(line, end) {
			return n, nil
		}
	}
}
