package room

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/record"
)

func (m *Manager) ensureWorkerLocked(r *roomState) {
	if r.working || r.dropped {
		return
	}
	if m.reserveWorkerLocked(r) {
		go m.work(r, nil)
	}
}

// reserveWorkerLocked marks the room as served by a worker the caller
// starts (go m.work); false when the manager closes.
func (m *Manager) reserveWorkerLocked(r *roomState) bool {
	m.wgMu.Lock()
	defer m.wgMu.Unlock()
	if m.ctx.Err() != nil || m.stopping.Load() {
		return false
	}
	r.working = true
	r.workerDone = make(chan struct{})
	m.wg.Add(1)
	r.worker.Add(1)
	return true
}

// stopWorkingLocked marks the room's worker gone (r.mu held).
func (r *roomState) stopWorkingLocked() {
	r.working = false
	close(r.workerDone)
}

// begunTurn is a turn started in the write that accepted its message:
// an idle room's message needs no second write (and fsync) before its
// turn.started. The room's worker, reserved with it and started once the
// write has committed, runs it first.
type begunTurn struct {
	t   *turnRun
	cfg Config
	q   queued
}

// beginLocked makes the message at the head of the queue, just inserted
// by the write accepting it, the room's turn when the room is idle: no
// worker, turn, continued turn or revert, the message alone in the queue.
// It reserves the worker (see unbegin); nil when the room is not idle.
func (m *Manager) beginLocked(r *roomState) *begunTurn {
	if r.working || r.dropped || r.turn != nil || r.cont != nil || r.reverting || len(r.queue) != 1 {
		return nil
	}
	if !m.reserveWorkerLocked(r) {
		return nil
	}
	q := r.queue[0]
	q.pending = false
	r.queue = r.queue[:0]
	t, cfg := m.newTurnLocked(r, q)
	t.accepting = true
	return &begunTurn{t: t, cfg: cfg, q: q}
}

// unbegin undoes beginLocked when the write accepting the message failed:
// nothing of it is recorded. Messages that arrived meanwhile get a worker.
func (m *Manager) unbegin(r *roomState, b *begunTurn) {
	b.t.cancel(nil)
	r.mu.Lock()
	if r.turn == b.t {
		r.turn = nil
	}
	r.stopWorkingLocked()
	r.worker.Done()
	m.wg.Done()
	if len(r.queue) > 0 && !r.queue[0].pending {
		m.ensureWorkerLocked(r)
	}
	r.mu.Unlock()
	m.slotWake.signal() // the room may have gone idle
}

// recordStart records turn t's start (turn.started) in tx.
func recordStart(tx Tx, room string, t *turnRun, at time.Time) error {
	if err := tx.PutTurn(record.Turn{ID: t.id, Room: room, MessageID: t.messageID, Started: at}); err != nil {
		return err
	}
	if err := tx.UpdateMessage(t.messageID, record.MessageStarted, t.id, "", ""); err != nil {
		return err
	}
	_, err := appendEvent(tx, room, event.TurnStarted{TurnID: t.id, MessageID: t.messageID})
	return err
}

// work serves the room's queue, one turn at a time, in order, until it is
// empty or its head is not settled yet (settle starts it again); begun,
// when not nil, is the turn it runs first.
func (m *Manager) work(r *roomState, begun *begunTurn) {
	defer m.wg.Done()
	defer r.worker.Done()
	r.mu.Lock()
	cont := r.cont
	r.cont = nil
	r.mu.Unlock()
	if cont != nil {
		m.continueTurn(r, *cont)
	}
	if begun != nil {
		m.runTurn(r, begun.t, begun.cfg, begun.q, true)
	}
	for {
		limit, checked := "", ""
		r.mu.Lock()
		if !r.noTurnLocked(m) {
			// Settings another host changed, and the budget, before each
			// turn (store reads: outside r.mu).
			r.mu.Unlock()
			limit, checked = m.turnBudget(r)
			r.mu.Lock()
		}
		if r.noTurnLocked(m) {
			r.stopWorkingLocked()
			r.mu.Unlock()
			m.slotWake.signal() // the room may have gone idle
			return
		}
		if limit != "" && r.settingsRaw != checked {
			// The settings changed since (a raised budget): check again.
			r.mu.Unlock()
			continue
		}
		q := r.queue[0]
		r.queue = r.queue[1:]
		if limit != "" {
			// Over its budget the room starts no turn: the message,
			// accepted before, ends failed saying why.
			r.mu.Unlock()
			m.writeEnd(r, func(tx Tx) error {
				return endMessages(tx, r.id, []string{q.id}, "", OutcomeFailed, budgetErr(limit).Error())
			})
			continue
		}
		// The turn is the room's from the moment its message leaves the
		// queue: the room is never idle (evictable) in between.
		t, cfg := m.newTurnLocked(r, q)
		r.mu.Unlock()
		m.runTurn(r, t, cfg, q, false)
	}
}

// noTurnLocked: the worker starts no turn now (no message is ready, a
// revert works, or the manager stops: Close or Detach began, and what is
// queued waits in the store for the next host).
func (r *roomState) noTurnLocked(m *Manager) bool {
	return len(r.queue) == 0 || r.queue[0].pending || r.reverting || m.stopping.Load()
}

// turnBudget reads the room's settings again and says which limit of its
// budget the room's totals reach ("" for none; also when the store cannot
// tell now: the turn runs, and the next check decides), and the settings
// it judged by.
func (m *Manager) turnBudget(r *roomState) (limit, settings string) {
	ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
	defer cancel()
	if err := m.refreshSettings(ctx, r); err != nil {
		m.log.Warn("room: reading the room's settings failed; the last read holds", "room", r.id, "err", err)
	}
	r.mu.Lock()
	s, raw := r.settings, r.settingsRaw
	r.mu.Unlock()
	limit, err := m.exhausted(ctx, r.id, s)
	if err != nil {
		m.log.Warn("room: reading the room's totals for its budget failed", "room", r.id, "err", err)
	}
	return limit, raw
}

// noteBudget writes budget.exhausted once the room's totals reach its
// budget (once for the settings in force: a changed budget may write it
// again).
func (m *Manager) noteBudget(r *roomState) {
	r.mu.Lock()
	s, noted := r.settings, r.budgetNoted
	r.mu.Unlock()
	b := m.budget(s)
	if noted || b.IsZero() {
		return
	}
	ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
	defer cancel()
	rec, err := m.st.Room(ctx, r.id)
	if err != nil {
		return
	}
	limit := b.over(rec.Turns, rec.Usage)
	if limit == "" {
		return
	}
	err = m.write(func(tx Tx) error {
		_, err := appendEvent(tx, r.id, event.BudgetExhausted{
			Limit: limit, Budget: event.Budget(b), Turns: rec.Turns, Usage: rec.Usage,
		})
		return err
	})
	if err != nil {
		m.log.Error("room: recording that the room's budget is exhausted failed", "room", r.id, "err", err)
		return
	}
	r.mu.Lock()
	r.budgetNoted = true
	r.mu.Unlock()
}

// newTurnLocked makes q's turn the room's running turn (r.mu held).
func (m *Manager) newTurnLocked(r *roomState, q queued) (*turnRun, Config) {
	cfg, _ := m.configLocked(r) // validated at Submit
	tctx, cancel := context.WithCancelCause(m.ctx)
	t := &turnRun{id: newID("t"), messageID: q.id, messageSeq: q.seq, ctx: tctx, cancel: cancel, clock: newClock(cfg.TurnTimeout, cfg.Liveness)}
	r.turn = t
	r.lastUsed = time.Now()
	return t, cfg
}

// runTurn runs turn t of message q to its end; started: its start is
// recorded already (a begunTurn).
func (m *Manager) runTurn(r *roomState, t *turnRun, cfg Config, q queued, started bool) {
	tctx, cancel := t.ctx, t.cancel
	defer cancel(nil)

	var err error
	if !started {
		err = m.write(func(tx Tx) error { return recordStart(tx, r.id, t, time.Now()) })
	}
	var res turnEnd
	if err != nil {
		// Nothing of the turn is recorded: its message ends failed (see
		// finishTurn) before the next one starts.
		res = turnEnd{outcome: OutcomeFailed, reason: "the store refused to record the turn's start: " + err.Error()}
	} else if werr := m.prepareWorkspace(tctx, r, cfg); werr != nil {
		// Before the clock: a checkout is no agent's silence; it has the
		// turn's timeout of its own.
		t.stored = true
		t.snapErr = "no snapshot: the workspace could not be prepared"
		res = turnEnd{outcome: OutcomeFailed, reason: werr.Error()}
		if tctx.Err() != nil {
			res = m.judge(t, TurnResult{}, werr)
		}
	} else {
		t.stored = true
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			t.clock.watch(tctx, cancel)
		}()
		t.snapErr = m.snapshotBefore(r, t)
		res = m.execute(r, t, cfg, q.text)
	}
	m.finishTurn(r, t, res)
}

// turnEnd is how a turn ended, as the room records it.
type turnEnd struct {
	outcome, reason, text string
	offset                int64        // TurnResult.Offset
	usage                 record.Usage // TurnResult.Usage
	// compute is what the room's processes used in the turn (nil: not
	// measured).
	compute *record.Compute
}

// continueTurn runs on a turn the previous host started, on the agent it
// left running (attached at Start), to the turn's end.
func (m *Manager) continueTurn(r *roomState, c contTurn) {
	t := c.run
	tctx, cancel := t.ctx, t.cancel
	r.mu.Lock()
	t.joined = c.joined
	r.lastUsed = time.Now()
	a, _ := r.agent.(Detachable)
	r.mu.Unlock()
	defer cancel(nil)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t.clock.watch(tctx, cancel)
	}()
	var res TurnResult
	err := errors.New("the attached agent is gone")
	var tm *turnMeter
	if a != nil {
		tm = m.startMeter(r, t, a)
		res, err = a.Continue(t.ctx)
	}
	r.mu.Lock()
	t.returned = true
	r.mu.Unlock()
	end := m.judge(t, res, err)
	tm.finish(&end)
	m.finishTurn(r, t, end)
}

// finishTurn records the turn's end and its messages' (message.ended,
// right after turn.ended), retiring the agent first when the turn did not
// settle. A turn whose start the store refused ends its messages only.
// The room's next turn starts only once this is recorded (see writeEnd),
// so that the log and a restart keep the order of acceptance.
//
// Deliveries into the turn in flight end first (see turnRun.closed): each
// message steered or followed up into it is then either joined, and ends
// here with it, or refused, and queued for a turn of its own; never both.
//
// While the host detaches (Detach), a turn whose agent was let go of
// running is left open (the next host continues it and records its end),
// and one whose agent never had the prompt is queued again; a turn whose
// run ended before its agent was let go of is recorded as it ended.
func (m *Manager) finishTurn(r *roomState, t *turnRun, res turnEnd) {
	r.mu.Lock()
	t.closed = true
	r.mu.Unlock()
	if m.onTurnClosing != nil {
		m.onTurnClosing(r.id)
	}
	m.awaitDeliveries(r, t)
	if m.isDetaching() {
		r.mu.Lock()
		prompted, letGo := t.prompted, t.letGo
		if !prompted && t.stored || letGo {
			r.turn = nil
		}
		r.mu.Unlock()
		switch {
		case !prompted && t.stored:
			// The agent never had it: the next host runs it again.
			m.requeue(r, t)
			return
		case letGo:
			return
		}
	}
	m.settleInherited(r)
	if res.outcome != OutcomeSettled && t.stored {
		// A turn that did not settle retires its agent before the next.
		m.release(r, "turn "+res.outcome)
	}
	r.events.flush() // the turn's events come before its end
	ended := event.TurnEnded{
		TurnID: t.id, MessageID: t.messageID, Outcome: res.outcome, Reason: res.reason, Text: res.text,
		Usage: res.usage, Compute: res.compute,
	}
	if t.stored {
		// While the turn is still the room's: no revert runs meanwhile.
		m.snapshotAfter(r, t, &ended)
	}
	r.mu.Lock()
	r.turn = nil // deliveries go to the queue from here on
	r.ending = true
	r.endDone = make(chan struct{})
	r.lastUsed = time.Now()
	joined := slices.Clone(t.joined)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.ending = false
		close(r.endDone)
		r.mu.Unlock()
		m.slotWake.signal() // the room may have gone idle
	}()
	resume, handled := r.events.release(0, res.offset, false)
	ids := append([]string{t.messageID}, joined...)
	turnID := ""
	if t.stored {
		turnID = t.id
	}
	m.writeEnd(r, func(tx Tx) error {
		if t.stored {
			if err := tx.EndTurn(t.id, res.outcome, res.reason, res.text, res.usage); err != nil {
				return err
			}
			if _, err := appendEvent(tx, r.id, ended); err != nil {
				return err
			}
			if res.compute != nil {
				if err := addCompute(tx, r.id, *res.compute); err != nil {
					return err
				}
			}
		}
		if err := endMessages(tx, r.id, ids, turnID, res.outcome, res.reason); err != nil {
			return err
		}
		if res.offset > 0 {
			// The turn's frames, its end included, are not read again.
			return tx.SetAgentOffset(r.id, resume, handled)
		}
		return nil
	})
	if m.onTurnEndWritten != nil {
		m.onTurnEndWritten(r.id)
	}
	if t.stored {
		m.noteBudget(r)
	}
}

// Retries of a write that ends messages (writeEnd).
const (
	endRetryFirst = 100 * time.Millisecond
	endRetryMax   = 5 * time.Second
)

// writeEnd makes a write that ends accepted messages, retrying it with
// backoff while the store refuses it (a full disk, a store without a
// leader): an accepted message must end, and the room's queue waits
// meanwhile rather than running later messages first. It gives up when
// the room is no longer this host's, the store is closed, or the manager
// closes (its next Start recovers the messages, in order).
func (m *Manager) writeEnd(r *roomState, fn func(tx Tx) error) {
	delay := endRetryFirst
	for attempt := 1; ; attempt++ {
		err := m.write(fn)
		if err == nil {
			if attempt > 1 {
				m.log.Info("room: the store took the end of a turn it had refused", "room", r.id, "attempts", attempt)
			}
			return
		}
		r.mu.Lock()
		dropped := r.dropped
		r.mu.Unlock()
		if dropped || errors.Is(err, ErrNotHeld) || errors.Is(err, record.ErrClosed) ||
			errors.Is(err, ErrNotFound) || errors.Is(err, ErrConflict) {
			m.log.Error("room: recording a turn's end failed", "room", r.id, "err", err)
			return
		}
		if attempt == 1 || attempt%20 == 0 {
			m.log.Error("room: the store refused the end of a turn; retrying", "room", r.id, "attempt", attempt, "err", err)
		}
		timer := time.NewTimer(delay)
		select {
		case <-timer.C:
		case <-m.ctx.Done():
			timer.Stop()
			m.log.Error("room: closing with a turn's end not recorded; the next start recovers it", "room", r.id, "err", err)
			return
		}
		delay = min(2*delay, endRetryMax)
	}
}

// requeue ends a turn whose prompt never reached the agent and puts its
// messages back in the queue (in the store, for the next host).
func (m *Manager) requeue(r *roomState, t *turnRun) {
	r.mu.Lock()
	joined := slices.Clone(t.joined)
	r.mu.Unlock()
	err := m.write(func(tx Tx) error {
		if err := tx.EndTurn(t.id, OutcomeCancelled, errRequeued.Error(), "", record.Usage{}); err != nil {
			return err
		}
		if _, err := appendEvent(tx, r.id, event.TurnEnded{
			TurnID: t.id, MessageID: t.messageID, Outcome: OutcomeCancelled, Reason: errRequeued.Error(),
		}); err != nil {
			return err
		}
		for _, id := range append([]string{t.messageID}, joined...) {
			if err := tx.UpdateMessage(id, record.MessageQueued, "", "", ""); err != nil {
				return err
			}
			if _, err := appendEvent(tx, r.id, event.MessageQueued{MessageID: id, Recovered: true}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		m.log.Error("room: queueing a turn the agent never had again", "room", r.id, "err", err)
	}
}

// execute runs the turn on the room's agent and judges its outcome.
func (m *Manager) execute(r *roomState, t *turnRun, cfg Config, text string) turnEnd {
	a, err := m.ensureAgent(t.ctx, r, cfg)
	var res TurnResult
	var tm *turnMeter
	if err == nil {
		r.mu.Lock()
		lost := r.lost
		r.mu.Unlock()
		if lost {
			text = m.transcript(r.id, t.messageSeq) + text
		}
		r.mu.Lock()
		// Checked with the prompt, under the lock Detach takes the agent
		// with: either the agent gets the prompt and is let go of with
		// the turn open, or neither happens and the turn is queued again.
		if m.stopping.Load() || r.agent != a {
			r.mu.Unlock()
			err = errShutdown
		} else {
			r.lost = false
			if r.revertedTo != "" {
				text = revertNote(r.revertedTo) + text
				r.revertedTo = ""
			}
			for _, e := range t.early {
				text += "\n\n" + e
			}
			t.prompted = true
			r.mu.Unlock()
			tm = m.startMeter(r, t, a)
			res, err = a.Run(t.ctx, text)
		}
	}
	r.mu.Lock()
	t.returned = true
	r.mu.Unlock()
	end := m.judge(t, res, err)
	tm.finish(&end)
	return end
}

// judge is a turn's outcome from the agent's result and the turn's
// context.
func (m *Manager) judge(t *turnRun, res TurnResult, err error) turnEnd {
	end := m.judgeOutcome(t, res, err)
	end.usage = res.Usage // spent whatever the outcome
	return end
}

func (m *Manager) judgeOutcome(t *turnRun, res TurnResult, err error) turnEnd {
	// A run the agent ended well is settled, whatever cut the turn's
	// context as it answered (a cancel, a deadline, the host's stop):
	// that is how it ended.
	if err == nil {
		if res.Uncertain {
			return turnEnd{outcome: OutcomeSettled, reason: "uncertain: the agent's state could not be confirmed after the turn", text: res.Text, offset: res.Offset}
		}
		return turnEnd{outcome: OutcomeSettled, text: res.Text, offset: res.Offset}
	}
	switch cause := context.Cause(t.ctx); {
	case errors.Is(cause, errCancelled):
		return turnEnd{outcome: OutcomeCancelled, reason: "cancelled"}
	case errors.Is(cause, errShutdown):
		return turnEnd{outcome: OutcomeCancelled, reason: errShutdown.Error()}
	case errors.Is(cause, errDropped):
		return turnEnd{outcome: OutcomeFailed, reason: cause.Error()}
	case errors.Is(cause, errTurnDeadline), errors.Is(cause, errStalled), errors.Is(cause, errNoSlot):
		return turnEnd{outcome: OutcomeTimedOut, reason: cause.Error()}
	case errors.Is(err, errShutdown):
		// The host stopped before the agent had the prompt.
		return turnEnd{outcome: OutcomeCancelled, reason: errShutdown.Error()}
	case err != nil:
		return turnEnd{outcome: OutcomeFailed, reason: err.Error()}
	default:
		return turnEnd{outcome: OutcomeFailed, reason: cause.Error()}
	}
}

// awaitDeliveries waits until no delivery into t is in flight. The caller
// made sure none begins any more (t.closed, or the manager stopping);
// each one in flight is bounded (deliverTimeout, and the store write's
// own bound), so this wait is too.
func (m *Manager) awaitDeliveries(r *roomState, t *turnRun) {
	for {
		r.mu.Lock()
		if t.delivering == 0 {
			r.mu.Unlock()
			return
		}
		if t.delivered == nil {
			t.delivered = make(chan struct{})
		}
		ch := t.delivered
		r.mu.Unlock()
		if m.onAwaitDeliveries != nil {
			m.onAwaitDeliveries(r.id)
		}
		<-ch
	}
}
