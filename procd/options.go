package procd

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/agenthost/agenthost/custody"
)

// Defaults for Options.
const (
	DefaultUnattended = 10 * time.Minute
	DefaultIdleExit   = 5 * time.Second
	DefaultExitDrain  = 2 * time.Second
	// DefaultTerminate bounds one terminate (custody's Close of a tree).
	DefaultTerminate = 30 * time.Second
	// firstFrameTimeout bounds how long a new connection may take to send
	// its request.
	firstFrameTimeout = 10 * time.Second
	// socketPathLimit is sun_path's size less its terminator, rounded down
	// for portability.
	socketPathLimit = 100
)

// Options configure a daemon. The zero value is usable but for DataDir.
type Options struct {
	// DataDir is the data dir the daemon serves; required.
	DataDir string
	// Unattended is how long a process of a daemon without owner may go
	// unattended (no request names it, nobody waits on or subscribes to
	// it) before it is ended (default DefaultUnattended).
	Unattended time.Duration
	// IdleExit is how long a daemon without owner, handoff, process or
	// connection lives on (default DefaultIdleExit).
	IdleExit time.Duration
	// ExitDrain bounds how long, after a pipe or pty process's leader
	// exited, its output may still arrive from descendants that hold the
	// pipe or terminal (default DefaultExitDrain); then its exit is
	// published and the reader stops.
	ExitDrain time.Duration
	// HandoffTTL is how long a handoff ticket is valid (default and
	// maximum HandoffTTL).
	HandoffTTL time.Duration
	// Custody configures the daemon's custodian.
	Custody custody.Options
	Logger  *slog.Logger

	// wire makes the daemon another build's (tests of version skew): the
	// versions it speaks, and whether it predates negotiation. Zero:
	// this build's.
	wire wireVersions
}

// wireVersions are the protocol versions a daemon speaks.
type wireVersions struct {
	Range
	// preNegotiation: a protocol 8 daemon built before negotiation
	// existed: no range in its ping or registration, and every request is
	// taken as its version.
	preNegotiation bool
}

func (o *Options) fill() {
	if o.Unattended <= 0 {
		o.Unattended = DefaultUnattended
	}
	if o.IdleExit <= 0 {
		o.IdleExit = DefaultIdleExit
	}
	if o.ExitDrain <= 0 {
		o.ExitDrain = DefaultExitDrain
	}
	if o.HandoffTTL <= 0 || o.HandoffTTL > HandoffTTL {
		o.HandoffTTL = HandoffTTL
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.wire.Range == (Range{}) {
		o.wire.Range = Versions()
	}
	if o.Custody.Logger == nil {
		o.Custody.Logger = o.Logger
	}
}

// ErrRunning is returned by Run when a daemon already serves the data dir.
var ErrRunning = errors.New("procd: a daemon already runs for this data dir")

// ErrUnsupportedPlatform is returned where the daemon cannot run (it
// needs Unix: process groups, flock, SO_PEERCRED on Linux).
var ErrUnsupportedPlatform = fmt.Errorf("procd: %w", errors.ErrUnsupported)
