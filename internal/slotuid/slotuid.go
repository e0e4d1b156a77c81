// Package slotuid hands a warm pool slot's agent uid to the room its bind
// serves, as root where each room's agent runs as a uid of its own
// (confine.Confiner.RoomUser). The pools of internal/rpcagent and
// internal/acpagent share it.
//
// A slot's agent gets a uid of its own from the rooms' range and allocator
// (confine.Confiner.SlotUser: the slot's folder holds it), starts as it,
// and its folders are its, as a room's would be. Its bind hands the uid to
// the room:
//
//  1. before the room's files move, a journal (uid.journal in the slot's
//     folder, which the agent cannot reach) names the room and its
//     folders (Begin);
//  2. after warmpool.Bind (the room's entries moved into the slot's
//     folders, those renamed into the room's place), the room's folders
//     are given whole to the slot's uid (a walk that follows no link);
//  3. the room's agent-uid record is replaced by one naming the slot's
//     uid (one rename: the room holds it from then on, the slot no more,
//     and the room's earlier uid, whose files are gone, is free);
//  4. the room's paths are made to reach its folders in the agent's
//     view (the launcher built that view before the room was known);
//  5. the journal is removed (HandOver does 2 to 5).
//
// A crash (or a fault) anywhere in between leaves the journal: the next
// start, after warmpool.Recover, gives the room's folders whole to
// whichever uid the room's record names, before any room or slot starts
// (RecoverAll). Linux only in effect: elsewhere agents never run as uids
// of their own and every call here does nothing.
package slotuid

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/warmpool"
)

// MaxOwnEntries bounds the entries of a room's workspace and home a bind
// gives to the pool agent's uid. Measured on a 2-core machine (ext4,
// 50,000 files in 500 folders, agentfs.OwnTree as root): 0.37 to 0.85 s,
// and 37 to 68 ms to count them first; past it, a cold start would be
// about as fast.
const MaxOwnEntries = 50_000

// Steps of a bind as root, beside warmpool.Steps, given to the fault hook
// before each runs.
const (
	StepJournal = "uid-journal" // the uid journal is written (before warmpool's)
	StepOwn     = "own"         // the room's folders are given to the slot's uid
	StepRecord  = "uid-record"  // the room's record names the slot's uid
	StepReveal  = "reveal"      // the room's paths are shown in the agent's view
	StepDone    = "uid-done"    // the uid journal is removed
)

// Steps lists them in order (for tests that stop a bind at each).
var Steps = []string{StepJournal, StepOwn, StepRecord, StepReveal, StepDone}

// Journal is the uid journal's name in a slot's folder.
const Journal = "uid.journal"

// record is the uid journal: the room's folder and its folders (the
// workspace, home and TMPDIR, at the room's paths).
type record struct {
	Room    string   `json:"room"`
	Folders []string `json:"folders"`
}

// Process is the slot's running agent (its launcher, this host's child).
type Process interface {
	Pid() int
	Exited() <-chan struct{}
}

// Binder hands slots' uids to rooms. The zero Fault does nothing.
type Binder struct {
	// Confine allocates the rooms' and slots' uids.
	Confine *confine.Confiner
	// Fault, if set, is called before each step (tests): an error stops
	// the bind there, as a crash would (wrapped in warmpool.ErrFault).
	Fault func(step string) error
}

// On reports whether agents run as uids of their own (else the Binder's
// calls do nothing).
func (b Binder) On() bool { return b.Confine != nil && !b.Confine.AgentUsers().Empty() }

func (b Binder) fault(step string) error {
	if b.Fault == nil {
		return nil
	}
	if err := b.Fault(step); err != nil {
		return fmt.Errorf("%w: %s: %w", warmpool.ErrFault, step, err)
	}
	return nil
}

// Folders are the room's folders of plan (workspace, home, TMPDIR).
func Folders(plan warmpool.Plan) []string {
	return []string{plan.Workspace.Room, plan.Home.Room, plan.Tmp.Room}
}

// roomDir is the room's folder of plan: its home's parent.
func roomDir(plan warmpool.Plan) string { return filepath.Dir(plan.Home.Room) }

// Begin writes the uid journal of the bind of slotDir's slot (step 1),
// before warmpool.Bind.
func (b Binder) Begin(slotDir string, plan warmpool.Plan) error {
	if !b.On() {
		return nil
	}
	if err := b.fault(StepJournal); err != nil {
		return err
	}
	buf, _ := json.Marshal(record{Room: roomDir(plan), Folders: Folders(plan)})
	tmp := filepath.Join(slotDir, Journal+".new")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("slotuid: the uid journal: %w", err)
	}
	_, err = f.Write(buf)
	if err == nil {
		err = f.Sync()
	}
	err = errors.Join(err, f.Close())
	if err == nil {
		err = os.Rename(tmp, filepath.Join(slotDir, Journal))
	}
	if err == nil {
		err = syncDir(slotDir)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("slotuid: the uid journal: %w", err)
	}
	return nil
}

// BindFailed is what a failed warmpool.Bind leaves: a fault stays as a
// crash would leave it (the next start recovers); after another error
// (warmpool recovered its part) the room's folders are given whole to the
// uid its record names, for the cold start that follows.
func (b Binder) BindFailed(slotDir string, err error) error {
	if !b.On() || errors.Is(err, warmpool.ErrFault) {
		return err
	}
	return errors.Join(err, b.recover(filepath.Join(slotDir, Journal)))
}

// HandOver gives the room's folders of plan (now the slot's) and the room
// to the uid of slotDir's slot, and shows them to its agent proc (steps 2
// to 5). After an error but a fault's it recovers as a restart would.
func (b Binder) HandOver(slotDir string, plan warmpool.Plan, proc any) error {
	if !b.On() {
		return nil
	}
	journal := filepath.Join(slotDir, Journal)
	err := b.handOver(slotDir, plan, proc)
	if err == nil {
		if err = b.fault(StepDone); err == nil {
			err = os.Remove(journal)
		}
	}
	if err != nil && !errors.Is(err, warmpool.ErrFault) {
		err = errors.Join(err, b.recover(journal))
	}
	return err
}

func (b Binder) handOver(slotDir string, plan warmpool.Plan, proc any) error {
	cf := b.Confine
	if err := b.fault(StepOwn); err != nil {
		return err
	}
	su, err := cf.SlotUser(slotDir)
	if err != nil {
		return fmt.Errorf("slotuid: the pool agent's user: %w", err)
	}
	// The room's earlier uid (whose files of several names are given
	// too: it is freed) is the one its record names.
	from := -1
	if ru, err := cf.RoomUser(roomDir(plan)); err == nil && ru != nil && ru.UID != su.UID {
		from = ru.UID
	}
	if _, err := confine.GiveTree(su, from, Folders(plan)...); err != nil {
		return fmt.Errorf("slotuid: %w", err)
	}
	if err := b.fault(StepRecord); err != nil {
		return err
	}
	if _, err := cf.HandOver(su, roomDir(plan)); err != nil {
		return fmt.Errorf("slotuid: %w", err)
	}
	if err := b.fault(StepReveal); err != nil {
		return err
	}
	pr, ok := proc.(Process)
	if !ok {
		return errors.New("slotuid: the pool agent's process is not this host's child")
	}
	select {
	case <-pr.Exited():
		return errors.New("slotuid: the pool agent exited")
	default:
	}
	// The leader is reaped only after Exited: its pid is not reused yet.
	if err := confine.Reveal(pr.Pid(), plan.Workspace.Room, plan.Home.Room); err != nil {
		return fmt.Errorf("slotuid: %w", err)
	}
	return nil
}

// RecoverAll recovers the uid part of the binds a crash stopped, in the
// slots under slotsRoot (after warmpool.Recover, before the slots are
// removed and any room starts); it returns the slots it recovered.
func (b Binder) RecoverAll(slotsRoot string) ([]string, error) {
	journals, _ := filepath.Glob(filepath.Join(slotsRoot, "*", Journal))
	var slots []string
	for _, j := range journals {
		if err := b.recover(j); err != nil {
			return slots, fmt.Errorf("slotuid: recovering the uid of a bind the last server left: %w", err)
		}
		slots = append(slots, filepath.Base(filepath.Dir(j)))
	}
	return slots, nil
}

// recover gives the folders of the room journal names whole to the uid
// the room's record names (allocated anew if it names none), then removes
// the journal.
func (b Binder) recover(journal string) error {
	buf, err := os.ReadFile(journal)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var r record
	if err := json.Unmarshal(buf, &r); err == nil && r.Room != "" {
		if _, err := os.Lstat(r.Room); err == nil {
			u, err := b.Confine.RoomUser(r.Room)
			if err != nil {
				return err
			}
			if err := confine.OwnWhole(u, r.Folders...); err != nil {
				return err
			}
		}
	}
	return os.Remove(journal)
}

// CountEntries counts the entries of folders (each folder itself
// included, no link followed), stopping past limit.
func CountEntries(limit int, folders ...string) int {
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

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
