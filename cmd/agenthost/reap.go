package main

import (
	"fmt"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/spf13/cobra"
)

func newReapCmd() *cobra.Command {
	var kill, asJSON bool
	cmd := &cobra.Command{
		Use:   "reap [--kill] [--json]",
		Short: "Find (and with --kill end) processes an agenthost that crashed left behind",
		Long: `Lists this user's processes whose agenthost is proven gone (after a crash
or kill -9): those carrying an agenthost custody marker whose agenthost no
longer runs (checked in the pid namespace the marker names), and those left in
such an agenthost's cgroup or a group below it. A dry run by default; --kill
ends them (SIGTERM, then SIGKILL after a second) and removes the dead
agenthosts' cgroup directories, the groups below them first. Processes without
such a marker outside such a cgroup, of other
users, of a running agenthost, or whose agenthost cannot be checked from here
(a pid namespace this one cannot see) are never touched. Linux only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := cmd.OutOrStdout()
			orphans, err := custody.FindOrphans()
			if err != nil {
				return err
			}
			if asJSON {
				// {"orphans": [...], "ended": N}: what was found, and
				// how many --kill ended.
				res := struct {
					Orphans []custody.Orphan `json:"orphans"`
					Ended   int              `json:"ended"`
				}{Orphans: orphans}
				if res.Orphans == nil {
					res.Orphans = []custody.Orphan{}
				}
				if kill {
					left, err := custody.KillOrphans(cmd.Context(), orphans, time.Second)
					if err != nil {
						return &exitError{1, fmt.Errorf("reap: %w (still running: %v)", err, left)}
					}
					res.Ended = len(orphans)
				}
				return printJSON(w, res)
			}
			for _, o := range orphans {
				how := ""
				if o.Cgroup != "" {
					how = "(in its cgroup) "
				}
				fmt.Fprintf(w, "pid %-7d host %-7d %s%s\n", o.PID, o.Host, how, o.Cmdline)
			}
			switch {
			case len(orphans) == 0 && !kill:
				fmt.Fprintln(w, "no orphaned agenthost processes")
				return nil
			case !kill:
				fmt.Fprintf(w, "%d orphaned process(es); run with --kill to end them\n", len(orphans))
				return nil
			}
			// With none listed this still removes dead agenthosts' empty
			// cgroup directories.
			left, err := custody.KillOrphans(cmd.Context(), orphans, time.Second)
			if err != nil {
				return &exitError{1, fmt.Errorf("reap: %w (still running: %v)", err, left)}
			}
			if len(orphans) == 0 {
				fmt.Fprintln(w, "no orphaned agenthost processes")
				return nil
			}
			fmt.Fprintf(w, "ended %d orphaned process(es)\n", len(orphans))
			return nil
		},
	}
	cmd.Flags().BoolVar(&kill, "kill", false, "end the orphans (default: only list them)")
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"orphans": [...], "ended": N} as JSON`)
	return cmd
}
