package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"
)

// The page shows a turn's changed files under its answer, the diff (added
// lines marked) when opened, and a Revert button that asks first and
// takes the turn's file back. omp on the built-in model writes the file.
func TestServePageChanges_Chromium(t *testing.T) {
	ctx := newBrowser(t)
	data := t.TempDir()
	t.Setenv("AGENTHOST_TOKEN", "")
	url, token, _ := startServe(t, "--data", data, "--approval-mode", "yolo")

	act(t, ctx, "opening the room", chromedp.Navigate(url+"#token="+token+"&room=pg"))
	waitFor(t, ctx, "the room", `!document.getElementById("room").hidden`)
	sendFromPage(t, ctx, "Write it: "+`[[tool:bash {"command":"echo page-made > page.txt"}]]`)
	waitFor(t, ctx, "the turn's changes", `document.querySelector("#log .msg.assistant .changes summary")?.textContent === "1 file(s) changed, +1 −0"`)
	act(t, ctx, "opening the changes", chromedp.Click(chromedp.CSS("#log .msg.assistant .changes summary")))
	waitFor(t, ctx, "the diff", `document.querySelector("#log .changes .files li")?.textContent === "added page.txt +1 −0" &&
		[...document.querySelectorAll("#log .changes .patch .add")].some(s => s.textContent === "+page-made\n")`)
	made, _ := filepath.Glob(filepath.Join(data, "workspaces", "pg-*", "page.txt"))
	if len(made) != 1 {
		t.Fatalf("page.txt in the workspace: %v", made)
	}

	// Reloaded, the page shows the turn from its record: its changes are
	// read when opened, and its Revert is there.
	act(t, ctx, "reloading", chromedp.Reload())
	waitFor(t, ctx, "the turn from its record", `document.querySelector("#log .msg.assistant .changes summary")?.textContent === "changes"`)
	act(t, ctx, "opening the recorded turn's changes", chromedp.Click(chromedp.CSS("#log .msg.assistant .changes summary")))
	waitFor(t, ctx, "the recorded turn's diff", `document.querySelector("#log .msg.assistant .changes summary")?.textContent === "1 file(s) changed, +1 −0" &&
		document.querySelector("#log .changes .files li")?.textContent === "added page.txt +1 −0" &&
		!document.querySelector("#log .changes button.revert").hidden`)

	// Declining the confirmation changes nothing; accepting reverts.
	act(t, ctx, "declining the revert",
		chromedp.Evaluate[chromedp.Void](`window.asked = 0; window.confirm = () => { window.asked++; return false; }`),
		chromedp.Click(chromedp.CSS("#log .changes button.revert")))
	if n := eval[int](t, ctx, `window.asked`); n != 1 {
		t.Fatalf("the revert asked %d times", n)
	}
	if _, err := os.Stat(made[0]); err != nil {
		t.Fatalf("page.txt after a declined revert: %v", err)
	}
	act(t, ctx, "reverting",
		chromedp.Evaluate[chromedp.Void](`window.confirm = () => true`),
		chromedp.Click(chromedp.CSS("#log .changes button.revert")))
	waitFor(t, ctx, "the revert's note", `[...document.querySelectorAll("#log .msg.system")].some(n => n.textContent.startsWith("workspace reverted to before turn ") && n.textContent.endsWith("(1 file(s) restored)"))`)
	if _, err := os.Stat(made[0]); !os.IsNotExist(err) {
		t.Fatalf("page.txt after the revert: %v", err)
	}
}
