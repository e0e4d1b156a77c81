package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"syscall"

	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/rpc"
	sdk "github.com/coder/acp-go-sdk"
)

// Exit codes, the same for every command (README, "Exit codes").
const (
	exitOK          = 0
	exitFailed      = 1 // the operation failed: a failed turn, not found, the server refused
	exitUsage       = 2 // a flag, argument or command is wrong
	exitTimedOut    = 3 // a --timeout ran out
	exitInterrupted = 130
	exitTerminated  = 143 // SIGTERM
)

// exitError carries a process exit code out of a command; main is the only
// place that exits.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageErr makes err a usage error (exit 2).
func usageErr(err error) error { return &exitError{exitUsage, err} }

// interrupted is the cause of the command's context when a signal ended it.
type interrupted struct{ sig os.Signal }

func (i *interrupted) Error() string {
	if i.sig == syscall.SIGTERM {
		return "terminated"
	}
	return "interrupted"
}

// exitStatus is the exit code of a command's result and the line to say
// on stderr ("" for none). A signal that ended the command's context wins
// over what the command made of it: 130 (Ctrl-C) or 143 (SIGTERM).
func exitStatus(ctx context.Context, err error) (int, string) {
	if err == nil {
		return exitOK, ""
	}
	var in *interrupted
	if errors.As(context.Cause(ctx), &in) {
		if in.sig == syscall.SIGTERM {
			return exitTerminated, in.Error()
		}
		return exitInterrupted, in.Error()
	}
	err = clientErr(err)
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		return ee.code, errorLine(err)
	case errors.Is(err, context.DeadlineExceeded):
		return exitTimedOut, errorLine(err)
	}
	return exitFailed, errorLine(err)
}

// errorLine says what failed in one line: an agent's multi-line error and
// its interactive advice ("Use /login ...") are cut to their first line,
// the RPC and ACP clients' wrappings are not repeated, and a JSON-RPC
// error object is read rather than printed.
func errorLine(err error) string {
	msg := err.Error()
	var re *rpc.ResponseError
	if errors.As(err, &re) {
		clean := firstLine(re.Message)
		if re.Late {
			clean = "after accepting it: " + clean
		}
		if re.Code != "" {
			clean += " (" + re.Code + ")"
		}
		msg = strings.Replace(msg, re.Error(), clean, 1)
	}
	if errors.Is(err, rpc.ErrPromptFailed) {
		msg = strings.Replace(msg, rpc.ErrPromptFailed.Error()+": ", "the agent refused the prompt: ", 1)
	}
	var ae *sdk.RequestError
	if errors.As(err, &ae) {
		clean := ae.Message
		if d := requestErrorDetail(ae.Data); d != "" {
			clean += ": " + d
		}
		msg = strings.Replace(msg, ae.Error(), clean, 1)
	}
	// A room's reason is the agent path's error as text (send --follow).
	msg = strings.Replace(msg, "rpc: prompt failed: rpc: prompt: failed after acknowledgement: ", "the agent refused the prompt: ", 1)
	return withKeyHint(dedupe(firstLine(msg)))
}

// noKeyRE matches an agent's refusal for want of its provider's key (omp's
// and pi's words).
var noKeyRE = regexp.MustCompile(`No API key found for ([A-Za-z0-9._-]+?)\.?(\s|$)`)

// withKeyHint adds to an agent's refusal for want of a key the variable
// that gives it.
func withKeyHint(line string) string {
	m := noKeyRE.FindStringSubmatch(line)
	if m == nil {
		return line
	}
	keys := agents.ProviderKeys(m[1])
	if len(keys) == 0 {
		return line + " (set the provider's key variable where agenthost runs)"
	}
	return line + " (set " + keys[0] + " where agenthost runs; agents get their provider's key variables)"
}

// requestErrorDetail is the first line of a JSON-RPC error's data: its
// "details" or "message" field, or the data itself when it is a string.
func requestErrorDetail(data any) string {
	switch d := data.(type) {
	case string:
		return firstLine(d)
	case map[string]any:
		for _, k := range []string{"details", "message", "error"} {
			if s, ok := d[k].(string); ok && s != "" {
				return firstLine(s)
			}
		}
	}
	return ""
}

// firstLine is s's first non-blank line, trimmed, without a trailing colon.
func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			return strings.TrimSuffix(l, ":")
		}
	}
	return strings.TrimSpace(s)
}

// oneLine is firstLine, for messages that are not errors.
func oneLine(s string) string { return firstLine(s) }

// dedupe drops a "prefix: " that repeats the one just before it (a
// wrapped error that names the same operation again).
func dedupe(s string) string {
	parts := strings.Split(s, ": ")
	out := make([]string, 0, len(parts))
	for i, p := range parts {
		if i > 0 && p == parts[i-1] && i < len(parts)-1 {
			continue
		}
		out = append(out, p)
	}
	return strings.Join(out, ": ")
}

// printJSON writes v as one line of JSON.
func printJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
