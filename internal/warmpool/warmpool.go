// Package warmpool hands the folders of an agent started ahead of its room
// (a slot: its own workspace, home and TMPDIR) to the room it is bound to.
//
// Landlock rules attach to the inodes the launcher opened (see
// internal/confine), so an agent confined to its slot's folders is handed a
// room by making those folders the room's: the room's entries are moved
// into the slot's folders (rename(2), one entry at a time, each recorded in
// a journal first), then the slot's folders are renamed onto the room's
// (now empty) ones. The agent then holds the room's workspace and home and
// nothing else; before the bind it could read neither.
//
// Every step works on folder descriptors opened without following a link
// (O_NOFOLLOW, relative to the folder above): a link the slot's agent
// planted in its folders is moved over or removed, never followed, and a
// folder it swapped for a link is refused. Where an entry exists in both,
// the room's wins (the slot's is replaced; two folders are merged): the
// room keeps every file it had, and the slot's leftovers are only what the
// agent wrote before the bind.
//
// A crash in the middle of a bind leaves the room recoverable: Recover,
// run before any room starts, moves back every entry the journal names
// that is still in a slot folder not yet renamed, and removes the slot.
//
// Linux and other Unix systems with renameat; elsewhere Bind fails with
// ErrUnsupported and the caller takes the cold path.
package warmpool

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrUnsupported: this platform cannot bind a slot (no *at calls).
var ErrUnsupported = errors.New("warmpool: binding a slot is not supported on this platform")

// Pair is one folder of the bind: the slot's and the room's, absolute
// paths on the same file system.
type Pair struct {
	Slot string `json:"slot"`
	Room string `json:"room"`
}

// Plan is a bind: the workspace and home are merged and renamed; the
// TMPDIR (emptied at every start anyway) is replaced.
type Plan struct {
	Workspace Pair `json:"workspace"`
	Home      Pair `json:"home"`
	Tmp       Pair `json:"tmp"`
}

// Steps of a bind, in order, given to the fault hook before each runs.
const (
	StepJournal     = "journal"      // the journal is written
	StepMoveWS      = "move-ws"      // the room's workspace entries are moved into the slot's
	StepMoveHome    = "move-home"    // the same for the home
	StepRenameWS    = "rename-ws"    // the slot's workspace becomes the room's
	StepRenameHome  = "rename-home"  // the same for the home
	StepRenameTmp   = "rename-tmp"   // the slot's TMPDIR replaces the room's
	StepDoneJournal = "done-journal" // the journal is removed
)

// Steps lists them in order (for tests that stop a bind at each).
var Steps = []string{StepJournal, StepMoveWS, StepMoveHome, StepRenameWS, StepRenameHome, StepRenameTmp, StepDoneJournal}

// ErrFault is what a fault hook returns to stop a bind (tests).
var ErrFault = errors.New("warmpool: bind stopped by its fault hook")

// Bind makes the slot's folders the room's (see the package doc),
// journaled in journal (a file in a folder the agent cannot write). fault,
// if set, is called before each step (Steps) and stops the bind where it
// returns an error: the room is then as a crash there would leave it, and
// Recover(journal) restores it. On another error Bind recovers itself.
func Bind(journal string, p Plan, fault func(step string) error) error {
	for _, pr := range []Pair{p.Workspace, p.Home, p.Tmp} {
		if !filepath.IsAbs(pr.Slot) || !filepath.IsAbs(pr.Room) {
			return fmt.Errorf("warmpool: paths must be absolute: %q, %q", pr.Slot, pr.Room)
		}
	}
	step := func(s string) error {
		if fault != nil {
			if err := fault(s); err != nil {
				return fmt.Errorf("%w: %s: %w", ErrFault, s, err)
			}
		}
		return nil
	}
	if err := step(StepJournal); err != nil {
		return err
	}
	j, err := createJournal(journal, p)
	if err != nil {
		return err
	}
	err = bind(j, p, step)
	if cerr := j.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("warmpool: journal: %w", cerr)
	}
	if err != nil {
		if errors.Is(err, ErrFault) {
			return err
		}
		if rerr := Recover(journal); rerr != nil {
			return errors.Join(err, rerr)
		}
		return err
	}
	if err := step(StepDoneJournal); err != nil {
		return err
	}
	if err := os.Remove(journal); err != nil {
		return fmt.Errorf("warmpool: journal: %w", err)
	}
	return nil
}

func bind(j *os.File, p Plan, step func(string) error) error {
	if err := step(StepMoveWS); err != nil {
		return err
	}
	if err := merge(j, "ws", p.Workspace); err != nil {
		return err
	}
	if err := step(StepMoveHome); err != nil {
		return err
	}
	if err := merge(j, "home", p.Home); err != nil {
		return err
	}
	if err := step(StepRenameWS); err != nil {
		return err
	}
	if err := renameOnto(p.Workspace); err != nil {
		return err
	}
	if err := step(StepRenameHome); err != nil {
		return err
	}
	if err := renameOnto(p.Home); err != nil {
		return err
	}
	if err := step(StepRenameTmp); err != nil {
		return err
	}
	// The room's TMPDIR is emptied at every start; the slot's, which the
	// agent holds, takes its place.
	if err := removeAll(p.Tmp.Room); err != nil {
		return err
	}
	return renameOnto(p.Tmp)
}

// header is the journal's first line.
type header struct {
	Plan Plan `json:"plan"`
}

func createJournal(path string, p Plan) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("warmpool: journal: %w", err)
	}
	b, _ := json.Marshal(header{Plan: p})
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = syncDir(filepath.Dir(path))
	}
	if err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("warmpool: journal: %w", err)
	}
	return f, nil
}

// record appends "folder rel" before the entry is moved: a crash after the
// rename finds it. (Not synced: a crash of the server keeps the page
// cache; a power loss may lose the tail, which Recover then reads as
// entries still in the room.)
func record(j *os.File, folder, rel string) error {
	b, _ := json.Marshal(rel)
	if _, err := j.Write([]byte(folder + " " + string(b) + "\n")); err != nil {
		return fmt.Errorf("warmpool: journal: %w", err)
	}
	return nil
}

// Recover undoes the bind journal records, if it exists: every entry moved
// into a slot folder that was not yet renamed onto the room's goes back to
// the room's folder, then the slot's folders and the journal are removed.
// A folder already renamed is the room's (whole). Safe to run again after
// it failed half way.
func Recover(journal string) error {
	f, err := os.Open(journal)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("warmpool: journal: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	if !sc.Scan() {
		// The header was never written whole: nothing was moved.
		return os.Remove(journal)
	}
	var h header
	if err := json.Unmarshal(sc.Bytes(), &h); err != nil {
		return os.Remove(journal)
	}
	moved := map[string][]string{}
	for sc.Scan() {
		folder, q, ok := strings.Cut(sc.Text(), " ")
		var rel string
		if !ok || json.Unmarshal([]byte(q), &rel) != nil {
			break // a torn last line: its move never happened
		}
		moved[folder] = append(moved[folder], rel)
	}
	for folder, pr := range map[string]Pair{"ws": h.Plan.Workspace, "home": h.Plan.Home} {
		rels := moved[folder]
		for i := len(rels) - 1; i >= 0; i-- {
			if err := moveBack(pr, rels[i]); err != nil {
				return err
			}
		}
	}
	for _, pr := range []Pair{h.Plan.Workspace, h.Plan.Home, h.Plan.Tmp} {
		if err := removeAll(pr.Slot); err != nil {
			return err
		}
	}
	if err := os.Remove(journal); err != nil {
		return fmt.Errorf("warmpool: journal: %w", err)
	}
	return nil
}

// Journal is the journal's name in a slot's folder.
const Journal = "bind.journal"
