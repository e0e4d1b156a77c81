//go:build linux

package procd

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/custody"
)

// Protocol 10: a pipe process is started with limits (its custody scope
// holds them where the daemon's custodian can), and usage reads what its
// scope used; a daemon of protocol 9 takes no limits (the process runs,
// ProcessInfo says none) and has no usage. Where the host has the cgroups,
// the daemon's scope enforces them: an allocation past the memory limit
// is killed, forks past the tasks limit refused, and usage counts both.
func TestLimits_CreatePipeAndUsage(t *testing.T) {
	t.Parallel()
	lim := &custody.Limits{Memory: 64 << 20, Pids: 32}
	t.Run("protocol 10", func(t *testing.T) {
		t.Parallel()
		_, c := startDaemon(t)
		ctx := testCtx(t)
		spec := pipeSpec(t, `head -c 4 /dev/zero | wc -c; exec cat`)
		spec.Limits = lim
		info, err := c.CreatePipe(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if info.Limits == nil || *info.Limits != *lim {
			t.Fatalf("the process's limits: %+v", info.Limits)
		}
		outputLines(t, c, info.ID, 1)
		u, err := c.Usage(ctx, info.ID, true)
		if err != nil {
			t.Fatal(err)
		}
		// The shell, head, wc and cat (those the looks caught).
		if u.Processes < 1 {
			t.Fatalf("usage %+v", u)
		}
		if _, err := c.Terminate(ctx, info.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Usage(ctx, info.ID, false); !errors.Is(err, ErrNotFound) {
			t.Fatalf("usage of a terminated process: %v", err)
		}
	})
	t.Run("enforced", func(t *testing.T) {
		t.Parallel()
		cu, err := custody.New(custody.Options{Resources: true, NoSubreaper: true})
		if err != nil {
			t.Fatal(err)
		}
		s := cu.Support()
		if err := cu.Close(); err != nil {
			t.Fatal(err)
		}
		if !s.Enforced() {
			t.Skipf("limits are not enforced by cgroups here: %s", s.Why)
		}
		_, c := startDaemon(t)
		ctx := testCtx(t)
		// tail keeps the last 200 MiB of a pipe in memory: killed at
		// 64 MiB. Then 64 sleeps under 32 tasks: forks refused (the
		// subshell that forks them ends at the first, the script goes on).
		spec := pipeSpec(t, `head -c 256m /dev/zero | tail -c 200m | wc -c; echo tail-done; `+
			`(for i in $(seq 64); do sleep 30 & done) 2>/dev/null; echo forks-done; exec cat`)
		spec.Limits = lim
		info, err := c.CreatePipe(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		var out []byte
		waitFor(t, "the script's end", func() bool {
			out, _ = os.ReadFile(spec.OutputPath)
			return strings.Contains(string(out), "forks-done\n")
		})
		u, err := c.Usage(ctx, info.ID, false)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("usage %+v; output %q", u, out)
		if !u.Metered || u.OOMKills < 1 || u.ForksRefused < 1 || u.PeakMemory > lim.Memory+1<<20 || u.PeakMemory < lim.Memory/2 {
			t.Fatalf("the daemon's scope under %+v: usage %+v", *lim, u)
		}
		if _, err := c.Terminate(ctx, info.ID); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("protocol 9", func(t *testing.T) {
		t.Parallel()
		_, c := startDaemon(t, "--protocols", "8-9")
		ctx := testCtx(t)
		if c.Protocol() != 9 {
			t.Fatalf("protocol %d", c.Protocol())
		}
		spec := pipeSpec(t, `echo up; exec cat`)
		spec.Limits = lim
		info, err := c.CreatePipe(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if info.Limits != nil {
			t.Fatalf("a protocol 9 daemon's process has limits %+v", info.Limits)
		}
		if _, err := c.Usage(ctx, info.ID, false); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "protocol 10") {
			t.Fatalf("usage from a protocol 9 daemon: %v", err)
		}
		if _, err := c.Terminate(ctx, info.ID); err != nil {
			t.Fatal(err)
		}
	})
}
