package confine

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/agenthost/agenthost/internal/agentfs"
)

// DefaultAgentUIDs is serve's --agent-uids: a million uids from
// 2,000,000,000. It lies above every range a Linux system hands out on
// its own (system users, regular users from 1000, systemd's dynamic
// users below 65536, nobody), above the subordinate ranges useradd gives
// for user namespaces (100000 up, 65536 a user: it would take 29,000 users
// to get here), outside systemd's container range (524288-1879048191) and
// its foreign range (2147352576-2147418111), and below 2^31, past which
// some software reads ids as negative.
var DefaultAgentUIDs = UIDRange{First: 2_000_000_000, Last: 2_000_999_999}

// Bounds of an agent uid range (see ParseUIDs).
const (
	minAgentUID = 65536         // past the 16-bit ids a system hands out itself
	maxAgentUID = 1<<31 - 1     // software that reads ids as signed
	uidFile     = "agent-uid"   // the room's uid, in its folder
	uidLock     = ".agent-uids" // serialises allocations between processes, in the rooms' folder
)

// ErrNoAgentUID: every uid of Options.AgentUIDs is held by a room; the
// room's agent does not start.
var ErrNoAgentUID = errors.New("confine: every uid of the agents' range is taken")

// Empty reports whether the range holds no uid (agents run as the
// server's user).
func (r UIDRange) Empty() bool { return r.First <= 0 || r.Last < r.First }

// String is the range as --agent-uids takes it.
func (r UIDRange) String() string {
	if r.Empty() {
		return "off"
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

// ParseUIDs reads an --agent-uids value: FIRST-LAST (inclusive, within
// 65536 to 2^31-1), or "off" (the empty range).
func ParseUIDs(s string) (UIDRange, error) {
	s = strings.TrimSpace(s)
	if s == "off" {
		return UIDRange{}, nil
	}
	a, b, ok := strings.Cut(s, "-")
	first, err1 := strconv.Atoi(strings.TrimSpace(a))
	last, err2 := strconv.Atoi(strings.TrimSpace(b))
	if !ok || err1 != nil || err2 != nil || first > last {
		return UIDRange{}, fmt.Errorf("confine: agent uids %q: want FIRST-LAST or off", s)
	}
	if first < minAgentUID || last > maxAgentUID {
		return UIDRange{}, fmt.Errorf("confine: agent uids %q: the range must lie within %d-%d (clear of the ids a system hands out itself, below 2^31)", s, minAgentUID, maxAgentUID)
	}
	return UIDRange{First: first, Last: last}, nil
}

// roomUsers allocates rooms' uids. Allocations are serialised in this
// process by mu and between processes sharing the rooms' folder (nodes on
// one data dir) by a lock file there.
type roomUsers struct {
	rng UIDRange
	mu  sync.Mutex
	// held maps each uid to the folder of the room that holds it, as
	// the last scan of the rooms' folder (parent) and this process's
	// allocations since saw it.
	held   map[int]string
	parent string
	next   int // where the next allocation starts looking
}

// uidRecord is the room's agent-uid file.
type uidRecord struct {
	UID int `json:"uid"`
	GID int `json:"gid"`
	// Room is the name of the room's folder: a record in a folder of
	// another name is a copy, whose uid is not that folder's.
	Room string `json:"room"`
	// Owned: the room's workspace, home and TMPDIR were given to the uid
	// whole (once; at every start after, only the folders themselves).
	Owned bool `json:"owned"`
}

// RoomUser returns the user the agent of the room whose folder is dir
// (the parent of its home, which the server owns) runs as: a uid of
// Options.AgentUIDs of its own (its gid the same number), allocated at its
// first start and kept in dir (agent-uid, 0600); nil when agents run as
// the server's own user (the server is not root, the range is empty,
// agents run unconfined, or the launcher does not switch users). No two
// rooms whose folders exist hold the same uid: the first call scans the rooms' folders (dir's parent), a room's
// purge (its folder gone) frees its uid, and a room whose record names
// another room's folder (a copy) or a uid outside the range gets a new one.
// ErrNoAgentUID when none is free. Safe for concurrent use.
//
// A User from a new allocation makes the next Policy give the room's
// workspace, home and TMPDIR to it whole (agentfs.OwnTree); every Policy
// gives it the folders themselves.
func (c *Confiner) RoomUser(dir string) (*User, error) {
	if c.AgentUsers().Empty() {
		return nil, nil
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("confine: the room's folder: %w", err)
	}
	return c.users.get(dir, filepath.Dir(dir))
}

// AgentUsers is the range rooms' agents get uids from: empty when they run
// as the server's own user (see RoomUser).
func (c *Confiner) AgentUsers() UIDRange {
	if !c.Enforced() || c.users == nil || c.euid != 0 {
		return UIDRange{}
	}
	return c.users.rng
}

// get is the user of the room (or slot, see SlotUser) whose folder is
// dir, allocated among those of the rooms' folder parent.
func (u *roomUsers) get(dir, parent string) (*User, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.held == nil || u.parent != parent {
		// The first use, or another server's rooms (tests): its folder is
		// scanned afresh.
		u.held, u.parent = scanUsers(parent), parent
	}
	file := filepath.Join(dir, uidFile)
	if rec, err := readUID(file); err == nil && u.fits(rec) && rec.Room == filepath.Base(dir) {
		if h := u.held[rec.UID]; h == "" || h == dir || !exists(h) {
			u.held[rec.UID] = dir
			return &User{UID: rec.UID, GID: rec.GID, file: file, owned: rec.Owned}, nil
		}
		// Another room holds the uid: this one gets its own.
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("confine: the room's folder: %w", err)
	}
	unlock, err := lockFile(filepath.Join(parent, uidLock))
	if err != nil {
		return nil, fmt.Errorf("confine: allocating the room's uid: %w", err)
	}
	defer unlock()
	// Under the lock another process's allocations are seen too.
	u.held = scanUsers(parent)
	uid, err := u.free(dir)
	if err != nil {
		return nil, err
	}
	rec := uidRecord{UID: uid, GID: uid, Room: filepath.Base(dir)}
	if err := writeUID(file, rec); err != nil {
		return nil, err
	}
	u.held[uid] = dir
	u.next = uid + 1
	return &User{UID: uid, GID: uid, file: file}, nil
}

// fits reports whether rec is a uid of the range (one the operator
// moved the range away from is replaced).
func (u *roomUsers) fits(rec uidRecord) bool {
	return rec.UID >= u.rng.First && rec.UID <= u.rng.Last && rec.GID == rec.UID
}

// free returns a uid no existing room but dir holds, from u.next on,
// round the range.
func (u *roomUsers) free(dir string) (int, error) {
	n := u.rng.Last - u.rng.First + 1
	start := u.next
	if start < u.rng.First || start > u.rng.Last {
		start = u.rng.First
	}
	for i := range n {
		uid := u.rng.First + (start-u.rng.First+i)%n
		h, ok := u.held[uid]
		if !ok || h == dir {
			return uid, nil
		}
		if !exists(h) {
			// Its room was purged since the scan.
			delete(u.held, uid)
			return uid, nil
		}
	}
	return 0, fmt.Errorf("%w (%s, %d rooms): purge rooms or widen --agent-uids", ErrNoAgentUID, u.rng, n)
}

// scanUsers reads the uid of every room folder in parent, and of every
// slot (a folder in a hidden folder of parent: a warm pool's, see
// SlotUser); a record copied from another folder holds nothing. A room's
// record wins over a slot's of the same uid: that is a bind's hand-over
// (HandOver), whose slot is being removed.
func scanUsers(parent string) map[int]string {
	held := map[int]string{}
	ents, err := os.ReadDir(parent)
	if err != nil {
		return held
	}
	var slots []string
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(parent, e.Name())
		if strings.HasPrefix(e.Name(), ".") {
			slots = append(slots, dir)
			continue
		}
		rec, err := readUID(filepath.Join(dir, uidFile))
		if err == nil && rec.Room == e.Name() {
			held[rec.UID] = dir
		}
	}
	for _, pool := range slots {
		ents, _ := os.ReadDir(pool)
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			dir := filepath.Join(pool, e.Name())
			rec, err := readUID(filepath.Join(dir, uidFile))
			if _, room := held[rec.UID]; err == nil && rec.Room == e.Name() && !room {
				held[rec.UID] = dir
			}
		}
	}
	return held
}

// readUID reads a room's agent-uid file (in the server's own folder: no
// link is followed all the same).
func readUID(file string) (uidRecord, error) {
	d, err := agentfs.Open(filepath.Dir(file), nil)
	if err != nil {
		return uidRecord{}, err
	}
	defer d.Close()
	b, err := d.ReadFile(uidFile, 1<<10)
	if err != nil {
		return uidRecord{}, err
	}
	var rec uidRecord
	if err := json.Unmarshal(b, &rec); err != nil || rec.UID <= 0 {
		return uidRecord{}, fmt.Errorf("confine: %s: not a uid record", file)
	}
	return rec, nil
}

// writeUID writes a room's agent-uid file whole (0600).
func writeUID(file string, rec uidRecord) error {
	d, err := agentfs.Open(filepath.Dir(file), nil)
	if err != nil {
		return fmt.Errorf("confine: the room's uid: %w", err)
	}
	defer d.Close()
	b, _ := json.Marshal(rec)
	if err := d.WriteFile(uidFile, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("confine: the room's uid: %w", err)
	}
	return nil
}

func exists(dir string) bool {
	_, err := os.Lstat(dir)
	return !errors.Is(err, fs.ErrNotExist)
}

// ownFolders gives the room's folders to u: each folder itself at every start,
// and everything beneath once after the uid was allocated (recorded in
// the room's agent-uid file).
func ownFolders(u *User, folders ...string) error {
	o := agentfs.Owner{UID: u.UID, GID: u.GID}
	for _, d := range folders {
		if d == "" {
			continue
		}
		var err error
		if u.owned || u.file == "" {
			err = agentfs.OwnFolder(d, o)
		} else {
			_, err = agentfs.OwnTree(d, o)
		}
		if err != nil {
			return fmt.Errorf("confine: giving %s to the agent's uid %d: %w", d, u.UID, err)
		}
	}
	if !u.owned && u.file != "" {
		rec := uidRecord{UID: u.UID, GID: u.GID, Room: filepath.Base(filepath.Dir(u.file)), Owned: true}
		if err := writeUID(u.file, rec); err != nil {
			return err
		}
		u.owned = true
	}
	return nil
}
