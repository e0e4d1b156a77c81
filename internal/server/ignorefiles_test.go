package server

import (
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agenthost/agenthost/room"
)

// An ignore file written during a turn (here "*", with an edit to a file
// an earlier turn wrote) never makes that turn's diff call the file
// deleted, and a revert to before the earlier turn takes the file away
// whatever the ignore file says.
func TestIgnoreFileWrittenDuringATurn(t *testing.T) {
	h := newHarness(t, room.Options{Snapshots: snapshots(t)}, Options{})
	t1 := h.ended("gi", h.post("gi", "write:a.txt"))
	ws := h.f.lastSpec().Workspace
	// The second turn waits for an approval; meanwhile "it" writes the
	// ignore file and edits a.txt.
	hang := h.post("gi", "approve:bash")
	req := h.until("gi", hang.Seq, func(ev sse) bool { return ev.typ == "approval.requested" })
	for name, content := range map[string]string{".gitignore": "*\n", "a.txt": "hello\nmore\n"} {
		if err := os.WriteFile(filepath.Join(ws, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if r := h.do("POST", "/v1/rooms/gi/approvals/"+req.data["approval_id"].(string), map[string]string{"decision": "allow"}); r.status != http.StatusOK {
		t.Fatalf("approve: %d %s", r.status, r.body)
	}
	t2 := h.ended("gi", hang)
	if c, _ := t2["changes"].(map[string]any); c["files"] != 1.0 || c["deletions"] != 0.0 {
		t.Fatalf("the second turn's changes: %v", t2["changes"])
	}
	r := h.do("GET", "/v1/rooms/gi/turns/"+t2["turn_id"].(string)+"/diff", nil)
	files, _ := r.json(t)["files"].([]any)
	if r.status != http.StatusOK || len(files) != 1 {
		t.Fatalf("the second turn's diff: %d %s", r.status, r.body)
	}
	if f := files[0].(map[string]any); f["path"] != "a.txt" || f["status"] != "modified" || f["insertions"] != 1.0 {
		t.Fatalf("the second turn's diff lists %v, want a.txt modified", f)
	}
	r = h.do("POST", "/v1/rooms/gi/turns/"+t1["turn_id"].(string)+"/revert", nil)
	out := r.json(t)
	if r.status != http.StatusOK || !slices.Equal(out["files"].([]any), []any{"a.txt"}) {
		t.Fatalf("revert to before the first turn: %d %s", r.status, r.body)
	}
	if _, err := os.Stat(filepath.Join(ws, "a.txt")); !os.IsNotExist(err) {
		t.Fatalf("a.txt after the revert: %v", err)
	}
}
