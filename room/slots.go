package room

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/agenthost/agenthost/event"
)

// errNoSlot ends a turn as timed_out when no agent slot came free within
// its turn timeout.
var errNoSlot = errors.New("no agent slot came free")

// Agent slots (Options.MaxResident). A turn whose room has no agent takes
// a free slot, or the slot of the least recently used idle room (whose
// agent it releases); failing both it waits in line (turns are served in
// the order they started waiting) and is woken whenever a slot frees or a
// resident room goes idle. A room between two turns of its queue is busy,
// not idle: busy rooms never evict each other. The turn's clocks stop
// while it waits (no agent runs for it, so none is silent) and a
// turn.waiting event says so; the wait has its own bound, the turn's
// timeout, after which the turn ends timed_out with errNoSlot.

// acquireSlot returns once self holds an agent slot, or with an error
// when ctx ends or the wait runs out.
func (m *Manager) acquireSlot(ctx context.Context, self *roomState) error {
	self.mu.Lock()
	t := self.turn
	cfg, _ := m.configLocked(self) // validated at Submit
	self.mu.Unlock()
	var bound <-chan time.Time
	inLine := false
	leaveLocked := func() {
		m.slotQ = slices.DeleteFunc(m.slotQ, func(r *roomState) bool { return r == self })
	}
	defer func() {
		if !inLine {
			return
		}
		m.mu.Lock()
		leaveLocked()
		m.mu.Unlock()
		m.slotWake.signal() // the next in line looks again
		if t != nil {
			t.clock.resume()
		}
	}()
	for {
		wake := m.slotWake.wait()
		m.mu.Lock()
		first := len(m.slotQ) == 0 || m.slotQ[0] == self
		if first && m.resident < m.opts.MaxResident {
			m.resident++
			leaveLocked()
			m.mu.Unlock()
			return nil
		}
		var victim *roomState
		var a Agent
		if first {
			victim, a = m.evictLocked(self)
		}
		if victim != nil {
			leaveLocked()
		} else if !slices.Contains(m.slotQ, self) {
			m.slotQ = append(m.slotQ, self)
		}
		resident := m.resident
		m.mu.Unlock()
		if victim != nil {
			m.slotWake.signal() // the next in line looks again
			// The victim's slot passes to self once its agent is gone.
			m.closeAgent(victim, a, "evicted: max resident reached", false)
			victim.door.leave(false)
			return nil
		}
		if !inLine {
			inLine = true
			timer := time.NewTimer(cfg.TurnTimeout)
			defer timer.Stop()
			bound = timer.C
			if t != nil {
				t.clock.pause()
				err := m.write(func(tx Tx) error {
					_, err := appendEvent(tx, self.id, event.TurnWaiting{
						TurnID: t.id, MessageID: t.messageID, Slots: m.opts.MaxResident, Resident: resident,
					})
					return err
				})
				if err != nil {
					m.log.Error("room: recording that a turn waits for an agent slot", "room", self.id, "err", err)
				}
			}
		}
		select {
		case <-wake:
		case <-bound:
			err := fmt.Errorf("%w in %s (%d agents resident, %d slots)", errNoSlot, cfg.TurnTimeout, resident, m.opts.MaxResident)
			if t != nil {
				t.cancel(err)
			}
			return err
		case <-ctx.Done():
			return fmt.Errorf("waiting for an agent slot (%d resident): %w", m.opts.MaxResident, context.Cause(ctx))
		}
	}
}

// evictLocked takes the agent of the least recently used idle room other
// than self (m.mu held), or returns nil when no room is idle. The victim
// is taken through its door (passed by when busy: a purge releases its
// agent itself), which the caller leaves once the agent is released.
func (m *Manager) evictLocked(self *roomState) (*roomState, Agent) {
	busy := map[*roomState]bool{}
	for {
		var victim *roomState
		var used time.Time
		for _, r := range m.rooms {
			if r == self || busy[r] {
				continue
			}
			r.mu.Lock()
			if r.idleLocked() && (victim == nil || r.lastUsed.Before(used)) {
				victim, used = r, r.lastUsed
			}
			r.mu.Unlock()
		}
		if victim == nil {
			return nil, nil
		}
		if !victim.door.tryEnter() {
			busy[victim] = true
			continue
		}
		if a := victim.takeAgent((*roomState).idleLocked); a != nil {
			return victim, a
		}
		victim.door.leave(false)
		// It got busy meanwhile: look again.
	}
}

// takeAgent takes the room's agent away when ok says so (under r.mu), so
// that a turn starting meanwhile keeps it.
func (r *roomState) takeAgent(ok func(*roomState) bool) Agent {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.agent == nil || ok != nil && !ok(r) {
		return nil
	}
	a := r.agent
	r.agent = nil
	return a
}

// Resident is how many agent slots are held (rooms' agents running or
// starting): a transport's warm pool keeps its own agents within
// MaxResident with it.
func (m *Manager) Resident() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.resident
}

func (m *Manager) freeSlot() {
	m.mu.Lock()
	m.resident--
	m.mu.Unlock()
	m.slotWake.signal()
}
