package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/propagation"

	"github.com/agenthost/agenthost/event"
	"github.com/agenthost/agenthost/internal/store"
	"github.com/agenthost/agenthost/room"
)

// The API's JSON shapes: the store's records carry no JSON names of their
// own, so the wire format is fixed here.

type roomView struct {
	ID string `json:"id"`
	// Incarnation names this life of the room: a room purged and created
	// again under its id is another (see room.Manager.Incarnation).
	Incarnation string          `json:"incarnation,omitempty"`
	Resident    bool            `json:"resident"`
	SessionID   string          `json:"session_id,omitempty"`
	Turn        *room.TurnRef   `json:"turn"`
	Queued      int             `json:"queued"`
	LastSeq     int64           `json:"last_seq"`
	Approvals   []approvalView  `json:"approvals"`
	Questions   []questionsView `json:"questions"`
	// Node holds the room's lease in a cluster ("" when none does, and
	// on one machine).
	Node string `json:"node"`
	// Confinement is what confines the room's agent (absent when the
	// transport does not say).
	Confinement *room.Confinement `json:"confinement,omitempty"`
	// Resources are the limits of the room's processes and how they hold
	// (absent when the transport does not say).
	Resources *room.Resources `json:"resources,omitempty"`
	// Turns ended, what they cost together, and that by sender ("" for
	// messages sent without one); what the room's processes used in them
	// (compute).
	Turns         int64                      `json:"turns"`
	Usage         store.Usage                `json:"usage"`
	UsageBySender map[string]senderUsageView `json:"usage_by_sender"`
	Compute       store.Compute              `json:"compute"`
}

// senderUsageView is one sender's share of a room's usage: its turns and
// the usage fields beside them.
type senderUsageView struct {
	Turns int64 `json:"turns"`
	store.Usage
}

type approvalView struct {
	ID       string    `json:"id"`
	TurnID   string    `json:"turn_id,omitempty"`
	Tool     string    `json:"tool"`
	Input    string    `json:"input,omitempty"`
	Options  []string  `json:"options"`
	Created  time.Time `json:"created"`
	Deadline time.Time `json:"deadline"`
}

type questionsView struct {
	ID       string    `json:"id"`
	TurnID   string    `json:"turn_id,omitempty"`
	Title    string    `json:"title"`
	Options  []string  `json:"options"`
	Created  time.Time `json:"created"`
	Deadline time.Time `json:"deadline"`
}

type messageView struct {
	ID       string     `json:"id"`
	Seq      int64      `json:"seq"`
	Sender   string     `json:"sender,omitempty"`
	Text     string     `json:"text"`
	Delivery string     `json:"delivery,omitempty"`
	Status   string     `json:"status"`
	Outcome  string     `json:"outcome,omitempty"`
	Reason   string     `json:"reason,omitempty"`
	TurnID   string     `json:"turn_id,omitempty"`
	Accepted time.Time  `json:"accepted"`
	Started  *time.Time `json:"started,omitempty"`
	Ended    *time.Time `json:"ended,omitempty"`
}

type turnView struct {
	ID        string     `json:"id"`
	MessageID string     `json:"message_id"`
	Outcome   string     `json:"outcome,omitempty"`
	Reason    string     `json:"reason,omitempty"`
	Text      string     `json:"text"`
	Started   time.Time  `json:"started"`
	Ended     *time.Time `json:"ended,omitempty"`
	// Usage is what the turn cost (absent while it runs).
	Usage *store.Usage `json:"usage,omitempty"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func viewRoom(st room.State) roomView {
	v := roomView{ID: st.ID, Incarnation: st.Incarnation, Resident: st.Resident, SessionID: st.SessionID, Turn: st.Turn, Queued: st.Queued,
		LastSeq: st.LastSeq, Approvals: []approvalView{}, Questions: []questionsView{}, Node: st.Node,
		Confinement: st.Confinement, Resources: st.Resources, Turns: st.Turns, Usage: st.Usage, UsageBySender: map[string]senderUsageView{},
		Compute: st.Compute}
	for sender, u := range st.UsageBySender {
		v.UsageBySender[sender] = senderUsageView{Turns: u.Turns, Usage: u.Usage}
	}
	for _, a := range st.Approvals {
		v.Approvals = append(v.Approvals, approvalView{ID: a.ID, TurnID: a.TurnID, Tool: a.Tool, Input: a.Input,
			Options: nonNil(a.Options), Created: a.Created.UTC(), Deadline: a.Deadline.UTC()})
	}
	for _, q := range st.Questions {
		v.Questions = append(v.Questions, questionsView{ID: q.ID, TurnID: q.TurnID, Title: q.Title,
			Options: nonNil(q.Options), Created: q.Created.UTC(), Deadline: q.Deadline.UTC()})
	}
	return v
}

func viewMessage(m store.Message) messageView {
	return messageView{ID: m.ID, Seq: m.Seq, Sender: m.Sender, Text: m.Text, Delivery: m.Delivery, Status: m.Status,
		Outcome: m.Outcome, Reason: m.Reason, TurnID: m.TurnID, Accepted: m.Accepted.UTC(),
		Started: timePtr(m.Started), Ended: timePtr(m.Ended)}
}

// Room listing pages: DefaultRoomsPage rooms unless ?limit= says, at
// most MaxRoomsPage.
const (
	DefaultRoomsPage = 100
	MaxRoomsPage     = store.MaxRoomsPage
)

// listRooms answers a page of rooms in order of id: ?after= (a room id,
// the previous page's next) and ?limit=. The answer keeps the unpaged
// route's shape, {"rooms": [...]}, with the number of rooms in total and,
// when more follow, next: the after of the next page.
func (s *Server) listRooms(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := DefaultRoomsPage
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxRoomsPage {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit must be a whole number from 1 to %d", MaxRoomsPage))
			return
		}
		limit = n
	}
	after := q.Get("after")
	if after != "" {
		if err := room.ValidateID(after); err != nil {
			writeError(w, http.StatusBadRequest, "after must be a room id (the next of the previous page): "+trimPrefix(err))
			return
		}
	}
	var page room.RoomsPage
	var err error
	if g := who(r); g != nil {
		page, err = s.roomsOf(r.Context(), g, after, limit)
	} else {
		page, err = s.m.RoomPage(r.Context(), after, limit)
	}
	if err != nil {
		s.fail(w, r, err, "rooms")
		return
	}
	out := make([]roomView, 0, len(page.Rooms))
	for _, st := range page.Rooms {
		out = append(out, viewRoom(st))
	}
	body := map[string]any{"rooms": out, "total": page.Total}
	if page.More && len(out) > 0 {
		body["next"] = out[len(out)-1].ID
	}
	writeJSON(w, http.StatusOK, body)
}

func (s *Server) getRoom(w http.ResponseWriter, r *http.Request) {
	id, ok := roomID(w, r)
	if !ok {
		return
	}
	st, err := s.m.State(r.Context(), id)
	if err != nil {
		s.fail(w, r, err, "room "+id)
		return
	}
	writeJSON(w, http.StatusOK, viewRoom(st))
}

// knownRoom writes 404 for a room the store does not know.
func (s *Server) knownRoom(w http.ResponseWriter, r *http.Request) (room.State, string, bool) {
	id, ok := roomID(w, r)
	if !ok {
		return room.State{}, "", false
	}
	st, err := s.m.State(r.Context(), id)
	if err != nil {
		s.fail(w, r, err, "room "+id)
		return room.State{}, "", false
	}
	return st, id, true
}

func (s *Server) releaseRoom(w http.ResponseWriter, r *http.Request) {
	purge := false
	switch v := r.URL.Query().Get("purge"); v {
	case "", "false":
	case "true":
		purge = true
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("purge must be true or false, not %q", v))
		return
	}
	st, id, ok := s.knownRoom(w, r)
	if !ok {
		return
	}
	if purge {
		s.purgeRoom(w, r, st, id)
		return
	}
	if st.Turn != nil {
		writeError(w, http.StatusConflict, "a turn is running in this room: cancel it before releasing the agent")
		return
	}
	if !st.Resident {
		writeJSON(w, http.StatusOK, map[string]any{"released": false})
		return
	}
	// Release records the receipt in an agent.released event after
	// LastSeq: read it back from there.
	if err := s.m.Release(r.Context(), id); err != nil {
		s.fail(w, r, err, "room "+id)
		return
	}
	evs, err := s.m.Events(r.Context(), id, st.LastSeq, 0)
	if err != nil {
		s.fail(w, r, err, "room "+id)
		return
	}
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Type != event.TypeAgentReleased {
			continue
		}
		var d event.AgentReleased
		_ = json.Unmarshal(evs[i].Data, &d)
		out := map[string]any{"released": true, "seq": evs[i].Seq, "reason": d.Reason}
		if len(d.Receipt) > 0 {
			out["receipt"] = d.Receipt
		}
		if d.Error != "" {
			out["error"] = d.Error
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	// A turn started between the check and the release, which then left
	// the agent alone.
	writeError(w, http.StatusConflict, "a turn is running in this room: cancel it before releasing the agent")
}

// purgeRoom deletes the room for good (room.Manager.Purge) and answers
// its agent's receipt; the room's event streams are cut.
func (s *Server) purgeRoom(w http.ResponseWriter, r *http.Request, st room.State, id string) {
	if st.Turn != nil {
		writeError(w, http.StatusConflict, "a turn is running in this room: cancel it before deleting the room")
		return
	}
	receipt, err := s.m.Purge(r.Context(), id)
	switch {
	case errors.Is(err, room.ErrBusy):
		// What keeps it: a turn, or messages waiting.
		writeError(w, http.StatusConflict, trimPrefix(err))
		return
	case errors.Is(err, room.ErrPurgeUnsupported):
		writeError(w, http.StatusNotImplemented, trimPrefix(err))
		return
	case err != nil:
		s.fail(w, r, err, "room "+id)
		return
	}
	s.hubs.drop(id)
	// The room's log is gone with it: the server's log says who.
	s.log.Info("room purged", append([]any{"room", id}, actor(r)...)...)
	out := map[string]any{"purged": true, "released": len(receipt) > 0}
	if len(receipt) > 0 {
		out["receipt"] = receipt
	}
	writeJSON(w, http.StatusOK, out)
}

type messageBody struct {
	Text     string `json:"text"`
	Sender   string `json:"sender"`
	Delivery string `json:"delivery"`
}

// maxSender bounds a message's sender name, in characters (as the
// schema's maxLength counts them).
const maxSender = 256

// headerIdempotencyKey carries a message's idempotency key: the same key
// in a room's incarnation is accepted once (room.Message.Key).
const headerIdempotencyKey = "Idempotency-Key"

func (s *Server) postMessage(w http.ResponseWriter, r *http.Request) {
	id, ok := roomID(w, r)
	if !ok {
		return
	}
	key := r.Header.Get(headerIdempotencyKey)
	switch vs := r.Header.Values(headerIdempotencyKey); {
	case len(vs) > 1:
		writeError(w, http.StatusBadRequest, "one Idempotency-Key header at most")
		return
	case len(vs) == 1 && key == "":
		// Sent, but empty: not the same as no key.
		writeError(w, http.StatusBadRequest, "the Idempotency-Key header is empty: leave it out, or give 1 to 255 printable ASCII characters")
		return
	}
	var b messageBody
	if !s.decode(w, r, &b) {
		return
	}
	if utf8.RuneCountInString(b.Sender) > maxSender {
		writeError(w, http.StatusBadRequest, "sender is over 256 characters")
		return
	}
	msg := room.Message{Text: b.Text, Sender: b.Sender, Delivery: b.Delivery, Key: key}
	if t := s.opts.Tracing; t != nil {
		// The request's span (otelhttp's, the caller's child): the
		// message's turn continues the caller's trace under it.
		c := propagation.MapCarrier{}
		t.Propagator.Inject(r.Context(), c)
		if len(c["traceparent"]) <= room.MaxTraceParentBytes && len(c["tracestate"]) <= room.MaxTraceStateBytes {
			msg.TraceParent, msg.TraceState = c["traceparent"], c["tracestate"]
		}
	}
	acc, err := s.m.Submit(r.Context(), id, msg)
	if err != nil {
		s.fail(w, r, err, "room "+id)
		return
	}
	writeJSON(w, http.StatusAccepted, acc)
}

func (s *Server) listMessages(w http.ResponseWriter, r *http.Request) {
	_, id, ok := s.knownRoom(w, r)
	if !ok {
		return
	}
	after, ok := afterParam(w, r)
	if !ok {
		return
	}
	limit, ok := limitParam(w, r, 100, 1000)
	if !ok {
		return
	}
	msgs, err := s.m.Messages(r.Context(), id, after, limit)
	if err != nil {
		s.fail(w, r, err, "room "+id)
		return
	}
	out := make([]messageView, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, viewMessage(m))
	}
	writeJSON(w, http.StatusOK, map[string]any{"messages": out})
}

// listTurns serves the turns' outcomes and final texts: with the
// messages, a client (the page) shows a long room's conversation without
// replaying its event log.
func (s *Server) listTurns(w http.ResponseWriter, r *http.Request) {
	_, id, ok := s.knownRoom(w, r)
	if !ok {
		return
	}
	after, ok := afterParam(w, r)
	if !ok {
		return
	}
	limit, ok := limitParam(w, r, 100, 1000)
	if !ok {
		return
	}
	turns, err := s.m.Turns(r.Context(), id, after, limit)
	if err != nil {
		s.fail(w, r, err, "room "+id)
		return
	}
	out := make([]turnView, 0, len(turns))
	for _, t := range turns {
		v := turnView{ID: t.ID, MessageID: t.MessageID, Outcome: t.Outcome, Reason: t.Reason, Text: t.Text,
			Started: t.Started.UTC(), Ended: timePtr(t.Ended.UTC())}
		if !t.Ended.IsZero() {
			v.Usage = &t.Usage
		}
		out = append(out, v)
	}
	writeJSON(w, http.StatusOK, map[string]any{"turns": out})
}

func (s *Server) cancelTurn(w http.ResponseWriter, r *http.Request) {
	st, id, ok := s.knownRoom(w, r)
	if !ok {
		return
	}
	if err := s.m.Cancel(r.Context(), id); err != nil {
		s.fail(w, r, err, "room "+id)
		return
	}
	out := map[string]any{"cancelled": true}
	if st.Turn != nil {
		out["turn_id"] = st.Turn.ID
	}
	writeJSON(w, http.StatusAccepted, out)
}

type decisionBody struct {
	Decision string `json:"decision"`
}

func (s *Server) approve(w http.ResponseWriter, r *http.Request) {
	rid, ok := roomID(w, r)
	if !ok {
		return
	}
	aid, ok := objectID(w, r, "approval")
	if !ok {
		return
	}
	var b decisionBody
	if !s.decode(w, r, &b) {
		return
	}
	if b.Decision != "allow" && b.Decision != "deny" {
		writeError(w, http.StatusBadRequest, `decision must be "allow" or "deny"`)
		return
	}
	if err := s.m.Approve(r.Context(), rid, aid, b.Decision == "allow"); err != nil {
		s.fail(w, r, err, "approval "+aid)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": aid, "decision": b.Decision})
}

type answerBody struct {
	Answer *string `json:"answer"`
}

func (s *Server) answer(w http.ResponseWriter, r *http.Request) {
	rid, ok := roomID(w, r)
	if !ok {
		return
	}
	qid, ok := objectID(w, r, "question")
	if !ok {
		return
	}
	var b answerBody
	if !s.decode(w, r, &b) {
		return
	}
	if b.Answer == nil {
		writeError(w, http.StatusBadRequest, `the body needs "answer"`)
		return
	}
	if err := s.m.Answer(r.Context(), rid, qid, *b.Answer); err != nil {
		s.fail(w, r, err, "question "+qid)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": qid, "answer": *b.Answer})
}

// turnParam reads the {turn} path value (400 when malformed).
func turnParam(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("turn")
	if id == "" || len(id) > 128 || strings.ContainsFunc(id, func(c rune) bool { return c < 0x21 || c > 0x7e }) {
		writeError(w, http.StatusBadRequest, "turn id must be 1 to 128 printable ASCII characters")
		return "", false
	}
	return id, true
}

// turnDiff answers what a turn changed in the room's workspace.
func (s *Server) turnDiff(w http.ResponseWriter, r *http.Request) {
	_, id, ok := s.knownRoom(w, r)
	if !ok {
		return
	}
	turn, ok := turnParam(w, r)
	if !ok {
		return
	}
	d, err := s.m.TurnDiff(r.Context(), id, turn)
	if err != nil {
		s.failSnapshot(w, r, err, turn)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// revertTurn restores the room's workspace to its state before a turn.
func (s *Server) revertTurn(w http.ResponseWriter, r *http.Request) {
	_, id, ok := s.knownRoom(w, r)
	if !ok {
		return
	}
	turn, ok := turnParam(w, r)
	if !ok {
		return
	}
	res, err := s.m.Revert(r.Context(), id, turn)
	if err != nil {
		s.failSnapshot(w, r, err, turn)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"reverted": true, "turn_id": turn, "files": nonNil(res.Files),
		"kept": nonNil(res.Kept)})
}

// failSnapshot maps a diff's or revert's error, saying why a turn is not
// found or the room busy.
func (s *Server) failSnapshot(w http.ResponseWriter, r *http.Request, err error, turn string) {
	switch {
	case errors.Is(err, room.ErrBusy):
		writeError(w, http.StatusConflict, "a turn is running in this room: wait for it to end (or cancel it)")
	case errors.Is(err, room.ErrNotFound):
		// The reason follows the sentinel: unknown, from another room, or
		// run with snapshots off.
		_, why, _ := strings.Cut(err.Error(), room.ErrNotFound.Error()+": ")
		msg := "turn " + turn + ": not found"
		if why != "" {
			msg += " (" + why + ")"
		}
		writeError(w, http.StatusNotFound, msg)
	default:
		s.fail(w, r, err, "turn "+turn)
	}
}

// getConfig answers the room's effective settings: its own, with the
// server's defaults filled in, and next_start (see room.Effective).
func (s *Server) getConfig(w http.ResponseWriter, r *http.Request) {
	id, ok := roomID(w, r)
	if !ok {
		return
	}
	e, err := s.m.EffectiveSettings(r.Context(), id)
	if err != nil {
		s.fail(w, r, err, "room "+id)
		return
	}
	writeJSON(w, http.StatusOK, e)
}

// putConfig stores the room's settings (the whole object; creating the
// room) and answers the effective ones. next_start, which GET answers,
// may be sent back and is ignored.
func (s *Server) putConfig(w http.ResponseWriter, r *http.Request) {
	id, ok := roomID(w, r)
	if !ok {
		return
	}
	var raw json.RawMessage
	if !s.decode(w, r, &raw) {
		return
	}
	settings, err := room.ParseSettings(raw, "next_start")
	if err != nil {
		s.fail(w, r, err, "room "+id)
		return
	}
	e, err := s.m.SetSettings(r.Context(), id, settings)
	if err != nil {
		s.fail(w, r, err, "room "+id)
		return
	}
	// The room's log has settings.changed where this node holds the room;
	// the server's log says who set which fields wherever it is (any node
	// of a cluster sets them), never their values (instructions, MCP
	// servers' environments).
	s.log.Info("room settings set", append([]any{"room", id, "fields", settingsFields(raw)}, actor(r)...)...)
	writeJSON(w, http.StatusOK, e)
}
