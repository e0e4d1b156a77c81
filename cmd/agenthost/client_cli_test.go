package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// clientServer is a real server (omp on the built-in model) for the
// client commands, which find it through AGENTHOST_URL and its data dir.
type clientServer struct {
	t          *testing.T
	url, token string
	data       string
}

func newClientServer(t *testing.T) *clientServer {
	t.Helper()
	data := t.TempDir()
	t.Setenv("AGENTHOST_TOKEN", "")
	url, token, _ := startServe(t, "--data", data)
	t.Setenv("AGENTHOST_URL", url)
	return &clientServer{t: t, url: url, token: token, data: data}
}

func (s *clientServer) cli(args ...string) (string, string, int) {
	s.t.Helper()
	return runCLI(s.t, append(args, "--data", s.data)...)
}

// send sends text to room with `send --json` and returns the message's
// sequence number.
func (s *clientServer) send(room, text string) int64 {
	s.t.Helper()
	out, errs, code := s.cli("send", room, text, "--json")
	var acc struct {
		ID  string `json:"id"`
		Seq int64  `json:"seq"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &acc) != nil || !strings.HasPrefix(acc.ID, "m_") || acc.Seq == 0 {
		s.t.Fatalf("send --json: code %d out %q err %q", code, out, errs)
	}
	return acc.Seq
}

// wait follows room after seq until an event of type typ, and returns it.
func (s *clientServer) wait(room string, after int64, typ string) map[string]any {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var got map[string]any
	err := newTestClient(s.t, s.url, s.token).events(ctx, room, after, true, func(t string, raw []byte) (bool, error) {
		if t != typ {
			return false, nil
		}
		return true, json.Unmarshal(raw, &got)
	})
	if err != nil {
		s.t.Fatalf("waiting for %s in room %s: %v", typ, room, err)
	}
	return got
}

const askColor = `[[tool:ask {"questions":[{"id":"c","question":"Which color?","options":[{"label":"red"},{"label":"blue"}]}]}]]`

// The client commands against a real server (one room, so one agent at a
// time): send (text, --json, --follow to the message's end), approve and
// answer say what they did, release and cancel, rooms, and errors that
// exit 1 in one line.
func TestClientCommands(t *testing.T) {
	s := newClientServer(t)
	seq := s.send("demo", "Run it: "+`[[tool:bash {"command":"echo approved-by-cli"}]]`)
	approval := s.wait("demo", seq, "approval.requested")["approval_id"].(string)
	if out, errs, code := s.cli("approve", "demo", approval, "allow"); code != 0 || out != "approval "+approval+" in room demo: allowed\n" {
		t.Fatalf("approve: %d %q %q", code, out, errs)
	}
	if _, errs, code := s.cli("approve", "demo", approval, "deny"); code != exitFailed || !strings.Contains(errs, "already resolved (HTTP 409)") {
		t.Fatalf("approve twice: %d %q", code, errs)
	}
	if ended := s.wait("demo", seq, "turn.ended"); ended["outcome"] != "settled" {
		t.Fatalf("the approved turn: %v", ended)
	}

	// A question, answered with answer. (send without --json prints the
	// message's id and sequence number.)
	out, _, code := s.cli("send", "demo", askColor)
	var id string
	if n, err := fmt.Sscanf(out, "%s %d\n", &id, &seq); code != 0 || n != 2 || err != nil || !strings.HasPrefix(id, "m_") {
		t.Fatalf("send: %d %q", code, out)
	}
	q := s.wait("demo", seq, "question.asked")
	qid := q["question_id"].(string)
	if out, errs, code := s.cli("answer", "demo", qid, "blue", "--json"); code != 0 || out != `{"id":"`+qid+`","answer":"blue"}`+"\n" {
		t.Fatalf("answer --json: %d %q %q", code, out, errs)
	}
	if _, errs, code := s.cli("answer", "demo", "q_nope", "x"); code != exitFailed || !strings.Contains(errs, "question q_nope: not found (HTTP 404)") {
		t.Fatalf("answer unknown: %d %q", code, errs)
	}
	if ended := s.wait("demo", seq, "turn.ended"); ended["outcome"] != "settled" || ended["message_id"] != id {
		t.Fatalf("the answered turn: %v", ended)
	}

	// send --follow ends on the message.ended naming its message: a turn
	// that settles (exit 0, the answer on stdout), and a message that
	// answers a pending question (answered, exit 0) rather than hang.
	out, errs, code := s.cli("send", "demo", "hello client", "--follow", "--timeout", "2m")
	if code != 0 || out != "ok: hello client\n" || !strings.Contains(errs, "turn started") {
		t.Fatalf("send --follow: code %d out %q err %q", code, out, errs)
	}
	seq = s.send("demo", askColor)
	s.wait("demo", seq, "question.asked")
	out, errs, code = s.cli("send", "demo", "blue", "--follow", "--timeout", "2m")
	if code != 0 || !strings.Contains(errs, "answered a pending question") {
		t.Fatalf("send --follow answering a question: code %d out %q err %q", code, out, errs)
	}
	// The asking turn goes on with the answer to its end.
	if ended := s.wait("demo", seq, "turn.ended"); ended["outcome"] != "settled" {
		t.Fatalf("the turn the message answered: %v", ended)
	}

	// The agent is resident between turns: release it, with its receipt.
	if out, errs, code := s.cli("release", "demo"); code != 0 || !strings.HasPrefix(out, "room demo: agent released (released on request); receipt: ") {
		t.Fatalf("release: %d %q %q", code, out, errs)
	}
	if out, errs, code := s.cli("release", "demo", "--json"); code != 0 || out != `{"released":false}`+"\n" {
		t.Fatalf("release --json of a released room: %d %q %q", code, out, errs)
	}

	// A turn waiting on an approval is running: it cannot be released,
	// and cancel ends it.
	seq = s.send("demo", "Run it: "+`[[tool:bash {"command":"echo never"}]]`)
	turn := s.wait("demo", seq, "approval.requested")["turn_id"].(string)
	if _, errs, code := s.cli("release", "demo"); code != exitFailed || !strings.Contains(errs, "cancel it before releasing") {
		t.Fatalf("release during a turn: %d %q", code, errs)
	}
	if out, errs, code := s.cli("cancel", "demo"); code != 0 || out != "room demo: cancelling turn "+turn+"\n" {
		t.Fatalf("cancel: %d %q %q", code, out, errs)
	}
	if ended := s.wait("demo", seq, "turn.ended"); ended["outcome"] != "cancelled" {
		t.Fatalf("the cancelled turn: %v", ended)
	}
	if _, errs, code := s.cli("cancel", "demo"); code != exitFailed || !strings.Contains(errs, "no turn is running in this room (HTTP 409)") {
		t.Fatalf("cancel with no turn: %d %q", code, errs)
	}

	out, errs, code = s.cli("rooms")
	if code != 0 || !strings.HasPrefix(out, "demo ") {
		t.Fatalf("rooms: %d %q %q", code, out, errs)
	}
	var r struct{ ID string }
	if out, _, code = s.cli("rooms", "--json"); code != 0 || json.Unmarshal([]byte(out), &r) != nil || r.ID != "demo" {
		t.Fatalf("rooms --json: %d %q", code, out)
	}
}

// agenthost config shows and changes a room's settings; a budget it sets
// stops the room (send fails naming the limit) until it is raised.
func TestConfigCommandAndBudget(t *testing.T) {
	s := newClientServer(t)
	if _, errs, code := s.cli("config", "cfg"); code != exitFailed || !strings.Contains(errs, "not found (HTTP 404)") {
		t.Fatalf("config of an unknown room: %d %q", code, errs)
	}
	out, errs, code := s.cli("config", "cfg", "--set", "instructions=Always be brief.", "--set", "budget.turns=1", "--set", "turn_timeout=90s")
	if code != 0 || !strings.Contains(out, "instructions:     Always be brief.\n") || !strings.Contains(out, "budget.turns:     1\n") ||
		!strings.Contains(out, "turn_timeout:     1m30s\n") || !strings.Contains(out, "approval_mode:    always-ask\n") {
		t.Fatalf("config --set: %d %q %q", code, out, errs)
	}
	out, errs, code = s.cli("config", "cfg", "--json")
	var cfg map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &cfg) != nil || cfg["instructions"] != "Always be brief." || cfg["agent"] != "omp" {
		t.Fatalf("config --json: %d %q %q", code, out, errs)
	}
	// Usage errors exit 2 whether the client or the server finds them, and
	// say what the setting takes in its own words (never Go's types).
	for _, c := range []struct{ set, want string }{
		{"colour=red", `agenthost: config: no setting "colour" (agenthost config ROOM lists them)` + "\n"},
		{"approval_mode=never", `approval_mode "never"`},
		{"turn_timeout=500ms", "turn_timeout must be from 1s to 168h0m0s (or 0 or empty for the server's default) (HTTP 400)"},
		{"idle_after=10", `agenthost: config: idle_after takes a Go duration such as "90s" or "5m", not a number (see agenthost config --help)` + "\n"},
		{"budget.turns=abc", "agenthost: config: budget.turns takes a whole number (0 is no limit), not a string (see agenthost config --help)\n"},
	} {
		if _, errs, code := s.cli("config", "cfg", "--set", c.set); code != exitUsage || !strings.Contains(errs, c.want) || strings.Contains(errs, "Go struct") {
			t.Fatalf("config --set %s: %d %q, want %q", c.set, code, errs, c.want)
		}
	}
	if _, errs, code := s.cli("send", "..", "x"); code != exitUsage || errs != `agenthost: bad request: invalid room id ".."`+"\n" {
		t.Fatalf("send to a bad room id: %d %q", code, errs)
	}
	t.Setenv("AGENTHOST_TOKEN", "wrong")
	if _, errs, code := runCLI(t, "rooms"); code != exitFailed || !strings.Contains(errs, "a valid bearer token is required (HTTP 401): the server's token is in its data dir (give --data or AGENTHOST_DATA), or set AGENTHOST_TOKEN") {
		t.Fatalf("a wrong token: %d %q", code, errs)
	}
	t.Setenv("AGENTHOST_TOKEN", "")
	if out, errs, code := s.cli("send", "cfg", "hello", "--follow", "--timeout", "2m"); code != 0 || out != "ok: hello\n" {
		t.Fatalf("send within the budget: %d %q %q", code, out, errs)
	}
	if _, errs, code := s.cli("send", "cfg", "more"); code != exitFailed ||
		!strings.Contains(errs, "room budget exhausted: 1 of 1 turns run (HTTP 429): raise the room's budget with agenthost config ROOM --set budget.turns=N") {
		t.Fatalf("send over the budget: %d %q", code, errs)
	}
	if out, errs, code := s.cli("config", "cfg", "--set", "budget.turns=2"); code != 0 || !strings.Contains(out, "budget.turns:     2\n") ||
		!strings.Contains(out, "instructions:     Always be brief.\n") {
		t.Fatalf("raising the budget: %d %q %q", code, out, errs)
	}
	if out, errs, code := s.cli("send", "cfg", "again", "--follow", "--timeout", "2m"); code != 0 || out != "ok: again\n" {
		t.Fatalf("send after raising the budget: %d %q %q", code, out, errs)
	}
	// The room's usage, in the rooms list.
	if out, errs, code := s.cli("rooms"); code != 0 || !regexp.MustCompile(`(?m)^cfg .* turns 2  tokens [1-9][0-9]*  \$0\.\d{4}$`).MatchString(out) {
		t.Fatalf("rooms: %d %q %q", code, out, errs)
	}
}

// testRepo makes a repository with two branches, main and feature, each
// with a README naming it, and returns its file:// URL.
func testRepo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false"}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q", "-b", "main")
	for _, br := range []string{"main", "feature"} {
		if br != "main" {
			git("checkout", "-q", "-b", br)
		}
		if err := os.WriteFile(filepath.Join(dir, "README"), []byte("on "+br+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		git("add", "README")
		git("commit", "-q", "-m", "commit on "+br)
	}
	return "file://" + dir
}

// Workspaces from git on the real agents, confined (serve's default): omp
// in one room on main, pi in another on feature, each in its own worktree,
// where git itself works (the shared mirror it borrows from is readable).
func TestServe_GitWorkspacesOnOmpAndPi(t *testing.T) {
	url := testRepo(t)
	// file:// repositories only under the folders the operator lists.
	t.Setenv("AGENTHOST_GIT_FILE_ROOTS", filepath.Dir(strings.TrimPrefix(url, "file://")))
	s := newClientServer(t)
	rooms := []struct{ room, agent, ref string }{{"wa", "omp", "main"}, {"wb", "pi", "feature"}}
	// Both rooms' messages first, then what came of them: the two agents
	// start side by side (an agent's start is most of a turn's time).
	seqs := map[string]int64{}
	for _, tc := range rooms {
		ws, _ := json.Marshal(map[string]string{"git": url, "ref": tc.ref})
		if out, errs, code := s.cli("config", tc.room, "--set", "agent="+tc.agent, "--set", "approval_mode=yolo", "--set", "workspace="+string(ws)); code != 0 {
			t.Fatalf("config %s: %d %q %q", tc.room, code, out, errs)
		}
		seqs[tc.room] = s.send(tc.room, `Run it: [[tool:bash {"command":"git log --format=%s -1 && cat README && touch mine-`+tc.room+` && ls"}]]`)
	}
	other := map[string]string{"wa": "wb", "wb": "wa"}
	for _, tc := range rooms {
		seq := seqs[tc.room]
		ready := s.wait(tc.room, 0, "workspace.ready")
		if ready["ref"] != tc.ref || ready["kind"] != "branch" || len(ready["commit"].(string)) != 40 {
			t.Fatalf("room %s: workspace.ready %v", tc.room, ready)
		}
		tool := s.wait(tc.room, seq, "tool.ended")
		out, _ := tool["output"].(string)
		if !strings.Contains(out, "commit on "+tc.ref) || !strings.Contains(out, "on "+tc.ref+"\n") || strings.Contains(out, "mine-"+other[tc.room]) {
			t.Fatalf("room %s (%s): the tool's output %q", tc.room, tc.agent, out)
		}
		if ended := s.wait(tc.room, seq, "turn.ended"); ended["outcome"] != "settled" {
			t.Fatalf("room %s: %v", tc.room, ended)
		}
	}
	// Each room's worktree holds its own file and not the other's: the
	// rooms ran side by side, so one's listing may predate the other's
	// file.
	for _, tc := range rooms {
		own, _ := filepath.Glob(filepath.Join(s.data, "workspaces", tc.room+"-*", "mine-"+tc.room))
		theirs, _ := filepath.Glob(filepath.Join(s.data, "workspaces", tc.room+"-*", "mine-"+other[tc.room]))
		if len(own) != 1 || len(theirs) != 0 {
			t.Fatalf("room %s's worktree: its own file %v, the other room's %v", tc.room, own, theirs)
		}
	}
	// Deleted for good (release --purge), the room's id takes the other
	// branch as a new room, in a worktree without the old room's files.
	if out, errs, code := s.cli("release", "wa", "--purge"); code != 0 || !strings.HasPrefix(out, "room wa: deleted for good (agent released: true; receipt: ") {
		t.Fatalf("release --purge: %d %q %q", code, out, errs)
	}
	if _, errs, code := s.cli("config", "wa"); code != exitFailed || !strings.Contains(errs, "not found") {
		t.Fatalf("config of a purged room: %d %q", code, errs)
	}
	ws, _ := json.Marshal(map[string]string{"git": url, "ref": "feature"})
	if out, errs, code := s.cli("config", "wa", "--set", "approval_mode=yolo", "--set", "workspace="+string(ws)); code != 0 {
		t.Fatalf("config of the new room: %d %q %q", code, out, errs)
	}
	seq := s.send("wa", `Run it: [[tool:bash {"command":"cat README && ls"}]]`)
	if seq != 2 {
		// 1 is the new room's settings.changed.
		t.Fatalf("the new room's second event is %d", seq)
	}
	tool := s.wait("wa", seq, "tool.ended")
	if out, _ := tool["output"].(string); !strings.Contains(out, "on feature\n") || strings.Contains(out, "mine-wa") {
		t.Fatalf("the new room's workspace: %q", out)
	}
}

// TestTokenCommands: token create prints the secret and a link whose
// fragment the client commands take; the room token sees only its rooms
// and cannot list tokens; token list shows no secret; token revoke ends
// it; the secret is in no file of the server's data dir.
func TestTokenCommands(t *testing.T) {
	s := newClientServer(t)
	out, errs, code := s.cli("token", "create", "ticket-4*,ticket-7", "--can", "read,send", "--expires", "1h", "--label", "ann")
	m := regexp.MustCompile(`(?m)^token (tok_[0-9a-f]+) .*\nsecret \(shown once\): (aht_\S+)\nlink: (http://\S+)$`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("token create: code %d out %q err %q", code, out, errs)
	}
	id, secret, link := m[1], m[2], m[3]
	if want := strings.TrimSuffix(s.url, "/") + "/#token=" + secret + "&room=ticket-7"; link != want {
		t.Fatalf("link %q, want %q", link, want)
	}
	if out, errs, code := s.cli("token", "list"); code != 0 || !strings.Contains(out, id+"\tann\tticket-4*,ticket-7\tread,send\texpires ") || strings.Contains(out, secret) {
		t.Fatalf("token list: code %d out %q err %q", code, out, errs)
	}
	// The room token, from the link: no token routes, only its rooms.
	if _, errs, code := runCLI(t, "token", "list", "--server", link); code != 1 || !strings.Contains(errs, "admin token") {
		t.Fatalf("token list as a room token: code %d err %q", code, errs)
	}
	if out, errs, code := runCLI(t, "rooms", "--server", link); code != 0 {
		t.Fatalf("rooms as a room token: code %d out %q err %q", code, out, errs)
	}
	if _, errs, code := runCLI(t, "cancel", "ticket-5", "--server", link); code != 1 || !strings.Contains(errs, "does not reach room ticket-5") {
		t.Fatalf("cancel in another room: code %d err %q", code, errs)
	}
	if out, errs, code := s.cli("token", "revoke", id); code != 0 || !strings.Contains(out, "revoked") {
		t.Fatalf("token revoke: code %d out %q err %q", code, out, errs)
	}
	if _, errs, code := runCLI(t, "rooms", "--server", link); code != 1 || !strings.Contains(errs, "revoked") {
		t.Fatalf("rooms with a revoked token: code %d err %q", code, errs)
	}
	err := filepath.WalkDir(s.data, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil // a socket or a file gone since
		}
		if strings.Contains(string(b), secret) || strings.Contains(string(b), strings.TrimPrefix(secret, "aht_")) {
			t.Errorf("the secret is in %s", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
