package main

import (
	"context"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/confine"
	"github.com/chromedp/chromedp"
)

// browserWait bounds each wait on the page: generous, since a loaded CI
// box runs omp, the server and Chromium on two cores.
const browserWait = 120 * time.Second

// browser is the one headless Chromium (Debian's) of the page tests,
// started by the first of them and ended after the last (see TestMain):
// each test gets a fresh browser context in it (newBrowser), which holds
// no cookies, storage or cache of another, as a fresh profile would. A
// browser start costs seconds of CPU that the tests share.
var browser struct {
	once   sync.Once
	ctx    context.Context // the browser's own (first) context
	cancel func()          // ends it and waits for the browser to exit
	err    error
}

// newBrowser returns a context in a fresh browser context (a new tab, its
// own cookies and storage) of the shared headless Chromium, closed when
// the test ends. It fails (never skips) when Chromium is missing: CI
// installs it.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("the browser test needs Chromium on PATH (Debian: apt-get install chromium; .ci/run installs it): %v", err)
	}
	browser.once.Do(func() { startBrowser(path) })
	if browser.err != nil {
		t.Fatalf("starting Chromium: %v", browser.err)
	}
	ctx, cancel := chromedp.NewContext(browser.ctx, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel) // closes the tab and disposes of its browser context
	// The tab lives as long as the context of its first action: ctx.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("opening a tab in Chromium: %v", err)
	}
	return ctx
}

func startBrowser(path string) {
	dir, err := os.MkdirTemp("", "agenthost-chromium-")
	if err != nil {
		browser.err = err
		return
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(dir),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), // containers have a small /dev/shm
		chromedp.WindowSize(1100, 800),
	}
	// The browser lives as long as the context of its first action:
	// the package's run, ended by closeBrowser.
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	browser.ctx = ctx
	browser.cancel = func() {
		cancel()
		acancel() // waits for the browser to exit
		_ = os.RemoveAll(dir)
	}
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		browser.err = err
	}
}

// closeBrowser ends the shared browser, if a test started it.
func closeBrowser() {
	if browser.cancel != nil {
		browser.cancel()
	}
}

// pageState describes the page for a failure message.
const pageState = `"rooms: " + document.getElementById("rooms").innerHTML + "\nstatus: " + document.getElementById("status").textContent + "\nconversation:\n" + document.getElementById("log").innerText + "\npending:\n" + document.getElementById("pending").innerText`

// waitFor polls a JS condition until it holds, failing with what and the
// page's state after browserWait.
func waitFor(t *testing.T, ctx context.Context, what, cond string) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, browserWait)
	defer cancel()
	_, err := chromedp.Run(wctx, chromedp.Poll[chromedp.Void](cond,
		chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(0)))
	if err == nil {
		return
	}
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	state, _ := chromedp.Run(sctx, chromedp.Evaluate[string](pageState))
	t.Fatalf("page: waiting for %s: %v\n%s", what, err, state)
}

func act(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	actx, cancel := context.WithTimeout(ctx, browserWait)
	defer cancel()
	if err := chromedp.Do(actx, actions...); err != nil {
		t.Fatalf("page: %s: %v", what, err)
	}
}

// press clicks sel with the mouse until took (a JavaScript condition)
// says the click reached the page's handler. The page keeps rendering
// the stream's events while the browser computes where to click (a tool
// card appears above, the log grows); a click at where the button was
// then lands beside it, and nothing would ever happen.
func press(t *testing.T, ctx context.Context, what, sel, took string) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		act(t, ctx, what, chromedp.Click(chromedp.CSS(sel)))
		wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_, err := chromedp.Run(wctx, chromedp.Poll[chromedp.Void](took,
			chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(0)))
		cancel()
		if err == nil {
			return
		}
		if attempt == 3 {
			waitFor(t, ctx, what+" to take", took) // fails, saying what the page shows
			return
		}
		t.Logf("page: %s: the click did not reach the button (the page moved under it); again", what)
	}
}

func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	actx, cancel := context.WithTimeout(ctx, browserWait)
	defer cancel()
	v, err := chromedp.Run(actx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("page: evaluating %s: %v", expr, err)
	}
	return v
}

// sendFromPage types a message into the page and sends it.
func sendFromPage(t *testing.T, ctx context.Context, text string) {
	t.Helper()
	act(t, ctx, "sending "+text,
		chromedp.SetValue(chromedp.CSS("#message"), text),
		chromedp.Click(chromedp.CSS("#send")))
}

// answered is a condition: the n-th agent turn (from 1) settled with text.
func answered(n int, text string) string {
	return fmt.Sprintf(`(() => { const t = document.querySelectorAll("#log .msg.assistant")[%d];
		return !!t && t.dataset.outcome === "settled" && t.querySelector(".text").textContent === %q; })()`, n-1, text)
}

// The page at the address serve prints, in headless Chromium: a message
// sent there is answered as it streams, an approval is answered there, and
// after the server restarts on the same data dir the page reconnects with
// the conversation intact and goes on; a question is answered and a turn
// cancelled there.
func TestServePage_Chromium(t *testing.T) {
	ctx := newBrowser(t)
	data := t.TempDir()
	t.Setenv("AGENTHOST_TOKEN", "")
	url, token, stop := startServe(t, "--data", data, "--approval-mode", "always-ask")

	act(t, ctx, "opening the printed address", chromedp.Navigate(url+"#token="+token))
	waitFor(t, ctx, "the rooms list", `!document.getElementById("layout").hidden && document.getElementById("login").hidden`)
	if h := eval[string](t, ctx, `location.hash`); strings.Contains(h, token) {
		t.Fatalf("the token stayed in the address bar: %q", h)
	}

	// A new room, opened by id; its first message creates it.
	act(t, ctx, "opening a room",
		chromedp.SetValue(chromedp.CSS("#open-id"), "web"),
		chromedp.Click(chromedp.CSS(`#open-form button[type="submit"]`)))
	waitFor(t, ctx, "the room", `!document.getElementById("room").hidden`)
	sendFromPage(t, ctx, "hello from the page")
	waitFor(t, ctx, "the user's message", `document.querySelector("#log .msg.user .text")?.textContent === "hello from the page"`)
	waitFor(t, ctx, "the streamed answer", answered(1, "ok: hello from the page"))
	if n := eval[int](t, ctx, `Number(document.querySelector("#log .msg.assistant").dataset.deltas || 0)`); n == 0 {
		t.Fatal("the answer came without a text.delta: it was not streamed")
	}
	waitFor(t, ctx, "the room in the list", `[...document.querySelectorAll("#rooms .room-link")].some(b => b.textContent.startsWith("web"))`)
	// What the turn cost, as omp reported it on the built-in model (a
	// registered price): on the turn, the room, and its entry in the list
	// (the room's compute follows where the host measures it:
	// TestServePage_RoomResources checks it).
	waitFor(t, ctx, "the room's usage", `!document.getElementById("room-usage").hidden && /^1 turn, [0-9,]+ tokens · \$[0-9.e-]+ \(input \d+, output \d+, cache read \d+, cache write \d+\)(; [0-9.]+ s CPU · .+)?$/.test(document.getElementById("room-usage").textContent)`)
	waitFor(t, ctx, "the turn's usage", `/tokens · \$/.test(document.querySelector("#log .msg.assistant .turn-usage")?.textContent ?? "")`)
	waitFor(t, ctx, "the room's usage in the list", `[...document.querySelectorAll("#rooms .room-link")].some(b => b.textContent.startsWith("web") && /tokens/.test(b.querySelector(".usage")?.textContent ?? ""))`)
	// The room's agent runs confined (serve's default, auto, on a kernel with Landlock), and the
	// page says so.
	want := `"Not confined"`
	if confine.KernelABI() > 0 {
		want = fmt.Sprintf(`"Confined (Landlock ABI %d)"`, min(confine.KernelABI(), confine.MaxABI))
	}
	waitFor(t, ctx, "the room's confinement", `!document.getElementById("room-confinement").hidden && document.getElementById("room-confinement").textContent.startsWith(`+want+`)`)

	// The room's settings, edited on the page: a bad value is refused
	// with the server's reason, a good one saved (and kept, see the
	// reload below).
	act(t, ctx, "opening the settings", chromedp.Click(chromedp.CSS("#room-config summary")))
	waitFor(t, ctx, "the settings form", `document.getElementById("cfg-approval_mode").value === "always-ask" && document.getElementById("cfg-turn_timeout").value !== ""`)
	act(t, ctx, "a bad setting",
		chromedp.SetValue(chromedp.CSS("#cfg-turn_timeout"), "soon"),
		chromedp.Click(chromedp.CSS("#config-save")))
	waitFor(t, ctx, "the refusal", `document.getElementById("config-error").textContent.includes('duration "soon"')`)
	act(t, ctx, "good settings",
		chromedp.SetValue(chromedp.CSS("#cfg-turn_timeout"), "4m"),
		chromedp.SetValue(chromedp.CSS("#cfg-instructions"), "Be brief."),
		chromedp.SetValue(chromedp.CSS("#cfg-budget-turns"), "100"),
		chromedp.Click(chromedp.CSS("#config-save")))
	waitFor(t, ctx, "the settings saved", `document.getElementById("config-status").textContent.startsWith("Saved.") && document.getElementById("config-error").textContent === ""`)

	// A tool call omp asks about: allowed in the page, then run.
	sendFromPage(t, ctx, `Run it: [[tool:bash {"command":"echo hi-from-the-page"}]]`)
	waitFor(t, ctx, "the approval", `!!document.querySelector("#approvals li button.allow") && !document.getElementById("pending").hidden`)
	if tool := eval[string](t, ctx, `document.querySelector("#approvals li p").textContent`); tool != "Allow bash?" {
		t.Fatalf("approval shows %q", tool)
	}
	press(t, ctx, "allowing", "#approvals li button.allow",
		`document.getElementById("approvals").children.length === 0 || [...document.querySelectorAll("#approvals li button")].every(b => b.disabled)`)
	waitFor(t, ctx, "the approval to go", `document.getElementById("approvals").children.length === 0 && document.getElementById("pending").hidden`)
	waitFor(t, ctx, "the tool's output", `[...document.querySelectorAll("#log .tool.done pre.output")].some(p => p.textContent.includes("hi-from-the-page"))`)
	waitFor(t, ctx, "the second turn to settle", `document.querySelectorAll("#log .msg.assistant")[1]?.dataset.outcome === "settled"`)
	second := eval[string](t, ctx, `document.querySelectorAll("#log .msg.assistant")[1].querySelector(".text").textContent`)

	// A question omp's ask tool puts, answered with one of its options
	// (omp adds its own "Other" option after them).
	sendFromPage(t, ctx, `[[tool:ask {"questions":[{"id":"c","question":"Which color?","options":[{"label":"red"},{"label":"blue"}]}]}]]`)
	waitFor(t, ctx, "the question", `document.querySelector("#questions li p")?.textContent === "Which color?" && !document.getElementById("pending").hidden`)
	if opts := eval[string](t, ctx, `[...document.querySelectorAll("#questions li [role=group] button")].map(b => b.textContent).join(",")`); !strings.HasPrefix(opts, "red,blue") {
		t.Fatalf("question options on the page: %q", opts)
	}
	press(t, ctx, "answering", `#questions li [role="group"] button:nth-child(2)`,
		`document.getElementById("questions").children.length === 0 || [...document.querySelectorAll("#questions li button")].every(b => b.disabled)`)
	waitFor(t, ctx, "the question to go", `document.getElementById("questions").children.length === 0 && document.getElementById("pending").hidden`)
	waitFor(t, ctx, "the ask tool's output", `[...document.querySelectorAll("#log .msg.assistant")[2]?.querySelectorAll(".tool.done pre.output") ?? []].some(p => p.textContent.includes("blue"))`)
	waitFor(t, ctx, "the third turn to settle", `document.querySelectorAll("#log .msg.assistant")[2]?.dataset.outcome === "settled"`)

	// Restart the server on the same address and data dir.
	connects := eval[string](t, ctx, `document.body.dataset.connects`)
	if err := stop(); err != nil {
		t.Fatalf("stopping serve: %v", err)
	}
	waitFor(t, ctx, "the page to see the server go", `document.getElementById("status").dataset.state !== "live"`)
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		t.Fatal(err)
	}
	url2, token2, _ := startServe(t, "--listen", u.Host, "--data", data, "--approval-mode", "always-ask")
	if url2 != url || token2 != token {
		t.Fatalf("restarted at %s (token kept: %v), want %s", url2, token2 == token, url)
	}
	waitFor(t, ctx, "the page to reconnect", fmt.Sprintf(`Number(document.body.dataset.connects) > %s && document.getElementById("status").dataset.state === "live"`, connects))
	waitFor(t, ctx, "the conversation after the restart", answered(1, "ok: hello from the page"))
	sendFromPage(t, ctx, "after the restart")
	waitFor(t, ctx, "the answer after the restart", answered(4, "ok: after the restart"))
	// Lossless and duplicate-free: each message and turn shown once.
	const counts = `[...document.querySelectorAll("#log .msg.user")].map(m => m.dataset.message).join(",") + "|" + [...document.querySelectorAll("#log .msg.assistant")].map(m => m.dataset.turn).join(",")`
	before := eval[string](t, ctx, counts)
	users, turns, _ := strings.Cut(before, "|")
	if u, tu := strings.Split(users, ","), strings.Split(turns, ","); len(u) != 4 || len(tu) != 4 || hasDup(u) || hasDup(tu) {
		t.Fatalf("messages|turns on the page: %s", before)
	}

	// The room's usage, added up on the page from each turn.ended.
	waitFor(t, ctx, "the room's usage after four turns", `document.getElementById("room-usage").textContent.startsWith("4 turns, ")`)
	usage := eval[string](t, ctx, `document.getElementById("room-usage").textContent`)

	// A reload (the token kept for the tab, the room in the address)
	// replays the same conversation from the store.
	act(t, ctx, "reloading", chromedp.Reload())
	waitFor(t, ctx, "the conversation after a reload", answered(4, "ok: after the restart"))
	// The same totals, read from the room's state this time.
	waitFor(t, ctx, "the room's usage after a reload", `!document.getElementById("room-usage").hidden`)
	if got := eval[string](t, ctx, `document.getElementById("room-usage").textContent`); got != usage {
		t.Fatalf("the room's usage after a reload: %q, before %q", got, usage)
	}
	if got := eval[string](t, ctx, counts); got != before {
		t.Fatalf("after a reload the page shows %s, before %s", got, before)
	}
	if got := eval[string](t, ctx, `document.querySelectorAll("#log .msg.assistant")[1].querySelector(".text").textContent`); got != second {
		t.Fatalf("the approved turn's text after a reload: %q, before %q", got, second)
	}
	if !eval[bool](t, ctx, answered(1, "ok: hello from the page")) {
		t.Fatal("the first answer is gone after a reload")
	}
	waitFor(t, ctx, "the saved settings after a reload", `document.getElementById("cfg-instructions").value === "Be brief." &&
		document.getElementById("cfg-budget-turns").value === "100" && document.getElementById("cfg-turn_timeout").value === "4m0s"`)

	// A reload while a turn runs shows it running (the stream replays it
	// from its message) and each message and turn once; Cancel ends it.
	sendFromPage(t, ctx, "[[slow:60s]]take your time")
	waitFor(t, ctx, "the cancel button", `!document.getElementById("cancel").disabled && document.querySelectorAll("#log .msg.assistant").length === 5`)
	act(t, ctx, "reloading during a turn", chromedp.Reload())
	waitFor(t, ctx, "the running turn after a reload", `!document.getElementById("cancel").disabled && document.querySelectorAll("#log .msg.assistant").length === 5 &&
		!document.querySelectorAll("#log .msg.assistant")[4].dataset.outcome && document.getElementById("status").dataset.state === "live"`)
	running := eval[string](t, ctx, counts)
	users, turns, _ = strings.Cut(running, "|")
	if u, tu := strings.Split(users, ","), strings.Split(turns, ","); len(u) != 5 || len(tu) != 5 || hasDup(u) || hasDup(tu) || !strings.HasPrefix(running, before[:strings.Index(before, "|")]) {
		t.Fatalf("messages|turns on the page during a turn: %s (before it: %s)", running, before)
	}
	act(t, ctx, "cancelling", chromedp.Click(chromedp.CSS("#cancel")))
	waitFor(t, ctx, "the cancelled turn", `document.querySelectorAll("#log .msg.assistant")[4].dataset.outcome === "cancelled" && document.getElementById("cancel").disabled`)
}

func hasDup(ids []string) bool {
	seen := map[string]bool{}
	for _, id := range ids {
		if id == "" || seen[id] {
			return true
		}
		seen[id] = true
	}
	return false
}
