package room

import (
	"slices"
	"sync"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/record"
)

// maxPendingEvents bounds a room's agent events waiting to be written.
// Past it, a text delta joins the last pending text event (no text is
// lost) and other events are counted in an events.dropped event.
const maxPendingEvents = 4096

// maxReleased bounds the decided dialogs remembered (see hold).
const maxReleased = 1024

// eventLog writes a room's agent events in order, many per store write,
// so that Handler.Event never waits for the disk: one durable write per
// event would hold the agent's event stream to the disk's pace (and a
// slow disk would overflow the RPC client's backlog). A writer goroutine
// runs only while events are pending.
type eventLog struct {
	m    *Manager
	room string

	mu        sync.Mutex
	pending   []pendingEvent
	dropped   int
	droppedAt int64      // the offset past the last dropped event
	running   bool       // a writer drains pending
	idle      *sync.Cond // broadcast when the writer stops

	// Positions in the agent's output (see Attachment): handled is past
	// the last frame handled (its events recorded, or a dialog decided);
	// holds are the starts of dialog frames not decided yet and floor,
	// when set, the previous host's resume point while dialogs it left are
	// not asked again: a new host reads from the lowest of them. seen is
	// what the previous host recorded: events up to it are not again.
	handled  int64
	holds    []int64
	released map[int64]struct{} // dialogs decided whose second hold may still come
	floor    int64
	hasFloor bool
	seen     int64
}

// resumeLocked is where a new host would read from.
func (l *eventLog) resumeLocked() int64 {
	r := l.handled
	for _, h := range l.holds {
		r = min(r, h)
	}
	if l.hasFloor {
		r = min(r, l.floor)
	}
	return r
}

// attached sets the positions of an agent attached at offset whose
// events up to seen are recorded; floor holds the offset while dialogs
// left by the previous host are pending.
func (l *eventLog) attached(offset, seen int64, floor bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.handled, l.seen, l.holds = max(offset, seen), seen, nil
	l.floor, l.hasFloor = offset, floor
}

// hold keeps a new host reading from start until release. A dialog is
// held twice (when read, KindDialog, and when asked, Approve or Ask) and
// released once; a hold after its release is ignored.
func (l *eventLog) hold(start int64) {
	if start <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.released[start]; ok {
		delete(l.released, start)
		return
	}
	if !slices.Contains(l.holds, start) {
		l.holds = append(l.holds, start)
	}
}

// release ends a hold (start 0: none) and the floor (dropFloor), marks
// the output up to end handled, and returns the positions to record.
func (l *eventLog) release(start, end int64, dropFloor bool) (resume, handled int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := slices.Index(l.holds, start); start > 0 && i >= 0 {
		l.holds = slices.Delete(l.holds, i, i+1)
		if l.released == nil {
			l.released = map[int64]struct{}{}
		}
		if len(l.released) < maxReleased {
			l.released[start] = struct{}{}
		}
	}
	if dropFloor {
		l.hasFloor = false
	}
	l.handled = max(l.handled, end)
	return l.resumeLocked(), l.handled
}

type pendingEvent struct {
	p      event.Payload
	offset int64 // in the agent's output, past the event's frame (0: none)
}

// appendEvent appends p to the room's log in tx, under p's own type.
func appendEvent(tx Tx, room string, p event.Payload) (record.Event, error) {
	return tx.Append(room, p.EventType(), p)
}

func newEventLog(m *Manager, room string) *eventLog {
	l := &eventLog{m: m, room: room}
	l.idle = sync.NewCond(&l.mu)
	return l
}

// joinText adds p to last when both are text deltas: past the bound no
// text is lost.
func joinText(last *pendingEvent, p event.Payload, offset int64) bool {
	a, ok := last.p.(event.TextDelta)
	b, ok2 := p.(event.TextDelta)
	if !ok || !ok2 {
		return false
	}
	a.Text += b.Text
	last.p, last.offset = a, max(last.offset, offset)
	return true
}

// add queues an event; it never waits for the store.
func (l *eventLog) add(p event.Payload, offset int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if offset > 0 && offset <= l.seen {
		return // read again after a restart: recorded by the host before
	}
	switch n := len(l.pending); {
	case n < maxPendingEvents:
		l.pending = append(l.pending, pendingEvent{p, offset})
	case joinText(&l.pending[n-1], p, offset):
	default:
		l.dropped++
		l.droppedAt = max(l.droppedAt, offset)
	}
	if !l.running {
		l.running = true
		l.m.wg.Add(1)
		go l.drain()
	}
}

// drain writes pending events, a batch per store write, until none is
// left.
func (l *eventLog) drain() {
	defer l.m.wg.Done()
	for {
		l.mu.Lock()
		batch, dropped, offset := l.pending, l.dropped, l.droppedAt
		l.pending, l.dropped, l.droppedAt = nil, 0, 0
		if len(batch) == 0 && dropped == 0 {
			l.running = false
			l.idle.Broadcast()
			l.mu.Unlock()
			return
		}
		for _, ev := range batch {
			offset = max(offset, ev.offset)
		}
		l.handled = max(l.handled, offset)
		resume, handled := l.resumeLocked(), l.handled
		l.mu.Unlock()
		err := l.m.write(func(tx Tx) error {
			for _, ev := range batch {
				if _, err := appendEvent(tx, l.room, ev.p); err != nil {
					return err
				}
			}
			if dropped > 0 {
				if _, err := appendEvent(tx, l.room, event.EventsDropped{Count: dropped}); err != nil {
					return err
				}
			}
			if offset > 0 {
				// These events' frames are not to be read again after a
				// restart that keeps the agent.
				return tx.SetAgentOffset(l.room, resume, handled)
			}
			return nil
		})
		if err != nil {
			l.m.log.Error("room: recording agent events failed", "room", l.room, "events", len(batch), "err", err)
		}
	}
}

// flush returns once every event added before it is written (or its
// write failed): what follows in the log comes after them.
func (l *eventLog) flush() {
	l.mu.Lock()
	for l.running {
		l.idle.Wait()
	}
	l.mu.Unlock()
}
