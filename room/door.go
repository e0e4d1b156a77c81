package room

import (
	"context"
	"fmt"
	"sync"
)

// door orders the operations on one room's durable state (see the
// package doc, "One door"): shared entries (a message, a diff, an
// approval, a release, ...) pass beside each other; an exclusive one (a
// purge) passes alone. An exclusive entry waiting holds new shared ones
// back, so that a stream of diffs cannot starve a purge. Used only
// exclusively it is a lock whose wait a context bounds (a room's settings
// and revert locks). Its own mutex is a leaf: tryEnter never waits, and
// may be called under any lock.
type door struct {
	mu      sync.Mutex
	shared  int           // shared entries inside
	excl    bool          // an exclusive entry is inside
	waiting int           // exclusive entries waiting to enter
	blocked int           // entries waiting, shared or exclusive
	changed chan struct{} // closed (and dropped) when the door is left
}

// enter waits until the caller may pass, or ctx ends.
func (d *door) enter(ctx context.Context, exclusive bool) error {
	d.mu.Lock()
	if exclusive {
		d.waiting++
	}
	for {
		switch {
		case exclusive && !d.excl && d.shared == 0:
			d.waiting--
			d.excl = true
			d.mu.Unlock()
			return nil
		case !exclusive && !d.excl && d.waiting == 0:
			d.shared++
			d.mu.Unlock()
			return nil
		}
		if d.changed == nil {
			d.changed = make(chan struct{})
		}
		ch := d.changed
		d.blocked++
		d.mu.Unlock()
		select {
		case <-ch:
			d.mu.Lock()
			d.blocked--
		case <-ctx.Done():
			d.mu.Lock()
			d.blocked--
			if exclusive {
				d.waiting--
				d.signalLocked() // shared entries it held back may pass
			}
			d.mu.Unlock()
			return ctx.Err()
		}
	}
}

// tryEnter passes shared if the door is free of exclusive entries,
// inside or waiting, without waiting.
func (d *door) tryEnter() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.excl || d.waiting > 0 {
		return false
	}
	d.shared++
	return true
}

// leave ends an entry of enter or tryEnter.
func (d *door) leave(exclusive bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if exclusive {
		d.excl = false
	} else {
		d.shared--
	}
	d.signalLocked()
}

func (d *door) signalLocked() {
	if d.changed != nil {
		close(d.changed)
		d.changed = nil
	}
}

// enter passes the door of the room id (see the package doc) and returns
// its state with the function that leaves. A room retired while this
// waited (purged) is not entered: the id's new room is, so that what
// comes after a purge acts on the new room, never on the old one.
func (m *Manager) enter(ctx context.Context, id string, exclusive bool) (*roomState, func(), error) {
	for {
		r, err := m.room(id)
		if err != nil {
			return nil, nil, err
		}
		if err := r.door.enter(ctx, exclusive); err != nil {
			return nil, nil, fmt.Errorf("room %q: waiting for the room's other operations: %w", id, err)
		}
		r.mu.Lock()
		retired := r.retired
		r.mu.Unlock()
		if !retired {
			return r, func() { r.door.leave(exclusive) }, nil
		}
		r.door.leave(exclusive)
	}
}
