package main

import (
	"fmt"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/spf13/cobra"
)

func newReapCmd() *cobra.Command {
	var kill bool
	cmd := &cobra.Command{
		Use:   "reap [--kill]",
		Short: "Find (and with --kill end) processes an agenthost that crashed left behind",
		Long: `Lists this user's processes that carry an agenthost custody marker whose
owning agenthost is no longer running (after a crash or kill -9). A dry run by
default; --kill ends them (SIGTERM, then SIGKILL after a second). Processes
without such a marker, of other users, or of a running agenthost are never
touched. Linux only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := cmd.OutOrStdout()
			orphans, err := custody.FindOrphans()
			if err != nil {
				return err
			}
			if len(orphans) == 0 {
				fmt.Fprintln(w, "no orphaned agenthost processes")
				return nil
			}
			for _, o := range orphans {
				fmt.Fprintf(w, "pid %-7d host %-7d %s\n", o.PID, o.Host, o.Cmdline)
			}
			if !kill {
				fmt.Fprintf(w, "%d orphaned process(es); run with --kill to end them\n", len(orphans))
				return nil
			}
			left, err := custody.KillOrphans(cmd.Context(), orphans, time.Second)
			if err != nil {
				return &exitError{1, fmt.Errorf("reap: %w (still running: %v)", err, left)}
			}
			fmt.Fprintf(w, "ended %d orphaned process(es)\n", len(orphans))
			return nil
		},
	}
	cmd.Flags().BoolVar(&kill, "kill", false, "end the orphans (default: only list them)")
	return cmd
}
