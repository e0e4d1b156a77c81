package tracing

import (
	"context"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/room"
)

// Attribute keys: the GenAI semantic conventions' where they say, and
// agenthost.* for the rest.
const (
	attrOperation    = "gen_ai.operation.name"
	attrAgentName    = "gen_ai.agent.name"
	attrProvider     = "gen_ai.provider.name"
	attrRequestModel = "gen_ai.request.model"
	attrConversation = "gen_ai.conversation.id"
	attrInputTokens  = "gen_ai.usage.input_tokens"
	attrOutputTokens = "gen_ai.usage.output_tokens"
	attrCacheRead    = "gen_ai.usage.cache_read.input_tokens"
	attrCacheWrite   = "gen_ai.usage.cache_creation.input_tokens"
	attrToolName     = "gen_ai.tool.name"
	attrToolCallID   = "gen_ai.tool.call.id"
	attrToolArgs     = "gen_ai.tool.call.arguments"
	attrToolType     = "gen_ai.tool.type"
	attrErrorType    = "error.type"

	attrRoom      = "agenthost.room.id"
	attrTurn      = "agenthost.turn.id"
	attrMessage   = "agenthost.message.id"
	attrSession   = "agenthost.session.id"
	attrOutcome   = "agenthost.turn.outcome"
	attrReason    = "agenthost.turn.reason"
	attrCost      = "agenthost.usage.cost_usd"
	attrFiles     = "agenthost.changes.files"
	attrInsert    = "agenthost.changes.insertions"
	attrDelete    = "agenthost.changes.deletions"
	attrChangeErr = "agenthost.changes.error"
)

// Span names. The turn's and the tool calls' are the GenAI conventions'
// ("invoke_agent {gen_ai.agent.name}", "execute_tool {gen_ai.tool.name}").
const (
	opInvokeAgent = "invoke_agent"
	opExecuteTool = "execute_tool"
	spanApproval  = "approval"
	spanQuestion  = "question"
	spanCheckout  = "workspace.checkout"
	spanAgentAt   = "agent.start"
	spanAttach    = "agent.attach"
)

func (t *Tracer) event(o room.Observed) {
	ev, at := o.Event, o.Event.Time
	switch d := o.Payload.(type) {
	case event.MessageAccepted:
		if o.TraceParent == "" {
			return
		}
		if sc := t.callerContext(o.TraceParent, o.TraceState); sc.IsValid() {
			t.noteMessage(d.MessageID, sc)
		}
	case event.MessageEnded:
		delete(t.msgs, d.MessageID)
	case event.TurnStarted:
		t.startTurn(ev.Room, d.TurnID, d.MessageID, at, false)
	case event.AgentAttached:
		// A turn the previous host started goes on here: its span starts
		// now (the previous host's ended unfinished).
		if d.TurnID != "" && t.turns[d.TurnID] == nil {
			t.startTurn(ev.Room, d.TurnID, "", at, true)
		}
		if ts := t.turns[d.TurnID]; ts != nil {
			t.child(ts, spanAttach, at, attribute.String(attrSession, d.SessionID), attribute.Int64("agenthost.agent.offset", d.Offset)).
				End(trace.WithTimestamp(at))
		}
	case event.MessageDelivered:
		ts := t.turns[d.TurnID]
		if ts == nil {
			return
		}
		ts.span.AddEvent("message.delivered", trace.WithTimestamp(at), trace.WithAttributes(
			attribute.String(attrMessage, d.MessageID), attribute.String("agenthost.message.delivery", d.Delivery)))
		if sc, ok := t.msgs[d.MessageID]; ok {
			ts.span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
				attribute.String(attrMessage, d.MessageID), attribute.String("agenthost.message.delivery", d.Delivery),
			}})
		}
	case event.TurnWaiting:
		if ts := t.turns[d.TurnID]; ts != nil {
			ts.span.AddEvent("turn.waiting", trace.WithTimestamp(at), trace.WithAttributes(
				attribute.Int("agenthost.slots.resident", d.Resident), attribute.Int("agenthost.slots.max", d.Slots)))
		}
	case event.WorkspaceReady:
		// The checkout runs from the turn's start to this event.
		if ts := t.turns[t.running[ev.Room]]; ts != nil {
			t.child(ts, spanCheckout, ts.started,
				attribute.String("agenthost.workspace.url", redactURL(d.URL)), attribute.String("agenthost.workspace.ref", d.Ref),
				attribute.String("agenthost.workspace.kind", d.Kind), attribute.String("agenthost.workspace.commit", d.Commit),
			).End(trace.WithTimestamp(at))
		}
	case event.AgentStarted:
		t.agentStarted(ev.Room, d, at)
	case event.ContextLost:
		if ts := t.turns[t.running[ev.Room]]; ts != nil {
			ts.span.AddEvent("context.lost", trace.WithTimestamp(at), trace.WithAttributes(
				attribute.String("agenthost.session.previous", d.PreviousSessionID), attribute.String(attrReason, bound(d.Reason, maxReason))))
		}
	case event.AgentReleased:
		if ts := t.turns[t.running[ev.Room]]; ts != nil {
			ts.span.AddEvent("agent.released", trace.WithTimestamp(at), trace.WithAttributes(attribute.String(attrReason, bound(d.Reason, maxReason))))
		}
	case event.ToolStarted:
		ts := t.turns[d.TurnID]
		if ts == nil {
			return
		}
		attrs := []attribute.KeyValue{
			attribute.String(attrOperation, opExecuteTool), attribute.String(attrToolName, d.Tool),
			attribute.String(attrToolCallID, d.CallID), attribute.String(attrToolType, "function"),
		}
		if t.cfg.ToolInput {
			attrs = append(attrs, attribute.String(attrToolArgs, d.Input))
		}
		if old := ts.tools[d.CallID]; old != nil {
			old.End(trace.WithTimestamp(at)) // a call id told twice: the first ends here
		}
		ts.tools[d.CallID] = t.child(ts, opExecuteTool+" "+d.Tool, at, attrs...)
	case event.ToolEnded:
		ts := t.turns[d.TurnID]
		if ts == nil {
			return
		}
		s := ts.tools[d.CallID]
		delete(ts.tools, d.CallID)
		if s == nil {
			// Its start was not seen (dropped, or before a restart).
			s = t.child(ts, opExecuteTool+" "+d.Tool, at, attribute.String(attrOperation, opExecuteTool),
				attribute.String(attrToolName, d.Tool), attribute.String(attrToolCallID, d.CallID))
		}
		outcome := "ok"
		if d.IsError {
			outcome = "error"
			s.SetAttributes(attribute.String(attrErrorType, "tool_error"))
			s.SetStatus(codes.Error, "the tool call failed")
		}
		s.SetAttributes(attribute.String("agenthost.tool.outcome", outcome))
		s.End(trace.WithTimestamp(at))
	case event.ApprovalRequested:
		if ts := t.turns[d.TurnID]; ts != nil {
			attrs := []attribute.KeyValue{
				attribute.String("agenthost.approval.id", d.ApprovalID), attribute.String(attrToolName, d.Tool),
				attribute.String("agenthost.approval.deadline", d.Deadline.UTC().Format(time.RFC3339)),
			}
			if t.cfg.ToolInput {
				attrs = append(attrs, attribute.String(attrToolArgs, d.Input))
			}
			t.pending[d.ApprovalID] = &pendingSpan{span: t.child(ts, spanApproval+" "+d.Tool, at, attrs...), turn: d.TurnID, started: at}
		}
	case event.ApprovalResolved:
		p := t.pending[d.ApprovalID]
		if p == nil {
			return
		}
		delete(t.pending, d.ApprovalID)
		p.span.SetAttributes(attribute.String("agenthost.approval.decision", d.Decision), attribute.String("agenthost.approval.by", d.By),
			attribute.Float64("agenthost.approval.wait_seconds", at.Sub(p.started).Seconds()))
		p.span.End(trace.WithTimestamp(at))
	case event.QuestionAsked:
		if ts := t.turns[d.TurnID]; ts != nil {
			t.pending[d.QuestionID] = &pendingSpan{span: t.child(ts, spanQuestion, at,
				attribute.String("agenthost.question.id", d.QuestionID)), turn: d.TurnID, started: at}
		}
	case event.QuestionAnswered:
		p := t.pending[d.QuestionID]
		if p == nil {
			return
		}
		delete(t.pending, d.QuestionID)
		p.span.SetAttributes(attribute.String("agenthost.question.by", d.By), attribute.Bool("agenthost.question.cancelled", d.Cancelled),
			attribute.Float64("agenthost.question.wait_seconds", at.Sub(p.started).Seconds()))
		p.span.End(trace.WithTimestamp(at))
	case event.TurnEnded:
		t.endTurn(ev.Room, d, at)
	}
}

// startTurn starts turn id's span: invoke_agent, the child of its
// message's caller when it had one.
func (t *Tracer) startTurn(roomID, id, messageID string, at time.Time, attached bool) {
	ctx := context.Background()
	if sc, ok := t.msgs[messageID]; ok {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	agent, model := "", ""
	if t.cfg.RoomInfo != nil {
		ictx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		agent, model, _ = t.cfg.RoomInfo(ictx, roomID)
		cancel()
	}
	name := opInvokeAgent
	if agent != "" {
		name += " " + agent
	}
	attrs := []attribute.KeyValue{
		attribute.String(attrOperation, opInvokeAgent), attribute.String(attrRoom, roomID), attribute.String(attrTurn, id),
	}
	if messageID != "" {
		attrs = append(attrs, attribute.String(attrMessage, messageID))
	}
	if agent != "" {
		attrs = append(attrs, attribute.String(attrAgentName, agent))
	}
	if model != "" {
		provider, id, ok := strings.Cut(model, "/")
		if ok {
			attrs = append(attrs, attribute.String(attrProvider, provider), attribute.String(attrRequestModel, id))
		} else {
			attrs = append(attrs, attribute.String(attrRequestModel, model))
		}
	}
	if attached {
		attrs = append(attrs, attribute.Bool("agenthost.turn.attached", true))
	}
	// CLIENT: the agent runs in a process of its own (the conventions'
	// kind for a remote agent).
	ctx, span := t.tr.Start(ctx, name, trace.WithTimestamp(at), trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	if old := t.turns[id]; old != nil {
		old.span.End(trace.WithTimestamp(at))
	}
	t.turns[id] = &turnSpan{span: span, ctx: ctx, room: roomID, started: at, tools: map[string]trace.Span{}}
	t.running[roomID] = id
	if t.relay != nil && span.SpanContext().IsSampled() {
		sc := span.SpanContext()
		tid, sid := sc.TraceID(), sc.SpanID()
		t.windows.started(roomID, turnWindow{traceID: tid[:], spanID: sid[:], start: at})
	}
}

// child starts a span under turn ts.
func (t *Tracer) child(ts *turnSpan, name string, at time.Time, attrs ...attribute.KeyValue) trace.Span {
	_, s := t.tr.Start(ts.ctx, name, trace.WithTimestamp(at), trace.WithAttributes(attrs...))
	return s
}

// agentStarted makes the agent's start a span of the room's running turn,
// from the start the Phase told (the event itself comes once recorded).
func (t *Tracer) agentStarted(roomID string, d event.AgentStarted, at time.Time) {
	ph := t.agentAt[roomID]
	delete(t.agentAt, roomID)
	ts := t.turns[t.running[roomID]]
	if ts == nil {
		return
	}
	ts.span.SetAttributes(attribute.String(attrSession, d.SessionID), attribute.String(attrConversation, d.SessionID))
	start, end := at, at
	if ph != nil {
		start, end = ph.Start, ph.End
	}
	attrs := []attribute.KeyValue{attribute.String(attrSession, d.SessionID), attribute.Bool("agenthost.agent.resumed", d.Resumed)}
	if d.Confinement != nil {
		attrs = append(attrs, attribute.String("agenthost.agent.confinement", d.Confinement.Mode))
	}
	t.child(ts, spanAgentAt, start, attrs...).End(trace.WithTimestamp(end))
}

// phase handles a step no event starts.
func (t *Tracer) phase(p room.Phase) {
	if p.Name == flushMark {
		return
	}
	turnID := p.TurnID
	if turnID == "" {
		turnID = t.running[p.Room]
	}
	if p.Name == room.PhaseAgentStart && p.Err == "" {
		// Its span waits for agent.started, which names the session.
		t.agentAt[p.Room] = &p
		return
	}
	ts := t.turns[turnID]
	if ts == nil {
		return
	}
	s := t.child(ts, p.Name, p.Start)
	if p.Err != "" {
		s.SetStatus(codes.Error, bound(p.Err, maxReason))
	}
	s.End(trace.WithTimestamp(p.End))
}

// endTurn ends the turn's span with its outcome, usage and changes.
func (t *Tracer) endTurn(roomID string, d event.TurnEnded, at time.Time) {
	ts := t.turns[d.TurnID]
	if ts == nil {
		// Its start was not seen: dropped, or recorded by a host before a
		// restart (recovery ends such turns). A span of no duration still
		// says how it ended.
		t.startTurn(roomID, d.TurnID, d.MessageID, at, false)
		ts = t.turns[d.TurnID]
	}
	delete(t.turns, d.TurnID)
	if t.running[roomID] == d.TurnID {
		delete(t.running, roomID)
	}
	for id, p := range t.pending {
		if p.turn == d.TurnID {
			p.span.SetAttributes(attribute.Bool("agenthost.unfinished", true))
			p.span.End(trace.WithTimestamp(at))
			delete(t.pending, id)
		}
	}
	for _, s := range ts.tools {
		s.SetAttributes(attribute.Bool("agenthost.unfinished", true))
		s.End(trace.WithTimestamp(at))
	}
	u := d.Usage
	attrs := []attribute.KeyValue{
		attribute.String(attrOutcome, d.Outcome),
		attribute.Int64(attrInputTokens, u.InputTokens), attribute.Int64(attrOutputTokens, u.OutputTokens),
	}
	if u.CacheReadTokens > 0 {
		attrs = append(attrs, attribute.Int64(attrCacheRead, u.CacheReadTokens))
	}
	if u.CacheWriteTokens > 0 {
		attrs = append(attrs, attribute.Int64(attrCacheWrite, u.CacheWriteTokens))
	}
	if u.CostUSD > 0 {
		attrs = append(attrs, attribute.Float64(attrCost, u.CostUSD))
	}
	if d.Reason != "" {
		attrs = append(attrs, attribute.String(attrReason, bound(d.Reason, maxReason)))
	}
	if c := d.Changes; c != nil {
		attrs = append(attrs, attribute.Int(attrFiles, c.Files), attribute.Int(attrInsert, c.Insertions), attribute.Int(attrDelete, c.Deletions))
	}
	if d.ChangesError != "" {
		attrs = append(attrs, attribute.String(attrChangeErr, bound(d.ChangesError, maxReason)))
	}
	ts.span.SetAttributes(attrs...)
	if d.Outcome != room.OutcomeSettled {
		ts.span.SetAttributes(attribute.String(attrErrorType, d.Outcome))
		ts.span.SetStatus(codes.Error, bound(d.Reason, maxReason))
	}
	ts.span.End(trace.WithTimestamp(at))
	if t.relay != nil {
		sid := ts.span.SpanContext().SpanID()
		t.windows.ended(roomID, sid[:], at)
	}
}
