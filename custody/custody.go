// Package custody starts agent processes and owns everything they start:
// each command runs in a scope whose descendants are found (by parent walk,
// process group and session, and an environment marker), identified by pid
// and start time, signalled only after that identity is re-checked, and
// confirmed gone and reaped before Close returns a receipt.
//
// On Linux the host becomes a child subreaper, so orphaned descendants are
// reparented to it and reaped by it, and a cgroup v2 child group is used when
// the host may create one. On other platforms only the process group is
// signalled and no descendant is discovered; see the README's platform notes.
//
// This is ownership tracking of discoverable processes, not a sandbox: a
// descendant that clears its environment, leaves the session, and is
// reparented outside the host before it is first seen can escape (the cgroup
// closes that gap where it is available).
package custody

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agenthost/agenthost/internal/procio"
)

// MarkerEnv is the environment variable stamped into every scope's command.
// Its value is "<host pid>.<host start time>.<scope id>".
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
	// ScanInterval is how often descendants are discovered while scopes
	// are open (default 250 ms). Close scans on its own schedule.
	ScanInterval time.Duration
	// NoCgroup disables the cgroup v2 upgrade.
	NoCgroup bool
	// NoSubreaper leaves the host's subreaper flag alone (for hosts that
	// manage it themselves).
	NoSubreaper bool
	Logger      *slog.Logger
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
	opts   Options
	log    *slog.Logger
	owner  string // "<pid>.<start>" of this host
	plat   platform
	scanMu sync.Mutex // one scan at a time
	mu     sync.Mutex
	scopes map[*Scope]struct{}
	closed bool
	kick   chan struct{}
	quit   chan struct{}
	wg     sync.WaitGroup
}

// New makes the host a child subreaper (Linux) and starts discovery.
func New(opts Options) (*Custodian, error) {
	opts.fill()
	c := &Custodian{
		opts:   opts,
		log:    opts.Logger,
		scopes: map[*Scope]struct{}{},
		kick:   make(chan struct{}, 1),
		quit:   make(chan struct{}),
	}
	plat, err := newPlatform(opts)
	if err != nil {
		return nil, err
	}
	c.plat = plat
	c.owner = plat.ownerID()
	c.wg.Add(1)
	go c.discoverLoop()
	return c, nil
}

// Close stops discovery. Scopes still open are closed first (with a
// bounded context); their errors are joined.
func (c *Custodian) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	var open []*Scope
	for s := range c.scopes {
		open = append(open, s)
	}
	c.mu.Unlock()
	var errs []error
	for _, s := range open {
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.Grace+c.opts.TermGrace+c.opts.Confirm+time.Second)
		_, err := s.Close(ctx)
		cancel()
		errs = append(errs, err)
	}
	close(c.quit)
	c.wg.Wait()
	return errors.Join(errs...)
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

// Entry is one owned process in a receipt.
type Entry struct {
	PID     int       `json:"pid"`
	Cmdline string    `json:"cmdline"`
	Found   Found     `json:"found"`
	Ended   Ended     `json:"ended"`
	At      time.Time `json:"at"`
	Reaped  bool      `json:"reaped"` // by this host (its child), not by another parent
}

// Receipt is what Close did.
type Receipt struct {
	Scope       string        `json:"scope"`
	Containment Containment   `json:"containment"`
	Processes   []Entry       `json:"processes"`
	Duration    time.Duration `json:"duration"`
	ExitErr     string        `json:"leaderExit,omitempty"`
}

// String is a short human summary.
func (r *Receipt) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "custody receipt for scope %s (%s), %d process(es), closed in %v:\n", r.Scope, r.Containment, len(r.Processes), r.Duration.Round(time.Millisecond))
	for _, e := range r.Processes {
		fmt.Fprintf(&b, "  pid %-7d %-7s %-13s %s\n", e.PID, e.Found, e.Ended, trimCmd(e.Cmdline))
	}
	return strings.TrimRight(b.String(), "\n")
}

func trimCmd(s string) string {
	if len(s) > 100 {
		return s[:100] + "…"
	}
	return s
}

type ident struct {
	pid   int
	start uint64
}

type owned struct {
	id      ident
	cmdline string
	found   Found
	ended   Ended
	at      time.Time
	reaped  bool
	gone    bool
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

	closeSem chan struct{} // one Close at a time
	mu       sync.Mutex
	procs    map[ident]*owned
	phase    int // 0 running, 1 stdin closed, 2 TERM sent, 3 KILL sent, 4 done
	receipt  *Receipt
	started  time.Time
	closeT0  time.Time
}

// ID is the scope's id, part of its marker.
func (s *Scope) ID() string { return s.id }

// Marker is the scope's marker value (MarkerEnv=Marker in its environment).
func (s *Scope) Marker() string { return s.marker }

// Pid is the leader's pid.
func (s *Scope) Pid() int { return s.leader.pid }

// Stdin is the command's stdin; Close closes it first.
func (s *Scope) Stdin() io.WriteCloser { return s.stdin }

// Stdout is the read end of the command's stdout; keep draining it until
// Close returns, so the command never blocks on a full pipe.
func (s *Scope) Stdout() io.Reader { return s.stdout }

// Stderr is the read end of the command's stderr.
func (s *Scope) Stderr() io.Reader { return s.stderr }

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
		s.stdout.Close()
		s.stderr.Close()
	})
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
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if cmd.Stdin != nil || cmd.Stdout != nil || cmd.Stderr != nil {
		return nil, errors.New("custody: Start makes the command's pipes; leave Stdin, Stdout and Stderr nil")
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	c.mu.Unlock()

	var rb [8]byte
	_, _ = rand.Read(rb[:])
	s := &Scope{
		c:        c,
		id:       hex.EncodeToString(rb[:]),
		cmd:      cmd,
		exited:   make(chan struct{}),
		closeSem: make(chan struct{}, 1),
		procs:    map[ident]*owned{},
	}
	s.marker = c.owner + "." + s.id
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	cmd.Env = append(stripMarker(env), MarkerEnv+"="+s.marker)
	c.plat.prepare(cmd)
	if !c.opts.NoCgroup {
		s.cg = c.plat.newCgroup(s.id, cmd)
	}

	pipes, err := procio.Start(cmd)
	if err != nil {
		s.cg.remove()
		return nil, fmt.Errorf("custody: start %s: %w", cmd.Path, err)
	}
	s.cg.started()
	s.stdin, s.stdout, s.stderr = pipes.Stdin, pipes.Stdout, pipes.Stderr
	s.started = time.Now()
	pid := cmd.Process.Pid
	s.leader = ident{pid: pid, start: c.plat.startTime(pid)}
	s.procs[s.leader] = &owned{id: s.leader, cmdline: strings.Join(cmd.Args, " "), found: FoundLeader}

	c.mu.Lock()
	c.scopes[s] = struct{}{}
	c.mu.Unlock()
	// cmd.Wait is the only waiter for the leader; custody reaps only
	// other processes, by pid, so it never takes this exit status.
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		s.exitErr = cmd.Wait()
		s.exitedAt = time.Now()
		close(s.exited)
		c.poke()
	}()
	c.poke()
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

func (c *Custodian) poke() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// discoverLoop scans for descendants while scopes are open.
func (c *Custodian) discoverLoop() {
	defer c.wg.Done()
	t := time.NewTicker(c.opts.ScanInterval)
	defer t.Stop()
	for {
		select {
		case <-c.quit:
			return
		case <-t.C:
		case <-c.kick:
		}
		c.scan()
	}
}

// scan reads the process table once and updates every open scope: new
// descendants are assigned in one pass over the table (oldest first, so a
// parent is always assigned before its children), then each scope's owned
// processes are checked against the same table.
func (c *Custodian) scan() {
	c.scanMu.Lock()
	defer c.scanMu.Unlock()
	c.mu.Lock()
	scopes := make([]*Scope, 0, len(c.scopes))
	for s := range c.scopes {
		scopes = append(scopes, s)
	}
	c.mu.Unlock()
	if len(scopes) == 0 {
		return
	}
	t := c.plat.table()
	now := time.Now()
	if t != nil {
		c.assign(t, scopes)
	}
	for _, s := range scopes {
		s.refresh(t, now)
	}
}

// assign takes every process not yet owned into the scope it belongs to.
func (c *Custodian) assign(t *procTable, scopes []*Scope) {
	byLeader := map[int]*Scope{}
	byMarker := map[string]*Scope{}
	owner := map[int]*Scope{} // pid of an owned, live process -> scope
	known := map[ident]bool{}
	var members map[int]*Scope
	for _, s := range scopes {
		s.mu.Lock()
		byLeader[s.leader.pid] = s
		byMarker[s.marker] = s
		for id, o := range s.procs {
			known[id] = true
			if !o.gone {
				owner[id.pid] = s
			}
		}
		// cgroup.procs is read only while a scope closes: its members are
		// found by the other means meanwhile, and the read is not free.
		if s.phase > 0 {
			for pid := range s.cg.members() {
				if members == nil {
					members = map[int]*Scope{}
				}
				members[pid] = s
			}
		}
		s.mu.Unlock()
	}
	self := c.plat.selfPid()
	for _, p := range t.byStart {
		id := ident{p.pid, p.start}
		if known[id] || p.pid == self {
			continue
		}
		var s *Scope
		var found Found
		switch {
		case byLeader[p.pgid] != nil:
			s, found = byLeader[p.pgid], FoundGroup
		case byLeader[p.sid] != nil:
			s, found = byLeader[p.sid], FoundGroup
		case owner[p.ppid] != nil:
			s, found = owner[p.ppid], FoundParent
		case members[p.pid] != nil:
			s, found = members[p.pid], FoundCgroup
		default:
			if m := t.marker(p); m != "" {
				if s = byMarker[m]; s != nil {
					found = FoundMarker
				}
			}
		}
		if s == nil {
			continue
		}
		if found == FoundGroup && s.leader.pid == p.pid && s.leader.start != p.start {
			continue // a new process reusing an old leader's pid
		}
		s.mu.Lock()
		s.procs[id] = &owned{id: id, cmdline: t.cmdline(p), found: found}
		s.mu.Unlock()
		owner[p.pid] = s
		known[id] = true
	}
}

// refresh marks owned processes gone, reaping those that are this host's
// zombie children. t may be nil (no /proc): then only the leader's exit is
// seen.
func (s *Scope) refresh(t *procTable, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, o := range s.procs {
		if o.gone {
			continue
		}
		if id == s.leader {
			select {
			case <-s.exited:
				s.markGone(o, now, true)
			default:
			}
			continue
		}
		if t == nil {
			continue
		}
		p, ok := t.lookup(id)
		switch {
		case !ok:
			s.markGone(o, now, false)
		case p.state == 'Z' && p.ppid == s.c.plat.selfPid():
			if s.c.plat.reap(id.pid) {
				s.markGone(o, now, true)
			}
		case p.state == 'Z':
			s.markGone(o, now, false) // dead; its parent reaps it
		}
	}
}

func (s *Scope) markGone(o *owned, at time.Time, reaped bool) {
	o.gone, o.at, o.reaped = true, at, reaped
	switch s.phase {
	case 0, 1:
		o.ended = EndedSelf
	case 2:
		o.ended = EndedTerm
	default:
		o.ended = EndedKill
	}
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
		// dies before the next periodic scan (agents kill some children
		// themselves on stdin EOF).
		c.scan()
		_ = s.stdin.Close()
		s.setPhase(1)
		if err := s.waitLeader(ctx, opts.Grace); err != nil {
			return nil, err
		}
	}
	if s.getPhase() < 2 {
		c.scan()
		// The phase moves before the signal, so an exit the discovery loop
		// sees right after the signal is credited to it.
		s.setPhase(2)
		if !s.allGone() {
			s.signalAll(sigTerm)
			if err := s.waitAllGone(ctx, opts.TermGrace); err != nil {
				return nil, err
			}
		}
	}
	if s.getPhase() < 3 {
		c.scan()
		s.setPhase(3)
		if !s.allGone() {
			s.cg.kill()
			s.signalAll(sigKill)
		}
	} else if !s.allGone() {
		// A retry after a Close that could not confirm: kill again.
		c.scan()
		s.cg.kill()
		s.signalAll(sigKill)
	}
	if err := s.waitAllGone(ctx, opts.Confirm); err != nil {
		return nil, err
	}
	if !s.allGone() {
		return nil, fmt.Errorf("%w: %s", ErrNotConfirmed, s.aliveList())
	}
	// The leader's Wait may still be flushing; it has exited.
	select {
	case <-s.exited:
	case <-ctx.Done():
		return nil, fmt.Errorf("custody: close: waiting for the leader's exit status: %w", ctx.Err())
	}
	c.scan() // a last look for anything born at the very end
	if !s.allGone() {
		s.signalAll(sigKill)
		if err := s.waitAllGone(ctx, opts.Confirm); err != nil {
			return nil, err
		}
	}
	s.cg.remove()
	c.mu.Lock()
	delete(c.scopes, s)
	c.mu.Unlock()

	s.mu.Lock()
	defer s.mu.Unlock()
	s.phase = 4
	r := &Receipt{Scope: s.id, Containment: c.plat.containment(s.cg != nil), Duration: time.Since(s.closeT0)}
	if s.exitErr != nil {
		r.ExitErr = s.exitErr.Error()
	}
	for _, o := range s.procs {
		r.Processes = append(r.Processes, Entry{PID: o.id.pid, Cmdline: o.cmdline, Found: o.found, Ended: o.ended, At: o.at, Reaped: o.reaped})
	}
	sort.Slice(r.Processes, func(i, j int) bool { return r.Processes[i].At.Before(r.Processes[j].At) })
	s.receipt = r
	return r, nil
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

// waitAllGone rescans every few milliseconds until every owned process is
// gone or d passes; ctx ending is an error. Exits have no event that covers
// non-children, hence the bounded poll.
func (s *Scope) waitAllGone(ctx context.Context, d time.Duration) error {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	exited := s.exited
	for {
		s.c.scan()
		if s.allGone() {
			return nil
		}
		select {
		case <-exited:
			exited = nil // seen once; a closed channel would spin
		case <-tick.C:
		case <-deadline.C:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("custody: close: %w", ctx.Err())
		}
	}
}

func (s *Scope) allGone() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.procs {
		if !o.gone {
			return false
		}
	}
	return true
}

func (s *Scope) aliveList() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var parts []string
	for _, o := range s.procs {
		if !o.gone {
			parts = append(parts, fmt.Sprintf("pid %d (%s)", o.id.pid, trimCmd(o.cmdline)))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// signalAll signals the leader's group and every owned process still
// alive, each after re-checking its identity; one whose pid now names
// another process is recorded as already gone and left alone.
func (s *Scope) signalAll(sig sysSignal) {
	s.mu.Lock()
	var targets []ident
	for id, o := range s.procs {
		if !o.gone {
			targets = append(targets, id)
		}
	}
	s.mu.Unlock()
	s.c.plat.signalGroup(s.leader, sig)
	for _, id := range targets {
		if s.c.plat.signal(id, sig) {
			s.mu.Lock()
			if o := s.procs[id]; o != nil && !o.gone {
				o.gone, o.at, o.ended = true, time.Now(), EndedAlreadyGone
			}
			s.mu.Unlock()
		}
	}
}

// platform is what custody needs from the operating system.
type platform interface {
	ownerID() string
	selfPid() int
	containment(cgroup bool) Containment
	prepare(cmd *exec.Cmd)
	startTime(pid int) uint64
	table() *procTable
	reap(pid int) bool
	signal(id ident, sig sysSignal) (reused bool)
	signalGroup(leader ident, sig sysSignal)
	newCgroup(id string, cmd *exec.Cmd) *cgroup
}
