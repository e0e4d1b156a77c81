//go:build linux

package procd

import (
	"errors"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/custody"
)

// Protocol 10: a pipe process is started with limits (its custody scope
// holds them where the daemon's custodian can), and usage reads what its
// scope used; a daemon of protocol 9 takes no limits (the process runs,
// ProcessInfo says none) and has no usage.
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
