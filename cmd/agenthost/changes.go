package main

import (
	"context"
	"fmt"
	"io"

	"github.com/agenthost/agenthost/client"
	"github.com/spf13/cobra"
)

// lastTurn is the room's last turn that ended ("" when none has).
func lastTurn(ctx context.Context, c *client.Client, room string) (string, error) {
	const page = 1000
	last := ""
	var after int64
	for {
		msgs, err := c.Messages(ctx, room, after, page)
		if err != nil {
			return "", err
		}
		for _, m := range msgs {
			after = m.Seq
			if m.TurnID != "" && m.Status == client.StatusEnded {
				last = m.TurnID
			}
		}
		if len(msgs) < page {
			return last, nil
		}
	}
}

// turnDiff is the diff command's answer: the turn and its changes.
type turnDiff struct {
	TurnID string `json:"turn_id"`
	client.TurnDiff
}

func newDiffCmd() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{
		Use:   "diff ROOM [TURN]",
		Short: "Print what a turn changed in a room's workspace (the last turn by default)",
		Long: `Print the unified diff of what a turn changed in the room's workspace, from the
snapshots the server takes before and after every turn (the room's last ended
turn when TURN is not given). A summary of the changed files goes to stderr;
--json prints {"turn_id","files","changes","patch","truncated"}. The patch is
bounded: a cut one is said so on stderr. Exits 1 for a turn without
snapshots and while that turn runs.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return oneShot(cmd, &f, func(ctx context.Context, c *client.Client) (turnDiff, error) {
				turn := ""
				if len(args) == 2 {
					turn = args[1]
				} else {
					var err error
					if turn, err = lastTurn(ctx, c, args[0]); err != nil {
						return turnDiff{}, err
					}
					if turn == "" {
						return turnDiff{}, fmt.Errorf("room %s has no ended turn yet: %w", args[0], client.ErrNotFound)
					}
				}
				d, err := c.TurnDiff(ctx, args[0], turn)
				return turnDiff{TurnID: turn, TurnDiff: d}, err
			}, func(w io.Writer, d turnDiff) error {
				e := cmd.ErrOrStderr()
				fmt.Fprintf(e, "turn %s: %d file(s) changed, %d insertion(s), %d deletion(s)\n", d.TurnID,
					d.Changes.Files, d.Changes.Insertions, d.Changes.Deletions)
				for _, fl := range d.Files {
					what := fmt.Sprintf("+%d -%d", fl.Insertions, fl.Deletions)
					if fl.Binary {
						what = "binary"
					}
					fmt.Fprintf(e, "  %-8s %s (%s)\n", fl.Status, fl.Path, what)
				}
				if d.FilesOmitted > 0 {
					fmt.Fprintf(e, "  ... and %d more file(s)\n", d.FilesOmitted)
				}
				// What snapshots leave out is named, never silently missing.
				for _, sk := range d.Skipped {
					why := sk.Reason
					if sk.Size > 0 {
						why = fmt.Sprintf("%s, %d bytes", sk.Reason, sk.Size)
					}
					fmt.Fprintf(e, "  left out %s (%s)\n", sk.Path, why)
				}
				if d.SkippedOmitted > 0 {
					fmt.Fprintf(e, "  ... and %d more left out\n", d.SkippedOmitted)
				}
				if _, err := io.WriteString(w, d.Patch); err != nil {
					return err
				}
				if d.Truncated {
					fmt.Fprintln(e, "(the patch was cut at the server's bound)")
				}
				return nil
			})
		},
	}
	f.add(cmd)
	return cmd
}

func newRevertCmd() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{
		Use:   "revert ROOM TURN",
		Short: "Restore a room's workspace to its state before a turn",
		Long: `Restore the room's workspace to its state before TURN: what that turn and every
later one changed goes (files ignored by the workspace's .gitignore and files
over the snapshot size bound are left alone). The room records
workspace.reverted, and the agent's next prompt is told. Prints the files
restored (--json: {"reverted","turn_id","files","kept"}). Exits 1 while a turn
runs and for a turn without snapshots.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return oneShot(cmd, &f, func(ctx context.Context, c *client.Client) (client.Reverted, error) {
				return c.Revert(ctx, args[0], args[1])
			}, func(w io.Writer, r client.Reverted) error {
				fmt.Fprintf(w, "room %s: workspace reverted to before turn %s (%d file(s) restored)\n", args[0], r.TurnID, len(r.Files))
				for _, p := range r.Files {
					fmt.Fprintf(w, "  %s\n", p)
				}
				for _, p := range r.Kept {
					fmt.Fprintf(w, "  kept (not in snapshots): %s\n", p)
				}
				return nil
			})
		},
	}
	f.add(cmd)
	return cmd
}
