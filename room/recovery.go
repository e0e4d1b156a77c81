package room

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/record"
)

// recoverRooms recovers room ("" for every room): turns that were running
// end failed (reason), pending approvals are denied and questions
// cancelled (by), and waiting messages queue again in order.
func (m *Manager) recoverRooms(ctx context.Context, room, reason, by string) error {
	turns, err := m.st.OpenTurns(ctx)
	if err != nil {
		return err
	}
	// Agents left running by the host before (the process daemon) are
	// attached at start; a room adopted from a cluster starts afresh.
	attached := map[string]string{}
	if room == "" {
		if attached, err = m.attach(ctx, turns); err != nil {
			return err
		}
	}
	msgs, err := m.st.OpenMessages(ctx)
	if err != nil {
		return err
	}
	inTurn := map[string][]string{} // turn -> its messages, the prompt's first
	for _, msg := range msgs {
		if msg.Status == record.MessageStarted && msg.TurnID != "" {
			inTurn[msg.TurnID] = append(inTurn[msg.TurnID], msg.ID)
		}
	}
	ended := map[string]bool{}
	for _, t := range openTurnsOf(turns, room) {
		if _, ok := attached[t.Room]; ok {
			continue // its agent runs on; the room's worker continues it
		}
		ids := []string{t.MessageID}
		for _, id := range inTurn[t.ID] {
			if id != t.MessageID {
				ids = append(ids, id)
			}
		}
		err := m.stWrite(ctx, func(tx Tx) error {
			// What the lost agent spent in the turn is unknown: it counts
			// as the turn's, zero.
			if err := tx.EndTurn(t.ID, OutcomeFailed, reason, "", record.Usage{}); err != nil {
				return err
			}
			if _, err := appendEvent(tx, t.Room, event.TurnEnded{
				TurnID: t.ID, MessageID: t.MessageID, Outcome: OutcomeFailed, Reason: reason,
			}); err != nil {
				return err
			}
			return endMessages(tx, t.Room, ids, t.ID, OutcomeFailed, reason)
		})
		if err != nil {
			return err
		}
		for _, id := range ids {
			ended[id] = true
		}
	}
	aps, err := m.st.Approvals(ctx, room, true)
	if err != nil {
		return err
	}
	for _, a := range aps {
		if tid := attached[a.Room]; tid != "" && a.TurnID == tid {
			continue // the attached agent asks again (inherited)
		}
		if err := m.resolveApproval(ctx, a.Room, a.ID, false, by); err != nil && !errors.Is(err, ErrConflict) {
			return err
		}
	}
	qs, err := m.st.Questions(ctx, room, true)
	if err != nil {
		return err
	}
	for _, q := range qs {
		if tid := attached[q.Room]; tid != "" && q.TurnID == tid {
			continue
		}
		if err := m.answerQuestion(ctx, q.Room, q.ID, "", by, false); err != nil && !errors.Is(err, ErrConflict) {
			return err
		}
	}
	for _, msg := range msgs {
		if room != "" && msg.Room != room || ended[msg.ID] {
			continue
		}
		if tid := attached[msg.Room]; msg.Status == record.MessageStarted && tid != "" && msg.TurnID == tid {
			// In (or steered into) the turn the attached agent runs on.
			continue
		}
		if msg.Status == record.MessageStarted {
			// Steered into a turn that died with the host.
			err := m.stWrite(ctx, func(tx Tx) error {
				return endMessages(tx, msg.Room, []string{msg.ID}, msg.TurnID, OutcomeFailed, reason)
			})
			if err != nil {
				return err
			}
			continue
		}
		r, err := m.room(msg.Room)
		if err != nil {
			m.log.Error("room: stored message for an invalid room id", "err", err)
			continue
		}
		if msg.Status == record.MessageAccepted {
			err := m.stWrite(ctx, func(tx Tx) error {
				if err := tx.UpdateMessage(msg.ID, record.MessageQueued, "", "", ""); err != nil {
					return err
				}
				_, err := appendEvent(tx, msg.Room, event.MessageQueued{MessageID: msg.ID, Recovered: true})
				return err
			})
			if err != nil {
				return err
			}
		}
		r.mu.Lock()
		r.insertLocked(queued{id: msg.ID, text: msg.Text, seq: msg.Seq, place: true})
		m.ensureWorkerLocked(r)
		r.mu.Unlock()
	}
	return nil
}

// attachConcurrency bounds the agents attached at once at Start.
const attachConcurrency = 32

// attach re-attaches the agents a previous host left running (through an
// Attacher transport) and reports the rooms attached, each with the turn
// it continues ("" for none). A room whose agent cannot be attached
// forgets it and recovers as after a crash.
func (m *Manager) attach(ctx context.Context, turns []record.Turn) (map[string]string, error) {
	attached := map[string]string{}
	recs, err := m.st.AgentRooms(ctx)
	if err != nil || len(recs) == 0 {
		return attached, err
	}
	at, ok := m.opts.Transport.(Attacher)
	open := map[string]record.Turn{}
	for _, t := range turns {
		open[t.Room] = t
	}
	var joined map[string][]string // turn -> messages steered into it
	if ok {
		msgs, err := m.st.OpenMessages(ctx)
		if err != nil {
			return nil, err
		}
		joined = map[string][]string{}
		for _, msg := range msgs {
			if msg.Status == record.MessageStarted && msg.TurnID != "" {
				joined[msg.TurnID] = append(joined[msg.TurnID], msg.ID)
			}
		}
	}
	// Side by side: each attach waits on its agent's answers.
	type attachment struct {
		a      Detachable
		r      *roomState
		reason string
	}
	got := make([]attachment, len(recs))
	sem := make(chan struct{}, attachConcurrency)
	var wg sync.WaitGroup
	for i, rec := range recs {
		if !ok {
			got[i].reason = "the transport cannot attach agents"
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			got[i].a, got[i].r, got[i].reason = m.attachRoom(ctx, at, rec, open)
		}()
	}
	wg.Wait()
	for i, rec := range recs {
		a, r, reason := got[i].a, got[i].r, got[i].reason
		if a == nil {
			m.log.Warn("room: the agent left running could not be attached; the room recovers", "room", rec.ID, "reason", reason)
			err := m.stWrite(ctx, func(tx Tx) error {
				if err := tx.SetAgentProc(rec.ID, ""); err != nil {
					return err
				}
				_, err := appendEvent(tx, rec.ID, event.AgentReleased{Reason: "not attached at restart: " + reason})
				return err
			})
			if err != nil {
				return nil, err
			}
			continue
		}
		t, running := open[rec.ID]
		attached[rec.ID] = t.ID
		r.mu.Lock()
		if running {
			c := &contTurn{rec: t, run: r.turn}
			for _, id := range joined[t.ID] {
				if id != t.MessageID {
					c.joined = append(c.joined, id)
				}
			}
			r.cont = c
			m.ensureWorkerLocked(r)
		}
		r.mu.Unlock()
	}
	return attached, nil
}

// inherit keeps the approvals and questions pending in the turn the
// attached agent runs on, for the agent to ask again.
func (m *Manager) inherit(ctx context.Context, r *roomState, turnID string) error {
	aps, err := m.st.Approvals(ctx, r.id, true)
	if err != nil {
		return err
	}
	qs, err := m.st.Questions(ctx, r.id, true)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.inheritedA = slices.DeleteFunc(aps, func(a record.Approval) bool { return a.TurnID != turnID })
	r.mu.Unlock()
	r.qmu.Lock()
	r.inheritedQ = slices.DeleteFunc(qs, func(q record.Question) bool { return q.TurnID != turnID })
	for _, q := range r.inheritedQ {
		// The room's next message answers it, as before the restart.
		r.questionQ = append(r.questionQ, q.ID)
	}
	r.qmu.Unlock()
	return nil
}

// settleInherited denies (cancels) what a continued turn inherited and the
// agent did not ask again, so nothing stays pending past its turn.
func (m *Manager) settleInherited(r *roomState) {
	r.mu.Lock()
	aps := r.inheritedA
	r.inheritedA = nil
	r.mu.Unlock()
	r.qmu.Lock()
	qs := r.inheritedQ
	r.inheritedQ = nil
	r.questionQ = slices.DeleteFunc(r.questionQ, func(id string) bool {
		return slices.ContainsFunc(qs, func(q record.Question) bool { return q.ID == id })
	})
	r.qmu.Unlock()
	r.events.release(0, 0, true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, a := range aps {
		if err := m.resolveApproval(ctx, r.id, a.ID, false, "restart"); err != nil && !errors.Is(err, ErrConflict) {
			m.log.Error("room: denying an approval left from before the restart", "room", r.id, "err", err)
		}
	}
	for _, q := range qs {
		if err := m.answerQuestion(ctx, r.id, q.ID, "", "restart", false); err != nil && !errors.Is(err, ErrConflict) {
			m.log.Error("room: cancelling a question left from before the restart", "room", r.id, "err", err)
		}
	}
}

// dialogDone records that a dialog (its frame from start to end in the
// agent's output) was decided, so a later attach does not ask it again.
func (m *Manager) dialogDone(r *roomState, start, end int64) {
	if end <= 0 || m.isDetaching() {
		return
	}
	resume, handled := r.events.release(start, end, !r.hasInherited())
	if err := m.write(func(tx Tx) error { return tx.SetAgentOffset(r.id, resume, handled) }); err != nil {
		m.log.Error("room: recording the agent's output offset", "room", r.id, "err", err)
	}
}

// hasInherited reports dialogs left by the previous host not asked again.
func (r *roomState) hasInherited() bool {
	r.mu.Lock()
	a := len(r.inheritedA)
	r.mu.Unlock()
	r.qmu.Lock()
	defer r.qmu.Unlock()
	return a+len(r.inheritedQ) > 0
}

// attachRoom attaches one room's agent; nil and why when it cannot.
func (m *Manager) attachRoom(ctx context.Context, at Attacher, rec record.Room, open map[string]record.Turn) (Detachable, *roomState, string) {
	r, err := m.room(rec.ID)
	if err != nil {
		return nil, nil, err.Error()
	}
	if err := m.refreshSettings(ctx, r); err != nil {
		return nil, nil, err.Error()
	}
	r.mu.Lock()
	cfg, err := m.configLocked(r)
	r.mu.Unlock()
	if err != nil {
		return nil, nil, err.Error()
	}
	t, running := open[rec.ID]
	spec := AgentSpec{Room: r.id, Workspace: r.workspace, Home: filepath.Join(r.dir, "home"),
		SessionID: rec.SessionID, Config: cfg, Tools: m.roomTools(r), MCP: cfg.MCP, Handler: &handler{m: m, r: r}}
	// The agent reads on from the offset as soon as it is attached: the
	// turn it continues, and what it asked before, are in place first,
	// and agent.attached precedes what it reads.
	if running {
		if err := m.inherit(ctx, r, t.ID); err != nil {
			return nil, nil, err.Error()
		}
		tctx, cancel := context.WithCancelCause(m.ctx)
		run := &turnRun{id: t.ID, messageID: t.MessageID, ctx: tctx, cancel: cancel, clock: newClock(cfg.TurnTimeout, cfg.Liveness), prompted: true, stored: true}
		r.mu.Lock()
		r.turn = run
		r.mu.Unlock()
	}
	undo := func() {
		r.mu.Lock()
		if r.turn != nil {
			r.turn.cancel(nil)
		}
		r.turn, r.inheritedA = nil, nil
		r.mu.Unlock()
		r.qmu.Lock()
		r.inheritedQ, r.questionQ = nil, nil
		r.qmu.Unlock()
	}
	r.events.attached(rec.AgentOffset, rec.AgentSeen, r.hasInherited())
	err = m.stWrite(ctx, func(tx Tx) error {
		_, err := appendEvent(tx, rec.ID, event.AgentAttached{SessionID: rec.SessionID, Offset: rec.AgentOffset, TurnID: t.ID})
		return err
	})
	if err != nil {
		undo()
		return nil, nil, err.Error()
	}
	m.mu.Lock()
	m.resident++ // a slot, over MaxResident if it must: the agent runs already
	m.mu.Unlock()
	a, err := at.Attach(ctx, spec, Attachment{Handle: rec.AgentProc, Offset: rec.AgentOffset, RunOpen: running})
	if err != nil {
		undo()
		m.freeSlot()
		return nil, nil, err.Error()
	}
	r.mu.Lock()
	r.agent, r.session, r.lastUsed = a, a.SessionID(), time.Now()
	r.mu.Unlock()
	return a, r, ""
}
