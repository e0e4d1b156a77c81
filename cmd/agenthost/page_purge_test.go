package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// A page left open on a room across its purge (issue 47 item 3,
// page-purge.sh) starts over on the new room of the same id: it shows the
// new room's messages and turns, once each, and none of the deleted
// room's. (It kept the old conversation and dropped the new room's events
// as already seen: they start at 1 again, under the old Last-Event-ID.)
func TestServePagePurge_Chromium(t *testing.T) {
	ctx := newBrowser(t)
	t.Setenv("AGENTHOST_TOKEN", "")
	url, token, _ := startServe(t, append([]string{"--data", t.TempDir(), "--confine", "off"}, fakeAgentArgs(t)...)...)
	post := func(text string) string {
		t.Helper()
		code, body := call(t, "POST", url+"v1/rooms/p/messages", token, fmt.Sprintf(`{"text":%q}`, text))
		var acc struct{ ID string }
		if code != 202 || json.Unmarshal(body, &acc) != nil {
			t.Fatalf("post: %d %s", code, body)
		}
		return acc.ID
	}
	// The page shows the room's messages (ids) and its turns, settled
	// with the agent's answers to texts, each once and in order (a turn's
	// bubble comes after its message, queued messages before it), and
	// nothing else.
	shows := func(ids, texts []string) string {
		var turns []string
		for _, text := range texts {
			turns = append(turns, "settled answer to "+text)
		}
		u, _ := json.Marshal(strings.Join(ids, "\n"))
		a, _ := json.Marshal(strings.Join(turns, "\n"))
		return `(() => { const ms = [...document.querySelectorAll("#log .msg")];
			return ms.length === ` + fmt.Sprint(2*len(ids)) + ` &&
				ms.filter(m => m.classList.contains("user")).map(m => m.dataset.message).join("\n") === ` + string(u) + ` &&
				ms.filter(m => m.classList.contains("assistant")).map(m => m.dataset.outcome + " " + m.querySelector(".text").textContent).join("\n") === ` + string(a) + `; })()`
	}
	var oldIDs, oldTexts []string
	for i := range 8 {
		oldTexts = append(oldTexts, fmt.Sprintf("old %d [few]", i))
		oldIDs = append(oldIDs, post(oldTexts[i]))
	}
	act(t, ctx, "opening the room", chromedp.Navigate(url+"#token="+token+"&room=p"))
	waitFor(t, ctx, "the old room's turns", shows(oldIDs, oldTexts))
	waitFor(t, ctx, "the stream", `document.getElementById("status").dataset.state === "live"`)

	if code, body := call(t, "DELETE", url+"v1/rooms/p?purge=true", token, ""); code != 200 {
		t.Fatalf("purge: %d %s", code, body)
	}
	var newIDs, newTexts []string
	for i := range 3 {
		newTexts = append(newTexts, fmt.Sprintf("new %d [few]", i))
		newIDs = append(newIDs, post(newTexts[i]))
	}
	waitFor(t, ctx, "the new room's turns, and none of the old room's", shows(newIDs, newTexts))
	// And so after a reload.
	act(t, ctx, "reloading", chromedp.Reload())
	waitFor(t, ctx, "the new room's turns after a reload", shows(newIDs, newTexts))
}
