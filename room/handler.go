package room

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/record"
)

// handler is a room's Handler, given to its agent.
type handler struct {
	m *Manager
	r *roomState
}

// turn returns the room's running turn (nil for a run the agent started
// by itself).
func (h *handler) turn() *turnRun {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	return h.r.turn
}

func (h *handler) Event(ev AgentEvent) {
	t := h.turn()
	turnID := ""
	if t != nil {
		t.clock.activity()
		turnID = t.id
	}
	if ev.Kind == KindActivity {
		return
	}
	if ev.Kind == KindDialog {
		h.r.events.hold(ev.Start)
		return
	}
	var p event.Payload
	switch ev.Kind {
	case KindText:
		p = event.TextDelta{TurnID: turnID, Text: ev.Text}
	case KindToolStarted:
		p = event.ToolStarted{TurnID: turnID, Tool: ev.Tool, CallID: ev.CallID, Input: ev.Input}
	case KindToolEnded:
		p = event.ToolEnded{TurnID: turnID, Tool: ev.Tool, CallID: ev.CallID, Output: ev.Output, IsError: ev.IsError}
		if t != nil {
			// Did the tool meet a limit of the room's? (room.limit)
			h.r.mu.Lock()
			tm := t.meter
			h.r.mu.Unlock()
			tm.kick()
		}
	case KindMalformed:
		if ev.Suppressed > 0 {
			p = event.AgentMalformed{TurnID: turnID, Suppressed: ev.Suppressed}
		} else {
			p = event.AgentMalformed{TurnID: turnID, Line: ev.Line, Length: ev.Length, Reason: ev.Reason}
		}
	default:
		return
	}
	h.r.events.add(p, ev.Offset)
}

// await pauses the turn's clocks while a person decides, and returns the
// decision from ch, or timedOut at the deadline, or neither when the turn
// (or ctx, or the manager) ends first.
func await[T any](ctx context.Context, m *Manager, t *turnRun, deadline time.Time, ch <-chan T) (v T, got, timedOut bool) {
	var tdone <-chan struct{}
	if t != nil {
		t.clock.pause()
		defer t.clock.resume()
		tdone = t.ctx.Done()
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case v = <-ch:
		return v, true, false
	case <-timer.C:
		return v, false, true
	case <-ctx.Done():
	case <-tdone:
	case <-m.ctx.Done():
	}
	return v, false, false
}

// context returns what a request for a person needs: the running turn
// (nil in a run the agent started by itself), its id and the room's
// configuration.
func (h *handler) context() (*turnRun, string, Config) {
	r := h.r
	r.mu.Lock()
	defer r.mu.Unlock()
	cfg, _ := h.m.configLocked(r) // validated at Submit
	if r.turn == nil {
		return nil, "", cfg
	}
	return r.turn, r.turn.id, cfg
}

func (h *handler) Approve(ctx context.Context, req ApprovalRequest) bool {
	m, r := h.m, h.r
	t, turnID, cfg := h.context()
	id := newID("a")
	now := time.Now()
	deadline := now.Add(cfg.ApprovalTimeout)
	ch := make(chan bool, 1)
	r.mu.Lock()
	// Asked again after a restart: the pending approval goes on.
	i := slices.IndexFunc(r.inheritedA, func(a record.Approval) bool { return a.Tool == req.Tool && a.Input == req.Input })
	inherited := i >= 0
	if inherited {
		id, deadline = r.inheritedA[i].ID, r.inheritedA[i].Deadline
		r.inheritedA = slices.Delete(r.inheritedA, i, i+1)
	}
	if r.approvals == nil {
		r.approvals = map[string]chan bool{}
	}
	r.approvals[id] = ch
	r.mu.Unlock()
	r.events.hold(req.Start) // until decided, a new host reads it again
	defer func() {
		r.mu.Lock()
		delete(r.approvals, id)
		r.mu.Unlock()
	}()
	r.events.flush() // the tool's own events come first
	if !inherited {
		err := m.write(func(tx Tx) error {
			if err := tx.PutApproval(record.Approval{ID: id, Room: r.id, TurnID: turnID, Tool: req.Tool, Input: req.Input,
				Options: req.Options, Created: now, Deadline: deadline}); err != nil {
				return err
			}
			_, err := appendEvent(tx, r.id, event.ApprovalRequested{
				ApprovalID: id, TurnID: turnID, Tool: req.Tool, Input: req.Input, Options: req.Options, Deadline: deadline.UTC(),
			})
			return err
		})
		if err != nil {
			m.log.Error("room: recording an approval failed; denied", "room", r.id, "err", err)
			m.dialogDone(r, req.Start, req.Offset)
			return false
		}
		if m.opts.Policy != nil {
			if d := m.opts.Policy(r.id, req); d != Ask {
				if err := m.resolveApproval(context.Background(), r.id, id, d == Allow, "policy"); err == nil {
					m.dialogDone(r, req.Start, req.Offset)
					return d == Allow
				}
			}
		}
	} else if aps, err := m.st.Approvals(context.Background(), r.id, false); err == nil {
		// Decided while no host listened: that decision stands.
		if j := slices.IndexFunc(aps, func(a record.Approval) bool { return a.ID == id }); j >= 0 && aps[j].Decision != "" {
			m.dialogDone(r, req.Start, req.Offset)
			return aps[j].Decision == "allow"
		}
	}
	allow, got, timedOut := await(ctx, m, t, deadline, ch)
	if got {
		m.dialogDone(r, req.Start, req.Offset)
		return allow
	}
	if m.isDetaching() {
		// Left pending for the next host, which asks the agent again.
		return false
	}
	by := "cancel"
	if timedOut {
		by = "deadline"
	}
	defer m.dialogDone(r, req.Start, req.Offset)
	// Nobody decided: deny, unless a person got there first.
	err := m.resolveApproval(context.Background(), r.id, id, false, by)
	if errors.Is(err, ErrConflict) {
		aps, _ := m.st.Approvals(context.Background(), r.id, false)
		i := slices.IndexFunc(aps, func(a record.Approval) bool { return a.ID == id })
		return i >= 0 && aps[i].Decision == "allow"
	}
	return false
}

// Approve records a person's decision on a pending approval:
// ErrNotFound for an unknown one, ErrConflict for one already resolved.
func (m *Manager) Approve(ctx context.Context, room, id string, allow bool) error {
	if err := ValidateID(room); err != nil {
		return err
	}
	if ok, err := m.remote(ctx, room, ControlOp{Kind: ControlApprove, ID: id, Allow: allow}); ok {
		return err
	}
	return m.approveLocal(ctx, room, id, allow)
}

// approveLocal is a person's decision, through the room's door.
func (m *Manager) approveLocal(ctx context.Context, room, id string, allow bool) error {
	_, leave, err := m.enter(ctx, room, false)
	if err != nil {
		return err
	}
	defer leave()
	return m.resolveApproval(ctx, room, id, allow, "person")
}

func (m *Manager) resolveApproval(ctx context.Context, room, id string, allow bool, by string) error {
	decision := "deny"
	if allow {
		decision = "allow"
	}
	err := m.stWrite(ctx, func(tx Tx) error {
		if err := tx.ResolveApproval(room, id, decision, by); err != nil {
			return err
		}
		d := event.ApprovalResolved{ApprovalID: id, Decision: decision, By: by}
		if by == "person" {
			d.Token = tokenOf(ctx)
		}
		_, err := appendEvent(tx, room, d)
		return err
	})
	if err != nil {
		return err
	}
	m.mu.Lock()
	r := m.rooms[room]
	m.mu.Unlock()
	if r != nil {
		r.mu.Lock()
		if ch := r.approvals[id]; ch != nil {
			select {
			case ch <- allow:
			default:
			}
		}
		r.mu.Unlock()
	}
	return nil
}

func (h *handler) Ask(ctx context.Context, req QuestionRequest) (string, bool) {
	m, r := h.m, h.r
	t, turnID, cfg := h.context()
	id := newID("q")
	now := time.Now()
	deadline := now.Add(cfg.QuestionTimeout)
	ch := make(chan answer, 1)
	r.events.flush()
	// qmu is held from the write to the registration: a message that saw
	// question.asked must find the question waiting for its answer.
	r.qmu.Lock()
	// Asked again after a restart: the pending question goes on.
	i := slices.IndexFunc(r.inheritedQ, func(q record.Question) bool {
		return q.Title == req.Title && slices.Equal(q.Options, req.Options)
	})
	if i >= 0 {
		id, deadline = r.inheritedQ[i].ID, r.inheritedQ[i].Deadline
		r.inheritedQ = slices.Delete(r.inheritedQ, i, i+1)
	} else {
		err := m.write(func(tx Tx) error {
			if err := tx.PutQuestion(record.Question{ID: id, Room: r.id, TurnID: turnID, Title: req.Title, Options: req.Options,
				Created: now, Deadline: deadline}); err != nil {
				return err
			}
			_, err := appendEvent(tx, r.id, event.QuestionAsked{
				QuestionID: id, TurnID: turnID, Title: req.Title, Options: req.Options, Deadline: deadline.UTC(),
			})
			return err
		})
		if err != nil {
			r.qmu.Unlock()
			m.log.Error("room: recording a question failed; cancelled", "room", r.id, "err", err)
			return "", false
		}
	}
	if r.questions == nil {
		r.questions = map[string]chan answer{}
	}
	r.questions[id] = ch
	if !slices.Contains(r.questionQ, id) { // an inherited one is in already
		r.questionQ = append(r.questionQ, id)
	}
	r.qmu.Unlock()
	r.events.hold(req.Start)
	defer func() {
		r.qmu.Lock()
		delete(r.questions, id)
		r.questionQ = slices.DeleteFunc(r.questionQ, func(q string) bool { return q == id })
		r.qmu.Unlock()
	}()
	if i >= 0 {
		// Answered while no host listened: that answer stands.
		if qs, err := m.st.Questions(context.Background(), r.id, false); err == nil {
			if j := slices.IndexFunc(qs, func(q record.Question) bool { return q.ID == id }); j >= 0 && !qs[j].Answered.IsZero() {
				m.dialogDone(r, req.Start, req.Offset)
				return qs[j].Answer, qs[j].By != "restart"
			}
		}
	}
	a, got, timedOut := await(ctx, m, t, deadline, ch)
	if got {
		m.dialogDone(r, req.Start, req.Offset)
		return a.text, a.ok
	}
	if m.isDetaching() {
		return "", false
	}
	defer m.dialogDone(r, req.Start, req.Offset)
	by := "cancel"
	if timedOut {
		by = "deadline"
	}
	if err := m.answerQuestion(context.Background(), r.id, id, "", by, false); errors.Is(err, ErrConflict) {
		qs, _ := m.st.Questions(context.Background(), r.id, false)
		if i := slices.IndexFunc(qs, func(q record.Question) bool { return q.ID == id }); i >= 0 {
			return qs[i].Answer, true
		}
	}
	if timedOut {
		// Cancelled for the room, but the turn goes on: the agent is told
		// that nobody answered (a cancelled dialog would abort omp's turn).
		return NoAnswer, true
	}
	return "", false
}

// NoAnswer is what the agent is told when nobody answered its question
// before the deadline.
const NoAnswer = "[no answer: nobody answered before the deadline; go on without it]"

// Answer records a person's answer to a pending question: ErrNotFound
// for an unknown one, ErrConflict for one already answered.
func (m *Manager) Answer(ctx context.Context, room, id, text string) error {
	if err := ValidateID(room); err != nil {
		return err
	}
	if len(text) > MaxMessageBytes {
		return fmt.Errorf("%w: answer over %d bytes", ErrBadMessage, MaxMessageBytes)
	}
	if ok, err := m.remote(ctx, room, ControlOp{Kind: ControlAnswer, ID: id, Text: text}); ok {
		return err
	}
	return m.answerLocal(ctx, room, id, text)
}

// answerLocal is a person's answer, through the room's door.
func (m *Manager) answerLocal(ctx context.Context, room, id, text string) error {
	_, leave, err := m.enter(ctx, room, false)
	if err != nil {
		return err
	}
	defer leave()
	return m.answerQuestion(ctx, room, id, text, "person", true)
}

func (m *Manager) answerQuestion(ctx context.Context, room, id, text, by string, ok bool) error {
	return m.answerQuestionWith(ctx, room, id, text, by, ok, "")
}

// answerByMessage takes message msgID as the answer to question id: the
// message ends ("answered", its message.ended right after
// question.answered) in the same write.
func (m *Manager) answerByMessage(ctx context.Context, room, id, msgID, text string) error {
	return m.answerQuestionWith(ctx, room, id, text, "message", true, msgID)
}

func (m *Manager) answerQuestionWith(ctx context.Context, room, id, text, by string, ok bool, msgID string) error {
	err := m.stWrite(ctx, func(tx Tx) error {
		if err := tx.AnswerQuestion(room, id, text, by); err != nil {
			return err
		}
		d := event.QuestionAnswered{QuestionID: id, Answer: text, By: by, Cancelled: !ok, MessageID: msgID}
		if ok {
			d.Token = tokenOf(ctx)
		}
		if _, err := appendEvent(tx, room, d); err != nil {
			return err
		}
		if msgID == "" {
			return nil
		}
		return endMessages(tx, room, []string{msgID}, "", OutcomeAnswered, "answered question "+id)
	})
	if err != nil {
		return err
	}
	m.mu.Lock()
	r := m.rooms[room]
	m.mu.Unlock()
	if r != nil {
		r.qmu.Lock()
		if ch := r.questions[id]; ch != nil {
			select {
			case ch <- answer{text: text, ok: ok}:
			default:
			}
		}
		r.qmu.Unlock()
	}
	return nil
}
