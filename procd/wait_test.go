//go:build linux

package procd

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

func TestWait_SeveralWaitersAndDisconnect(t *testing.T) {
	t.Parallel()
	_, c := startDaemon(t)
	ctx := testCtx(t)
	info, err := c.CreatePipe(ctx, pipeSpec(t, `read x; exit 7`))
	if err != nil {
		t.Fatal(err)
	}
	// A waiter whose client goes away: the daemon notices, nothing breaks.
	gctx, gcancel := context.WithCancel(ctx)
	gerr := make(chan error, 1)
	go func() { _, err := c.Wait(gctx, info.ID); gerr <- err }()
	var wg sync.WaitGroup
	exits := make([]Exit, 3)
	errs := make([]error, 3)
	for i := range exits {
		wg.Add(1)
		go func() { defer wg.Done(); exits[i], errs[i] = c.Wait(ctx, info.ID) }()
	}
	// Every waiter is registered before the process may exit.
	watchers(t, c, info.ID, 4)
	gcancel()
	if err := <-gerr; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	// The daemon saw that client go.
	watchers(t, c, info.ID, 3)
	if err := c.Write(ctx, info.ID, []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i := range exits {
		if errs[i] != nil || exits[i].Code != 7 {
			t.Errorf("waiter %d: %+v %v", i, exits[i], errs[i])
		}
	}
}

func TestWait_TerminatedFirst(t *testing.T) {
	t.Parallel()
	_, c := startDaemon(t)
	ctx := testCtx(t)
	info, err := c.CreatePipe(ctx, pipeSpec(t, `exec sleep 300`))
	if err != nil {
		t.Fatal(err)
	}
	werr := make(chan error, 1)
	go func() { _, err := c.Wait(ctx, info.ID); werr <- err }()
	watchers(t, c, info.ID, 1)
	rec, err := c.Terminate(ctx, info.ID)
	if err != nil || rec == nil || len(rec.Processes) == 0 {
		t.Fatalf("terminate: %+v %v", rec, err)
	}
	if err := <-werr; !errors.Is(err, ErrTerminated) {
		t.Fatalf("wait: %v, want ErrTerminated", err)
	}
	// Every request on the id is refused now, signal included.
	if err := c.Signal(ctx, info.ID, SigKill); !errors.Is(err, ErrNotFound) {
		t.Fatalf("signal after terminate: %v", err)
	}
	if _, err := c.Wait(ctx, info.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("wait after terminate: %v", err)
	}
}

// TestWait_TerminateRace runs wait and terminate side by side many times:
// every wait ends with an exit, "terminated" or "not found", never hangs.
func TestWait_TerminateRace(t *testing.T) {
	t.Parallel()
	_, c := startDaemon(t)
	ctx := testCtx(t)
	for i := range 8 {
		info, err := c.CreatePipe(ctx, pipeSpec(t, `exit `+strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var werr, terr error
		var exit Exit
		wg.Add(3)
		go func() { defer wg.Done(); exit, werr = c.Wait(ctx, info.ID) }()
		go func() { defer wg.Done(); _, terr = c.Terminate(ctx, info.ID) }()
		go func() { defer wg.Done(); _ = c.Signal(ctx, info.ID, SigKill) }()
		wg.Wait()
		if terr != nil {
			t.Fatalf("terminate: %v", terr)
		}
		switch {
		case werr == nil:
			// Its own exit, or the KILL sent beside it.
			if exit.Code != i && exit.Signal != "KILL" {
				t.Fatalf("exit %+v, want code %d or KILL", exit, i)
			}
		case errors.Is(werr, ErrTerminated), errors.Is(werr, ErrNotFound):
		default:
			t.Fatalf("wait: %v", werr)
		}
	}
}

func TestWait_Shutdown(t *testing.T) {
	t.Parallel()
	dir, c := startDaemon(t)
	ctx := testCtx(t)
	info, err := c.CreatePipe(ctx, pipeSpec(t, `exec sleep 300`))
	if err != nil {
		t.Fatal(err)
	}
	werr := make(chan error, 1)
	go func() { _, err := c.Wait(ctx, info.ID); werr <- err }()
	watchers(t, c, info.ID, 1)
	rs, err := c.Shutdown(ctx)
	if err != nil || len(rs) != 1 {
		t.Fatalf("shutdown: %+v %v", rs, err)
	}
	if err := <-werr; !errors.Is(err, ErrShuttingDown) {
		t.Fatalf("wait across shutdown: %v", err)
	}
	if err := waitGone(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if pidAlive(info.PID) {
		t.Fatalf("pid %d still runs after shutdown", info.PID)
	}
}

func TestSignal_WholeGroupKeepsRecord(t *testing.T) {
	t.Parallel()
	_, c := startDaemon(t)
	ctx := testCtx(t)
	// A background child in the same group, and a leader that traps TERM
	// (a handler, not an ignore, which the child would inherit). The child
	// says its pid itself, after an exec (which resets the inherited
	// handler): a pid said by the leader ($!) can reach the test before the
	// forked child dropped the trap, and a TERM then runs the trap in it.
	info, err := c.CreatePipe(ctx, pipeSpec(t, `trap 'echo trapped' TERM; sh -c 'echo $$; exec sleep 300' & wait; exit 5`))
	if err != nil {
		t.Fatal(err)
	}
	bg, _ := strconv.Atoi(outputLines(t, c, info.ID, 1)[0])
	if err := c.Signal(ctx, info.ID, Signal("HUP")); !errors.Is(err, ErrInvalid) {
		t.Fatalf("HUP: %v", err)
	}
	if err := c.Signal(ctx, info.ID, SigTerm); err != nil {
		t.Fatal(err)
	}
	// TERM reached the background sleep (the group) and the leader,
	// whose trap ran; it then exits on its own.
	exit, err := c.Wait(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if exit.Signal != "" || exit.Code != 5 || exit.OutputLines != 2 {
		t.Fatalf("the leader should trap TERM and exit 5: %+v", exit)
	}
	waitFor(t, "the background child to die", func() bool { return !pidAlive(bg) })
	// The record is kept after the exit: get and signal still work.
	if _, err := c.Get(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.Signal(ctx, info.ID, SigKill); err != nil {
		t.Fatalf("signal after exit, before terminate: %v", err)
	}

	info2, err := c.CreatePipe(ctx, pipeSpec(t, `exec sleep 300`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Signal(ctx, info2.ID, SigKill); err != nil {
		t.Fatal(err)
	}
	exit, err = c.Wait(ctx, info2.ID)
	if err != nil || exit.Signal != "KILL" || exit.Code != 128+int(syscall.SIGKILL) {
		t.Fatalf("killed: %+v %v", exit, err)
	}
}

func TestSetMetadata(t *testing.T) {
	t.Parallel()
	_, c := startDaemon(t)
	ctx := testCtx(t)
	info, err := c.CreatePipe(ctx, pipeSpec(t, `exec sleep 300`))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetMetadata(ctx, info.ID, json.RawMessage(`{"offset":42}`)); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, info.ID)
	if err != nil || string(got.Metadata) != `{"offset":42}` {
		t.Fatalf("get: %s %v", got.Metadata, err)
	}
	big := json.RawMessage(`"` + strings.Repeat("a", MaxMetadata-1) + `"`)
	if err := c.SetMetadata(ctx, info.ID, big); !errors.Is(err, ErrInvalid) {
		t.Fatalf("1 MiB + 1 of metadata: %v", err)
	}
	if err := c.SetMetadata(ctx, info.ID, big[1:]); !errors.Is(err, ErrInvalid) {
		// Not JSON: refused by the client's encoder or the daemon.
		t.Logf("invalid JSON metadata: %v", err)
	}
}

func TestTerminate_TreeGone(t *testing.T) {
	t.Parallel()
	_, c := startDaemon(t)
	ctx := testCtx(t)
	// A background child, a setsid'd child in its own session, and a
	// double-forked one that the shell no longer knows.
	info, err := c.CreatePipe(ctx, pipeSpec(t, `sleep 301 </dev/null >/dev/null 2>&1 & echo $!
setsid sleep 302 </dev/null >/dev/null 2>&1 & echo $!
(setsid sleep 303 </dev/null >/dev/null 2>&1 & echo $!) 
exec sleep 300`))
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, l := range outputLines(t, c, info.ID, 3) {
		p, err := strconv.Atoi(l)
		if err != nil {
			t.Fatalf("pid line %q", l)
		}
		pids = append(pids, p)
	}
	rec, err := c.Terminate(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	owned := map[int]bool{}
	for _, e := range rec.Processes {
		owned[e.PID] = true
	}
	for _, p := range append(pids, info.PID) {
		if !owned[p] {
			t.Errorf("pid %d not on the receipt %s", p, rec)
		}
		if pidAlive(p) {
			t.Errorf("pid %d still runs after terminate", p)
		}
	}
}
