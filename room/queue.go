package room

import (
	"slices"
	"sync"
)

// queued is a message in its room's queue. The queue is kept in the order
// of the messages' message.accepted sequence numbers (the order a restart
// replays): a message takes its place inside the store write that accepts
// it (see submit), so concurrent submits can neither overfill the queue
// nor line up out of the order of their 202s.
type queued struct {
	id, text string
	seq      int64 // of its message.accepted event
	// pending: the message is not settled yet (the write accepting it has
	// not returned, or it is being taken as an answer or delivered into
	// the running turn). No turn starts past a pending message, so one
	// that falls back to the queue still runs in its place.
	pending bool
	// place: it waits for a turn of its own and counts against
	// QueueLimit. An answer or a delivery into the running turn takes no
	// place unless it falls back to the queue.
	place bool
}

// placesLocked is how many messages hold a queue place (pending
// admissions included: they are reserved).
func (r *roomState) placesLocked() int {
	n := 0
	for _, q := range r.queue {
		if q.place {
			n++
		}
	}
	return n
}

// queuedLocked is how many messages wait for a turn of their own.
func (r *roomState) queuedLocked() int {
	n := 0
	for _, q := range r.queue {
		if q.place && !q.pending {
			n++
		}
	}
	return n
}

// insertLocked puts q in its place by sequence number.
func (r *roomState) insertLocked(q queued) {
	i := len(r.queue)
	for i > 0 && r.queue[i-1].seq > q.seq {
		i--
	}
	r.queue = slices.Insert(r.queue, i, q)
}

// idleLocked reports whether the room's agent may be taken away: resident,
// no turn running or ending and nothing waiting for one. A room between
// two turns of its queue is busy: it keeps its agent.
func (r *roomState) idleLocked() bool {
	return r.agent != nil && r.turn == nil && !r.ending && len(r.queue) == 0 && !r.dropped
}

// settle ends the admission of message id: with keep it waits in its
// place for a turn of its own; otherwise it is gone from the queue (taken
// as an answer, delivered into the running turn, or never accepted).
// The room's worker then goes on past it.
func (m *Manager) settle(r *roomState, id string, keep bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// From the back: a message settles soon after it took its place.
	i := len(r.queue) - 1
	for i >= 0 && r.queue[i].id != id {
		i--
	}
	if i >= 0 {
		if keep {
			r.queue[i].pending, r.queue[i].place = false, true
		} else {
			r.queue = slices.Delete(r.queue, i, i+1)
		}
	}
	if len(r.queue) > 0 && !r.queue[0].pending {
		m.ensureWorkerLocked(r)
	}
	// The room may have gone idle.
	m.slotWake.signal()
}

// wakeup wakes every goroutine waiting on it at once, a broadcast that
// can be selected on. Its lock is a leaf: signal may be called under any
// other lock.
type wakeup struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel closed by the next signal. Take it before
// looking at what the signal announces, so that no signal is missed.
func (w *wakeup) wait() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

func (w *wakeup) signal() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}
