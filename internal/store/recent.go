package store

import (
	"sync"
)

// recent keeps each room's last committed events in memory, so that a
// live stream woken by a commit reads what the commit appended without a
// query. It holds only what is committed (the writer adds a batch's
// events after its commit), a contiguous run ending at the room's last
// sequence number: a read it cannot answer whole goes to SQLite. The
// store's file lock makes the writer the only one that changes the log.
//
// It never answers behind SQLite: a reader that saw a commit in SQLite
// (a room's last sequence number) and then reads here must find that
// commit's events. SQLite shows a commit before the writer can add it
// here, so the rooms of the batch being committed are marked (pending)
// from before its commit until their events are added, and their reads
// go to SQLite meanwhile.
//
// It keeps the rooms someone watches (DB.Watch: a live stream) and only
// while they are watched; others are read from SQLite. It is bounded:
// recentPerRoom events a room, recentMaxBytes in all (past that, whole
// rooms' runs are dropped), and an event over recentMaxEvent bytes is not
// kept (its room's run starts again after it).
type recent struct {
	mu      sync.Mutex
	rooms   map[string]*tail
	watched map[string]int // room: its watches
	pending map[string]struct{}
	bytes   int
}

// tail is one room's run: evs[i].Seq == evs[0].Seq+i.
type tail struct {
	evs   []Event
	bytes int
}

const (
	recentPerRoom  = 64
	recentMaxBytes = 8 << 20
	recentMaxEvent = 16 << 10
)

// eventBytes is what an event held here costs, roughly.
func eventBytes(ev Event) int { return len(ev.Room) + len(ev.Type) + len(ev.Data) + 64 }

func newRecent() *recent {
	return &recent{rooms: map[string]*tail{}, watched: map[string]int{}, pending: map[string]struct{}{}}
}

// watch and unwatch count a room's watches; its events are kept while it
// has one.
func (rc *recent) watch(room string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.watched[room]++
}

func (rc *recent) unwatch(room string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.watched[room]--; rc.watched[room] <= 0 {
		delete(rc.watched, room)
		rc.dropLocked(room)
	}
}

// committing marks the rooms of a batch about to commit (see recent).
func (rc *recent) committing(changes []Event) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, ev := range changes {
		if rc.watched[ev.Room] > 0 {
			rc.pending[ev.Room] = struct{}{}
		}
	}
}

// deleted marks, in a batch's changes, that a room's events were deleted.
const deletedSeq = -1

// add applies one committed batch's changes, in their order: events, and
// rooms whose events were deleted (Seq deletedSeq).
func (rc *recent) add(changes []Event) {
	if len(changes) == 0 {
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	clear(rc.pending)
	for _, ev := range changes {
		t := rc.rooms[ev.Room]
		n := eventBytes(ev)
		switch {
		case rc.watched[ev.Room] == 0:
			continue // no tail: it was dropped at unwatch
		case ev.Seq == deletedSeq || n > recentMaxEvent:
			rc.dropLocked(ev.Room)
			continue
		case t == nil:
			t = &tail{}
			rc.rooms[ev.Room] = t
		case t.evs[len(t.evs)-1].Seq+1 != ev.Seq:
			// Not the next one (a room deleted and begun again): start over.
			rc.bytes -= t.bytes
			t.evs, t.bytes = t.evs[:0], 0
		}
		if len(t.evs) == recentPerRoom {
			rc.bytes -= eventBytes(t.evs[0])
			t.bytes -= eventBytes(t.evs[0])
			t.evs = append(t.evs[:0], t.evs[1:]...)
		}
		ev.Time = fromNS(ev.Time.UnixNano()) // as a read from SQLite gives it
		t.evs = append(t.evs, ev)
		t.bytes += n
		rc.bytes += n
	}
	// Over the bound: drop whole rooms' runs, any rooms (the next read of
	// a dropped room goes to SQLite).
	for room := range rc.rooms {
		if rc.bytes <= recentMaxBytes {
			break
		}
		rc.dropLocked(room)
	}
}

func (rc *recent) dropLocked(room string) {
	if t := rc.rooms[room]; t != nil {
		rc.bytes -= t.bytes
		delete(rc.rooms, room)
	}
}

// clear forgets everything (after a commit that failed: what SQLite holds
// is then read again).
func (rc *recent) clear() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	clear(rc.rooms)
	clear(rc.pending)
	rc.bytes = 0
}

// events answers Events(room, after, limit) when the room's run covers
// it: every event after after up to the room's last, or limit of them.
// ok is false when it cannot (the caller reads SQLite).
func (rc *recent) events(room string, after int64, limit int) (out []Event, ok bool) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if _, ok := rc.pending[room]; ok {
		return nil, false
	}
	t := rc.rooms[room]
	if t == nil || len(t.evs) == 0 {
		return nil, false
	}
	first, last := t.evs[0].Seq, t.evs[len(t.evs)-1].Seq
	if after+1 < first {
		return nil, false
	}
	if after >= last {
		return nil, true
	}
	evs := t.evs[after+1-first:]
	if len(evs) > limit {
		evs = evs[:limit]
	}
	out = make([]Event, len(evs))
	for i, ev := range evs {
		// The caller owns what it gets: Data is copied.
		ev.Data = append([]byte(nil), ev.Data...)
		out[i] = ev
	}
	return out, true
}
