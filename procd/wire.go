package procd

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/agenthost/agenthost/custody"
)

// Protocol versions. They follow the reference's numbering (protocol 8:
// create_pty/create_pipe, get, wait, signal, set_metadata); protocol 9
// adds the negotiation of a version between client and daemon (see
// Range), and is protocol 8 otherwise; protocol 10 adds limits to
// create_pipe and create_pty (a process's custody limits: memory, pids,
// CPU) and the usage request (what a process's scope used).
const (
	// Protocol is the newest version this build speaks.
	Protocol = 10
	// limitsProtocol is the first version with limits and usage.
	limitsProtocol = 10
	// MinProtocol is the oldest version this build speaks: a daemon of
	// an older build that speaks it keeps its processes across a planned
	// restart into this one, and a client of such a build can use a
	// daemon of this one.
	MinProtocol = 8
	// preNegotiation is the last protocol without negotiation: what a
	// request that names no version speaks.
	preNegotiation = 8
)

// Range is an inclusive range of protocol versions: those a client or a
// daemon speaks. A client speaks the newest version in both its own range
// and the daemon's; the daemon is the one that keeps running across a
// planned restart, so the new client adapts to it, whichever is newer.
type Range struct {
	Min int `json:"min"`
	Max int `json:"max"`
}

// Versions is the range this build speaks.
func Versions() Range { return Range{MinProtocol, Protocol} }

func (r Range) String() string {
	if r.Min == r.Max {
		return fmt.Sprint(r.Min)
	}
	return fmt.Sprintf("%d-%d", r.Min, r.Max)
}

func (r Range) contains(v int) bool { return r.Min <= v && v <= r.Max }

// common is the newest version in both r and o (false: none).
func (r Range) common(o Range) (int, bool) {
	v := min(r.Max, o.Max)
	return v, v >= max(r.Min, o.Min)
}

// VersionError reports a client and a daemon that speak no protocol
// version in common (a daemon of a much older or newer build); it matches
// ErrProtocol. Own leaves such a daemon and its processes alone: the build
// it came with can still claim, use or shut it down.
type VersionError struct {
	// Client and Daemon are the ranges each speaks.
	Client, Daemon Range
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("procd: the daemon speaks protocol %s and this client %s: no version in common (use the agenthost that started the daemon, or shut it down with it)", e.Daemon, e.Client)
}

// Is makes errors.Is(err, ErrProtocol) true.
func (e *VersionError) Is(target error) bool { return target == ErrProtocol }

const (
	// MaxFrame caps one frame's payload, both ways (the reference's cap).
	MaxFrame = 8 << 20
	// MaxMetadata caps a process's opaque metadata.
	MaxMetadata = 1 << 20
	// ReplayLimit is how much pty output each terminal keeps for replay.
	ReplayLimit = 2 << 20
	// HandoffTTL bounds how long a handoff ticket is valid.
	HandoffTTL = 120 * time.Second
	// maxWrite caps one write request's data, well under MaxFrame once
	// base64-encoded.
	maxWrite = 1 << 20
)

// Mode is how a process's stdio is connected.
type Mode string

const (
	ModePipe Mode = "pipe" // stdin from write, stdout (and stderr) to a file
	ModePTY  Mode = "pty"  // a pseudo-terminal with a replay buffer
)

// Signal names a signal that may be sent to a process's group.
type Signal string

const (
	SigTerm Signal = "TERM"
	SigInt  Signal = "INT"
	SigKill Signal = "KILL"
)

// ProcessInfo describes one process the daemon holds.
type ProcessInfo struct {
	ID        string          `json:"id"`
	Mode      Mode            `json:"mode"`
	Argv      []string        `json:"argv"`
	Cwd       string          `json:"cwd"`
	PID       int             `json:"pid"`
	Running   bool            `json:"running"`
	StartedAt time.Time       `json:"started_at"`
	ExitedAt  *time.Time      `json:"exited_at,omitempty"`
	Exit      *Exit           `json:"exit,omitempty"`
	Metadata  json.RawMessage `json:"metadata,omitempty"`
	// Watchers counts the open waits and subscriptions on it: a process
	// with any is attended.
	Watchers int       `json:"watchers"`
	PTY      *PTYInfo  `json:"pty,omitempty"`
	Pipe     *PipeInfo `json:"pipe,omitempty"`
	// Limits are the limits the process's scope was started with
	// (protocol 10; absent: none).
	Limits *custody.Limits `json:"limits,omitempty"`
}

// PTYInfo is the pty group of a ProcessInfo.
type PTYInfo struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
	// Offset is the absolute offset of the end of the output so far.
	Offset int64 `json:"offset"`
	// Controller says whether a subscriber controls the terminal.
	Controller bool `json:"controller"`
}

// PipeInfo is the pipe group of a ProcessInfo.
type PipeInfo struct {
	OutputPath string `json:"output_path"`
	// StderrPath is where stderr goes; "" means into OutputPath too.
	StderrPath string `json:"stderr_path,omitempty"`
	// OutputBytes and OutputLines count what reached the output file.
	OutputBytes int64  `json:"output_bytes"`
	OutputLines int64  `json:"output_lines"`
	OutputError string `json:"output_error,omitempty"`
	// OutputTrimmed is how much of the output file's start was released
	// (trim): those offsets read as zeros; the file keeps its size.
	OutputTrimmed int64 `json:"output_trimmed,omitempty"`
}

// Exit is how a process ended. It is published only after its output is
// complete (the pipe file closed, the pty at EOF or given up on).
type Exit struct {
	ID string `json:"id"`
	// Code is the exit status, or 128+signal for a process killed by one.
	Code int `json:"exit_code"`
	// Signal names the signal that killed it, if one did.
	Signal      string    `json:"signal,omitempty"`
	ExitedAt    time.Time `json:"exited_at"`
	OutputLines int64     `json:"output_lines,omitempty"`
	OutputError string    `json:"output_error,omitempty"`
	// FinalOffset is the output's end: bytes in the pipe file, or the pty's
	// absolute offset.
	FinalOffset int64 `json:"final_offset"`
}

// PipeSpec is a create_pipe request.
type PipeSpec struct {
	Argv []string `json:"argv"`
	// Cwd must be absolute.
	Cwd string `json:"cwd"`
	// Env is the child's exact environment (custody adds only its scope
	// marker, AGENTHOST_SCOPE).
	Env []string `json:"env"`
	// OutputPath (absolute) is created or truncated (0600), never through
	// a symlink; stdout goes there, and stderr too unless StderrPath is set.
	OutputPath string `json:"output_path"`
	// StderrPath (absolute), if set, gets stderr alone, opened the same way.
	StderrPath string          `json:"stderr_path,omitempty"`
	Metadata   json.RawMessage `json:"metadata,omitempty"`
	// Limits bound the process and everything it starts where the
	// daemon's custodian can (protocol 10; Client.CreatePipe leaves them
	// out for an older daemon, and ProcessInfo.Limits then says none).
	Limits *custody.Limits `json:"limits,omitempty"`
}

// PTYSpec is a create_pty request.
type PTYSpec struct {
	Argv     []string        `json:"argv"`
	Cwd      string          `json:"cwd"`
	Env      []string        `json:"env"`
	Cols     uint16          `json:"cols"`
	Rows     uint16          `json:"rows"`
	Metadata json.RawMessage `json:"metadata,omitempty"`
	// Limits as PipeSpec's.
	Limits *custody.Limits `json:"limits,omitempty"`
}

// Ticket is a prepared handoff.
type Ticket struct {
	InstanceID string    `json:"instance_id"`
	Ticket     string    `json:"ticket"`
	ExpiresAt  time.Time `json:"expires_at"`
}

// Reply is one frame from the daemon: a reply or an event.
type Reply struct {
	Type    string `json:"type"`
	Message string `json:"message,omitempty"` // "error"
	Code    string `json:"code,omitempty"`    // "error": what kind
	// Protocol and Protocols answer ping: the oldest version the daemon
	// speaks (all a client before negotiation reads, and demands
	// exactly), and the whole range (absent from a protocol 8 daemon:
	// Protocol alone).
	Protocol   int           `json:"protocol,omitempty"`
	Protocols  *Range        `json:"protocols,omitempty"`
	InstanceID string        `json:"instance_id,omitempty"`
	Process    *ProcessInfo  `json:"process,omitempty"`
	Processes  []ProcessInfo `json:"processes,omitempty"`
	// Next, on a list reply, says more processes follow: list again with
	// "after" set to it (a page stays under a frame whatever the metadata).
	Next     string            `json:"next,omitempty"`
	Exit     *Exit             `json:"exit,omitempty"`
	Receipt  *custody.Receipt  `json:"receipt,omitempty"`
	Receipts []custody.Receipt `json:"receipts,omitempty"`
	// Usage answers usage (protocol 10).
	Usage  *custody.Usage `json:"usage,omitempty"`
	Ticket *Ticket        `json:"ticket,omitempty"`
	// Subscriptions: "attached" carries the replay from Offset (Truncated
	// when older output was already dropped); "output" carries Data at
	// Offset; "resized" Cols and Rows; "controller_changed" Controller.
	Offset     int64  `json:"offset,omitempty"`
	Data       []byte `json:"data,omitempty"`
	Truncated  bool   `json:"truncated,omitempty"`
	Cols       uint16 `json:"cols,omitempty"`
	Rows       uint16 `json:"rows,omitempty"`
	Controller bool   `json:"controller,omitempty"`
}

// Reply and event types.
const (
	TypeError             = "error"
	TypeOK                = "ok"
	TypePong              = "pong"
	TypeProcess           = "process"
	TypeProcesses         = "processes"
	TypeExited            = "exited"
	TypeTerminated        = "terminated"
	TypeOwned             = "owned"
	TypeHandoff           = "handoff"
	TypeShutdown          = "shutdown"
	TypeAttached          = "attached"
	TypeOutput            = "output"
	TypeResized           = "resized"
	TypeControllerChanged = "controller_changed"
	TypeDropped           = "dropped"
	TypeUsage             = "usage"
)

// Error codes in an "error" reply, each mapped to a sentinel by the client.
const (
	codeUnsupported = "unsupported"
	codeInvalid     = "invalid"
	codeNotFound    = "not_found"
	codeTerminated  = "terminated"
	codeForbidden   = "forbidden"
	codeOwned       = "owned"
	codeHandoff     = "handoff"
	codeShutdown    = "shutting_down"
	codeFailed      = "failed"
	// codeProtocol: the request names a protocol version the daemon does
	// not speak (a client before protocol 9 reads it as a failure).
	codeProtocol = "protocol"
)

var (
	// ErrUnsupported: the daemon does not know the request.
	ErrUnsupported = errors.New("procd: unsupported request")
	// ErrInvalid: a request field was missing or wrong.
	ErrInvalid = errors.New("procd: invalid request")
	// ErrNotFound: no process has that id (never created, or terminated).
	ErrNotFound = errors.New("procd: no such process")
	// ErrTerminated: the process was terminated before it could be waited
	// on to its exit.
	ErrTerminated = errors.New("procd: terminated")
	// ErrForbidden: the token was missing or wrong, the peer another user,
	// or the request needs the owner (or the pty's controller).
	ErrForbidden = errors.New("procd: forbidden")
	// ErrOwned: the daemon already has an owner.
	ErrOwned = errors.New("procd: daemon already owned")
	// ErrHandoff: a handoff ticket was refused (wrong, spent or expired).
	ErrHandoff = errors.New("procd: handoff refused")
	// ErrShuttingDown: the daemon is shutting down.
	ErrShuttingDown = errors.New("procd: daemon shutting down")
	// ErrProtocol: the daemon speaks another protocol or broke framing.
	ErrProtocol = errors.New("procd: protocol error")
	// ErrNoDaemon: no daemon answers for the data dir.
	ErrNoDaemon = errors.New("procd: no daemon running")
	// ErrFailed: the daemon could not do what was asked (an error the other
	// sentinels do not name; the message says what).
	ErrFailed = errors.New("procd: request failed")
	// ErrClosed: the client was closed.
	ErrClosed = errors.New("procd: client closed")
)

var codeErrs = map[string]error{
	codeUnsupported: ErrUnsupported, codeInvalid: ErrInvalid, codeNotFound: ErrNotFound,
	codeTerminated: ErrTerminated, codeForbidden: ErrForbidden, codeOwned: ErrOwned,
	codeHandoff: ErrHandoff, codeShutdown: ErrShuttingDown, codeFailed: ErrFailed,
	codeProtocol: ErrProtocol,
}

// ReplyError is an "error" reply; it unwraps to the sentinel its code names.
type ReplyError struct {
	Code    string
	Message string
}

func (e *ReplyError) Error() string { return "procd: " + e.Message }
func (e *ReplyError) Unwrap() error {
	if err, ok := codeErrs[e.Code]; ok {
		return err
	}
	return ErrFailed
}

// envelope is what a client sends. Protocol is the version the client
// speaks (0: preNegotiation; ping, which negotiates, is answered whatever
// it says).
type envelope struct {
	Token    string          `json:"token"`
	Protocol int             `json:"protocol,omitempty"`
	Request  json.RawMessage `json:"request"`
}

// writeFrame writes one frame; the caller serialises writers.
func writeFrame(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > MaxFrame {
		return fmt.Errorf("%w: frame of %d bytes over %d", ErrProtocol, len(b), MaxFrame)
	}
	buf := make([]byte, 4+len(b))
	binary.BigEndian.PutUint32(buf, uint32(len(b)))
	copy(buf[4:], b)
	_, err = w.Write(buf)
	return err
}

// readFrame reads one frame's payload (at most MaxFrame bytes).
func readFrame(r io.Reader) ([]byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(h[:])
	if n > MaxFrame {
		return nil, fmt.Errorf("%w: frame of %d bytes over %d", ErrProtocol, n, MaxFrame)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return b, nil
}
