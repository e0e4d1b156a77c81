package room

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Cancel ends the room's running turn as cancelled.
func (m *Manager) Cancel(ctx context.Context, room string) error {
	if err := ValidateID(room); err != nil {
		return err
	}
	if ok, err := m.remote(ctx, room, ControlOp{Kind: ControlCancel}); ok {
		return err
	}
	return m.cancelLocal(ctx, room)
}

func (m *Manager) cancelLocal(ctx context.Context, room string) error {
	r, leave, err := m.enter(ctx, room, false)
	if err != nil {
		return err
	}
	defer leave()
	r.mu.Lock()
	t := r.turn
	r.mu.Unlock()
	if t == nil {
		return ErrNoTurn
	}
	t.cancel(errCancelled)
	return nil
}

// Release releases the room's agent (not while a turn runs).
func (m *Manager) Release(ctx context.Context, room string) error {
	if err := ValidateID(room); err != nil {
		return err
	}
	if ok, err := m.remote(ctx, room, ControlOp{Kind: ControlRelease}); ok {
		return err
	}
	return m.releaseLocal(ctx, room)
}

func (m *Manager) releaseLocal(ctx context.Context, room string) error {
	r, leave, err := m.enter(ctx, room, false)
	if err != nil {
		return err
	}
	defer leave()
	// A turn whose end is being written (its turn.ended may already be
	// read) is over: wait for its end, so that a release right after a
	// turn ended releases, rather than finding the room busy.
	r.mu.Lock()
	wait := r.endDone
	ending := r.ending
	r.mu.Unlock()
	if ending {
		if m.onReleaseWaits != nil {
			m.onReleaseWaits(room)
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	m.releaseIfIdle(r, "released on request", tokenOf(ctx))
	return nil
}

// Close begins the manager's shutdown and returns: it stops accepting
// messages and starting turns and agents and, on the manager's own
// goroutines, cancels running turns ("host shutting down"; their queued
// successors stay queued in the store for the next start) and releases
// every agent within ShutdownBudget, recording each receipt.
//
// Close never waits for user code (the Transport and its agents, the
// Store, Policy, RoomConfig, MCP, the Cluster), so it is safe to call from
// any of them; Wait joins the shutdown. Close is idempotent: every call
// returns the first one's result, nil, after Detach too.
func (m *Manager) Close() error {
	_ = m.begin(false)
	return nil
}

// Detach begins the manager's end for a planned restart and returns: like
// Close, except that agents that can outlive the host (Detachable, with a
// Handle) are let go of running, their turns left open in the store with
// the position their output was read to, their pending approvals and
// questions left pending; the next manager's Start attaches them (see
// Attacher) and continues those turns. A turn whose run ended before its
// agent was let go of is recorded as it ended; one whose agent never had
// the prompt is queued again; deliveries into a turn in flight end before
// its agent is let go of. Nothing starts meanwhile: the queues wait in the
// store for the next manager. Other agents are released as by Close. As Close, it is safe from any callback, and Wait joins it. A
// second Detach returns the first's result (nil); after Close it is
// ErrClosed, for the agents were not let go of.
func (m *Manager) Detach() error {
	return m.begin(true)
}

// Wait waits until the shutdown Close or Detach began is complete: every
// turn ended, every agent released (or let go of) and its receipt
// recorded, every goroutine of the manager gone. It returns the
// shutdown's error (turns still running after ShutdownBudget), or ctx's
// error first. It waits for Close or Detach to be called. Wait must not
// be called from a callback of the manager (a transport's agent, Policy,
// ...): it would wait for its own caller.
func (m *Manager) Wait(ctx context.Context) error {
	select {
	case <-m.joined:
		return m.shutErr
	case <-ctx.Done():
		err := fmt.Errorf("room: wait: %w", context.Cause(ctx))
		select {
		case <-m.released:
			return errors.Join(m.shutErr, err)
		default:
			return err
		}
	}
}

// begin starts Close's (detach false) or Detach's work on a goroutine of
// its own: never on the caller's, which may be a callback that work waits
// for. Only m.mu is taken, which is never held while user code runs.
func (m *Manager) begin(detach bool) error {
	m.mu.Lock()
	if m.closing {
		first := m.detaching
		m.mu.Unlock()
		if detach && !first {
			return ErrClosed
		}
		return nil
	}
	m.closing = true
	m.detaching = detach
	// Before any room is looked at: from here no turn, agent or delivery
	// starts (see Manager.stopping).
	m.stopping.Store(true)
	rooms := make([]*roomState, 0, len(m.rooms))
	for _, r := range m.rooms {
		rooms = append(rooms, r)
	}
	m.mu.Unlock()
	go m.shutdown(rooms, detach)
	return nil
}

// shutdown ends the turns and the agents; see Close and Detach.
func (m *Manager) shutdown(rooms []*roomState, detach bool) {
	defer close(m.joined)
	if detach {
		// Let go of the agents first: their turns' Run and Continue
		// return with nothing sent to the agent, and finishTurn leaves
		// those turns open for the next host (letGo).
		m.detachAll(rooms)
	}
	for _, r := range rooms {
		r.mu.Lock()
		// A turn whose run returned keeps the outcome the agent gave it:
		// cancelling it now would record a settled turn as cancelled.
		if t := r.turn; t != nil && !t.returned {
			cause := errShutdown
			if t.letGo {
				cause = errDetached
			}
			t.cancel(cause)
		}
		r.mu.Unlock()
	}
	m.wgMu.Lock()
	m.cancel()
	m.wgMu.Unlock()
	err := m.waitWorkers()
	if detach {
		// An agent started meanwhile is let go of too.
		m.detachAll(rooms)
	}
	// Workers are done (or out of budget): release every agent left,
	// all at once.
	var wg sync.WaitGroup
	for _, r := range rooms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Through the door, so that a purge in progress (which
			// releases the agent itself) is not raced to the agent and
			// its agent.released is never written after the room is
			// deleted; a door kept shut past the budget is not waited
			// for (the agent must go).
			ctx, cancel := context.WithTimeout(context.Background(), m.opts.ShutdownBudget)
			err := r.door.enter(ctx, false)
			cancel()
			m.release(r, "host shutting down")
			if err == nil {
				r.door.leave(false)
			}
		}()
	}
	wg.Wait()
	m.shutErr = err
	close(m.released)
	// A turn that outlived the budget is joined too (Wait's ctx bounds
	// the caller's wait for it).
	m.wg.Wait()
}

// detachAll lets go of every detachable agent, leaving it running; the
// room forgets it (the store keeps its handle for the next host). A
// turn running on it whose run has not returned is marked letGo: the next
// host continues it. Deliveries into that turn in flight end first
// (none begins once the manager stops), so that a message is never half
// delivered to an agent let go of.
func (m *Manager) detachAll(rooms []*roomState) {
	var wg sync.WaitGroup
	for _, r := range rooms {
		r.mu.Lock()
		d, ok := r.agent.(Detachable)
		r.mu.Unlock()
		if !ok || d.Handle() == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.mu.Lock()
			t := r.turn
			r.mu.Unlock()
			if t != nil {
				m.awaitDeliveries(r, t)
			}
			r.mu.Lock()
			if r.agent != d {
				// Released meanwhile (the turn failed).
				r.mu.Unlock()
				return
			}
			r.agent = nil
			if t := r.turn; t != nil && !t.returned {
				t.letGo = true
			}
			r.mu.Unlock()
			if err := d.Detach(); err != nil {
				m.log.Warn("room: letting go of the agent", "room", r.id, "err", err)
			}
			m.freeSlot()
		}()
	}
	wg.Wait()
}

// waitWorkers waits for the workers within ShutdownBudget.
func (m *Manager) waitWorkers() error {
	done := make(chan struct{})
	go func() {
		m.wg.Wait()
		close(done)
	}()
	t := time.NewTimer(m.opts.ShutdownBudget)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		return errors.New("room: close: turns still running after the shutdown budget")
	}
}
