package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// Client commands talk to a running `agenthost serve`.

type clientFlags struct {
	server, data string
}

func (f *clientFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.server, "server", "", "the server's address (default: AGENTHOST_URL, else http://"+defaultListen+")")
	cmd.Flags().StringVar(&f.data, "data", "", "the server's data dir, for its token (default: the per-user dir)")
}

type client struct {
	base  string // ends with "/"
	token string
	hc    *http.Client
}

func (f *clientFlags) client() (*client, error) {
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
	// The page's address may carry the token in its fragment.
	base, frag, _ := strings.Cut(base, "#")
	base = strings.TrimSuffix(base, "/") + "/"
	tok := strings.TrimSpace(os.Getenv(tokenEnv))
	if t, ok := strings.CutPrefix(frag, "token="); ok && tok == "" {
		tok = t
	}
	if tok == "" {
		data := f.data
		if data == "" {
			data = os.Getenv("AGENTHOST_DATA")
		}
		if data == "" {
			var err error
			if data, err = defaultDataDir(); err != nil {
				return nil, &exitError{2, err}
			}
		}
		b, err := os.ReadFile(filepath.Join(data, tokenFile))
		if err != nil {
			return nil, &exitError{2, fmt.Errorf("no token: set %s or give the server's --data (%w)", tokenEnv, err)}
		}
		tok = strings.TrimSpace(string(b))
	}
	return &client{base: base, token: tok, hc: &http.Client{}}, nil
}

// apiError is an error answer of the server.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return fmt.Sprintf("server: %d %s", e.status, e.msg) }

// do sends a JSON request and decodes a JSON answer into out.
func (c *client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return &exitError{2, err}
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("no answer from a server at %s (is agenthost serve running? --server or AGENTHOST_URL name it): %w", c.base, errors.Unwrap(err))
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return err
	}
	if res.StatusCode/100 != 2 {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(raw, &e) != nil || e.Error == "" {
			e.Error = http.StatusText(res.StatusCode)
		}
		return &apiError{res.StatusCode, e.Error}
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// events reads the room's events after after and calls fn with each
// (its type, its JSON); fn returns true to stop. Following, it resumes
// after a dropped stream (the server cuts clients that fall behind) from
// the last id it saw.
func (c *client) events(ctx context.Context, room string, after int64, follow bool, fn func(typ string, data []byte) (bool, error)) error {
	q := "?follow=0"
	if follow {
		q = ""
	}
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, "GET", c.base+"v1/rooms/"+url.PathEscape(room)+"/events"+q, nil)
		if err != nil {
			return &exitError{2, err}
		}
		req.Header.Set("Authorization", "Bearer "+c.token)
		req.Header.Set("Last-Event-ID", strconv.FormatInt(after, 10))
		res, err := c.hc.Do(req)
		if err != nil {
			if ctx.Err() != nil || attempt >= 5 {
				return err
			}
		} else if res.StatusCode != http.StatusOK {
			raw, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
			res.Body.Close()
			var e struct {
				Error string `json:"error"`
			}
			_ = json.Unmarshal(raw, &e)
			return &apiError{res.StatusCode, e.Error}
		} else {
			stop, err := readSSE(res.Body, func(id int64, typ string, data []byte) (bool, error) {
				after = id
				attempt = 0
				return fn(typ, data)
			})
			res.Body.Close()
			if stop || err != nil && !isStreamEnd(err) {
				return err
			}
			if !follow {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
		}
	}
}

func isStreamEnd(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// readSSE parses an event stream; an event is dispatched at its blank
// line, so a torn last event is dropped (and read again on resume).
func readSSE(r io.Reader, fn func(id int64, typ string, data []byte) (bool, error)) (bool, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	var id int64
	var typ string
	var data []byte
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if data != nil {
				stop, err := fn(id, typ, data)
				if stop || err != nil {
					return stop, err
				}
			}
			typ, data = "", nil
		case strings.HasPrefix(line, "id: "):
			n, err := strconv.ParseInt(line[4:], 10, 64)
			if err != nil {
				return false, fmt.Errorf("stream: bad id %q", line[4:])
			}
			id = n
		case strings.HasPrefix(line, "event: "):
			typ = line[7:]
		case strings.HasPrefix(line, "data: "):
			data = append(data, line[6:]...)
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	return false, io.EOF
}

func newRoomsCmd() *cobra.Command {
	var f clientFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "rooms",
		Short: "List the rooms of a running server",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			var out struct {
				Rooms []json.RawMessage `json:"rooms"`
			}
			if err := c.do(cmd.Context(), "GET", "v1/rooms", nil, &out); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			for _, raw := range out.Rooms {
				if asJSON {
					fmt.Fprintln(w, string(raw))
					continue
				}
				var r struct {
					ID        string               `json:"id"`
					Resident  bool                 `json:"resident"`
					Queued    int                  `json:"queued"`
					LastSeq   int64                `json:"last_seq"`
					Turn      *struct{ ID string } `json:"turn"`
					Approvals []json.RawMessage    `json:"approvals"`
					Questions []json.RawMessage    `json:"questions"`
				}
				_ = json.Unmarshal(raw, &r)
				state := "idle"
				if r.Turn != nil {
					state = "working"
				}
				if !r.Resident && r.Turn == nil {
					state = "released"
				}
				fmt.Fprintf(w, "%-24s %-8s queued %d  approvals %d  questions %d  events %d\n",
					r.ID, state, r.Queued, len(r.Approvals), len(r.Questions), r.LastSeq)
			}
			return nil
		},
	}
	f.add(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per room")
	return cmd
}

func newSendCmd() *cobra.Command {
	var f clientFlags
	var follow bool
	var sender, delivery string
	cmd := &cobra.Command{
		Use:   "send ROOM MESSAGE [--follow]",
		Short: "Send a message to a room of a running server",
		Long: `Send a message to a room. Without --follow it prints the accepted message's
id and sequence number as JSON. With --follow it shows progress on stderr while
it waits, streams the answer to stdout, and exits 0 only if the turn settled
(1 failed or cancelled, 3 timed out).`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			var acc struct {
				ID  string `json:"id"`
				Seq int64  `json:"seq"`
			}
			body := map[string]string{"text": args[1], "sender": sender, "delivery": delivery}
			if err := c.do(cmd.Context(), "POST", "v1/rooms/"+url.PathEscape(args[0])+"/messages", body, &acc); err != nil {
				return err
			}
			if !follow {
				b, _ := json.Marshal(acc)
				fmt.Fprintln(cmd.OutOrStdout(), string(b))
				return nil
			}
			return followTurn(cmd.Context(), c, cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0], acc.ID, acc.Seq)
		},
	}
	f.add(cmd)
	cmd.Flags().BoolVar(&follow, "follow", false, "wait for the turn, streaming its answer")
	cmd.Flags().StringVar(&sender, "sender", os.Getenv("USER"), "who sends it")
	cmd.Flags().StringVar(&delivery, "delivery", "queue", "queue, steer or follow_up")
	return cmd
}

// followTurn streams the turn of message id and judges its outcome.
func followTurn(ctx context.Context, c *client, stdout, stderr io.Writer, room, id string, seq int64) error {
	var turn, outcome, reason, final string
	streamed := false
	err := c.events(ctx, room, seq-1, true, func(typ string, data []byte) (bool, error) {
		var d map[string]any
		_ = json.Unmarshal(data, &d)
		str := func(k string) string { s, _ := d[k].(string); return s }
		mine := turn != "" && str("turn_id") == turn
		switch typ {
		case "message.queued":
			if str("message_id") == id {
				fmt.Fprintln(stderr, "queued")
			}
		case "turn.started":
			if str("message_id") == id {
				turn = str("turn_id")
				fmt.Fprintln(stderr, "turn started")
			}
		case "message.delivered":
			if str("message_id") == id {
				turn = str("turn_id")
				fmt.Fprintln(stderr, "delivered into the running turn")
			}
		case "agent.started":
			fmt.Fprintln(stderr, "agent started")
		case "text.delta":
			if mine {
				fmt.Fprint(stdout, str("text"))
				streamed = true
			}
		case "tool.started":
			if mine {
				fmt.Fprintf(stderr, "tool %s started\n", str("tool"))
			}
		case "tool.ended":
			if mine {
				fmt.Fprintf(stderr, "tool %s ended\n", str("tool"))
			}
		case "approval.requested":
			if mine {
				fmt.Fprintf(stderr, "approval %s requested for %s: agenthost approve %s %s allow|deny\n",
					str("approval_id"), str("tool"), room, str("approval_id"))
			}
		case "question.asked":
			if mine {
				fmt.Fprintf(stderr, "question %s: %s (agenthost answer %s %s TEXT)\n", str("question_id"), str("title"), room, str("question_id"))
			}
		case "turn.ended":
			if str("turn_id") == turn && turn != "" || str("message_id") == id {
				outcome, reason, final = str("outcome"), str("reason"), str("text")
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return err
	}
	if !streamed && final != "" {
		fmt.Fprint(stdout, final)
	}
	if streamed || final != "" {
		fmt.Fprintln(stdout)
	}
	switch outcome {
	case "settled":
		return nil
	case "timed_out":
		return &exitError{3, fmt.Errorf("turn timed out: %s", reason)}
	default:
		return &exitError{1, fmt.Errorf("turn %s: %s", outcome, reason)}
	}
}

func newEventsCmd() *cobra.Command {
	var f clientFlags
	var after int64
	var follow bool
	cmd := &cobra.Command{
		Use:   "events ROOM [--after N] [--follow]",
		Short: "Print a room's events as JSON lines",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			return c.events(cmd.Context(), args[0], after, follow, func(_ string, data []byte) (bool, error) {
				_, err := fmt.Fprintln(w, string(data))
				return false, err
			})
		},
	}
	f.add(cmd)
	cmd.Flags().Int64Var(&after, "after", 0, "start after this sequence number")
	cmd.Flags().BoolVar(&follow, "follow", false, "keep following new events")
	return cmd
}

func newApproveCmd() *cobra.Command {
	var f clientFlags
	cmd := &cobra.Command{
		Use:   "approve ROOM APPROVAL_ID allow|deny",
		Short: "Decide a pending approval",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[2] != "allow" && args[2] != "deny" {
				return &exitError{2, fmt.Errorf("approve: decision %q: want allow or deny", args[2])}
			}
			c, err := f.client()
			if err != nil {
				return err
			}
			return c.do(cmd.Context(), "POST", "v1/rooms/"+url.PathEscape(args[0])+"/approvals/"+url.PathEscape(args[1]),
				map[string]string{"decision": args[2]}, nil)
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
			c, err := f.client()
			if err != nil {
				return err
			}
			return c.do(cmd.Context(), "POST", "v1/rooms/"+url.PathEscape(args[0])+"/questions/"+url.PathEscape(args[1]),
				map[string]string{"answer": args[2]}, nil)
		},
	}
	f.add(cmd)
	return cmd
}
