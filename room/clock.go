package room

import (
	"context"
	"errors"
	"sync"
	"time"
)

var (
	// errTurnDeadline and errStalled end a turn as timed_out.
	errTurnDeadline = errors.New("the turn ran past its deadline")
	errStalled      = errors.New("the agent sent nothing for too long")
)

// clock enforces a turn's deadline and the agent's liveness. Both stop
// while the turn waits on a person (pause/resume), so an approval that
// takes ten minutes costs the turn nothing.
type clock struct {
	mu        sync.Mutex
	turnLimit time.Duration
	liveLimit time.Duration
	used      time.Duration // active time before the current period
	since     time.Time     // start of the current active period
	last      time.Time     // last sign of life
	paused    int
	kick      chan struct{}
}

func newClock(turnLimit, liveLimit time.Duration) *clock {
	now := time.Now()
	return &clock{turnLimit: turnLimit, liveLimit: liveLimit, since: now, last: now, kick: make(chan struct{}, 1)}
}

// activity records a sign of life.
func (c *clock) activity() {
	c.mu.Lock()
	c.last = time.Now()
	c.mu.Unlock()
}

func (c *clock) pause() {
	c.mu.Lock()
	if c.paused == 0 {
		c.used += time.Since(c.since)
	}
	c.paused++
	c.mu.Unlock()
	c.poke()
}

func (c *clock) resume() {
	c.mu.Lock()
	c.paused--
	if c.paused == 0 {
		now := time.Now()
		c.since, c.last = now, now
	}
	c.mu.Unlock()
	c.poke()
}

func (c *clock) poke() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// left returns how long until a limit is reached (or the limit reached),
// and whether the clock is paused.
func (c *clock) left() (time.Duration, error, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.paused > 0 {
		return 0, nil, true
	}
	now := time.Now()
	turn := c.turnLimit - c.used - now.Sub(c.since)
	live := c.liveLimit - now.Sub(c.last)
	switch {
	case turn <= 0:
		return 0, errTurnDeadline, false
	case live <= 0:
		return 0, errStalled, false
	}
	return min(turn, live), nil, false
}

// watch cancels the turn when a limit is reached; it returns when ctx
// ends.
func (c *clock) watch(ctx context.Context, cancel context.CancelCauseFunc) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wait, expired, paused := c.left()
		if expired != nil {
			cancel(expired)
			return
		}
		var fire <-chan time.Time
		if !paused {
			timer.Reset(wait)
			fire = timer.C
		}
		select {
		case <-fire:
		case <-c.kick:
			timer.Stop()
		case <-ctx.Done():
			return
		}
	}
}
