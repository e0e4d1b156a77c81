package main

import (
	"fmt"
	"io"
	"runtime"
	"strings"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/room"
	"github.com/spf13/pflag"
)

// Defaults of the rooms' limits (serve --room-memory, --room-pids,
// --room-cpu); see the README's "Resources".
const (
	// defaultRoomMemory: omp on Bun takes a few hundred MiB, a build
	// (go, tsc, cargo on a mid-sized project) 1 to 3 GiB more; 4 GiB
	// holds both, and no room takes more than half a smaller machine.
	defaultRoomMemory = 4 << 30
	// defaultRoomPids counts tasks, threads included: Bun runs a dozen
	// or two, a parallel build a few hundred; a fork bomb stops at 4096
	// (the kernel's pid_max is 32768 here, systemd's default TasksMax
	// for a service about 4915).
	defaultRoomPids = 4096
)

// resourceFlags are serve's limits of every room's processes.
type resourceFlags struct {
	memory string // a size, "auto" (the default) or 0 (none)
	pids   int64
	cpu    float64 // cores; 0: all the machine's
}

func addResourceFlags(fl *pflag.FlagSet, f *resourceFlags) {
	fl.StringVar(&f.memory, "room-memory", "auto", "the most memory a room's processes hold together, and the ceiling of its settings (a size: 512M, 4G; auto: 4G, or half the machine's memory if less; 0: none)")
	fl.Int64Var(&f.pids, "room-pids", defaultRoomPids, "the most tasks (processes and threads) a room runs at once, and the ceiling of its settings (0: none)")
	fl.Float64Var(&f.cpu, "room-cpu", 0, "the most CPU a room uses, in cores, and the ceiling of its settings (0: all the machine's; every room has an equal share besides)")
}

// limits are the flags as rooms' default limits and ceilings.
func (f resourceFlags) limits() (room.Limits, error) {
	var l room.Limits
	switch m := strings.TrimSpace(f.memory); strings.ToLower(m) {
	case "auto", "":
		l.Memory = room.Bytes(defaultRoomMemory)
		if total := memTotal(); total > 0 && total/2 < defaultRoomMemory {
			l.Memory = room.Bytes(total / 2)
		}
	default:
		n, err := room.ParseBytes(m)
		if err != nil {
			return l, fmt.Errorf("serve: --room-memory: %w", err)
		}
		l.Memory = room.Bytes(n)
	}
	l.Pids = f.pids
	l.CPU = f.cpu
	if l.CPU == 0 {
		l.CPU = float64(runtime.NumCPU())
	}
	if err := room.CheckLimits(l); err != nil {
		return l, fmt.Errorf("serve: --room-memory, --room-pids, --room-cpu: %s", strings.TrimPrefix(err.Error(), room.ErrBadSettings.Error()+": "))
	}
	return l, nil
}

// limitsReport is one line on the rooms' limits and how they hold.
func limitsReport(l room.Limits, s custody.Support) string {
	parts := []string{}
	if l.Memory > 0 {
		parts = append(parts, "memory "+room.FormatBytes(int64(l.Memory)))
	}
	if l.Pids > 0 {
		parts = append(parts, fmt.Sprintf("%d tasks", l.Pids))
	}
	if l.CPU > 0 {
		parts = append(parts, fmt.Sprintf("%g cores", l.CPU))
	}
	what := strings.Join(parts, ", ")
	if what == "" {
		what = "none"
	}
	if s.Enforced() {
		by := string(s.Memory)
		if s.Pids != s.Memory || s.CPU != s.Memory {
			// Mixed hierarchies (a controller in v2, another in v1).
			by = fmt.Sprintf("memory by %s, tasks by %s, CPU by %s", s.Memory, s.Pids, s.CPU)
		}
		return fmt.Sprintf("%s per room (%s, with an equal CPU share each)", what, by)
	}
	return fmt.Sprintf("%s per room, NOT enforced by cgroups: %s", what, s.Why)
}

// printLimits says at start what limits the rooms' processes.
func printLimits(w io.Writer, l room.Limits, s custody.Support) {
	fmt.Fprintf(w, "agenthost: room limits: %s\n", limitsReport(l, s))
}
