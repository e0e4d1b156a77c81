package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/bench"
	"github.com/spf13/cobra"
)

func newBenchCmd() *cobra.Command {
	var frames, runs int
	var asJSON bool
	var profile, agent string
	var cold bool
	var coldRooms int
	var coldAgents []string
	var burst, burstPool int
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Time agenthost prompt on a frame flood against pi's TypeScript client and a line-splitting floor",
		Long: `Writes FRAMES message_update frames (about 1 KB each, the shape omp streams),
then runs four whole processes RUNS times each, interleaved, on the same
stream written by the same flood agent: a floor that only splits lines,
agenthost prompt (custody, the RPC client, the turn), agenthost's RPC client
alone (spawn, prompt, every event to a listener), and pi's own TypeScript
RpcClient. Each must see every frame. Prints median wall times, median CPU
times (user+sys of the consumer, the agent's own left out) and agenthost
prompt's ratios to the floor and to pi's client.

The flood agent (--agent) is a Go program by default, started through a small
node file as pi's client requires (every consumer pays that node start-up);
--agent node is the node agent earlier figures were taken with: it loads the
whole flood into memory as it starts (about 1 s of system time for the
default flood) before its first frame, a wait every consumer shares.

--cpuprofile FILE has each run of agenthost prompt write a CPU profile of its
whole process (with several runs, FILE with the run's number before its
extension; go tool pprof merges them).

--cold times instead message → first text.delta of rooms whose agent is not
running: new rooms, and rooms woken after their agent was released, with the
warm pool on (serve --pool 1) and off, on omp and pi over RPC and codex and
copilot over ACP (--cold-agents; the ACP pool serves new rooms only),
on the built-in model; --rooms rooms per arm, the arms interleaved room by
room. Prints each arm's median, p90, min and max. --burst N sends N new rooms
their first message at once instead, with no pool and with a pool of
--burst-pool.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cold {
				if coldRooms < 1 {
					return &exitError{2, errors.New("bench: --rooms must be at least 1")}
				}
				var kinds []agents.Kind
				for _, a := range coldAgents {
					if k := agents.Kind(a); k == agents.OMP || k == agents.Pi || k == agents.Codex || k == agents.Copilot {
						kinds = append(kinds, k)
						continue
					}
					return &exitError{2, fmt.Errorf("bench: --cold-agents %q: omp, pi (rpc), codex or copilot (acp)", a)}
				}
				if burst > 0 {
					return runColdBurst(cmd.Context(), cmd.OutOrStdout(), kinds, burst, max(burstPool, 1), slog.New(slog.DiscardHandler))
				}
				return runColdBench(cmd.Context(), cmd.OutOrStdout(), kinds, coldRooms, slog.New(slog.DiscardHandler))
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			node, err := exec.LookPath("node")
			if err != nil {
				return fmt.Errorf("bench: node is not on PATH: %w", err)
			}
			in, err := agents.Find()
			if err != nil {
				return err
			}
			piClient := filepath.Join(in.Dir, "node_modules", "@mariozechner", "pi-coding-agent", "dist", "modes", "rpc", "rpc-client.js")
			if _, err := os.Stat(piClient); err != nil {
				return fmt.Errorf("bench: pi's RpcClient is missing (run make setup): %w", err)
			}
			if runs < 1 || frames < 1 {
				return &exitError{2, errors.New("bench: --runs and --frames must be at least 1")}
			}
			if profile != "" {
				if profile, err = filepath.Abs(profile); err != nil {
					return err
				}
			}
			res, size, err := bench.Run(cmd.Context(), bench.Config{Frames: frames, Runs: runs, Self: self, PiClient: piClient, Node: node, Agent: agent, CPUProfile: profile})
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if asJSON {
				if err := printBenchJSON(w, res, size, frames); err != nil {
					return err
				}
			} else {
				printBench(w, res, size, frames, runs)
			}
			if profile != "" {
				var files []string
				for i := range runs {
					files = append(files, bench.ProfilePath(profile, i, runs))
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "profiles of agenthost prompt: go tool pprof -top %s %s\n", self, strings.Join(files, " "))
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&frames, "frames", 200000, "frames in the flood")
	cmd.Flags().IntVar(&runs, "runs", 5, "runs of each consumer")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the timings as one JSON object")
	cmd.Flags().StringVar(&profile, "cpuprofile", "", "write CPU profiles of agenthost prompt's runs to `FILE`")
	cmd.Flags().StringVar(&agent, "agent", bench.AgentGo, "the flood agent: go or node")
	cmd.Flags().BoolVar(&cold, "cold", false, "time cold rooms (new and woken) with the warm pool on and off instead")
	cmd.Flags().IntVar(&coldRooms, "rooms", 20, "with --cold: rooms per arm")
	cmd.Flags().StringSliceVar(&coldAgents, "cold-agents", []string{"omp", "pi"}, "with --cold: the agents to time (omp and pi over rpc, codex and copilot over acp)")
	cmd.Flags().IntVar(&burst, "burst", 0, "with --cold: send this many new rooms their first message at once instead, on no pool and on a pool of --burst-pool")
	cmd.Flags().IntVar(&burstPool, "burst-pool", 2, "with --cold --burst: the pool's size")

	var floor bool
	consume := &cobra.Command{
		Use:    "consume [--floor] -- COMMAND ARGS...",
		Short:  "One bench consumer (run by bench itself)",
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("bench consume: no agent command")
			}
			var n int
			var err error
			if floor {
				n, err = bench.ConsumeFloor(cmd.Context(), args)
			} else {
				n, err = bench.ConsumeClient(cmd.Context(), args)
			}
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]int{"updates": n})
		},
	}
	consume.Flags().BoolVar(&floor, "floor", false, "only split lines")
	cmd.AddCommand(consume)
	cmd.AddCommand(&cobra.Command{
		Use:    "flood-agent",
		Short:  "The Go flood agent (run by bench itself)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// pi's client stops its agent with SIGTERM: the agent's CPU
			// time is still written, and the process ends there.
			term := make(chan os.Signal, 1)
			signal.Notify(term, syscall.SIGTERM)
			defer signal.Stop(term)
			done := make(chan struct{})
			defer close(done)
			go func() {
				select {
				case <-term:
					_ = bench.WriteAgentCPU()
					os.Exit(0)
				case <-done:
				}
			}()
			return bench.FloodAgent(os.Stdin, os.Stdout)
		},
	})
	return cmd
}

// printBench prints each arm's medians and the ratios issue tables use:
// agenthost prompt's wall time over the floor's and over pi's client's.
func printBench(w io.Writer, res []bench.Result, size int64, frames, runs int) {
	fmt.Fprintf(w, "flood: %d message_update frames, %.1f MB, medians of %d interleaved runs of each whole process\n", frames, float64(size)/1e6, runs)
	fmt.Fprintf(w, "  %-30s %8s %9s %8s %10s  %s\n", "", "wall", "MB/s", "CPU", "agent CPU", "walls")
	for _, r := range res {
		m := r.Median()
		fmt.Fprintf(w, "  %-30s %7.3fs %9.1f %7.3fs %9.3fs  %v\n", r.Name, m.Seconds(), float64(size)/1e6/m.Seconds(), r.MedianCPU().Seconds(), r.MedianAgentCPU().Seconds(), roundAll(r.Walls))
	}
	floor, prompt, client, ts := res[bench.ArmFloor], res[bench.ArmPrompt], res[bench.ArmClient], res[bench.ArmTS]
	ratio := func(a, b time.Duration) float64 { return a.Seconds() / b.Seconds() }
	fmt.Fprintf(w, "agenthost prompt: wall %.2fx the floor, %.2fx pi's TypeScript client; CPU %.2fx the floor's, %.2fx pi's\n",
		ratio(prompt.Median(), floor.Median()), ratio(prompt.Median(), ts.Median()),
		ratio(prompt.MedianCPU(), floor.MedianCPU()), ratio(prompt.MedianCPU(), ts.MedianCPU()))
	fmt.Fprintf(w, "agenthost rpc client alone: wall %.2fx the floor, %.2fx pi's TypeScript client\n",
		ratio(client.Median(), floor.Median()), ratio(client.Median(), ts.Median()))
}

// printBenchJSON prints the same figures as printBench as one JSON object.
func printBenchJSON(w io.Writer, res []bench.Result, size int64, frames int) error {
	type row struct {
		Name             string    `json:"name"`
		MedianSeconds    float64   `json:"median_seconds"`
		RunsSeconds      []float64 `json:"runs_seconds"`
		MedianCPUSeconds float64   `json:"median_cpu_seconds"`
		MedianAgentCPU   float64   `json:"median_agent_cpu_seconds"`
	}
	out := struct {
		Frames int   `json:"frames"`
		Bytes  int64 `json:"bytes"`
		Rows   []row `json:"consumers"`
	}{Frames: frames, Bytes: size}
	for _, r := range res {
		var runs []float64
		for _, d := range r.Walls {
			runs = append(runs, d.Seconds())
		}
		out.Rows = append(out.Rows, row{r.Name, r.Median().Seconds(), runs, r.MedianCPU().Seconds(), r.MedianAgentCPU().Seconds()})
	}
	return printJSON(w, out)
}

func roundAll(d []time.Duration) []time.Duration {
	out := make([]time.Duration, len(d))
	for i, v := range d {
		out[i] = v.Round(time.Millisecond)
	}
	return out
}
