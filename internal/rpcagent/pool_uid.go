package rpcagent

import (
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/slotuid"
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

// slotUser is the user of a slot's agent when dir (a home's parent) is a
// slot's folder (ok), as confine.Confiner.SlotUser allocates it.
func (t *Transport) slotUser(dir string) (u *confine.User, ok bool, err error) {
	if t.pool == nil {
		return nil, false, nil
	}
	return t.pool.SlotUser(dir)
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

// uidBinder hands a slot's uid to its room as root with agent uids
// (nothing otherwise).
func (p *pool) uidBinder() slotuid.Binder {
	return slotuid.Binder{Confine: p.t.opts.Confine, Fault: p.opts.Fault}
}
