package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The page opened with a room token's link (issue 43) shows only the
// token's rooms, and no button the token cannot use: a read-only token
// sees the pending approval without Allow or Deny, and no message box or
// settings' Save; a token that may approve decides it, and the room's log
// names the token.
func TestServePageRoomToken_Chromium(t *testing.T) {
	ctx := newBrowser(t)
	t.Setenv("AGENTHOST_TOKEN", "")
	url, admin, _ := startServe(t, "--data", t.TempDir(), "--approval-mode", "always-ask")
	post := func(room, text string) {
		t.Helper()
		b, _ := json.Marshal(map[string]string{"text": text})
		if code, body := call(t, "POST", url+"v1/rooms/"+room+"/messages", admin, string(b)); code != 202 {
			t.Fatalf("post: %d %s", code, body)
		}
	}
	mint := func(can ...string) string {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"rooms": []string{"mine"}, "can": can, "label": "viewer " + strings.Join(can, "+")})
		code, body := call(t, "POST", url+"v1/tokens", admin, string(b))
		var tok struct{ Token string }
		if code != 201 || json.Unmarshal(body, &tok) != nil || tok.Token == "" {
			t.Fatalf("token: %d %s", code, body)
		}
		return tok.Token
	}
	post("theirs", "hello")
	post("mine", `Run it: [[tool:bash {"command":"echo hi-from-the-page"}]]`)
	wctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	err := newTestClient(t, url, admin).events(wctx, "mine", 0, true, func(typ string, _ []byte) (bool, error) {
		return typ == "approval.requested", nil
	})
	if err != nil {
		t.Fatal(err)
	}

	reader := mint("read")
	act(t, ctx, "opening the read-only link", chromedp.Navigate(url+"#token="+reader+"&room=mine"))
	waitFor(t, ctx, "the pending approval", `document.querySelectorAll("#approvals li").length === 1 && !document.getElementById("pending").hidden`)
	waitFor(t, ctx, "the token's room in the list", `[...document.querySelectorAll("#rooms .room-link")].some(b => b.textContent.startsWith("mine"))`)
	if got := eval[string](t, ctx, `[...document.querySelectorAll("#rooms .room-link")].map(b => b.dataset.room).join(",") + "|" +
		document.querySelectorAll("#approvals button").length + "|" + document.getElementById("send-form").hidden + "|" +
		document.getElementById("config-save").hidden`); got != "mine|0|true|true" {
		t.Fatalf("rooms|approval buttons|send hidden|save hidden: %s", got)
	}

	approver := mint("read", "approve")
	act(t, ctx, "opening the approver's link", chromedp.Navigate(url+"#token="+approver+"&room=mine"), chromedp.Reload())
	waitFor(t, ctx, "the approval's buttons", `!!document.querySelector("#approvals li button.allow")`)
	if eval[bool](t, ctx, `document.getElementById("send-form").hidden`) != true {
		t.Fatal("the message box shows to a token that may not send")
	}
	press(t, ctx, "allowing", "#approvals li button.allow",
		`document.getElementById("approvals").children.length === 0 || [...document.querySelectorAll("#approvals li button")].every(b => b.disabled)`)
	var by map[string]any
	err = newTestClient(t, url, admin).events(wctx, "mine", 0, true, func(typ string, raw []byte) (bool, error) {
		if typ != "approval.resolved" {
			return false, nil
		}
		return true, json.Unmarshal(raw, &by)
	})
	if tok, _ := by["token"].(map[string]any); err != nil || tok["label"] != "viewer read+approve" {
		t.Fatalf("approval.resolved %v (%v): want the approver's token", by, err)
	}
}
