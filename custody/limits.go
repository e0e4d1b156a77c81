package custody

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"
)

// Limits bound what a scope's processes may take together. A zero field
// is no limit. They are set when the scope starts (StartWith) and hold for
// its life: every process it starts inherits them.
type Limits struct {
	// Memory is the most memory, in bytes, the scope's processes may hold
	// together (memory.max with memory.swap.max 0 and memory.high a tenth
	// below on cgroup v2; memory.limit_in_bytes and memory.memsw on v1).
	// At it the kernel kills one of them (the largest).
	Memory int64 `json:"memory,omitempty"`
	// Pids is the most tasks (processes and their threads) the scope may
	// run at once (pids.max): a fork past it fails.
	Pids int64 `json:"pids,omitempty"`
	// CPU is the most CPU time per second, in cores (cpu.max on v2,
	// cpu.cfs_quota_us on v1).
	CPU float64 `json:"cpu,omitempty"`
}

// IsZero: no limit at all.
func (l Limits) IsZero() bool { return l == Limits{} }

// check says what is wrong with l.
func (l Limits) check() error {
	if l.Memory < 0 || l.Pids < 0 || l.CPU < 0 || l.CPU != l.CPU {
		return errors.New("custody: limits must be 0 (none) or more")
	}
	return nil
}

// Mechanism names how a limit is enforced.
type Mechanism string

// Mechanisms of Support.
const (
	// ByCgroupV2: a cgroup v2 controller on the scope's group.
	ByCgroupV2 Mechanism = "cgroup-v2"
	// ByCgroupV1: a cgroup v1 controller, on a group of the scope's in
	// that controller's hierarchy (a hybrid host).
	ByCgroupV1 Mechanism = "cgroup-v1"
	// ByRlimit: a resource limit of each process (RLIMIT_AS for memory,
	// RLIMIT_NPROC for processes), not of the scope as a whole.
	ByRlimit Mechanism = "rlimit"
	// ByNothing: not enforced.
	ByNothing Mechanism = "none"
)

// MinAddressSpace is the least RLIMIT_AS custody sets where memory is
// limited by rlimit: agents on Bun or Node reserve gigabytes of address
// space they never use (omp 18 fails to start under 2 GiB and starts at 4),
// so a smaller bound stops the agent rather than what it runs.
const MinAddressSpace = 4 << 30

// Support says how a Custodian limits and measures its scopes (see
// Options.Resources): by which mechanism each limit holds, and why one
// does not hold by a cgroup.
type Support struct {
	Memory Mechanism `json:"memory"`
	Pids   Mechanism `json:"pids"`
	// CPU by a cgroup is both the limit (cpu.max, cfs quota) and an equal
	// share for every scope (cpu.weight, cpu.shares).
	CPU Mechanism `json:"cpu"`
	// Metered: Scope.Usage reads the scope's CPU time and peak memory
	// from its groups.
	Metered bool `json:"metered"`
	// Why says what is not enforced by a cgroup, and why ("" when all
	// is).
	Why string `json:"why,omitempty"`
}

// Enforced: every limit is enforced by a cgroup (for the scope as a
// whole).
func (s Support) Enforced() bool {
	cg := func(m Mechanism) bool { return m == ByCgroupV2 || m == ByCgroupV1 }
	return cg(s.Memory) && cg(s.Pids) && cg(s.CPU)
}

// Usage is what a scope's processes have used, read from its groups.
type Usage struct {
	// CPU is the CPU time of every process of the scope since it started,
	// those that ended included.
	CPU time.Duration `json:"cpu_ns"`
	// PeakMemory is the most memory the scope held at once (its
	// processes' and the page cache they caused) since its start or the
	// last ResetPeak.
	PeakMemory int64 `json:"peak_memory_bytes"`
	// Processes counts the processes custody saw in the scope since it
	// started, the leader included; a process that lives shorter than a
	// look (ScanInterval) may be missed.
	Processes int64 `json:"processes"`
	// OOMKills counts the processes the kernel killed at the memory
	// limit, ForksRefused the forks it refused at the pids limit.
	OOMKills     int64 `json:"oom_kills"`
	ForksRefused int64 `json:"forks_refused"`
	// Metered: CPU and PeakMemory were read (false: no group to read them
	// from; only Processes counts).
	Metered bool `json:"metered"`
}

// StartOptions are how StartWith starts a command.
type StartOptions struct {
	// Limits bound the scope's processes where the Custodian can (see
	// Options.Resources and Support); without Options.Resources they are
	// not applied.
	Limits Limits
	// Combined puts the command's stderr on its stdout pipe, in the order
	// it wrote them (as StartCombined).
	Combined bool
	// TTY, if set, is the command's terminal (as StartTTY).
	TTY *os.File
}

// StartWith is Start with options: limits, and the command's stdio
// (StartCombined's, StartTTY's).
func (c *Custodian) StartWith(ctx context.Context, cmd *exec.Cmd, o StartOptions) (*Scope, error) {
	if cmd.Stdin != nil || cmd.Stdout != nil || cmd.Stderr != nil {
		return nil, errors.New("custody: Start makes the command's pipes; leave Stdin, Stdout and Stderr nil")
	}
	if err := o.Limits.check(); err != nil {
		return nil, err
	}
	if o.TTY != nil && o.Combined {
		return nil, errors.New("custody: a tty has no separate stderr to combine")
	}
	return c.start(ctx, cmd, o.TTY, o.Combined, o.Limits)
}

// Support says how the Custodian limits and measures its scopes: nothing
// without Options.Resources.
func (c *Custodian) Support() Support {
	if c.res == nil {
		return Support{Memory: ByNothing, Pids: ByNothing, CPU: ByNothing,
			Why: "the custodian was made without Options.Resources"}
	}
	return c.res.support
}

// Usage reads what the scope's processes have used so far; after Close,
// what they had used when its groups were removed.
func (s *Scope) Usage() Usage {
	s.mu.Lock()
	n := s.seen
	s.mu.Unlock()
	u := s.res.usage()
	u.Processes = n
	return u
}

// ResetPeak starts a new window for Usage's PeakMemory: from now on it is
// the most the scope holds at once from now (where the kernel can reset
// it; otherwise it stays the most since the scope's start). Errors say it
// could not.
func (s *Scope) ResetPeak() error {
	if err := s.res.resetPeak(); err != nil {
		return fmt.Errorf("custody: resetting the scope's peak memory: %w", err)
	}
	return nil
}

// Limits are the limits the scope was started with.
func (s *Scope) Limits() Limits { return s.limits }
