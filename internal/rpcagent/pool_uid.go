package rpcagent

import (
	"fmt"
	"path/filepath"

	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/slotuid"
	"github.com/agenthost/agenthost/internal/warmpool"
	"github.com/agenthost/agenthost/room"
)

// The warm pool as root, where each room's agent runs as a uid of its own
// (confine.Confiner.RoomUser): a slot's agent runs as a uid of its own
// (confine.Confiner.SlotUser), which its bind hands to the room, journaled
// and recovered at the next start (internal/slotuid, shared with the ACP
// pool). A woken room whose folders hold more than maxOwnEntries entries
// is not bound (MissLarge): its walk would cost more than the boot it
// saves.

// maxOwnEntries bounds the entries of a woken room's workspace and home
// a bind gives to the pool agent's uid (slotuid.MaxOwnEntries; pi's cold
// start, 1.4 to 1.7 s, is about as fast past it).
const maxOwnEntries = slotuid.MaxOwnEntries

// MissLarge: as root, the woken room's files are more than the bind gives
// to another uid (maxOwnEntries).
const MissLarge = "large"

// Steps of a bind as root, beside warmpool.Steps, given to the fault hook
// before each runs (slotuid's).
const (
	StepUIDJournal = slotuid.StepJournal // the uid journal is written (before warmpool's)
	StepOwn        = slotuid.StepOwn     // the room's folders are given to the slot's uid
	StepUIDRecord  = slotuid.StepRecord  // the room's record names the slot's uid
	StepReveal     = slotuid.StepReveal  // the room's paths are shown in the agent's view
	StepUIDDone    = slotuid.StepDone    // the uid journal is removed
)

// UIDSteps lists them in order (for tests that stop a bind at each).
var UIDSteps = slotuid.Steps

// uids reports whether agents run as uids of their own.
func (p *pool) uids() bool { return !p.t.opts.Confine.AgentUsers().Empty() }

// slotUser is the user of a slot's agent when home is a slot's (ok), as
// confine.Confiner.SlotUser allocates it.
func (t *Transport) slotUser(dir string) (u *confine.User, ok bool, err error) {
	if t.pool == nil || filepath.Dir(dir) != filepath.Join(t.pool.opts.Rooms, slotsDir) {
		return nil, false, nil
	}
	u, err = t.opts.Confine.SlotUser(dir)
	if err != nil {
		return nil, true, fmt.Errorf("rpcagent: the pool agent's user: %w", err)
	}
	return u, true, nil
}

// roomUser is the user spec's room holds (allocated for a new room, as its
// cold start would), for what take writes before a slot is spent; reason
// says why the room must start cold instead (MissLarge).
func (p *pool) roomUser(spec room.AgentSpec) (*confine.User, string, error) {
	if !p.uids() {
		return nil, "", nil
	}
	u, err := p.t.roomUser(spec)
	if err != nil || !u.Owned() {
		return u, "", err
	}
	if slotuid.CountEntries(maxOwnEntries+1, spec.Workspace, spec.Home) > maxOwnEntries {
		return u, MissLarge, nil
	}
	return u, "", nil
}

func (p *pool) uidBinder() slotuid.Binder {
	return slotuid.Binder{Confine: p.t.opts.Confine, Fault: p.opts.Fault}
}

// beginUID writes the uid journal of s's bind (step 1); nothing without
// agent uids.
func (p *pool) beginUID(s *slot, plan warmpool.Plan) error { return p.uidBinder().Begin(s.dir, plan) }

// bindFailed: see slotuid.Binder.BindFailed.
func (p *pool) bindFailed(s *slot, err error) error { return p.uidBinder().BindFailed(s.dir, err) }

// handOver gives the room's folders (now the slot's) and the room to the
// slot's uid, and shows them to its agent (steps 2 to 5); nothing without
// agent uids. After an error but a fault's it recovers as a restart
// would.
func (p *pool) handOver(s *slot, plan warmpool.Plan) error {
	return p.uidBinder().HandOver(s.dir, plan, s.a.c.Process())
}

// recoverUIDs recovers the uid part of the binds a crash stopped (after
// warmpool.Recover, before the slots are removed and any room starts).
func (p *pool) recoverUIDs() error {
	slots, err := p.uidBinder().RecoverAll(filepath.Join(p.opts.Rooms, slotsDir))
	for _, s := range slots {
		p.t.opts.Logger.Warn("rpcagent: gave a room's files back to its uid after a stopped bind", "slot", s)
	}
	if err != nil {
		return fmt.Errorf("rpcagent: %w", err)
	}
	return nil
}
