package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/agenthost/agenthost/client"
	"github.com/spf13/cobra"
)

// newTokenCmd is `agenthost token create|list|revoke`: room tokens, made
// with the admin token.
func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Create, list and revoke room tokens (access to only some rooms, with only some permissions)",
		Long: `A room token reaches only the rooms it names (ids, or prefix* patterns),
with only the permissions it names, until it expires or is revoked:

  read       the room, its messages, turns, events, diffs and settings
  send       send messages, cancel the turn
  approve    decide approvals, answer questions
  configure  set the room's settings, revert a turn
  release    release the room's agent
  purge      delete the room for good

The admin token (the server's) creates, lists and revokes them.`,
	}
	cmd.AddCommand(newTokenCreateCmd(), newTokenListCmd(), newTokenRevokeCmd())
	return cmd
}

func newTokenCreateCmd() *cobra.Command {
	var f clientFlags
	var can, label string
	var expires time.Duration
	cmd := &cobra.Command{
		Use:   "create ROOM[,ROOM...] --can read,send,approve [--expires 24h] [--label L]",
		Short: "Create a room token and print it with a link to the page",
		Long: `Create a room token for the rooms named (ids, or prefix* patterns) and print
its secret, once, with a link that opens the page on the first room with it
(http://HOST/#token=...&room=...). Only the token's hash is kept by the server.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rooms := splitList(args[0])
			perms := splitList(can)
			if len(rooms) == 0 {
				return usageErr(fmt.Errorf("token create: name at least one room"))
			}
			if len(perms) == 0 {
				return usageErr(fmt.Errorf("token create: --can names at least one of read, send, approve, configure, release, purge"))
			}
			var base string
			return oneShot(cmd, &f, func(ctx context.Context, c *client.Client) (client.Token, error) {
				base = c.URL()
				return c.CreateToken(ctx, client.NewToken{Rooms: rooms, Can: perms, ExpiresIn: expires, Label: label})
			}, func(w io.Writer, t client.Token) error {
				fmt.Fprintf(w, "token %s (%s in %s, expires %s)\n", t.ID, strings.Join(t.Can, ", "), strings.Join(t.Rooms, ", "),
					t.Expires.Local().Format(time.RFC3339))
				fmt.Fprintf(w, "secret (shown once): %s\n", t.Secret)
				_, err := fmt.Fprintf(w, "link: %s\n", tokenLink(base, t.Secret, rooms))
				return err
			})
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&can, "can", "read", "the permissions, comma-separated: read, send, approve, configure, release, purge")
	cmd.Flags().DurationVar(&expires, "expires", 24*time.Hour, "the token's life")
	cmd.Flags().StringVar(&label, "label", "", "a name for the token's holder (events it causes carry it)")
	return cmd
}

// tokenLink is the page's address with the token and the first room that
// is an id (not a pattern) in its fragment, which browsers never send.
func tokenLink(base, secret string, rooms []string) string {
	link := strings.TrimSuffix(base, "/") + "/#token=" + url.QueryEscape(secret)
	for _, r := range rooms {
		if !strings.HasSuffix(r, "*") {
			link += "&room=" + url.QueryEscape(r)
			break
		}
	}
	return link
}

func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

func newTokenListCmd() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the room tokens (never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return oneShot(cmd, &f, func(ctx context.Context, c *client.Client) ([]client.Token, error) {
				return c.Tokens(ctx)
			}, func(w io.Writer, ts []client.Token) error {
				if len(ts) == 0 {
					_, err := fmt.Fprintln(w, "no room tokens")
					return err
				}
				for _, t := range ts {
					state := "expires " + t.Expires.Local().Format(time.RFC3339)
					switch {
					case t.Revoked != nil:
						state = "revoked " + t.Revoked.Local().Format(time.RFC3339)
					case !time.Now().Before(t.Expires):
						state = "expired " + t.Expires.Local().Format(time.RFC3339)
					}
					label := t.Label
					if label == "" {
						label = "-"
					}
					if _, err := fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", t.ID, label, strings.Join(t.Rooms, ","), strings.Join(t.Can, ","), state); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	f.add(cmd)
	return cmd
}

func newTokenRevokeCmd() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a room token at once (its open event streams end)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return oneShot(cmd, &f, func(ctx context.Context, c *client.Client) (struct{}, error) {
				return struct{}{}, c.RevokeToken(ctx, args[0])
			}, func(w io.Writer, _ struct{}) error {
				_, err := fmt.Fprintf(w, "token %s: revoked\n", args[0])
				return err
			})
		},
	}
	f.add(cmd)
	return cmd
}
