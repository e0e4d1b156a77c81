package rpc

import (
	"errors"
	"fmt"
	"strings"
)

var (
	// ErrClosed is returned by calls on a client that was closed.
	ErrClosed = errors.New("rpc: client closed")
	// ErrAgentExited reports that the agent's output ended (the process
	// exited or closed stdout) while a call or turn was waiting. See
	// ExitError. The same name and meaning as acp.ErrAgentExited.
	ErrAgentExited = errors.New("rpc: agent exited")
	// ErrProcessExited is ErrAgentExited, under its former name.
	//
	// Deprecated: use ErrAgentExited.
	ErrProcessExited = ErrAgentExited
	// ErrLineTooLong matches a *LineTooLongError.
	ErrLineTooLong = errors.New("rpc: line too long")
	// ErrProtocol matches every *ProtocolError.
	ErrProtocol = errors.New("rpc: protocol error")
	// ErrBacklogOverflow reports that events arrived faster than listeners
	// took them and the bounded backlog filled: the turn fails and the
	// transport is retired.
	ErrBacklogOverflow = errors.New("rpc: event backlog overflow")
	// ErrConcurrentWait is returned when a second caller waits on a turn
	// while another is already waiting.
	ErrConcurrentWait = errors.New("rpc: another caller is already waiting for the turn")
	// ErrNoTurn is returned by WaitTurn when no turn was started.
	ErrNoTurn = errors.New("rpc: no turn in progress")
	// ErrTurnInProgress is returned by Prompt when a turn is running and the
	// prompt is neither a steer nor a follow-up.
	ErrTurnInProgress = errors.New("rpc: a turn is already in progress")
	// ErrPromptFailed reports a prompt the agent refused, at once or after
	// acknowledging it.
	ErrPromptFailed = errors.New("rpc: prompt failed")
	// ErrNotStarted is returned by calls made before Start.
	ErrNotStarted = errors.New("rpc: client not started")
	// ErrDuplicateID is returned by RequestLine for a frame whose id is
	// that of a request still waiting for its response.
	ErrDuplicateID = errors.New("rpc: a request with this id is already pending")
	// ErrUnsupported is returned for a feature the agent did not offer.
	ErrUnsupported = errors.New("rpc: not supported by the agent")
)

// ResponseError is a response with success:false.
type ResponseError struct {
	Command string // the command the agent says it answered
	Message string // the agent's error text
	Code    string // the agent's error code, when given
	Late    bool   // a second response after the command was acknowledged
}

func (e *ResponseError) Error() string {
	var b strings.Builder
	b.WriteString("rpc: ")
	if e.Command != "" {
		b.WriteString(e.Command)
		b.WriteString(": ")
	}
	if e.Late {
		b.WriteString("failed after acknowledgement: ")
	}
	b.WriteString(e.Message)
	if e.Code != "" {
		fmt.Fprintf(&b, " (%s)", e.Code)
	}
	return b.String()
}

// ProtocolError reports a frame the client could not use: invalid JSON, an
// oversized line, a broken chunk sequence, an unmatched response. The frame's
// content is never included beyond a short, trimmed prefix in Frame.
type ProtocolError struct {
	Op    string // what was being done: "frame", "chunk", "response", ...
	Frame string // a trimmed prefix of the offending frame, for diagnosis
	Err   error
}

func (e *ProtocolError) Error() string {
	if e.Frame != "" {
		return fmt.Sprintf("rpc: protocol error (%s): %v: %q", e.Op, e.Err, e.Frame)
	}
	return fmt.Sprintf("rpc: protocol error (%s): %v", e.Op, e.Err)
}

func (e *ProtocolError) Unwrap() error { return e.Err }

// Is lets callers match with errors.Is(err, ErrProtocol).
func (e *ProtocolError) Is(target error) bool { return target == ErrProtocol }

// ExitError reports the end of the agent's process or stream; it matches
// ErrAgentExited (as acp.ExitError does). Stderr holds the tail of what
// the agent wrote there, for diagnosis.
type ExitError struct {
	// Status is the process's exit status, or the read error that ended
	// the stream (nil: exited 0, or no status within a short wait).
	Status error
	Stderr string // bounded tail of the agent's stderr
}

// Error names the line of Stderr that says why (see causeLine), not merely
// its last: a runtime's last words are often its banner or a stack frame.
func (e *ExitError) Error() string {
	msg := "rpc: agent exited"
	if e.Status != nil {
		msg += ": " + e.Status.Error()
	}
	if t := strings.TrimSpace(e.Stderr); t != "" {
		msg += " (stderr: " + trim(causeLine(t), 300) + ")"
	}
	return msg
}

// Unwrap returns the exit status.
func (e *ExitError) Unwrap() error { return e.Status }

// Is makes errors.Is(err, ErrAgentExited) true.
func (e *ExitError) Is(target error) bool { return target == ErrAgentExited }

func trim(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
