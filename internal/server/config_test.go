package server

import (
	"net/http"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/room"
)

func TestRoomConfigAndBudget(t *testing.T) {
	configAndBudget(t, newHarness(t, room.Options{}, Options{}))
}

// configAndBudget: PUT config creates the room and answers the effective
// settings, GET reads them back (and may be sent back as is), a budget
// stops the room with 429 naming the limit and one budget.exhausted, and
// raising it reopens the room.
func configAndBudget(t *testing.T, h *harness) {
	r := h.do("PUT", "/v1/rooms/cfg/config", map[string]any{"model": "m1", "instructions": "Say hi.", "turn_timeout": "90s", "budget": map[string]any{"turns": 1}})
	e := r.json(t)
	if r.status != http.StatusOK || e["model"] != "m1" || e["instructions"] != "Say hi." || e["turn_timeout"] != "1m30s" ||
		e["approval_mode"] != room.ApprovalAsk || e["approval_timeout"] != "10m0s" || e["agent"] == nil {
		t.Fatalf("PUT config: %d %s", r.status, r.body)
	}
	if b, _ := e["budget"].(map[string]any); b["turns"] != 1.0 || b["tokens"] != 0.0 {
		t.Fatalf("PUT config budget: %s", r.body)
	}
	if ns, ok := e["next_start"].([]any); !ok || len(ns) != 0 {
		t.Fatalf("next_start with no agent: %s", r.body)
	}
	got := h.do("GET", "/v1/rooms/cfg/config", nil)
	if got.status != http.StatusOK || string(got.body) != string(r.body) {
		t.Fatalf("GET config: %d %s, PUT answered %s", got.status, got.body, r.body)
	}
	acc := h.post("cfg", "hello")
	if d := h.ended("cfg", acc); d["outcome"] != "settled" {
		t.Fatalf("turn: %v", d)
	}
	ex := h.until("cfg", acc.Seq, func(ev sse) bool { return ev.typ == "budget.exhausted" })
	if ex.data["limit"] != "1 of 1 turns run" {
		t.Fatalf("budget.exhausted %v", ex.data)
	}
	over := h.do("POST", "/v1/rooms/cfg/messages", map[string]string{"text": "more"})
	if over.status != http.StatusTooManyRequests || over.json(t)["error"] != "room budget exhausted: 1 of 1 turns run" {
		t.Fatalf("a message over the budget: %d %s", over.status, over.body)
	}
	// GET's answer, changed and sent back.
	e = got.json(t)
	e["budget"] = map[string]any{"turns": 2}
	if r := h.do("PUT", "/v1/rooms/cfg/config", e); r.status != http.StatusOK {
		t.Fatalf("raising the budget: %d %s", r.status, r.body)
	}
	acc = h.post("cfg", "again")
	if d := h.ended("cfg", acc); d["outcome"] != "settled" || !strings.Contains(d["text"].(string), "again") {
		t.Fatalf("after raising the budget: %v", d)
	}
}
