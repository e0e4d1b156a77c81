package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A real omp turn (the built-in model) that writes, edits and deletes
// files: see diffAndRevertReal.
func TestDiffAndRevertARealTurn(t *testing.T) { diffAndRevertReal(t, "omp") }

// The same with pi.
func TestDiffAndRevertARealPiTurn(t *testing.T) { diffAndRevertReal(t, "pi") }

// bashStep is the built-in model's directive to run command with bash.
func bashStep(t *testing.T, command string) string {
	t.Helper()
	b, err := json.Marshal(map[string]string{"command": command})
	if err != nil {
		t.Fatal(err)
	}
	return "[[tool:bash " + string(b) + "]]"
}

// diffAndRevertReal drives one agent, one room, through the CLI (over
// the API): a first turn makes files and a .gitignore; a second writes,
// edits and deletes them and adds an ignored build output and a file over
// --snapshot-max-file. turn.ended counts only the three, `diff` names
// each with its status (the last turn by default), a revert is refused
// while a turn runs, and then takes the second turn back (the ignored and
// the big file, never snapshotted, stay) and the room records
// workspace.reverted. The edge cases run against the fake agents in room
// and server.
func diffAndRevertReal(t *testing.T, agent string) {
	data := t.TempDir()
	t.Setenv("AGENTHOST_TOKEN", "")
	url, token, _ := startServe(t, "--data", data, "--agent", agent, "--approval-mode", "yolo", "--snapshot-max-file", "1024")
	t.Setenv("AGENTHOST_URL", url)
	s := &clientServer{t: t, url: url, token: token, data: data}

	seq := s.send("snap", "Set up: "+bashStep(t, `printf 'a\nb\n' > edit.txt && echo gone > gone.txt && echo build/ > .gitignore`))
	first := s.wait("snap", seq, "turn.ended")
	if c, _ := first["changes"].(map[string]any); first["outcome"] != "settled" || c["files"] != 3.0 || c["insertions"] != 4.0 {
		t.Fatalf("first turn.ended %v", first)
	}
	ws, _ := filepath.Glob(filepath.Join(data, "workspaces", "snap-*"))
	if len(ws) != 1 {
		t.Fatalf("the room's workspace: %v", ws)
	}
	in := func(name string) string { return filepath.Join(ws[0], name) }

	seq = s.send("snap", "Change it: "+bashStep(t, `echo made > made.txt && echo c >> edit.txt && rm gone.txt && `+
		`mkdir build && echo obj > build/out.o && head -c 2048 /dev/zero > big.bin`))
	ended := s.wait("snap", seq, "turn.ended")
	turn, _ := ended["turn_id"].(string)
	c, _ := ended["changes"].(map[string]any)
	// The ignored build folder and the file over the bound are left out,
	// and counted.
	if ended["outcome"] != "settled" || c["files"] != 3.0 || c["insertions"] != 2.0 || c["deletions"] != 1.0 ||
		c["skipped"] != 2.0 {
		t.Fatalf("turn.ended %v", ended)
	}

	out, errs, code := s.cli("diff", "snap")
	if code != 0 || !strings.Contains(out, "+made") || !strings.Contains(out, "+c") || !strings.Contains(out, "-gone") ||
		!strings.Contains(errs, "turn "+turn+": 3 file(s) changed, 2 insertion(s), 1 deletion(s)") ||
		!strings.Contains(errs, "  added    made.txt (+1 -0)") || !strings.Contains(errs, "  modified edit.txt (+1 -0)") ||
		!strings.Contains(errs, "  deleted  gone.txt (+0 -1)") || strings.Contains(out+errs, "out.o") ||
		strings.Contains(out, "big.bin") || !strings.Contains(errs, "  left out big.bin (too_large, 2048 bytes)\n") ||
		!strings.Contains(errs, "  left out build/ (ignored)\n") {
		t.Fatalf("diff: %d %q %q", code, out, errs)
	}
	out, errs, code = s.cli("diff", "snap", turn, "--json")
	var d struct {
		TurnID string `json:"turn_id"`
		Files  []struct {
			Path, Status          string
			Insertions, Deletions int
		} `json:"files"`
		Truncated bool `json:"truncated"`
		Skipped   []struct {
			Path, Reason string
			Size         int64
		} `json:"skipped"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &d) != nil || d.TurnID != turn || len(d.Files) != 3 || d.Truncated ||
		fmt.Sprint(d.Skipped) != "[{big.bin too_large 2048} {build/ ignored 0}]" {
		t.Fatalf("diff --json: %d %q %q", code, out, errs)
	}
	status := map[string]string{}
	for _, f := range d.Files {
		status[f.Path] = f.Status
	}
	if status["made.txt"] != "added" || status["edit.txt"] != "modified" || status["gone.txt"] != "deleted" {
		t.Fatalf("diff --json files: %+v", d.Files)
	}

	// A turn in progress (its model answers slowly): no revert.
	busy := s.send("snap", "[[slow:1m]] take your time")
	s.wait("snap", busy, "turn.started")
	if _, errs, code := s.cli("revert", "snap", turn); code != exitFailed || !strings.Contains(errs, "(HTTP 409)") {
		t.Fatalf("revert while a turn runs: %d %q", code, errs)
	}
	if _, errs, code := s.cli("cancel", "snap"); code != 0 {
		t.Fatalf("cancel: %d %q", code, errs)
	}
	if ev := s.wait("snap", busy, "turn.ended"); ev["outcome"] != "cancelled" {
		t.Fatalf("the slow turn: %v", ev)
	}

	out, errs, code = s.cli("revert", "snap", turn)
	if code != 0 || !strings.HasPrefix(out, "room snap: workspace reverted to before turn "+turn+" (3 file(s) restored)\n") {
		t.Fatalf("revert: %d %q %q", code, out, errs)
	}
	if _, err := os.Stat(in("made.txt")); !os.IsNotExist(err) {
		t.Fatalf("made.txt after the revert: %v", err)
	}
	for name, want := range map[string]string{"edit.txt": "a\nb\n", "gone.txt": "gone\n", "build/out.o": "obj\n",
		"big.bin": string(make([]byte, 2048))} {
		if b, err := os.ReadFile(in(name)); err != nil || !bytes.Equal(b, []byte(want)) {
			t.Fatalf("%s after the revert: %q %v", name, b, err)
		}
	}
	if ev := s.wait("snap", seq, "workspace.reverted"); ev["turn_id"] != turn || ev["count"] != 3.0 {
		t.Fatalf("workspace.reverted %v", ev)
	}
	if _, errs, code := s.cli("revert", "snap", "t_nope"); code != exitFailed || !strings.Contains(errs, "turn t_nope: not found") {
		t.Fatalf("revert of an unknown turn: %d %q", code, errs)
	}
}
