//go:build linux

package procd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// ownDaemon makes a data dir and its first owner.
func ownDaemon(t *testing.T, flags ...string) (string, *Client) {
	t.Helper()
	dir := t.TempDir()
	o, err := Own(testCtx(t), dir, testOpts(flags...))
	if err != nil {
		t.Fatalf("Own: %v", err)
	}
	t.Cleanup(func() {
		o.Close()
		stopDaemon(t, dir)
	})
	if o.Claimed() || !o.Owner() {
		t.Fatalf("a fresh daemon: claimed %v owner %v", o.Claimed(), o.Owner())
	}
	return dir, o
}

func TestHandoff_Claimed(t *testing.T) {
	t.Parallel()
	dir, o1 := ownDaemon(t)
	ctx := testCtx(t)
	info, err := o1.CreatePipe(ctx, pipeSpec(t, `while read l; do echo "$l"; done`))
	if err != nil {
		t.Fatal(err)
	}
	// A second owner is refused while the first is connected.
	if _, err := Own(ctx, dir, testOpts()); !errors.Is(err, ErrOwned) {
		t.Fatalf("second owner: %v", err)
	}
	// A plain client may not prepare a handoff.
	plain, err := Connect(ctx, dir, testOpts())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.PrepareHandoff(ctx); !errors.Is(err, ErrForbidden) {
		t.Fatalf("plain client's handoff: %v", err)
	}
	tk, err := o1.PrepareHandoff(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(procdDir(dir), ticketFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ticket file: %v %v", fi, err)
	}
	if tk.InstanceID != o1.InstanceID() || time.Until(tk.ExpiresAt) > HandoffTTL {
		t.Fatalf("ticket: %+v", tk)
	}
	// The old owner leaves (the host exits for its restart).
	o1.Close()
	o2, err := Own(ctx, dir, testOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer o2.Close()
	if !o2.Claimed() || o2.InstanceID() != o1.InstanceID() || o2.HandoffErr() != nil {
		t.Fatalf("claim: claimed %v instance %s/%s err %v", o2.Claimed(), o2.InstanceID(), o1.InstanceID(), o2.HandoffErr())
	}
	// The process ran on, and takes input from the new owner.
	if err := o2.Write(ctx, info.ID, []byte("after\n")); err != nil {
		t.Fatal(err)
	}
	if l := outputLines(t, o2, info.ID, 1); l[0] != "after" {
		t.Fatalf("output %q", l)
	}
	// The ticket is spent.
	if _, err := os.Stat(filepath.Join(procdDir(dir), ticketFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ticket file after the claim: %v", err)
	}
	// A stale ticket while an owner is connected and no handoff pending:
	// refused, and the live owner's daemon is left alone.
	stale := tk
	stale.Ticket = "stale"
	if err := writeJSON(filepath.Join(procdDir(dir), ticketFile), stale); err != nil {
		t.Fatal(err)
	}
	if _, err := Own(ctx, dir, testOpts()); !errors.Is(err, ErrOwned) {
		t.Fatalf("own with a stale ticket beside a live owner: %v", err)
	}
	if got, err := o2.Get(ctx, info.ID); err != nil || !got.Running {
		t.Fatalf("the live owner's process after a stale claim: %+v %v", got, err)
	}
	// A new owner with a fresh ticket cuts the old one off.
	if _, err := o2.PrepareHandoff(ctx); err != nil {
		t.Fatal(err)
	}
	o3, err := Own(ctx, dir, testOpts())
	if err != nil || !o3.Claimed() {
		t.Fatalf("third owner: %v", err)
	}
	defer o3.Close()
	select {
	case <-o2.Done():
	case <-ctx.Done():
		t.Fatal("the old owner was not cut off")
	}
	if _, err := o3.Get(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
}

// TestHandoff_Failed: a ticket the daemon refuses (here: a forged one)
// ends the old daemon with its processes, and Own starts fresh.
func TestHandoff_Failed(t *testing.T) {
	t.Parallel()
	dir, o1 := ownDaemon(t)
	ctx := testCtx(t)
	info, err := o1.CreatePipe(ctx, pipeSpec(t, `exec sleep 300`))
	if err != nil {
		t.Fatal(err)
	}
	tk, err := o1.PrepareHandoff(ctx)
	if err != nil {
		t.Fatal(err)
	}
	o1.Close()
	tk.Ticket = "forged"
	if err := writeJSON(filepath.Join(procdDir(dir), ticketFile), tk); err != nil {
		t.Fatal(err)
	}
	o2, err := Own(ctx, dir, testOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer o2.Close()
	if o2.Claimed() || !errors.Is(o2.HandoffErr(), ErrHandoff) || o2.InstanceID() == o1.InstanceID() {
		t.Fatalf("claimed %v handoffErr %v instance %s", o2.Claimed(), o2.HandoffErr(), o2.InstanceID())
	}
	if pidAlive(info.PID) {
		t.Fatalf("the old daemon's process %d still runs", info.PID)
	}
	if rs := o2.OldReceipts(); len(rs) != 1 || len(rs[0].Processes) == 0 || rs[0].Processes[0].PID != info.PID {
		t.Fatalf("receipts of the old daemon: %+v", rs)
	}
	if ps, err := o2.List(ctx, ModePipe); err != nil || len(ps) != 0 {
		t.Fatalf("fresh daemon's list: %+v %v", ps, err)
	}
}

// TestHandoff_Expired: a handoff nobody claims ends the daemon and its
// processes on its own; the next Own, with the stale ticket, starts fresh.
func TestHandoff_Expired(t *testing.T) {
	t.Parallel()
	dir, o1 := ownDaemon(t, "--handoff-ttl", "300ms")
	ctx := testCtx(t)
	info, err := o1.CreatePipe(ctx, pipeSpec(t, `exec sleep 300`))
	if err != nil {
		t.Fatal(err)
	}
	tk, err := o1.PrepareHandoff(ctx)
	if err != nil {
		t.Fatal(err)
	}
	o1.Close()
	if err := waitGone(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if pidAlive(info.PID) {
		t.Fatalf("process %d outlived the expired handoff", info.PID)
	}
	// The stale ticket (as a crashed host might leave it) is refused.
	if err := writeJSON(filepath.Join(procdDir(dir), ticketFile), tk); err != nil {
		t.Fatal(err)
	}
	o2, err := Own(ctx, dir, testOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer o2.Close()
	if o2.Claimed() || o2.HandoffErr() == nil || o2.InstanceID() == tk.InstanceID {
		t.Fatalf("claimed %v handoffErr %v", o2.Claimed(), o2.HandoffErr())
	}
}

// TestOwner_LeavesWithoutHandoff: the owner's connection closing (a crash,
// or a stop) ends every process and the daemon.
func TestOwner_LeavesWithoutHandoff(t *testing.T) {
	t.Parallel()
	dir, o1 := ownDaemon(t)
	ctx := testCtx(t)
	info, err := o1.CreatePipe(ctx, pipeSpec(t, `sleep 300 & exec sleep 301`))
	if err != nil {
		t.Fatal(err)
	}
	o1.Close()
	if err := waitGone(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if pidAlive(info.PID) {
		t.Fatalf("process %d outlived its owner", info.PID)
	}
	if _, err := os.Stat(filepath.Join(procdDir(dir), serviceFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("registration left behind: %v", err)
	}
}

// TestUnowned_UnattendedEnded: without an owner, a process nobody looks
// after is ended after the bound, and the idle daemon exits.
func TestUnowned_UnattendedEnded(t *testing.T) {
	t.Parallel()
	dir, c := startDaemon(t, "--unattended", "1s", "--idle", "1s")
	ctx := testCtx(t)
	info, err := c.CreatePipe(ctx, pipeSpec(t, `exec sleep 300`))
	if err != nil {
		t.Fatal(err)
	}
	if err := waitGone(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if pidAlive(info.PID) {
		t.Fatalf("unattended process %d still runs", info.PID)
	}
}

// TestUnowned_WatchedKept: a process someone waits on is attended.
func TestUnowned_WatchedKept(t *testing.T) {
	t.Parallel()
	// The default idle exit: a daemon idle for 1 s could end before the
	// first request on a loaded machine.
	_, c := startDaemon(t, "--unattended", "500ms")
	ctx := testCtx(t)
	info, err := c.CreatePipe(ctx, pipeSpec(t, `sleep 2; exit 4`))
	if err != nil {
		t.Fatal(err)
	}
	exit, err := c.Wait(ctx, info.ID)
	if err != nil || exit.Code != 4 {
		t.Fatalf("a waited-on process past the bound: %+v %v", exit, err)
	}
}

// TestConnect_Concurrent: clients racing to start the daemon of one data
// dir all end up with the same one.
func TestConnect_Concurrent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	t.Cleanup(func() { stopDaemon(t, dir) })
	ctx := testCtx(t)
	ids := make(chan string, 4)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			c, err := Connect(ctx, dir, testOpts())
			if err != nil {
				errs <- err
				return
			}
			ids <- c.InstanceID()
		}()
	}
	seen := map[string]bool{}
	for range 4 {
		select {
		case id := <-ids:
			seen[id] = true
		case err := <-errs:
			t.Fatal(err)
		}
	}
	if len(seen) != 1 {
		t.Fatalf("%d daemons for one data dir: %v", len(seen), seen)
	}
}

// A daemon that holds its data dir but does not answer the claim for a
// while (stopped, swapping) is waited for while the ticket is valid, and
// claimed with its processes. (The first unanswered ping made Own shut
// it down: its agents ended, the restart's turn failed.) The daemon is
// stopped for a second, several claim attempts long.
func TestHandoff_SlowDaemonWaitedFor(t *testing.T) {
	t.Parallel()
	dir, o1 := ownDaemon(t)
	ctx := testCtx(t)
	info, err := o1.CreatePipe(ctx, pipeSpec(t, `exec cat`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o1.PrepareHandoff(ctx); err != nil {
		t.Fatal(err)
	}
	o1.Close()
	pid := o1.PID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	resumed := make(chan struct{})
	go func() {
		defer close(resumed)
		time.Sleep(time.Second) // how long the daemon stalls: the fault under test
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}()
	opts := testOpts()
	opts.PingTimeout = 100 * time.Millisecond
	o2, err := Own(ctx, dir, opts)
	<-resumed
	if err != nil {
		t.Fatal(err)
	}
	defer o2.Close()
	if !o2.Claimed() || o2.InstanceID() != o1.InstanceID() || o2.HandoffErr() != nil {
		t.Fatalf("claimed %v, instance %s (was %s), handoff error %v: the slow daemon should have been claimed",
			o2.Claimed(), o2.InstanceID(), o1.InstanceID(), o2.HandoffErr())
	}
	if got, err := o2.Get(ctx, info.ID); err != nil || !got.Running {
		t.Fatalf("the process after the claim: %+v %v", got, err)
	}
}

// An owner whose daemon died (kill -9) owns a fresh one with Reown; a
// request made while it is gone waits for it, and Done is the new
// connection's.
func TestOwner_ReownAfterTheDaemonDied(t *testing.T) {
	t.Parallel()
	_, o := ownDaemon(t)
	ctx := testCtx(t)
	if _, err := o.CreatePipe(ctx, pipeSpec(t, `exec cat`)); err != nil {
		t.Fatal(err)
	}
	old, done := o.InstanceID(), o.Done()
	if err := syscall.Kill(o.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("Done not closed when the daemon died")
	}
	listed := make(chan error, 1)
	go func() {
		ps, err := o.List(ctx, ModePipe)
		if err == nil && len(ps) != 0 {
			err = fmt.Errorf("a fresh daemon lists %d processes", len(ps))
		}
		listed <- err
	}()
	if err := o.Reown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-listed; err != nil {
		t.Fatalf("a request made while the daemon was gone: %v", err)
	}
	if o.InstanceID() == old || o.Claimed() || isClosed(o.Done()) {
		t.Fatalf("after Reown: instance %s (was %s), claimed %v, done %v", o.InstanceID(), old, o.Claimed(), isClosed(o.Done()))
	}
	if _, err := o.CreatePipe(ctx, pipeSpec(t, `exec cat`)); err != nil {
		t.Fatal(err)
	}
	if err := o.Reown(ctx); !errors.Is(err, ErrOwned) {
		t.Fatalf("Reown with the owner connection up: %v", err)
	}
}
