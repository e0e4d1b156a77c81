package confine

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// A warm pool's slot gets its uid from the rooms' range by the rooms'
// allocator: no room and no slot share one, also across servers sharing
// the rooms' folder (each scan counts the slots); HandOver makes the
// slot's uid the room's in one record (the slot holds it no more, the
// room's earlier uid is free) and a room's record wins over a slot's left
// beside it.
func TestSlotUIDs(t *testing.T) {
	rng := UIDRange{First: 3_300_000, Last: 3_300_003}
	rooms := t.TempDir()
	c := usersConfiner(t, rng)
	a, err := c.RoomUser(roomDir(t, rooms, "a"))
	if err != nil {
		t.Fatal(err)
	}
	slot := roomDir(t, filepath.Join(rooms, ".pool"), "s1")
	su, err := c.SlotUser(slot)
	if err != nil || su == nil || su.UID == a.UID {
		t.Fatalf("the slot's user %+v (room a's %d), %v", su, a.UID, err)
	}
	if _, err := c.SlotUser(roomDir(t, rooms, "b")); err == nil {
		t.Fatal("SlotUser took a room's folder")
	}
	// Another server on the same rooms' folder sees the slot's uid held.
	other := usersConfiner(t, rng)
	seen := map[int]bool{a.UID: true, su.UID: true}
	for _, n := range []string{"c", "d"} {
		u, err := other.RoomUser(roomDir(t, rooms, n))
		if err != nil || seen[u.UID] {
			t.Fatalf("room %s: %+v, %v (held: %v)", n, u, err, seen)
		}
		seen[u.UID] = true
	}
	if _, err := other.RoomUser(roomDir(t, rooms, "e")); err == nil {
		t.Fatal("a fifth uid from a range of four")
	}

	// Room a is bound to the slot: it holds the slot's uid, a's earlier one
	// is free, the slot's record is gone.
	ru, err := c.HandOver(su, filepath.Join(rooms, "a"))
	if err != nil || ru.UID != su.UID || !ru.Owned() {
		t.Fatalf("HandOver: %+v, %v", ru, err)
	}
	if _, err := os.Lstat(filepath.Join(slot, uidFile)); !os.IsNotExist(err) {
		t.Fatalf("the slot's record after the hand-over: %v", err)
	}
	held := scanUsers(rooms)
	if held[su.UID] != filepath.Join(rooms, "a") || held[a.UID] != "" {
		t.Fatalf("held after the hand-over: %v", held)
	}
	// A slot's record left beside the room's (a crash after the rename)
	// holds nothing: the room's wins.
	if err := writeUID(filepath.Join(slot, uidFile), uidRecord{UID: su.UID, GID: su.GID, Room: "s1", Owned: true}); err != nil {
		t.Fatal(err)
	}
	if h := scanUsers(rooms)[su.UID]; h != filepath.Join(rooms, "a") {
		t.Fatalf("uid %d held by %s, want room a", su.UID, h)
	}
	if u, err := usersConfiner(t, rng).RoomUser(filepath.Join(rooms, "e")); err != nil || u.UID != a.UID {
		t.Fatalf("room e after a's earlier uid %d was freed: %+v, %v", a.UID, u, err)
	}
}

// Rooms and slots allocating at once, on two servers sharing the rooms'
// folder, never get the same uid.
func TestSlotUIDsConcurrent(t *testing.T) {
	rng := UIDRange{First: 3_300_100, Last: 3_300_199}
	rooms := t.TempDir()
	servers := []*Confiner{usersConfiner(t, rng), usersConfiner(t, rng)}
	dirs := make([]string, 40)
	for i := range dirs {
		if i%2 == 0 {
			dirs[i] = roomDir(t, rooms, fmt.Sprintf("r%d", i))
		} else {
			dirs[i] = roomDir(t, filepath.Join(rooms, ".pool"), fmt.Sprintf("s%d", i))
		}
	}
	var mu sync.Mutex
	got := map[int]string{}
	var wg sync.WaitGroup
	for i, d := range dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := servers[i/2%2]
			var u *User
			var err error
			if i%2 == 0 {
				u, err = c.RoomUser(d)
			} else {
				u, err = c.SlotUser(d)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Error(err)
				return
			}
			if prev, dup := got[u.UID]; dup {
				t.Errorf("%s and %s got uid %d", prev, d, u.UID)
			}
			got[u.UID] = d
		}()
	}
	wg.Wait()
}
