package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/procd"
)

// serveHealth is what /healthz reports: the parts of the server that are
// down, by name (none: healthy). Safe for concurrent use.
type serveHealth struct {
	mu       sync.Mutex
	problems map[string]error
	checks   map[string]func() error // asked at each /healthz
}

// check makes part's health fn's answer at each /healthz.
func (h *serveHealth) check(part string, fn func() error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.checks == nil {
		h.checks = map[string]func() error{}
	}
	h.checks[part] = fn
}

func (h *serveHealth) set(part string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.problems == nil {
		h.problems = map[string]error{}
	}
	h.problems[part] = err
}

func (h *serveHealth) clear(part string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.problems, part)
}

// err is nil when healthy, else every problem, by part.
func (h *serveHealth) err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	parts := make([]string, 0, len(h.problems))
	for p, err := range h.problems {
		parts = append(parts, p+": "+err.Error())
	}
	for p, fn := range h.checks {
		if err := fn(); err != nil {
			parts = append(parts, p+": "+err.Error())
		}
	}
	if len(parts) == 0 {
		return nil
	}
	sort.Strings(parts)
	return errors.New(strings.Join(parts, "; "))
}

// healthNATS names the embedded NATS node's entry in serveHealth.
const healthNATS = "nats"

// healthDaemon names the process daemon's entry in serveHealth.
const healthDaemon = "process daemon"

// Bounds of replacing a process daemon that died: attempts from
// reownRetryMin doubling to reownRetryMax apart, for reownBudget in all;
// then serve exits non-zero for a supervisor to restart it.
const (
	reownRetryMin = 100 * time.Millisecond
	reownRetryMax = 5 * time.Second
	reownBudget   = 2 * time.Minute
)

// watchDaemon watches the process daemon under serve --daemon until ctx
// ends (shutdown, or a planned restart about to hand the daemon over).
// When the daemon dies (its agents die with it: their running turns fail
// with that reason, and the rooms start new agents for what comes next)
// it reaps what the dead daemon left, owns a fresh daemon (Reown; the
// rooms' next agents start there), and /healthz says unhealthy
// meanwhile. It returns an error when no daemon could be had within
// reownBudget.
func watchDaemon(ctx context.Context, pd *procd.Client, health *serveHealth, log *slog.Logger) error {
	// The followers of dead daemons' trees end when this returns at the
	// latest.
	var followers sync.WaitGroup
	defer followers.Wait()
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	for {
		done := pd.Done()
		select {
		case <-ctx.Done():
			return nil
		case <-done:
		}
		if ctx.Err() != nil {
			return nil
		}
		dead := pd.PID()
		log.Error("the process daemon ended, and the rooms' agents with it; starting a new one", "daemon_pid", dead)
		health.set(healthDaemon, errors.New("the process daemon ended; a new one is starting"))
		// What the dead daemon left exits at any time from now on (see
		// daemonTree): followed until it is all collected.
		tree := reapDaemon(ctx, dead, log)
		followers.Go(func() { tree.follow(fctx, log) })
		if err := reown(ctx, pd, log); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			health.set(healthDaemon, fmt.Errorf("no process daemon: %w", err))
			return fmt.Errorf("the process daemon ended and no new one could be started: %w", err)
		}
		health.clear(healthDaemon)
		log.Info("a new process daemon runs the agents", "daemon_pid", pd.PID())
	}
}

// reown calls Reown until it succeeds, ctx ends or reownBudget passed.
func reown(ctx context.Context, pd *procd.Client, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, reownBudget)
	defer cancel()
	wait := reownRetryMin
	for {
		err := pd.Reown(ctx)
		if err == nil {
			return nil
		}
		log.Warn("starting a new process daemon failed; retrying", "err", err, "in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, reownRetryMax)
	}
}

// reapDaemon collects what a dead daemon leaves this server at once and
// returns its tree, to follow for what exits later: the server is a
// child subreaper and the daemon its child (through the detaching start),
// so the daemon and every process it ran that exited become the server's
// zombies, and those still running its orphans. The daemon is collected
// first (its children are ours from then on), then the orphans are ended
// (custody's marker names the dead daemon as their host) and collected,
// then the tree's zombies.
func reapDaemon(ctx context.Context, pid int, log *slog.Logger) *daemonTree {
	tree := newDaemonTree(pid) // before the daemon is collected: its start time names its tree
	reapDeadChild(ctx, pid)
	if orphans, err := custody.FindOrphans(); err == nil && len(orphans) > 0 {
		kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		left, kerr := custody.KillOrphans(kctx, orphans, time.Second)
		cancel()
		if kerr != nil {
			log.Warn("ending what the dead process daemon left", "found", len(orphans), "still_running", len(left), "err", kerr)
		} else {
			log.Info("ended what the dead process daemon left", "ended", len(orphans))
		}
	}
	if n := tree.collect(); n > 0 {
		log.Info("collected the dead process daemon's exited processes", "count", n)
	}
	return tree
}
