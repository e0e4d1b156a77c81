// Package custody starts agent processes and owns everything they start:
// each command runs in a scope whose descendants are found (by parent walk,
// process group and session, an environment marker, and the cgroup), each
// identified by pid and start time, signalled only after that identity is
// re-checked, and confirmed gone and reaped before Close returns a receipt.
//
// On Linux the host becomes a child subreaper, so orphaned descendants are
// reparented to it and reaped by it (every child it inherits, attributed to
// its scope where possible), and a cgroup v2 child group is used when the
// host may create one. On other platforms only the process group is
// signalled and no descendant is discovered; see the README's platform notes.
//
// With Options.Resources a scope may also be limited (memory, processes,
// CPU: StartOptions.Limits) and measured (Scope.Usage), by cgroup v2
// controllers, cgroup v1 hierarchies on a hybrid host, or resource limits
// of each process where neither may be written; Support says which.
//
// This is ownership tracking of discoverable processes, not a sandbox: a
// descendant with no readable marker (a cleared environment, or a
// non-dumpable process when the host is not root) that leaves the session
// and is reparented before it is first seen is found only by the cgroup, or
// when it is reparented to the host while its scope is the only one open.
package custody

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/agenthost/agenthost/internal/procio"
)

// MarkerEnv is the environment variable stamped into every scope's command.
// Its value is "<host pid namespace>.<host pid>.<host start time>.<scope
// id>": the namespace (the inode of the host's /proc/self/ns/pid) tells
// which pid namespace the host's pid is counted in.
const MarkerEnv = "AGENTHOST_SCOPE"

// Defaults for Options.
const (
	DefaultGrace        = time.Second
	DefaultTermGrace    = time.Second
	DefaultConfirm      = 5 * time.Second
	DefaultScanInterval = 250 * time.Millisecond
)

var (
	// ErrClosed is returned by Start after the Custodian was closed.
	ErrClosed = errors.New("custody: custodian closed")
	// ErrNotConfirmed is returned by Close when an owned process could not
	// be confirmed gone; the scope keeps it and a later Close retries.
	ErrNotConfirmed = errors.New("custody: processes not confirmed gone")
	// ErrScopeClosed is returned by Signal after the scope's Close
	// completed: its processes are gone and their ids may be reused.
	ErrScopeClosed = errors.New("custody: scope closed")
)

// Options configure a Custodian. The zero value is usable.
type Options struct {
	// Grace is how long Close waits for the leader to exit on its own
	// after stdin is closed (default 1 s).
	Grace time.Duration
	// TermGrace is how long Close waits after SIGTERM before SIGKILL
	// (default 1 s).
	TermGrace time.Duration
	// Confirm bounds the wait for every owned process to be gone and
	// reaped after SIGKILL (default 5 s).
	Confirm time.Duration
	// ScanInterval is how often descendants are looked for while scopes
	// are open (default 250 ms), less often with so many scopes open that
	// a look would take more than 1 % of a core. Close looks on its own
	// schedule.
	ScanInterval time.Duration
	// NoCgroup disables the cgroup v2 upgrade.
	NoCgroup bool
	// Resources makes the custodian able to limit its scopes' memory,
	// processes and CPU (StartOptions.Limits) and measure what they use
	// (Scope.Usage), by the means Support reports: cgroup v2 controllers
	// (on a v2 host whose group the custodian's process owns, it moves
	// itself into a leaf group below it, so that the controllers can be
	// enabled for its scopes), cgroup v1 hierarchies (a hybrid host), or
	// else resource limits of each process. Off, limits are not applied.
	Resources bool
	// NoSubreaper leaves the host's subreaper flag alone (for hosts that
	// manage it themselves).
	NoSubreaper bool
	// Fuse, when set, keeps the scopes' holds (Scope.HoldUntil) in a
	// process of its own, so that they hold while this one is paused.
	Fuse   *Fuse
	Logger *slog.Logger
}

func (o *Options) fill() {
	if o.Grace <= 0 {
		o.Grace = DefaultGrace
	}
	if o.TermGrace <= 0 {
		o.TermGrace = DefaultTermGrace
	}
	if o.Confirm <= 0 {
		o.Confirm = DefaultConfirm
	}
	if o.ScanInterval <= 0 {
		o.ScanInterval = DefaultScanInterval
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Custodian starts commands in scopes and tracks them. Create one per host
// process with New, and Close it last. Safe for concurrent use.
type Custodian struct {
	opts  Options
	log   *slog.Logger
	owner string // "<pid namespace>.<pid>.<start>" of this host
	plat  platform
	res   *resources // nil without Options.Resources
	// selfStart is the host's start time (no orphan it inherits is older).
	selfStart uint64
	scanMu    sync.Mutex // one look at a time
	mu        sync.Mutex
	scopes    map[*Scope]struct{} // open: not closed with success yet
	closed    bool
	// poked are the scopes to look at as soon as the loop can (a leader
	// started or exited); under mu.
	poked  map[*Scope]struct{}
	kick   chan struct{}
	quit   chan struct{}
	stop   sync.Once
	loopWG sync.WaitGroup // the discovery loop
	// starting counts Starts past the closed check; Close waits for them
	// so their scopes are closed with the rest. Added to under mu while
	// !closed only.
	starting sync.WaitGroup
	wg       sync.WaitGroup // leader waiters
}

// New makes the host a child subreaper (Linux) and starts discovery.
func New(opts Options) (*Custodian, error) {
	opts.fill()
	c := &Custodian{
		opts:   opts,
		log:    opts.Logger,
		scopes: map[*Scope]struct{}{},
		poked:  map[*Scope]struct{}{},
		kick:   make(chan struct{}, 1),
		quit:   make(chan struct{}),
	}
	plat, err := newPlatform(opts)
	if err != nil {
		return nil, err
	}
	c.plat = plat
	if opts.Resources {
		c.res = plat.resources()
	}
	c.owner = plat.ownerID()
	c.selfStart = plat.startTime(plat.selfPid())
	c.loopWG.Add(1)
	go c.discoverLoop()
	return c, nil
}

// Close closes every scope still open (each with a bounded context) and
// stops discovery; Start fails with ErrClosed from the first call on, and a
// Start already under way has its scope closed with the rest. Errors are
// joined; then the scopes that failed stay open and a later Close retries
// them, so Close never reports nil while an owned process may run.
func (c *Custodian) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.starting.Wait()
	c.mu.Lock()
	open := make([]*Scope, 0, len(c.scopes))
	for s := range c.scopes {
		open = append(open, s)
	}
	c.mu.Unlock()
	var errs []error
	for _, s := range open {
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.Grace+c.opts.TermGrace+2*c.opts.Confirm+time.Second)
		_, err := s.Close(ctx)
		cancel()
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	c.stop.Do(func() { close(c.quit) })
	c.loopWG.Wait()
	c.wg.Wait() // every leader has exited: each scope's Close saw it
	return nil
}

// Containment says how a scope's processes were contained.
type Containment string

const (
	// ContainCgroup: a cgroup v2 group of its own, killed with cgroup.kill.
	ContainCgroup Containment = "cgroup-v2+subreaper+marker"
	// ContainPortable: process group, subreaper, marker and /proc scan.
	ContainPortable Containment = "process-group+subreaper+marker"
	// ContainGroupOnly: the process group alone (non-Linux).
	ContainGroupOnly Containment = "process-group"
)

// Found says how a process came into custody.
type Found string

const (
	FoundLeader Found = "leader" // the command itself
	FoundParent Found = "parent" // a descendant by parent walk
	FoundGroup  Found = "group"  // in the leader's process group or session
	FoundMarker Found = "marker" // carries the scope's environment marker
	FoundCgroup Found = "cgroup" // listed in the scope's cgroup
	// FoundInherited: the host's child by inheritance (an orphan reparented
	// to it), in a session of its own, that only this scope could have
	// started (the only scope open when it was born).
	FoundInherited Found = "inherited"
)

// Ended says how an owned process ended.
type Ended string

const (
	EndedSelf        Ended = "exited"       // before any signal
	EndedTerm        Ended = "term"         // after SIGTERM
	EndedKill        Ended = "kill"         // after SIGKILL
	EndedAlreadyGone Ended = "already-gone" // its pid was reused or it vanished unseen
	EndedUnknown     Ended = ""             // still running
)

// Bounds of a receipt's JSON (it is stored, and streamed in a room's
// agent.released): each command line, and the processes listed in full.
const (
	MaxCmdline = maxCmdline
	MaxListed  = 64
)

const maxCmdline = 512

// Entry is one owned process in a receipt.
type Entry struct {
	PID     int    `json:"pid"`
	Cmdline string `json:"cmdline"`
	// CmdlineTruncated: Cmdline is the first MaxCmdline bytes of it.
	CmdlineTruncated bool      `json:"cmdline_truncated,omitempty"`
	Found            Found     `json:"found"`
	Ended            Ended     `json:"ended"`
	At               time.Time `json:"at"`
	Reaped           bool      `json:"reaped"` // by this host (its child), not by another parent
	// ExitCode (it exited) or Signal (a signal ended it, "TERM", "KILL",
	// ...): its status, known where this host reaped it.
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
}

// Receipt is what Close did.
type Receipt struct {
	Scope       string        `json:"scope"`
	Containment Containment   `json:"containment"`
	Processes   []Entry       `json:"processes"`
	Duration    time.Duration `json:"duration"` // nanoseconds (kept for earlier readers)
	ExitErr     string        `json:"leaderExit,omitempty"`
	// More counts the processes not in Processes, MoreEnded them by how
	// they ended: a scope keeps only so many that ended on their own, and
	// the JSON form lists at most MaxListed (see MarshalJSON).
	More      int           `json:"more,omitempty"`
	MoreEnded map[Ended]int `json:"more_ended,omitempty"`
}

// receiptJSON is a receipt's JSON form: snake_case beside the earlier
// names, the duration in seconds too.
type receiptJSON struct {
	Scope           string        `json:"scope"`
	Containment     Containment   `json:"containment"`
	Processes       []Entry       `json:"processes"`
	More            int           `json:"more,omitempty"`
	MoreEnded       map[Ended]int `json:"more_ended,omitempty"`
	Duration        time.Duration `json:"duration"`
	DurationSeconds float64       `json:"duration_seconds"`
	ExitErr         string        `json:"leaderExit,omitempty"`
	LeaderExit      string        `json:"leader_exit,omitempty"`
}

// MarshalJSON writes the receipt bounded: at most MaxListed processes (the
// leader, then those Close had to end, then those that ended on their own,
// earliest first within each), the rest counted in more and more_ended.
// Command lines are bounded when recorded.
func (r Receipt) MarshalJSON() ([]byte, error) {
	out := receiptJSON{Scope: r.Scope, Containment: r.Containment, Duration: r.Duration,
		DurationSeconds: r.Duration.Seconds(), ExitErr: r.ExitErr, LeaderExit: r.ExitErr, More: r.More}
	if len(r.MoreEnded) > 0 {
		out.MoreEnded = maps.Clone(r.MoreEnded)
	}
	out.Processes = r.Processes
	if len(r.Processes) > MaxListed {
		rank := func(e Entry) int {
			switch {
			case e.Found == FoundLeader:
				return 0
			case e.Ended != EndedSelf:
				return 1
			}
			return 2
		}
		idx := make([]int, len(r.Processes))
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(a, b int) bool { return rank(r.Processes[idx[a]]) < rank(r.Processes[idx[b]]) })
		keep := idx[:MaxListed]
		sort.Ints(keep) // back in the receipt's order
		out.Processes = make([]Entry, 0, MaxListed)
		for _, i := range keep {
			out.Processes = append(out.Processes, r.Processes[i])
		}
		if out.MoreEnded == nil {
			out.MoreEnded = map[Ended]int{}
		}
		for _, i := range idx[MaxListed:] {
			out.More++
			out.MoreEnded[r.Processes[i].Ended]++
		}
	}
	if out.Processes == nil {
		out.Processes = []Entry{}
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads MarshalJSON's form (and receipts written before it).
func (r *Receipt) UnmarshalJSON(b []byte) error {
	var in receiptJSON
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	*r = Receipt{Scope: in.Scope, Containment: in.Containment, Processes: in.Processes, Duration: in.Duration,
		ExitErr: in.ExitErr, More: in.More, MoreEnded: in.MoreEnded}
	if r.ExitErr == "" {
		r.ExitErr = in.LeaderExit
	}
	return nil
}

// String is a short human summary.
func (r *Receipt) String() string {
	var b strings.Builder
	n := len(r.Processes) + r.More
	fmt.Fprintf(&b, "custody receipt for scope %s (%s), %d process(es), closed in %v:\n", r.Scope, r.Containment, n, r.Duration.Round(time.Millisecond))
	// "pid PID FOUND ENDED CMDLINE": callers read these columns; the exit
	// statuses are in the JSON form.
	for _, e := range r.Processes {
		fmt.Fprintf(&b, "  pid %-7d %-7s %-13s %s\n", e.PID, e.Found, e.Ended, trimCmd(e.Cmdline))
	}
	if r.More > 0 {
		fmt.Fprintf(&b, "  and %d more: %v\n", r.More, r.MoreEnded)
	}
	return strings.TrimRight(b.String(), "\n")
}

func trimCmd(s string) string {
	if len(s) > 100 {
		return s[:100] + "…"
	}
	return s
}

// boundCmdline keeps the first maxCmdline bytes of a command line (cut at
// a character boundary) and says whether it cut.
func boundCmdline(s string) (string, bool) {
	if len(s) <= maxCmdline {
		return s, false
	}
	n := maxCmdline
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n], true
}

// exitStatus is how a process this host reaped ended.
type exitStatus struct {
	known  bool
	code   int       // its exit code, when it exited
	signal sysSignal // the signal that ended it, 0 when it exited
}

type ident struct {
	pid   int
	start uint64
}

type owned struct {
	id       ident
	cmdline  string // bounded (boundCmdline)
	cut      bool   // cmdline was cut
	found    Found
	ended    Ended
	at       time.Time
	reaped   bool
	gone     bool
	lastSeen uint64 // the latest table tick it was seen in
	// bornDead: first seen after it died (a zombie). How it ended is then
	// its exit status's to say, not the phase Close was in when it was
	// found.
	bornDead bool
	status   exitStatus // where this host reaped it
	// comm is its command name when cmdline was read: a process found
	// between fork and exec, or while it execs (its command line reads
	// empty then), has its command line read again once it changes.
	comm [16]byte
}

func (o *owned) entry() Entry {
	e := Entry{PID: o.id.pid, Cmdline: o.cmdline, CmdlineTruncated: o.cut, Found: o.found, Ended: o.ended, At: o.at, Reaped: o.reaped}
	switch {
	case o.status.known && o.status.signal != 0:
		e.Signal = signalName(o.status.signal)
	case o.status.known:
		code := o.status.code
		e.ExitCode = &code
	}
	return e
}

// Scope is one started command and everything it starts.
type Scope struct {
	c      *Custodian
	id     string
	marker string
	cmd    *exec.Cmd
	leader ident

	stdin          io.WriteCloser
	stdout, stderr *os.File
	outOnce        sync.Once

	exited   chan struct{}
	exitErr  error
	exitedAt time.Time // set before exited closes

	cg *cgroup // nil without cgroup containment
	// res are the scope's limits and meters (nil without
	// Options.Resources), limits those it was started with.
	res    *scopeRes
	limits Limits

	closeSem chan struct{} // one Close at a time
	mu       sync.Mutex
	procs    map[ident]*owned    // everything ever owned: the receipt
	live     map[ident]*owned    // not gone yet
	groups   map[int]*owned      // owned group and session leaders, by pid
	dead     map[ident]deadEntry // gone, possibly still in a table (see refresh)
	phase    int                 // 0 running, 1 stdin closed, 2 TERM sent, 3 KILL sent, 4 done
	receipt  *Receipt
	started  time.Time
	closeT0  time.Time
	// failed: a Close gave up (ErrNotConfirmed); the discovery loop then
	// kills what it finds in the scope and completes it once it is empty.
	failed bool
	// keptExited counts the processes on the receipt that ended on their
	// own; forgot, by how they ended, those left off it (maxKeptExited).
	keptExited int
	forgot     map[Ended]int
	// lookedAt is when a look last read the scope (UnixNano).
	lookedAt atomic.Int64
	// seen counts the processes ever owned (Usage.Processes), under mu.
	seen int64

	// A hold kept in this process (see HoldUntil).
	holdMu     sync.Mutex
	holdTimer  *time.Timer
	heldFrozen bool
}

// ID is the scope's id, part of its marker.
func (s *Scope) ID() string { return s.id }

// Marker is the scope's marker value (MarkerEnv=Marker in its environment).
func (s *Scope) Marker() string { return s.marker }

// Pid is the leader's pid.
func (s *Scope) Pid() int { return s.leader.pid }

// Stdin is the command's stdin; Close closes it first. Closing it looks
// at the scope first (see stdinPipe); it has SetWriteDeadline.
func (s *Scope) Stdin() io.WriteCloser { return s.stdin }

// stdinPipe is a scope's stdin pipe. Agents end some of their children
// themselves on stdin EOF, and callers close stdin before they Close the
// scope: closing it first records everything alive, so the receipt names
// what ran when the agent was told to stop.
type stdinPipe struct {
	*os.File
	s *Scope
}

func (p stdinPipe) Close() error {
	if p.s.getPhase() < 1 {
		p.s.c.lookAt(p.s)
	}
	return p.File.Close()
}

// Stdout is the read end of the command's stdout; keep draining it until
// Close returns, so the command never blocks on a full pipe.
// Nil after StartTTY.
func (s *Scope) Stdout() io.Reader {
	if s.stdout == nil {
		return nil
	}
	return s.stdout
}

// Stderr is the read end of the command's stderr (nil after StartTTY or
// StartCombined).
func (s *Scope) Stderr() io.Reader {
	if s.stderr == nil {
		return nil
	}
	return s.stderr
}

// Exited is closed when the leader has exited and been reaped.
func (s *Scope) Exited() <-chan struct{} { return s.exited }

// ExitErr is the leader's exit status once Exited is closed.
func (s *Scope) ExitErr() error {
	select {
	case <-s.exited:
		return s.exitErr
	default:
		return nil
	}
}

// CloseOutput closes the host's ends of stdout and stderr, releasing readers
// blocked on a pipe that a descendant still holds.
func (s *Scope) CloseOutput() {
	s.outOnce.Do(func() {
		if s.stdout != nil {
			s.stdout.Close()
		}
		if s.stderr != nil {
			s.stderr.Close()
		}
	})
}

// nopCloser is a tty scope's stdin: the terminal is the caller's.
type nopCloser struct{}

func (nopCloser) Write(p []byte) (int, error) {
	return 0, errors.New("custody: a tty scope has no stdin pipe")
}
func (nopCloser) Close() error { return nil }

// Signal sends sig to the scope's process group (while the leader is
// unreaped, so the group id cannot have been reused) and to every owned
// process still alive, each after re-checking its identity. It never
// reaches a process that is not the scope's; after a completed Close it
// returns ErrScopeClosed.
func (s *Scope) Signal(sig syscall.Signal) error {
	if s.getPhase() >= 4 {
		return ErrScopeClosed
	}
	s.c.lookAt(s) // what was born since the last look gets it too
	targets := s.liveIdents()
	// The group gets one kill(-pgid) while the leader is unreaped; its
	// members are then not signalled again one by one (a second INT is
	// "force quit" to many programs).
	inGroup := map[ident]bool{}
	if _, ok := s.c.plat.lookup(s.leader); ok {
		for _, id := range targets {
			if pi, ok := s.c.plat.lookup(id); ok && pi.pgid == s.leader.pid {
				inGroup[id] = true
			}
		}
	}
	s.c.plat.signalGroup(s.leader, sysSignal(sig))
	for _, id := range targets {
		if inGroup[id] {
			continue
		}
		if s.c.plat.signal(id, sysSignal(sig)) {
			s.mu.Lock()
			if o := s.live[id]; o != nil {
				o.gone, o.at, o.ended = true, time.Now(), EndedAlreadyGone
				delete(s.live, id)
			}
			s.mu.Unlock()
		}
	}
	return nil
}

// Receipt returns the receipt of a completed Close, or nil.
func (s *Scope) Receipt() *Receipt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.receipt
}

// Start runs cmd in a new scope: its own session (so its process group and
// session id are the leader's pid), the marker in its environment, and on
// Linux a cgroup when available. cmd's Stdin, Stdout and Stderr must be nil:
// the scope makes the pipes. ctx bounds starting only.
func (c *Custodian) Start(ctx context.Context, cmd *exec.Cmd) (*Scope, error) {
	return c.StartWith(ctx, cmd, StartOptions{})
}

// StartCombined is Start with the command's stderr on its stdout pipe, in
// the order it wrote them (as 2>&1); the scope's Stderr is then nil.
func (c *Custodian) StartCombined(ctx context.Context, cmd *exec.Cmd) (*Scope, error) {
	return c.StartWith(ctx, cmd, StartOptions{Combined: true})
}

// StartTTY is Start for a command on a terminal: tty (the pty's child end)
// becomes its stdin, stdout, stderr and controlling terminal. The scope has
// no pipes (Stdin is a no-op closer, Stdout and Stderr are nil); the caller
// keeps the pty's host end and closes its copy of tty after StartTTY.
func (c *Custodian) StartTTY(ctx context.Context, cmd *exec.Cmd, tty *os.File) (*Scope, error) {
	if tty == nil || cmd.Stdin != nil || cmd.Stdout != nil || cmd.Stderr != nil {
		return nil, errors.New("custody: StartTTY needs a tty and the command's stdio unset")
	}
	return c.StartWith(ctx, cmd, StartOptions{TTY: tty})
}

func (c *Custodian) start(ctx context.Context, cmd *exec.Cmd, tty *os.File, combined bool, limits Limits) (*Scope, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	c.starting.Add(1)
	c.mu.Unlock()
	defer c.starting.Done()

	var rb [8]byte
	_, _ = rand.Read(rb[:])
	s := &Scope{
		c:        c,
		id:       hex.EncodeToString(rb[:]),
		cmd:      cmd,
		exited:   make(chan struct{}),
		closeSem: make(chan struct{}, 1),
		procs:    map[ident]*owned{},
		live:     map[ident]*owned{},
		groups:   map[int]*owned{},
		dead:     map[ident]deadEntry{},
		limits:   limits,
	}
	s.marker = c.owner + "." + s.id
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	cmd.Env = append(stripMarker(env), MarkerEnv+"="+s.marker)
	c.plat.prepare(cmd)
	if !c.opts.NoCgroup {
		s.cg = c.plat.newCgroup(s.marker, cmd)
	}
	if c.res != nil {
		var err error
		if s.res, err = c.res.prepare(s.marker, s.cg, limits); err != nil {
			_ = s.cg.remove()
			return nil, err
		}
	}

	// The leader is registered before any scan can see it as the host's
	// child: its exit status is cmd.Wait's alone.
	hostChildren.mu.Lock()
	var pipes procio.Pipes
	err := s.res.start(func() error {
		var err error
		if tty != nil {
			// The leader's own session (prepare) with the tty as its
			// controlling terminal: fd 0 in the child.
			setCtty(cmd)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
			err = cmd.Start()
		} else if combined {
			pipes, err = procio.StartCombined(cmd)
		} else {
			pipes, err = procio.Start(cmd)
		}
		return err
	})
	if err != nil {
		hostChildren.mu.Unlock()
		_ = s.cg.remove()
		_ = s.res.removeV1()
		return nil, fmt.Errorf("custody: start %s: %w", cmd.Path, err)
	}
	pid := cmd.Process.Pid
	s.res.started(pid)
	hostChildren.leaders[pid] = true
	s.leader = ident{pid: pid, start: c.plat.startTime(pid)}
	hostChildren.scopes[s] = struct{}{}
	hostChildren.mu.Unlock()
	s.cg.started()
	if tty != nil {
		s.stdin = nopCloser{}
	} else {
		s.stdin, s.stdout, s.stderr = stdinPipe{pipes.Stdin, s}, pipes.Stdout, pipes.Stderr
	}
	s.started = time.Now()
	// Until cmd.Wait reaps it the leader holds its pid, so its group and
	// session are its own at least until now.
	cmdline, cut := boundCmdline(strings.Join(cmd.Args, " "))
	lo := &owned{id: s.leader, cmdline: cmdline, cut: cut, found: FoundLeader, lastSeen: c.plat.ticks()}
	s.procs[s.leader], s.live[s.leader], s.groups[pid] = lo, lo, lo
	s.seen = 1

	// Registered even if Close began meanwhile: Close waits for this
	// Start and then closes the scope with the rest.
	c.mu.Lock()
	c.scopes[s] = struct{}{}
	c.wg.Add(1)
	c.mu.Unlock()
	// cmd.Wait is the only waiter for the leader; custody reaps only
	// other processes, by pid, so it never takes this exit status.
	go func() {
		defer c.wg.Done()
		err := cmd.Wait()
		hostChildren.mu.Lock()
		delete(hostChildren.leaders, pid)
		hostChildren.mu.Unlock()
		s.exitErr = err
		s.exitedAt = time.Now()
		close(s.exited)
		c.poke(s)
	}()
	c.poke(s)
	return s, nil
}

func stripMarker(env []string) []string {
	out := make([]string, 0, len(env)+1)
	for _, e := range env {
		if !strings.HasPrefix(e, MarkerEnv+"=") {
			out = append(out, e)
		}
	}
	return out
}

// Close ends the scope: stdin closed, Grace for the leader to exit, SIGTERM
// to the group and every owned process, TermGrace, SIGKILL (cgroup.kill
// where contained), then confirmation that every owned process is gone and
// reaped, within Confirm. The caller keeps draining Stdout meanwhile.
//
// A ctx that ends early returns its error and keeps everything in custody:
// a later Close goes on from where this one stopped. After success Close
// returns the same receipt again.
func (s *Scope) Close(ctx context.Context) (*Receipt, error) {
	select {
	case s.closeSem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("custody: close: %w", ctx.Err())
	}
	defer func() { <-s.closeSem }()
	s.mu.Lock()
	if s.receipt != nil {
		r := s.receipt
		s.mu.Unlock()
		return r, nil
	}
	if s.closeT0.IsZero() {
		s.closeT0 = time.Now()
	}
	s.mu.Unlock()
	c := s.c
	opts := c.opts

	if s.getPhase() < 1 {
		// Record everything alive now, so the receipt names even what
		// dies before the next periodic look (agents kill some children
		// themselves on stdin EOF).
		c.lookAt(s)
		if p, ok := s.stdin.(stdinPipe); ok {
			_ = p.File.Close() // looked at just now
		} else {
			_ = s.stdin.Close()
		}
		s.setPhase(1)
		if err := s.waitLeader(ctx, opts.Grace); err != nil {
			return nil, err
		}
	}
	if s.getPhase() < 2 {
		c.lookAt(s)
		// The phase moves before the signal, so an exit the discovery loop
		// sees right after the signal is credited to it, and what a look
		// finds from now on is signalled at once.
		s.setPhase(2)
		if testHookBeforeSignal != nil {
			testHookBeforeSignal(s, 2)
		}
		if !s.allGone() {
			s.signalAll(sigTerm)
			if err := s.waitAllGone(ctx, opts.TermGrace); err != nil {
				return nil, err
			}
		}
	}
	if s.getPhase() < 3 {
		if !s.allGone() {
			c.lookAt(s) // everything alive now is killed; newborns are killed when found
		}
		s.setPhase(3)
		if testHookBeforeSignal != nil {
			testHookBeforeSignal(s, 3)
		}
		if !s.allGone() || s.cg.populated() {
			s.cg.kill()
			s.signalAll(sigKill)
		}
	} else if !s.allGone() {
		// A retry after a Close that could not confirm: kill again.
		c.lookAt(s)
		s.cg.kill()
		s.signalAll(sigKill)
	}
	if err := s.waitAllGone(ctx, opts.Confirm); err != nil {
		return nil, err
	}
	if !s.allGone() {
		return nil, s.fail(fmt.Errorf("%w: %s", ErrNotConfirmed, s.aliveList()))
	}
	// The leader's Wait may still be flushing; it has exited.
	select {
	case <-s.exited:
	case <-ctx.Done():
		return nil, fmt.Errorf("custody: close: waiting for the leader's exit status: %w", ctx.Err())
	}
	if err := s.lastLook(ctx); err != nil {
		return nil, err
	}
	return s.complete(), nil
}

// lastLook looks again until a look finds nothing alive, for anything born
// at the very end: what a look finds is killed at once (the phase is 3),
// and then waited for. Where there is a cgroup, it must hold no process
// (cgroup.events) and is removed with the groups below it. Close gives up
// only when a process it killed outlives Confirm, or after lastLooks looks
// that each found something new.
func (s *Scope) lastLook(ctx context.Context) error {
	opts := s.c.opts
	for look := 0; ; look++ {
		if testHookLastLook != nil {
			testHookLastLook(s)
		}
		s.c.lookAt(s)
		if s.allGone() {
			if !s.cg.populated() {
				err := s.removeGroups()
				if err == nil {
					return nil
				}
				if !s.cg.populated() {
					return s.fail(fmt.Errorf("%w: removing its cgroup: %v", ErrNotConfirmed, err))
				}
			}
			if look == lastLooks {
				return s.fail(fmt.Errorf("%w: the cgroup still holds %s", ErrNotConfirmed, s.cg.memberList()))
			}
			// Members on their way out, or one no look can adopt: kill
			// them all by pid and wait for the cgroup to empty.
			s.cg.kill()
			if !s.cg.waitEmpty(ctx, opts.Confirm) {
				if err := ctx.Err(); err != nil {
					return fmt.Errorf("custody: close: %w", err)
				}
				s.c.lookAt(s)
				if s.allGone() {
					return s.fail(fmt.Errorf("%w: the cgroup still holds %s", ErrNotConfirmed, s.cg.memberList()))
				}
			}
			continue
		}
		if look == lastLooks {
			return s.fail(fmt.Errorf("%w: %s", ErrNotConfirmed, s.aliveList()))
		}
		killed := s.liveIdents()
		s.cg.kill()
		s.signalAll(sigKill)
		if err := s.waitAllGone(ctx, opts.Confirm); err != nil {
			return err
		}
		if left := s.stillLive(killed); left != "" {
			return s.fail(fmt.Errorf("%w: %s", ErrNotConfirmed, left))
		}
	}
}

// removeGroups removes the scope's groups once it holds no process: its
// usage is read a last time first. A v1 group that cannot be removed is
// left for reap (its processes, all in the v2 group, are gone).
func (s *Scope) removeGroups() error {
	s.res.keep()
	if err := s.cg.remove(); err != nil {
		return err
	}
	if err := s.res.removeV1(); err != nil {
		s.c.log.Warn("custody: a scope's cgroup v1 group was not removed", "scope", s.id, "err", err)
	}
	return nil
}

// stillLive lists those of ids the scope still has alive.
func (s *Scope) stillLive(ids []ident) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var parts []string
	for _, id := range ids {
		if o := s.live[id]; o != nil {
			parts = append(parts, fmt.Sprintf("pid %d (%s)", id.pid, trimCmd(o.cmdline)))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// fail marks the scope as one whose Close gave up, and returns err.
func (s *Scope) fail(err error) error {
	s.mu.Lock()
	s.failed = true
	s.mu.Unlock()
	// No command lines here (they may hold anything); the error has them.
	s.c.log.Warn("custody: close not confirmed; ending what remains in the background", "scope", s.id, "alive", len(s.liveIdents()))
	return err
}

// complete ends the scope's custody once it is empty (the leader reaped,
// nothing owned alive, its cgroup removed) and makes its receipt.
func (s *Scope) complete() *Receipt {
	c := s.c
	c.mu.Lock()
	delete(c.scopes, s)
	c.mu.Unlock()
	hostChildren.mu.Lock()
	delete(hostChildren.scopes, s)
	hostChildren.mu.Unlock()

	s.mu.Lock()
	defer s.mu.Unlock()
	s.phase = 4
	r := &Receipt{Scope: s.id, Containment: c.plat.containment(s.cg != nil), Duration: time.Since(s.closeT0)}
	if s.exitErr != nil {
		r.ExitErr = s.exitErr.Error()
	}
	for _, o := range s.procs {
		r.Processes = append(r.Processes, o.entry())
	}
	sort.Slice(r.Processes, func(i, j int) bool { return r.Processes[i].At.Before(r.Processes[j].At) })
	for e, n := range s.forgot {
		if r.MoreEnded == nil {
			r.MoreEnded = map[Ended]int{}
		}
		r.MoreEnded[e] += n
		r.More += n
	}
	s.receipt = r
	return r
}

// finishFailed completes, in the discovery loop, each scope whose Close
// gave up and which is empty now (its looks kill what they find), so that
// nothing keeps running, and no cgroup stays behind, until someone closes
// it again; a later Close returns the receipt. A scope whose Close runs is
// left to it.
func (c *Custodian) finishFailed() {
	for _, s := range c.openScopes() {
		s.mu.Lock()
		failed := s.failed
		s.mu.Unlock()
		if !failed {
			continue
		}
		select {
		case s.closeSem <- struct{}{}:
		default:
			continue
		}
		if !s.allGone() {
			// A retry of the kill: cheap, and a process may have been
			// stopped or in uninterruptible sleep at the last one.
			s.cg.kill()
			s.signalAll(sigKill)
		} else if isClosed(s.exited) && !s.cg.populated() && s.removeGroups() == nil && s.Receipt() == nil {
			r := s.complete()
			c.log.Info("custody: a scope whose close failed is empty now", "scope", s.id, "processes", len(r.Processes)+r.More)
		}
		<-s.closeSem
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (s *Scope) getPhase() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phase
}

func (s *Scope) setPhase(p int) {
	s.mu.Lock()
	s.phase = p
	s.mu.Unlock()
}

// waitLeader waits up to d for the leader to exit; ctx ending is an error.
func (s *Scope) waitLeader(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.exited:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("custody: close: %w", ctx.Err())
	}
}

// signalAll signals the leader's group and every owned process still
// alive, each after re-checking its identity; one whose pid now names
// another process is recorded as already gone and left alone.
func (s *Scope) signalAll(sig sysSignal) {
	targets := s.liveIdents()
	s.c.plat.signalGroup(s.leader, sig)
	for _, id := range targets {
		if s.c.plat.signal(id, sig) {
			s.mu.Lock()
			if o := s.live[id]; o != nil {
				o.gone, o.at, o.ended = true, time.Now(), EndedAlreadyGone
				delete(s.live, id)
			}
			s.mu.Unlock()
		}
	}
}

// lastLooks bounds how often Close's last look may find something new
// (each such look kills it and waits for it).
const lastLooks = 20

// testHookLastLook runs right before Close's last look (tests only).
var testHookLastLook func(*Scope)

// testHookBeforeSignal runs after Close's look of a phase, right before
// that phase's signal round (tests only).
var testHookBeforeSignal func(s *Scope, phase int)

// platform is what custody needs from the operating system.
type platform interface {
	ownerID() string
	selfPid() int
	containment(cgroup bool) Containment
	prepare(cmd *exec.Cmd)
	startTime(pid int) uint64
	hostSession() int
	ticks() uint64 // the clock of stat start times, now
	// table reads every process of the machine (nil without /proc).
	table() *procTable
	// newTable starts an empty table that looks fill (nil without /proc).
	newTable() *procTable
	// stat reads one process (false: gone, or no /proc).
	stat(pid int) (procInfo, bool)
	// children appends the children of every thread of a process to out.
	children(p procInfo, out []int) []int
	// hostChildren appends the orphans the host inherited (and the
	// children of its main thread) to out.
	hostChildren(out []int) []int
	// lookup reads one process by identity (false: gone, or no /proc).
	lookup(id ident) (procInfo, bool)
	// cgroupOf is the cgroup v2 path of a process ("" if unknown).
	cgroupOf(pid int) string
	exitWaiter() exitWaiter
	// reap collects a zombie child by identity: true once it is gone, with
	// its status when collected here.
	reap(id ident) (bool, exitStatus)
	signal(id ident, sig sysSignal) (reused bool)
	signalGroup(leader ident, sig sysSignal)
	newCgroup(id string, cmd *exec.Cmd) *cgroup
	// resources finds what limits scopes may have (Options.Resources).
	resources() *resources
}
