// Package roomsnap gives rooms their per-turn workspace snapshots: it
// implements room.Snapshots over the snapshot engine, one shadow
// repository per room in the room's own folder (beside its agent home,
// outside its workspace), and remembers which snapshots each turn began
// and ended with in a small journal beside it, so a turn's diff and its
// revert survive a restart.
package roomsnap

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/agenthost/agenthost/internal/snapshot"
	"github.com/agenthost/agenthost/room"
)

// maxJournalLine bounds a journal line read back (a turn id and an object
// name are far shorter).
const maxJournalLine = 4096

// Options configure Snapshots. The zero value is usable.
type Options struct {
	// Repo configures each room's shadow repository (file size bound,
	// git binary).
	Repo snapshot.Options
	// Limits bound a turn's diff (patch size, files listed).
	Limits snapshot.Limits
}

// Snapshots is room.Snapshots over the snapshot engine. Each room's shadow
// repository is opened at its first use and held until Close.
type Snapshots struct {
	opts Options

	mu     sync.Mutex
	closed bool
	rooms  map[string]*roomRepo
	// opened are the repositories and journals to close, listed apart
	// so that Close need not wait for a room's call in flight.
	opened []io.Closer
}

// roomRepo is one room's shadow repository and journal.
type roomRepo struct {
	mu      sync.Mutex // guards everything below; held while opening
	repo    *snapshot.Repo
	journal *os.File
	turns   map[string]*turnIDs
}

// turnIDs are the snapshots a turn began and ended with.
type turnIDs struct{ before, after snapshot.ID }

// journalEntry is one line of a room's journal.
type journalEntry struct {
	Turn   string      `json:"turn"`
	Before snapshot.ID `json:"before,omitempty"`
	After  snapshot.ID `json:"after,omitempty"`
}

// New returns Snapshots; Close it after the rooms' manager.
func New(opts Options) *Snapshots {
	return &Snapshots{opts: opts, rooms: map[string]*roomRepo{}}
}

var _ room.Snapshots = (*Snapshots)(nil)

// open returns the room's repository, opening it (and reading its
// journal) at first use; the caller unlocks rr.mu. Only create (a turn's
// first snapshot) makes the room's folder and repository: a diff or a
// revert of a room that has none (a room being deleted) finds no
// snapshots rather than making them.
func (s *Snapshots) open(ctx context.Context, p room.SnapshotPlace, create bool) (*roomRepo, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, snapshot.ErrClosed
	}
	rr := s.rooms[p.Room]
	if rr == nil {
		rr = &roomRepo{}
		s.rooms[p.Room] = rr
	}
	s.mu.Unlock()
	rr.mu.Lock()
	if rr.repo != nil {
		return rr, nil
	}
	if !create {
		if _, err := os.Lstat(filepath.Join(p.Dir, "repo")); errors.Is(err, fs.ErrNotExist) {
			rr.mu.Unlock()
			return nil, fmt.Errorf("%w: no snapshots in this room", room.ErrNotFound)
		}
	}
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		rr.mu.Unlock()
		return nil, fmt.Errorf("roomsnap: %w", err)
	}
	repo, err := snapshot.Open(ctx, filepath.Join(p.Dir, "repo"), p.Workspace, s.opts.Repo)
	if err != nil {
		rr.mu.Unlock()
		return nil, err
	}
	turns, err := readJournal(filepath.Join(p.Dir, "turns.jsonl"))
	if err == nil {
		rr.journal, err = os.OpenFile(filepath.Join(p.Dir, "turns.jsonl"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	}
	if err != nil {
		_ = repo.Close()
		rr.mu.Unlock()
		return nil, fmt.Errorf("roomsnap: journal: %w", err)
	}
	// A Close that ran meanwhile did not see this repository.
	s.mu.Lock()
	closed := s.closed
	if !closed {
		s.opened = append(s.opened, repo, rr.journal)
	}
	s.mu.Unlock()
	if closed {
		_ = repo.Close()
		_ = rr.journal.Close()
		rr.mu.Unlock()
		return nil, snapshot.ErrClosed
	}
	rr.repo, rr.turns = repo, turns
	return rr, nil
}

// readJournal reads a room's journal (none yet: empty). A line that does
// not parse (a write cut by a crash) is passed over.
func readJournal(path string) (map[string]*turnIDs, error) {
	turns := map[string]*turnIDs{}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return turns, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 512), maxJournalLine)
	for sc.Scan() {
		var e journalEntry
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Turn == "" {
			continue
		}
		t := turns[e.Turn]
		if t == nil {
			t = &turnIDs{}
			turns[e.Turn] = t
		}
		if e.Before != "" {
			t.before = e.Before
		}
		if e.After != "" {
			t.after = e.After
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, bufio.ErrTooLong) {
		return nil, err
	}
	return turns, nil
}

// record notes a turn's snapshot in memory and in the journal.
func (rr *roomRepo) record(e journalEntry) error {
	t := rr.turns[e.Turn]
	if t == nil {
		t = &turnIDs{}
		rr.turns[e.Turn] = t
	}
	if e.Before != "" {
		t.before = e.Before
	}
	if e.After != "" {
		t.after = e.After
	}
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if _, err := rr.journal.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("roomsnap: journal: %w", err)
	}
	return nil
}

// Before records the workspace as turn starts.
func (s *Snapshots) Before(ctx context.Context, p room.SnapshotPlace, turn string) error {
	rr, err := s.open(ctx, p, true)
	if err != nil {
		return err
	}
	defer rr.mu.Unlock()
	id, _, err := rr.repo.Snapshot(ctx)
	if err != nil {
		return err
	}
	return rr.record(journalEntry{Turn: turn, Before: id})
}

// After records the workspace as turn ends and counts its changes.
func (s *Snapshots) After(ctx context.Context, p room.SnapshotPlace, turn string) (room.Changes, error) {
	rr, err := s.open(ctx, p, false)
	if err != nil {
		return room.Changes{}, err
	}
	defer rr.mu.Unlock()
	t := rr.turns[turn]
	if t == nil || t.before == "" {
		return room.Changes{}, fmt.Errorf("%w: no snapshot before turn %s", room.ErrNotFound, turn)
	}
	id, rep, err := rr.repo.Snapshot(ctx)
	if err != nil {
		return room.Changes{}, err
	}
	// What was left out is written before the journal names the
	// snapshot, so a recorded end always has its report.
	if err := writeSkipped(p.Dir, turn, rep); err != nil {
		return room.Changes{}, err
	}
	if err := rr.record(journalEntry{Turn: turn, After: id}); err != nil {
		return room.Changes{}, err
	}
	c, err := rr.repo.Changes(ctx, t.before, id)
	if err != nil {
		return room.Changes{}, err
	}
	return room.Changes{Files: c.Files, Insertions: c.Insertions, Deletions: c.Deletions,
		Skipped: len(rep.Skipped) + rep.SkippedOmitted}, nil
}

// skippedReport is what a turn's closing snapshot left out, as kept in
// the room's folder (one file per turn that left something out).
type skippedReport struct {
	Skipped []room.SkippedPath `json:"skipped"`
	Omitted int                `json:"omitted,omitempty"`
}

// skippedFile is where turn's report lives; turn ids are the room's own
// ("t_" and hex), anything else is refused rather than used as a name.
func skippedFile(dir, turn string) (string, error) {
	if turn == "" || len(turn) > 64 || strings.IndexFunc(turn, func(r rune) bool {
		return !(r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}) >= 0 {
		return "", fmt.Errorf("roomsnap: turn id %q is not a file name", turn)
	}
	return filepath.Join(dir, "skipped", turn+".json"), nil
}

func writeSkipped(dir, turn string, rep snapshot.Report) error {
	if len(rep.Skipped) == 0 && rep.SkippedOmitted == 0 {
		return nil
	}
	path, err := skippedFile(dir, turn)
	if err != nil {
		return err
	}
	r := skippedReport{Skipped: make([]room.SkippedPath, 0, len(rep.Skipped)), Omitted: rep.SkippedOmitted}
	for _, s := range rep.Skipped {
		r.Skipped = append(r.Skipped, room.SkippedPath{Path: quotePath(s.Path), Reason: string(s.Reason), Size: s.Size})
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("roomsnap: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("roomsnap: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("roomsnap: %w", err)
	}
	return nil
}

// readSkipped returns turn's report (none: nothing was left out).
func readSkipped(dir, turn string) (skippedReport, error) {
	var r skippedReport
	path, err := skippedFile(dir, turn)
	if err != nil {
		return r, err
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return r, fmt.Errorf("roomsnap: %w", err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("roomsnap: the report of what turn %s left out: %w", turn, err)
	}
	return r, nil
}

// ids returns a turn's snapshots; both must be recorded.
func (rr *roomRepo) ids(turn string) (turnIDs, error) {
	t := rr.turns[turn]
	switch {
	case t == nil || t.before == "":
		return turnIDs{}, fmt.Errorf("%w: no snapshots of turn %s in this room", room.ErrNotFound, turn)
	case t.after == "":
		return turnIDs{}, fmt.Errorf("%w: the end of turn %s was not recorded", room.ErrNotFound, turn)
	}
	return *t, nil
}

// Diff tells what turn changed.
func (s *Snapshots) Diff(ctx context.Context, p room.SnapshotPlace, turn string) (room.TurnDiff, error) {
	rr, err := s.open(ctx, p, false)
	if err != nil {
		return room.TurnDiff{}, err
	}
	t, err := rr.ids(turn)
	repo := rr.repo
	rr.mu.Unlock() // diffs run beside snapshots
	if err != nil {
		return room.TurnDiff{}, err
	}
	d, err := repo.Diff(ctx, t.before, t.after, s.opts.Limits)
	if err != nil {
		return room.TurnDiff{}, err
	}
	out := room.TurnDiff{Files: make([]room.ChangedFile, 0, len(d.Files)), FilesOmitted: d.FilesOmitted,
		Changes: room.Changes{Files: d.Changes.Files, Insertions: d.Changes.Insertions, Deletions: d.Changes.Deletions},
		Patch:   d.Patch, Truncated: d.Truncated}
	for _, f := range d.Files {
		out.Files = append(out.Files, room.ChangedFile{Path: quotePath(f.Path), Status: string(f.Status), Insertions: f.Insertions,
			Deletions: f.Deletions, Binary: f.Binary})
	}
	sk, err := readSkipped(p.Dir, turn)
	if err != nil {
		return room.TurnDiff{}, err
	}
	out.Skipped, out.SkippedOmitted = sk.Skipped, sk.Omitted
	out.Changes.Skipped = len(sk.Skipped) + sk.Omitted
	return out, nil
}

// Revert restores the workspace to its snapshot before turn.
func (s *Snapshots) Revert(ctx context.Context, p room.SnapshotPlace, turn string) (room.Reverted, error) {
	rr, err := s.open(ctx, p, false)
	if err != nil {
		return room.Reverted{}, err
	}
	defer rr.mu.Unlock()
	t := rr.turns[turn]
	if t == nil || t.before == "" {
		return room.Reverted{}, fmt.Errorf("%w: no snapshots of turn %s in this room", room.ErrNotFound, turn)
	}
	res, err := rr.repo.Restore(ctx, t.before)
	if err != nil {
		return room.Reverted{Files: quotePaths(res.Paths), Kept: quotePaths(res.Kept)}, err
	}
	return room.Reverted{Files: quotePaths(res.Paths), Kept: quotePaths(res.Kept)}, nil
}

// quotePath is how a path is named to clients (room.ChangedFile.Path):
// as it is, unless it is not UTF-8 (a file name is any bytes; JSON would
// turn the others into U+FFFD, and a client could neither name nor tell
// the file) or starts with a double quote: then Go-quoted (strconv.Quote,
// which strconv.Unquote reverses; git quotes such names too).
func quotePath(p string) string {
	if utf8.ValidString(p) && !strings.HasPrefix(p, `"`) {
		return p
	}
	return strconv.Quote(p)
}

func quotePaths(ps []string) []string {
	for i, p := range ps {
		ps[i] = quotePath(p)
	}
	return ps
}

var _ room.SnapshotForgetter = (*Snapshots)(nil)

// Forget closes the room's shadow repository and journal, if open (a
// deleted room: its folder goes next); the room's next use opens them
// again.
func (s *Snapshots) Forget(ctx context.Context, p room.SnapshotPlace) error {
	s.mu.Lock()
	rr := s.rooms[p.Room]
	delete(s.rooms, p.Room)
	s.mu.Unlock()
	if rr == nil {
		return nil
	}
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.repo == nil {
		return nil
	}
	s.mu.Lock()
	s.opened = slices.DeleteFunc(s.opened, func(c io.Closer) bool { return c == io.Closer(rr.repo) || c == io.Closer(rr.journal) })
	s.mu.Unlock()
	err := errors.Join(rr.repo.Close(), rr.journal.Close())
	rr.repo, rr.journal, rr.turns = nil, nil, nil
	return err
}

// Close closes every room's shadow repository; later calls fail with
// snapshot.ErrClosed.
func (s *Snapshots) Close() error {
	s.mu.Lock()
	s.closed = true
	opened := s.opened
	s.opened = nil
	s.mu.Unlock()
	// A repository's Close interrupts its calls in flight.
	var errs []error
	for _, c := range opened {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
