package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agenthost/agenthost/client"
	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/event"
	"github.com/spf13/cobra"
)

// The client commands talk to a running `agenthost serve` through the
// client package.

type clientFlags struct {
	server, data string
	json         bool
}

func (f *clientFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.server, "server", "", "the server's address (default: $AGENTHOST_URL, else http://"+defaultListen+")")
	cmd.Flags().StringVar(&f.data, "data", "", "the server's data dir, for its token when $AGENTHOST_TOKEN is not set (default: $AGENTHOST_DATA, else the per-user dir)")
	cmd.Flags().BoolVar(&f.json, "json", false, "print the result as JSON")
}

// client makes the command's client: the server from --server,
// AGENTHOST_URL or the default; the token from AGENTHOST_TOKEN, the
// address's #token= fragment (the page's address), or the data dir's file.
// Reconnects of an event stream are told on stderr.
func (f *clientFlags) client(stderr io.Writer) (*client.Client, error) {
	base := f.server
	if base == "" {
		base = os.Getenv("AGENTHOST_URL")
	}
	if base == "" {
		base = "http://" + defaultListen
	}
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	base, frag, _ := strings.Cut(base, "#")
	tok := strings.TrimSpace(os.Getenv(tokenEnv))
	// The page's fragment: token=...&room=... (a room token's link).
	if q, err := url.ParseQuery(frag); err == nil && tok == "" {
		tok = q.Get("token")
	}
	if tok == "" {
		data := f.data
		if data == "" {
			data = os.Getenv("AGENTHOST_DATA")
		}
		if data == "" {
			var err error
			if data, err = defaultDataDir(); err != nil {
				return nil, usageErr(err)
			}
		}
		b, err := os.ReadFile(filepath.Join(data, tokenFile))
		if err != nil {
			return nil, usageErr(fmt.Errorf("no token: set %s or give the server's --data (%w)", tokenEnv, err))
		}
		tok = strings.TrimSpace(string(b))
	}
	c, err := client.New(base, client.Options{Token: tok, OnReconnect: reconnectNotes(stderr)})
	if err != nil {
		return nil, usageErr(err)
	}
	return c, nil
}

// reconnectNotes says on stderr that a stream reconnects, and when it did.
func reconnectNotes(w io.Writer) func(client.Reconnect) {
	return func(r client.Reconnect) {
		if r.Err == nil {
			fmt.Fprintf(w, "agenthost: reconnected to room %s's events, resuming after event %d\n", r.Room, r.After)
			return
		}
		fmt.Fprintf(w, "agenthost: room %s's events: %s; reconnecting in %s (attempt %d)\n",
			r.Room, strings.TrimPrefix(oneLine(r.Err.Error()), "client: "), r.Delay.Round(10*time.Millisecond), r.Attempt)
	}
}

// clientErr makes a client error the command's, with the next step where
// there is one: a server that does not answer, a token it refuses, a
// budget spent. A request the server (or the client, before sending it)
// finds malformed is a usage error (exit 2); the rest is the operation
// failing (exit 1, as main makes any other error). main passes every
// command's error through it.
func clientErr(err error) error {
	var ee *exitError
	msg := ""
	if err != nil {
		msg = strings.TrimPrefix(err.Error(), "client: ")
	}
	switch {
	case err == nil || errors.As(err, &ee):
		return err
	case errors.Is(err, client.ErrUnreachable):
		return &exitError{exitFailed, fmt.Errorf("%s (is agenthost serve running? --server or AGENTHOST_URL name it)", msg)}
	case errors.Is(err, client.ErrUnauthorized):
		return &exitError{exitFailed, fmt.Errorf("%s: the server's token is in its data dir (give --data or AGENTHOST_DATA), or set %s to the one it was started with", msg, tokenEnv)}
	case errors.Is(err, client.ErrBudgetExhausted):
		return &exitError{exitFailed, fmt.Errorf("%s: raise the room's budget with agenthost config ROOM --set budget.turns=N (or budget.tokens, budget.cost_usd; 0 is no limit)", msg)}
	case errors.Is(err, client.ErrBadRequest):
		return &exitError{exitUsage, errors.New(msg)}
	}
	return err
}

// requestTimeout bounds a one-shot request (not a follower, which
// --timeout bounds): a server that takes the connection but never answers
// does not hold the command.
const requestTimeout = 60 * time.Second

// withTimeout bounds ctx by d (0: no bound).
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// timedOut makes a follower's error after its --timeout exit 3.
func timedOut(ctx context.Context, err error, d time.Duration, what string) error {
	if errors.Is(err, context.DeadlineExceeded) && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &exitError{3, fmt.Errorf("timed out after %s %s", d, what)}
	}
	return clientErr(err)
}

func newRoomsCmd() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{
		Use:   "rooms",
		Short: "List the rooms of a running server",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			// A page at a time, each printed as it comes, each request
			// within requestTimeout: a server with many rooms answers fast.
			w := cmd.OutOrStdout()
			after, total := "", 0
			for {
				ctx, cancel := context.WithTimeout(cmd.Context(), requestTimeout)
				page, err := c.RoomsPage(ctx, after, client.MaxRoomsPage)
				if err != nil {
					err = timedOut(ctx, err, requestTimeout, "waiting for the server's answer")
				}
				cancel()
				if err != nil {
					return err
				}
				total += len(page.Rooms)
				if err := printRooms(w, page.Rooms, f.json); err != nil {
					return err
				}
				if page.Next == "" {
					break
				}
				if page.Next <= after {
					return fmt.Errorf("the server's next page (after %q) does not follow %q", page.Next, after)
				}
				after = page.Next
			}
			if total == 0 && !f.json {
				fmt.Fprintln(cmd.ErrOrStderr(), "no rooms yet")
			}
			return nil
		},
	}
	f.add(cmd)
	return cmd
}

// printRooms writes rooms as JSON lines or one line each.
func printRooms(w io.Writer, rooms []client.Room, asJSON bool) error {
	for _, r := range rooms {
		if asJSON {
			if err := printJSON(w, r); err != nil {
				return err
			}
			continue
		}
		state := "idle"
		switch {
		case r.Turn != nil:
			state = "working"
		case !r.Resident:
			state = "released"
		}
		u := r.Usage
		fmt.Fprintf(w, "%-24s %-8s queued %d  approvals %d  questions %d  events %d  turns %d  tokens %d  $%.4f\n",
			r.ID, state, r.Queued, len(r.Approvals), len(r.Questions), r.LastSeq, r.Turns,
			u.InputTokens+u.OutputTokens+u.CacheReadTokens+u.CacheWriteTokens, u.CostUSD)
	}
	return nil
}

func newSendCmd() *cobra.Command {
	var f clientFlags
	var follow bool
	var sender, delivery string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "send ROOM MESSAGE [--follow]",
		Short: "Send a message to a room of a running server",
		Long: `Send a message to a room. Without --follow it prints the accepted message's
id and sequence number (--json: {"id","seq","incarnation"}). With --follow it shows progress
on stderr (a question's options, an approval's decision) while it waits,
streams the answer to stdout (--json: the room's events as JSON lines), and
ends on the message's message.ended event: exit 0 settled or answered a
question, 1 failed or cancelled (or its room deleted), 3 timed out. A dropped
connection (a server restart) is resumed with backoff, said on stderr, for as
long as --timeout allows (default: no bound; Ctrl-C stops, exit 130, the turn
goes on). The message goes with an idempotency key and is sent again with it
after a connection error, a 503 or a full queue (up to 5 attempts, with
backoff): the room accepts it once, so it runs at most one turn.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch delivery {
			case client.DeliverQueue, client.DeliverSteer, client.DeliverFollowUp:
			default:
				return usageErr(fmt.Errorf("send: --delivery %q: want queue, steer or follow_up", delivery))
			}
			c, err := f.client(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			ctx, cancel := withTimeout(cmd.Context(), timeout)
			defer cancel()
			bound := requestTimeout
			if timeout > 0 && timeout < bound {
				bound = timeout
			}
			pctx, pcancel := context.WithTimeout(ctx, bound)
			acc, err := c.Send(pctx, args[0], client.NewMessage{Text: args[1], Sender: sender, Delivery: delivery})
			pcancel()
			if err != nil {
				return timedOut(pctx, err, bound, "sending")
			}
			if !follow {
				if f.json {
					return printJSON(cmd.OutOrStdout(), acc)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s %d\n", acc.ID, acc.Seq)
				return nil
			}
			fw := &follower{c: c, room: args[0], acc: acc, json: f.json, stdout: cmd.OutOrStdout(), stderr: cmd.ErrOrStderr()}
			end, err := fw.run(ctx)
			if err != nil {
				return timedOut(ctx, err, timeout, "waiting for message "+acc.ID)
			}
			return outcomeErr(end)
		},
	}
	f.add(cmd)
	fl := cmd.Flags()
	fl.BoolVar(&follow, "follow", false, "wait for the message's end, streaming its turn's answer")
	fl.StringVar(&sender, "sender", os.Getenv("USER"), "who sends it")
	fl.StringVar(&delivery, "delivery", client.DeliverQueue, "queue, steer or follow_up")
	fl.DurationVar(&timeout, "timeout", 0, "give up after this long (exit 3; default: no bound)")
	return cmd
}

// outcomeErr is the exit of a followed message's end.
func outcomeErr(end client.MessageEnded) error {
	switch end.Outcome {
	case client.OutcomeSettled, client.OutcomeAnswered:
		return nil
	case client.OutcomeTimedOut:
		return &exitError{3, fmt.Errorf("message %s timed out: %s", end.MessageID, end.Reason)}
	default:
		return &exitError{1, fmt.Errorf("message %s %s: %s", end.MessageID, end.Outcome, end.Reason)}
	}
}

// follower follows one accepted message to its message.ended, telling
// what happens on stderr and streaming its turn's answer to stdout.
type follower struct {
	c      *client.Client
	room   string
	acc    client.Accepted
	json   bool
	stdout io.Writer
	stderr io.Writer

	turn      string          // the turn running the message
	approvals map[string]bool // approvals asked in that turn
	questions map[string]bool
	streamed  bool // text deltas were printed
	final     string
}

func (fw *follower) run(ctx context.Context) (client.MessageEnded, error) {
	fw.approvals, fw.questions = map[string]bool{}, map[string]bool{}
	for ev, err := range fw.c.FollowAt(ctx, fw.room, fw.acc.Incarnation, fw.acc.Seq-1) {
		if err != nil {
			return client.MessageEnded{}, err
		}
		if fw.json {
			fmt.Fprintln(fw.stdout, string(ev.Data))
		}
		if ev.Type == client.TypeReset {
			return client.MessageEnded{}, fmt.Errorf("%w: message %s went with it", client.ErrReset, fw.acc.ID)
		}
		end, done, err := fw.event(ev)
		if err != nil {
			return client.MessageEnded{}, fmt.Errorf("event %d (%s): %w", ev.Seq, ev.Type, err)
		}
		if done {
			if !fw.json {
				if !fw.streamed && fw.final != "" {
					fmt.Fprint(fw.stdout, fw.final)
				}
				if fw.streamed || fw.final != "" {
					fmt.Fprintln(fw.stdout)
				}
			}
			return end, nil
		}
	}
	return client.MessageEnded{}, ctx.Err()
}

// event handles one event; done with the message's end.
func (fw *follower) event(ev client.Event) (end client.MessageEnded, done bool, err error) {
	p, err := ev.Payload()
	if errors.Is(err, event.ErrUnknownType) {
		return end, false, nil // a newer server's: nothing to say of it
	}
	if err != nil {
		return end, false, err
	}
	mine := func(messageID string) bool { return messageID == fw.acc.ID }
	mineTurn := func(turnID string) bool { return fw.turn != "" && turnID == fw.turn }
	say := func(format string, a ...any) {
		if !fw.json {
			fmt.Fprintf(fw.stderr, format+"\n", a...)
		}
	}
	switch d := p.(type) {
	case event.MessageQueued:
		if mine(d.MessageID) {
			say("queued")
		}
	case event.TurnWaiting:
		if mine(d.MessageID) {
			say("waiting for an agent slot (%d of %d in use)", d.Resident, d.Slots)
		}
	case event.TurnStarted:
		if mine(d.MessageID) {
			fw.turn = d.TurnID
			say("turn started")
		}
	case event.MessageDelivered:
		if mine(d.MessageID) {
			fw.turn = d.TurnID
			say("delivered into the running turn")
		}
	case event.AgentStarted:
		if fw.turn != "" {
			say("agent started")
		}
	case event.TextDelta:
		if mineTurn(d.TurnID) && !fw.json {
			fmt.Fprint(fw.stdout, d.Text)
			fw.streamed = true
		}
	case event.ToolStarted:
		// "called", not "started": omp reports a tool before asking for
		// its approval, and the approval event names no call, so whether
		// this call waits on a person is not known yet.
		if mineTurn(d.TurnID) {
			say("tool %s called", d.Tool)
		}
	case event.ToolEnded:
		if mineTurn(d.TurnID) {
			if d.IsError {
				say("tool %s ended with an error", d.Tool)
			} else {
				say("tool %s ended", d.Tool)
			}
		}
	case event.ApprovalRequested:
		if mineTurn(d.TurnID) {
			fw.approvals[d.ApprovalID] = true
			say("approval %s requested for %s: agenthost approve %s %s allow|deny", d.ApprovalID, d.Tool, fw.room, d.ApprovalID)
		}
	case event.ApprovalResolved:
		if fw.approvals[d.ApprovalID] {
			switch {
			case d.By == "deadline":
				say("approval %s denied: nobody decided before its deadline", d.ApprovalID)
			case d.Decision == client.DecisionAllow:
				say("approval %s allowed (by %s)", d.ApprovalID, d.By)
			default:
				say("approval %s denied (by %s)", d.ApprovalID, d.By)
			}
		}
	case event.QuestionAsked:
		if mineTurn(d.TurnID) {
			fw.questions[d.QuestionID] = true
			opts := ""
			if len(d.Options) > 0 {
				opts = " [" + strings.Join(d.Options, " | ") + "]"
			}
			say("question %s: %s%s (agenthost answer %s %s TEXT)", d.QuestionID, d.Title, opts, fw.room, d.QuestionID)
		}
	case event.QuestionAnswered:
		if fw.questions[d.QuestionID] {
			if d.Cancelled {
				say("question %s ended unanswered (by %s)", d.QuestionID, d.By)
			} else {
				say("question %s answered: %s", d.QuestionID, d.Answer)
			}
		}
	case event.TurnEnded:
		if mineTurn(d.TurnID) {
			fw.final = d.Text
		}
	case event.MessageEnded:
		if mine(d.MessageID) {
			if d.Outcome == client.OutcomeAnswered {
				say("answered a pending question")
			}
			return d, true, nil
		}
	}
	return end, false, nil
}

func newEventsCmd() *cobra.Command {
	var f clientFlags
	var after int64
	var follow bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "events ROOM [--after N] [--follow]",
		Short: "Print a room's events as JSON lines",
		Long: `Print a room's events after --after as JSON lines (the only format; --json
is accepted for uniformity). With --follow it goes on printing new events; a
dropped connection (a server restart) is resumed with backoff and
Last-Event-ID, said on stderr, for as long as --timeout allows (default: no
bound; Ctrl-C stops, exit 130). A room deleted (purged) and created again
under its id starts its events at 1 again: the stream then prints a reset
line ({"seq":0,"type":"reset",...}, also said on stderr) and the new room's
events from its first; while the id names no room, --follow waits for one.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if after < 0 {
				return usageErr(fmt.Errorf("events: --after %d: want 0 or more", after))
			}
			c, err := f.client(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			ctx, cancel := withTimeout(cmd.Context(), timeout)
			defer cancel()
			evs := c.Events
			if follow {
				evs = c.Follow
			}
			w := cmd.OutOrStdout()
			for ev, err := range evs(ctx, args[0], after) {
				if err != nil {
					return timedOut(ctx, err, timeout, "following room "+args[0])
				}
				if _, err := fmt.Fprintln(w, string(ev.Data)); err != nil {
					return err
				}
				if ev.Type == client.TypeReset {
					var r client.Reset
					_ = ev.Decode(&r)
					fmt.Fprintf(cmd.ErrOrStderr(), "agenthost: room %s's events start again: %s\n", args[0], r.Reason)
				}
			}
			return nil
		},
	}
	f.add(cmd)
	cmd.Flags().Int64Var(&after, "after", 0, "start after this sequence number")
	cmd.Flags().BoolVar(&follow, "follow", false, "keep following new events")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "give up after this long (exit 3; default: no bound)")
	return cmd
}

// oneShot runs a client command's one request, bounded by
// requestTimeout, and prints its answer: as JSON with --json, else by text.
func oneShot[T any](cmd *cobra.Command, f *clientFlags, call func(context.Context, *client.Client) (T, error), text func(io.Writer, T) error) error {
	c, err := f.client(cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), requestTimeout)
	defer cancel()
	v, err := call(ctx, c)
	if err != nil {
		return timedOut(ctx, err, requestTimeout, "waiting for the server's answer")
	}
	if f.json {
		return printJSON(cmd.OutOrStdout(), v)
	}
	return text(cmd.OutOrStdout(), v)
}

func newApproveCmd() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{
		Use:   "approve ROOM APPROVAL_ID allow|deny",
		Short: "Decide a pending approval",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[2] != client.DecisionAllow && args[2] != client.DecisionDeny {
				return usageErr(fmt.Errorf("approve: decision %q: want allow or deny", args[2]))
			}
			return oneShot(cmd, &f, func(ctx context.Context, c *client.Client) (client.Decision, error) {
				return c.Approve(ctx, args[0], args[1], args[2] == client.DecisionAllow)
			}, func(w io.Writer, d client.Decision) error {
				verb := "allowed"
				if d.Decision == client.DecisionDeny {
					verb = "denied"
				}
				_, err := fmt.Fprintf(w, "approval %s in room %s: %s\n", d.ID, args[0], verb)
				return err
			})
		},
	}
	f.add(cmd)
	return cmd
}

func newAnswerCmd() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{
		Use:   "answer ROOM QUESTION_ID TEXT",
		Short: "Answer a pending question",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			return oneShot(cmd, &f, func(ctx context.Context, c *client.Client) (client.Answered, error) {
				return c.Answer(ctx, args[0], args[1], args[2])
			}, func(w io.Writer, a client.Answered) error {
				_, err := fmt.Fprintf(w, "question %s in room %s: answered %q\n", a.ID, args[0], a.Answer)
				return err
			})
		},
	}
	f.add(cmd)
	return cmd
}

func newCancelCmd() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{
		Use:   "cancel ROOM",
		Short: "Cancel a room's running turn",
		Long: `Cancel the room's running turn: it ends cancelled, and its pending approvals
are denied. Exits 1 when no turn runs.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return oneShot(cmd, &f, func(ctx context.Context, c *client.Client) (client.Cancelled, error) {
				return c.Cancel(ctx, args[0])
			}, func(w io.Writer, r client.Cancelled) error {
				_, err := fmt.Fprintf(w, "room %s: cancelling turn %s\n", args[0], r.TurnID)
				return err
			})
		},
	}
	f.add(cmd)
	return cmd
}

func newReleaseCmd() *cobra.Command {
	var f clientFlags
	var purge bool
	cmd := &cobra.Command{
		Use:   "release ROOM [--purge]",
		Short: "Release a room's agent (the room and its history stay; --purge deletes the room)",
		Long: `Release the room's agent process and print its custody receipt's summary
(--json: the server's answer, the receipt included). The room, its session
and its history stay: the next message starts the agent again. Exits 1 while
a turn runs (cancel it first).

--purge deletes the room for good: its agent, session files, agent home,
workspace, snapshots, event log and settings. The id may then name a new
room. Exits 1 while a turn runs or messages wait.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if purge {
				return oneShot(cmd, &f, func(ctx context.Context, c *client.Client) (client.Purged, error) {
					return c.Purge(ctx, args[0])
				}, func(w io.Writer, p client.Purged) error {
					_, err := fmt.Fprintf(w, "room %s: deleted for good (agent released: %v; receipt: %d process(es))\n", args[0], p.Released, receiptProcs(p.Receipt))
					return err
				})
			}
			return oneShot(cmd, &f, func(ctx context.Context, c *client.Client) (client.Released, error) {
				return c.Release(ctx, args[0])
			}, func(w io.Writer, r client.Released) error {
				if !r.Released {
					_, err := fmt.Fprintf(w, "room %s: no agent was running\n", args[0])
					return err
				}
				fmt.Fprintf(w, "room %s: agent released (%s); receipt: %d process(es)\n", args[0], r.Reason, receiptProcs(r.Receipt))
				if r.Error != "" {
					return &exitError{1, fmt.Errorf("releasing room %s's agent: %s", args[0], r.Error)}
				}
				return nil
			})
		},
	}
	f.add(cmd)
	cmd.Flags().BoolVar(&purge, "purge", false, "delete the room for good")
	return cmd
}

// receiptProcs counts the processes of a receipt (0 for none).
func receiptProcs(r *custody.Receipt) int {
	if r == nil {
		return 0
	}
	return len(r.Processes) + r.More
}
