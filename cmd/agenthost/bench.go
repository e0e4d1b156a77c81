package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/bench"
	"github.com/spf13/cobra"
)

func newBenchCmd() *cobra.Command {
	var frames, runs int
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Time agenthost's client on a frame flood against pi's TypeScript client and a line-splitting floor",
		Long: `Writes FRAMES message_update frames (about 1 KB each, the shape omp streams),
then runs three whole processes RUNS times each on the same stream, written by
the same small node agent: a floor that only splits lines, agenthost's RPC
client (spawn, prompt, every event to a listener), and pi's own TypeScript
RpcClient. Each must see every frame. Prints median wall times and ratios.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
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
			res, size, err := bench.Run(cmd.Context(), bench.Config{Frames: frames, Runs: runs, Self: self, PiClient: piClient, Node: node})
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "flood: %d message_update frames, %.1f MB, median of %d runs (whole-process wall time)\n", frames, float64(size)/1e6, runs)
			floor := res[0].Median()
			for _, r := range res {
				m := r.Median()
				fmt.Fprintf(w, "  %-30s %8.3fs  %7.1f MB/s  %5.2fx floor  runs %v\n", r.Name, m.Seconds(), float64(size)/1e6/m.Seconds(), m.Seconds()/floor.Seconds(), r.Walls)
			}
			fmt.Fprintf(w, "agenthost is %.2fx faster than pi's TypeScript client\n", res[2].Median().Seconds()/res[1].Median().Seconds())
			return nil
		},
	}
	cmd.Flags().IntVar(&frames, "frames", 200000, "frames in the flood")
	cmd.Flags().IntVar(&runs, "runs", 5, "runs of each consumer")

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
	return cmd
}
