package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// busyRoom is a room whose list entry carries everything at once: a long
// id, busy, an approval waiting and its usage.
const busyRoom = "fix-123-a-room-with-a-long-name"

// The page's layout in headless Chromium at a wide desktop, a laptop and a
// phone width: the status says connected before a room is opened, a busy
// room's entry keeps its badges and usage inside its button, nothing
// scrolls sideways, the room takes the width it has, and an opened diff at
// the end of a long log is brought into view. omp's "Other (type your
// own)" takes the person's own words in the answer box instead of being
// sent as an answer (omp would then ask again in its terminal's words).
func TestServePageLayout_Chromium(t *testing.T) {
	ctx := newBrowser(t)
	data := t.TempDir()
	t.Setenv("AGENTHOST_TOKEN", "")
	url, token, _ := startServe(t, "--data", data, "--approval-mode", "always-ask")
	post := func(room, text string) {
		t.Helper()
		body := fmt.Sprintf(`{"text":%q}`, text)
		if code, b := call(t, "POST", url+"v1/rooms/"+room+"/messages", token, body); code != 202 {
			t.Fatalf("post to %s: %d %s", room, code, b)
		}
	}
	// A room with a long log whose last turn wrote a file (yolo: no approval).
	if code, b := call(t, "PUT", url+"v1/rooms/notes/config", token, `{"approval_mode":"yolo"}`); code != 200 {
		t.Fatalf("config: %d %s", code, b)
	}
	post("notes", "[[big:4000]]")
	post("notes", `Write it: [[tool:bash {"command":"echo page-made > page.txt"}]]`)
	// The busy room: one turn done (its usage), the next waiting on an approval.
	post(busyRoom, "hello")
	post(busyRoom, `Run it: [[tool:bash {"command":"echo hi"}]]`)
	// A question of omp's ask tool.
	post("ask", `[[tool:ask {"questions":[{"id":"c","question":"Which color?","options":[{"label":"red"},{"label":"blue"}]}]}]]`)

	// The page lists the rooms as they are when it loads: wait for them to be so.
	tc := newTestClient(t, url, token)
	for _, w := range []struct {
		room, typ string
		n         int
	}{{"notes", "turn.ended", 2}, {busyRoom, "approval.requested", 1}, {"ask", "question.asked", 1}} {
		wctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		seen := 0
		err := tc.events(wctx, w.room, 0, true, func(typ string, _ []byte) (bool, error) {
			if typ == w.typ {
				seen++
			}
			return seen == w.n, nil
		})
		cancel()
		if err != nil {
			t.Fatalf("room %s: waiting for %d %s: %v", w.room, w.n, w.typ, err)
		}
	}

	for _, vp := range []struct {
		name          string
		width, height int64
		mainShare     float64 // of the window's width, at least
	}{{"wide", 1920, 1080, 0.7}, {"laptop", 1280, 860, 0.6}, {"phone", 390, 844, 0.9}} {
		t.Run(vp.name, func(t *testing.T) {
			act(t, ctx, "the viewport", chromedp.EmulateViewport(vp.width, vp.height))
			act(t, ctx, "opening the page", chromedp.Navigate(url+"?"+vp.name+"#token="+token)) // a new load: not only the fragment
			waitFor(t, ctx, "the status before a room is opened", `document.getElementById("status").dataset.state === "live" && document.getElementById("room").hidden &&
				!/not connected/.test(document.getElementById("status").textContent)`)
			waitFor(t, ctx, "the busy room's entry", `(() => { const b = [...document.querySelectorAll("#rooms .room-link")].find(b => b.querySelector(".name")?.textContent === `+fmt.Sprintf("%q", busyRoom)+`);
				return !!b && b.textContent.includes("busy") && b.textContent.includes("1 waiting") && /tokens/.test(b.querySelector(".usage")?.textContent ?? ""); })()`)
			if out := eval[string](t, ctx, `[...document.querySelectorAll("#rooms .room-link")].flatMap(b => { const r = b.getBoundingClientRect();
				return [...b.children].filter(c => { const q = c.getBoundingClientRect(); return q.left < r.left - 1 || q.right > r.right + 1 || q.top < r.top - 1 || q.bottom > r.bottom + 1; })
				.map(c => b.querySelector(".name").textContent + ": " + c.className + " " + c.textContent); }).join("; ")`); out != "" {
				t.Fatalf("outside their room's button: %s", out)
			}
			act(t, ctx, "opening the room with the long log", chromedp.Click(chromedp.CSS(`#rooms .room-link[data-room="notes"]`)))
			// Read from the room's record, the turn's changes say what they are once opened.
			waitFor(t, ctx, "the turn's changes", `document.querySelectorAll("#log .msg.assistant").length === 2 &&
				!!document.querySelectorAll("#log .msg.assistant")[1].querySelector(".changes summary")`)
			if share := eval[float64](t, ctx, `document.getElementById("room").getBoundingClientRect().width / window.innerWidth`); share < vp.mainShare {
				t.Fatalf("the room takes %.2f of the window's width, want at least %.2f", share, vp.mainShare)
			}
			if w := eval[string](t, ctx, `document.documentElement.scrollWidth + " " + window.innerWidth`); func() bool { var a, b int; fmt.Sscan(w, &a, &b); return a > b }() {
				t.Fatalf("the page scrolls sideways (scroll width, window width): %s", w)
			}
			act(t, ctx, "opening the diff", chromedp.Click(chromedp.CSS(`#log .msg.assistant:last-child .changes summary`)))
			waitFor(t, ctx, "the diff in view", `(() => { const p = document.querySelector("#log .msg.assistant:last-child .changes .patch");
				if (!p || !p.textContent.includes("+page-made")) return false;
				const r = p.getBoundingClientRect(), l = document.getElementById("log").getBoundingClientRect();
				return r.top >= l.top && r.top < l.bottom - 10 && r.top >= 0 && r.top < window.innerHeight - 10; })()`)
		})
	}

	// "Other (type your own)" puts the cursor in the answer box and sends
	// nothing; the person's own words answer the question.
	act(t, ctx, "the desktop viewport", chromedp.EmulateViewport(1280, 860))
	act(t, ctx, "opening the question's room", chromedp.Navigate(url+"?question#token="+token+"&room=ask"))
	waitFor(t, ctx, "the question", `document.querySelector("#questions li p")?.textContent === "Which color?"`)
	act(t, ctx, "choosing Other", chromedp.Click(chromedp.CSS(`#questions li [role="group"] button:nth-child(3)`)))
	waitFor(t, ctx, "the answer box focused", `document.activeElement?.id?.startsWith("qa-") && [...document.querySelectorAll("#questions li button")].every(b => !b.disabled)`)
	if n := eval[int](t, ctx, `document.getElementById("questions").children.length`); n != 1 {
		t.Fatalf("%d questions after choosing Other, want the same one still waiting", n)
	}
	act(t, ctx, "typing an answer", chromedp.SetValue(chromedp.CSS(`#questions li form input`), "green"),
		chromedp.Click(chromedp.CSS(`#questions li form button`)))
	waitFor(t, ctx, "the question to go", `document.getElementById("questions").children.length === 0`)
	waitFor(t, ctx, "the ask tool's answer", `[...document.querySelectorAll("#log .tool.done pre.output")].some(p => p.textContent.includes("green"))`)
	if n := eval[int](t, ctx, `document.getElementById("questions").children.length`); n != 0 || strings.Contains(eval[string](t, ctx, `document.getElementById("log").innerText`), "Enter your response") {
		t.Fatal("omp asked again in its terminal's words")
	}
}
