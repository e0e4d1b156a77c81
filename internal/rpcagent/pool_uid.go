package rpcagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/warmpool"
	"github.com/agenthost/agenthost/room"
)

// The warm pool as root, where each room's agent runs as a uid of its own
// (confine.Confiner.RoomUser). A slot's agent gets a uid of its own from
// the same range and allocator (confine.Confiner.SlotUser: the slot's
// folder holds it), starts as it, and its folders are its, as a room's
// would be. Its bind hands the uid to the room:
//
//  1. before the room's files move, a journal (uid.journal in the slot's
//     folder, which the agent cannot reach) names the room and its
//     folders;
//  2. after warmpool.Bind (the room's entries moved into the slot's
//     folders, those renamed into the room's place), the room's folders
//     are given whole to the slot's uid (a walk that follows no link);
//  3. the room's agent-uid record is replaced by one naming the slot's
//     uid (one rename: the room holds it from then on, the slot no more,
//     and the room's earlier uid, whose files are gone, is free);
//  4. the room's paths are made to reach its folders in the agent's
//     view (the launcher built that view before the room was known);
//  5. the journal is removed.
//
// A crash (or a fault) anywhere in between leaves the journal: the next
// start, after warmpool.Recover, gives the room's folders whole to
// whichever uid the room's record names, before any room or slot starts.
// A woken room whose folders hold more than maxOwnEntries entries is not
// bound (MissLarge): its walk would cost more than the boot it saves.

// maxOwnEntries bounds the entries of a woken room's workspace and home
// a bind gives to the pool agent's uid. Measured on a 2-core machine
// (ext4, 50,000 files in 500 folders, agentfs.OwnTree as root): 0.37 to
// 0.85 s, and 37 to 68 ms to count them first; past it, pi's cold start
// (1.4 to 1.7 s) would be about as fast.
const maxOwnEntries = 50_000

// MissLarge: as root, the woken room's files are more than the bind gives
// to another uid (maxOwnEntries).
const MissLarge = "large"

// Steps of a bind as root, beside warmpool.Steps, given to the fault hook
// before each runs.
const (
	StepUIDJournal = "uid-journal" // the uid journal is written (before warmpool's)
	StepOwn        = "own"         // the room's folders are given to the slot's uid
	StepUIDRecord  = "uid-record"  // the room's record names the slot's uid
	StepReveal     = "reveal"      // the room's paths are shown in the agent's view
	StepUIDDone    = "uid-done"    // the uid journal is removed
)

// UIDSteps lists them in order (for tests that stop a bind at each).
var UIDSteps = []string{StepUIDJournal, StepOwn, StepUIDRecord, StepReveal, StepUIDDone}

// uidJournal is the uid journal's name in a slot's folder.
const uidJournal = "uid.journal"

// uidBind is the uid journal: the room's folder and its folders (the
// workspace, home and TMPDIR, at the room's paths).
type uidBind struct {
	Room    string   `json:"room"`
	Folders []string `json:"folders"`
}

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
	if countEntries(maxOwnEntries+1, spec.Workspace, spec.Home) > maxOwnEntries {
		return u, MissLarge, nil
	}
	return u, "", nil
}

// countEntries counts the entries of folders (each folder itself
// included, no link followed), stopping past limit.
func countEntries(limit int, folders ...string) int {
	n := 0
	for _, f := range folders {
		_ = filepath.WalkDir(f, func(_ string, _ fs.DirEntry, err error) error {
			n++
			if n > limit {
				return filepath.SkipAll
			}
			return nil
		})
	}
	return n
}

func (p *pool) fault(step string) error {
	if p.opts.Fault == nil {
		return nil
	}
	if err := p.opts.Fault(step); err != nil {
		return fmt.Errorf("%w: %s: %w", warmpool.ErrFault, step, err)
	}
	return nil
}

func planFolders(plan warmpool.Plan) []string {
	return []string{plan.Workspace.Room, plan.Home.Room, plan.Tmp.Room}
}

// beginUID writes the uid journal of s's bind (step 1); nothing without
// agent uids.
func (p *pool) beginUID(s *slot, plan warmpool.Plan) error {
	if !p.uids() {
		return nil
	}
	if err := p.fault(StepUIDJournal); err != nil {
		return err
	}
	b, _ := json.Marshal(uidBind{Room: filepath.Dir(plan.Home.Room), Folders: planFolders(plan)})
	tmp := filepath.Join(s.dir, uidJournal+".new")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("rpcagent: the uid journal: %w", err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	err = errors.Join(err, f.Close())
	if err == nil {
		err = os.Rename(tmp, filepath.Join(s.dir, uidJournal))
	}
	if err == nil {
		err = syncDir(s.dir)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("rpcagent: the uid journal: %w", err)
	}
	return nil
}

// bindFailed is what a failed warmpool.Bind leaves: a fault stays as a
// crash would leave it (the next start recovers); after another error
// (warmpool recovered its part) the room's folders are given whole to the
// uid its record names, for the cold start that follows.
func (p *pool) bindFailed(s *slot, err error) error {
	if !p.uids() || errors.Is(err, warmpool.ErrFault) {
		return err
	}
	return errors.Join(err, p.recoverUID(filepath.Join(s.dir, uidJournal)))
}

// handOver gives the room's folders (now the slot's) and the room to the
// slot's uid, and shows them to its agent (steps 2 to 5); nothing without
// agent uids. After an error but a fault's it recovers as a restart
// would.
func (p *pool) handOver(s *slot, plan warmpool.Plan) error {
	if !p.uids() {
		return nil
	}
	journal := filepath.Join(s.dir, uidJournal)
	err := p.handOverSteps(s, plan)
	if err == nil {
		if err = p.fault(StepUIDDone); err == nil {
			err = os.Remove(journal)
		}
	}
	if err != nil && !errors.Is(err, warmpool.ErrFault) {
		err = errors.Join(err, p.recoverUID(journal))
	}
	return err
}

func (p *pool) handOverSteps(s *slot, plan warmpool.Plan) error {
	cf := p.t.opts.Confine
	if err := p.fault(StepOwn); err != nil {
		return err
	}
	su, err := cf.SlotUser(s.dir)
	if err != nil {
		return fmt.Errorf("rpcagent: the pool agent's user: %w", err)
	}
	// The room's earlier uid (whose files of several names are given
	// too: it is freed) is the one its record names.
	from := -1
	if ru, err := cf.RoomUser(filepath.Dir(plan.Home.Room)); err == nil && ru != nil && ru.UID != su.UID {
		from = ru.UID
	}
	if _, err := confine.GiveTree(su, from, planFolders(plan)...); err != nil {
		return fmt.Errorf("rpcagent: %w", err)
	}
	if err := p.fault(StepUIDRecord); err != nil {
		return err
	}
	if _, err := cf.HandOver(su, filepath.Dir(plan.Home.Room)); err != nil {
		return fmt.Errorf("rpcagent: %w", err)
	}
	if err := p.fault(StepReveal); err != nil {
		return err
	}
	pr, ok := s.a.c.Process().(interface {
		Pid() int
		Exited() <-chan struct{}
	})
	if !ok {
		return errors.New("rpcagent: the pool agent's process is not this host's child")
	}
	select {
	case <-pr.Exited():
		return errors.New("rpcagent: the pool agent exited")
	default:
	}
	// The leader is reaped only after Exited: its pid is not reused yet.
	if err := confine.Reveal(pr.Pid(), plan.Workspace.Room, plan.Home.Room); err != nil {
		return fmt.Errorf("rpcagent: %w", err)
	}
	return nil
}

// recoverUIDs recovers the uid part of the binds a crash stopped (after
// warmpool.Recover, before the slots are removed and any room starts).
func (p *pool) recoverUIDs() error {
	journals, _ := filepath.Glob(filepath.Join(p.opts.Rooms, slotsDir, "*", uidJournal))
	for _, j := range journals {
		if err := p.recoverUID(j); err != nil {
			return fmt.Errorf("rpcagent: recovering the uid of a bind the last server left: %w", err)
		}
		p.t.opts.Logger.Warn("rpcagent: gave a room's files back to its uid after a stopped bind", "slot", filepath.Base(filepath.Dir(j)))
	}
	return nil
}

// recoverUID gives the folders of the room journal names whole to the uid
// the room's record names (allocated anew if it names none), then removes
// the journal.
func (p *pool) recoverUID(journal string) error {
	b, err := os.ReadFile(journal)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var ub uidBind
	if err := json.Unmarshal(b, &ub); err == nil && ub.Room != "" {
		if _, err := os.Lstat(ub.Room); err == nil {
			u, err := p.t.opts.Confine.RoomUser(ub.Room)
			if err != nil {
				return err
			}
			if err := confine.OwnWhole(u, ub.Folders...); err != nil {
				return err
			}
		}
	}
	return os.Remove(journal)
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
