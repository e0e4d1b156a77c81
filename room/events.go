package room

import "sync"

// maxPendingEvents bounds a room's agent events waiting to be written.
// Past it, a text delta joins the last pending text event (no text is
// lost) and other events are counted in an events.dropped event.
const maxPendingEvents = 4096

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
}

type pendingEvent struct {
	kind   string
	data   map[string]any
	offset int64 // in the agent's output, past the event's frame (0: none)
}

func newEventLog(m *Manager, room string) *eventLog {
	l := &eventLog{m: m, room: room}
	l.idle = sync.NewCond(&l.mu)
	return l
}

// add queues an event; it never waits for the store.
func (l *eventLog) add(kind string, data map[string]any, offset int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch n := len(l.pending); {
	case n < maxPendingEvents:
		l.pending = append(l.pending, pendingEvent{kind, data, offset})
	case kind == KindText && l.pending[n-1].kind == KindText:
		last := &l.pending[n-1]
		last.data["text"] = last.data["text"].(string) + data["text"].(string)
		last.offset = max(last.offset, offset)
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
		l.mu.Unlock()
		err := l.m.write(func(tx Tx) error {
			for _, ev := range batch {
				if _, err := tx.Append(l.room, ev.kind, ev.data); err != nil {
					return err
				}
				offset = max(offset, ev.offset)
			}
			if dropped > 0 {
				if _, err := tx.Append(l.room, "events.dropped", map[string]int{"count": dropped}); err != nil {
					return err
				}
			}
			if offset > 0 {
				// These events' frames are not to be read again after a
				// restart that keeps the agent.
				return tx.SetAgentOffset(l.room, offset)
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
