package confine

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/agenthost/agenthost/internal/agentfs"
)

// A warm pool's agent (internal/rpcagent) is started in a slot before its
// room is known: as root it runs as a uid of its own from the rooms' range
// (SlotUser), and its bind hands that uid to the room (HandOver), so that
// no room and no slot ever share one and an agent never runs as a uid
// another room holds.

// SlotUser is RoomUser for a warm pool's slot: dir is a folder in a hidden
// folder of the rooms' folder (rooms/.pool/ID). Its uid comes from the
// rooms' range by the same allocator, recorded in dir's agent-uid file
// (whose Room names the slot's folder), and counts as held while dir
// exists. nil when agents run as the server's own user.
func (c *Confiner) SlotUser(dir string) (*User, error) {
	if c.AgentUsers().Empty() {
		return nil, nil
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("confine: the slot's folder: %w", err)
	}
	pool := filepath.Dir(dir)
	if !strings.HasPrefix(filepath.Base(pool), ".") {
		return nil, fmt.Errorf("confine: %s is not a slot's folder (one in a hidden folder of the rooms' folder)", dir)
	}
	return c.users.get(dir, filepath.Dir(pool))
}

// Owned reports whether the folders of u's room were given to it whole
// (its record says so).
func (u *User) Owned() bool { return u != nil && u.owned }

// GiveTree gives each of folders that exists, and everything beneath it,
// to u (agentfs.OwnTree: never through a link, files with several names
// left as they are but those of the uid from, -1: none) and returns how
// many entries it changed. It records nothing: see HandOver and OwnWhole.
func GiveTree(u *User, from int, folders ...string) (int, error) {
	n := 0
	for _, d := range folders {
		if _, err := os.Lstat(d); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		got, err := agentfs.OwnTreeFrom(d, agentfs.Owner{UID: u.UID, GID: u.GID}, from)
		n += got.Entries
		if err != nil {
			return n, fmt.Errorf("confine: giving %s to uid %d: %w", d, u.UID, err)
		}
	}
	return n, nil
}

// HandOver makes the uid of slot (SlotUser's) the uid of the room whose
// folder is roomDir, the room's folders already given to it whole
// (GiveTree): the room's agent-uid record is replaced by one naming the
// slot's uid and the room (Owned), in one rename, which is also the
// moment the slot stops holding the uid (a room's record wins over a
// slot's, see scanUsers) and the room's earlier uid, if any, is free. The
// slot's record is removed after. It returns the room's user.
func (c *Confiner) HandOver(slot *User, roomDir string) (*User, error) {
	if slot == nil || c.users == nil || slot.file == "" {
		return nil, errors.New("confine: HandOver needs a slot's user")
	}
	roomDir, err := filepath.Abs(roomDir)
	if err != nil {
		return nil, fmt.Errorf("confine: the room's folder: %w", err)
	}
	u := c.users
	u.mu.Lock()
	defer u.mu.Unlock()
	parent := filepath.Dir(roomDir)
	unlock, err := lockFile(filepath.Join(parent, uidLock))
	if err != nil {
		return nil, fmt.Errorf("confine: handing the slot's uid to the room: %w", err)
	}
	defer unlock()
	file := filepath.Join(roomDir, uidFile)
	rec := uidRecord{UID: slot.UID, GID: slot.GID, Room: filepath.Base(roomDir), Owned: true}
	if err := writeUID(file, rec); err != nil {
		return nil, err
	}
	if err := os.Remove(slot.file); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("confine: the slot's uid: %w", err)
	}
	if u.parent == parent && u.held != nil {
		for uid, h := range u.held {
			if h == roomDir {
				delete(u.held, uid) // the room's earlier uid
			}
		}
		u.held[slot.UID] = roomDir
	}
	return &User{UID: slot.UID, GID: slot.GID, file: file, owned: true}, nil
}

// OwnWhole gives the folders of u's room (RoomUser's) that exist whole to
// u, and records that in the room's agent-uid file: a bind a crash stopped
// is recovered so, whichever uid the room's record names.
func OwnWhole(u *User, folders ...string) error {
	if u == nil {
		return nil
	}
	if _, err := GiveTree(u, -1, folders...); err != nil {
		return err
	}
	if u.file == "" {
		return nil
	}
	rec := uidRecord{UID: u.UID, GID: u.GID, Room: filepath.Base(filepath.Dir(u.file)), Owned: true}
	if err := writeUID(u.file, rec); err != nil {
		return err
	}
	u.owned = true
	return nil
}
