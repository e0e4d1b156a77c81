package rpcagent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agenthost/agenthost/internal/agentfs"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/room"
)

// repairTail keeps a session file whose last line is whole, ends one
// without a newline, and cuts a torn last line (keeping the original as
// .torn), whatever the line's length against its read buffer.
func TestRepairTail(t *testing.T) {
	long := `{"x":"` + strings.Repeat("y", 200<<10) + `"}`
	for _, tc := range []struct{ name, in, want, torn string }{
		{"empty", "", "", ""},
		{"whole", "{\"a\":1}\n{\"b\":2}\n", "{\"a\":1}\n{\"b\":2}\n", ""},
		{"no newline", "{\"a\":1}\n{\"b\":2}", "{\"a\":1}\n{\"b\":2}\n", ""},
		{"torn", "{\"a\":1}\n{\"b\":", "{\"a\":1}\n", "{\"a\":1}\n{\"b\":"},
		{"torn, newlines after", "{\"a\":1}\n{\"b\":\n\n", "{\"a\":1}\n", "{\"a\":1}\n{\"b\":\n\n"},
		{"only newlines", "\n\n", "", "\n\n"},
		{"one torn line", "{\"b\":", "", "{\"b\":"},
		{"long whole", "{\"a\":1}\n" + long + "\n", "{\"a\":1}\n" + long + "\n", ""},
		{"long torn", long + "\n" + long[:100<<10], long + "\n", long + "\n" + long[:100<<10]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			home := t.TempDir()
			file := filepath.Join(home, sessionsDir, "1_id.jsonl")
			if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, []byte(tc.in), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := resumeSession(home, "id", nil)
			if err != nil || got != file {
				t.Fatalf("resumeSession: %q, %v", got, err)
			}
			if b, _ := os.ReadFile(file); string(b) != tc.want {
				t.Errorf("file: %q, want %q", b, tc.want)
			}
			b, err := os.ReadFile(file + ".torn")
			if tc.torn == "" && !errors.Is(err, os.ErrNotExist) || tc.torn != "" && string(b) != tc.torn {
				t.Errorf("torn copy: %q, %v; want %q", b, err, tc.torn)
			}
		})
	}
}

// The agent plants links and special files named like its session file
// (sorting after it): the server resumes the real one, never reads
// through a link, never blocks on a FIFO, and never copies a link's target
// into the room; a session folder that is a link is no session at all.
func TestResumeSessionNeverFollowsLinks(t *testing.T) {
	base := t.TempDir()
	token := filepath.Join(base, "token")
	secret := "the-server-token\nnot json"
	if err := os.WriteFile(token, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(base, "home")
	sessions := filepath.Join(home, sessionsDir)
	if err := os.MkdirAll(sessions, 0o700); err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(sessions, "2026_id.jsonl")
	if err := os.WriteFile(real, []byte("{\"a\":1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(token, filepath.Join(sessions, "zzzz_id.jsonl")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("2026_id.jsonl", filepath.Join(sessions, "zzzy_id.jsonl")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(sessions, "zzzx_id.jsonl"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := resumeSession(home, "id", nil)
	if err != nil || got != real {
		t.Fatalf("resumeSession: %q, %v; want %q", got, err, real)
	}
	ents, _ := os.ReadDir(sessions)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".torn") {
			t.Errorf("a copy was made: %s", e.Name())
		}
	}
	if b, _ := os.ReadFile(token); string(b) != secret {
		t.Fatalf("the token changed: %q", b)
	}

	// Only links: no session.
	if err := os.Remove(real); err != nil {
		t.Fatal(err)
	}
	if _, err := resumeSession(home, "id", nil); !errors.Is(err, room.ErrSessionNotFound) {
		t.Fatalf("only links: %v", err)
	}
	// The sessions folder itself a link to a folder holding a session file.
	elsewhere := filepath.Join(base, "elsewhere")
	if err := os.MkdirAll(elsewhere, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(elsewhere, "1_id.jsonl"), []byte("torn"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(sessions); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, sessions); err != nil {
		t.Fatal(err)
	}
	if _, err := resumeSession(home, "id", nil); !errors.Is(err, room.ErrSessionNotFound) {
		t.Fatalf("a linked sessions folder: %v", err)
	}
	if ents, _ := os.ReadDir(elsewhere); len(ents) != 1 {
		t.Fatalf("written through the linked folder: %v", ents)
	}
	for _, bad := range []string{"", "a/b", "*", "x?"} {
		if _, err := resumeSession(home, bad, nil); !errors.Is(err, room.ErrSessionNotFound) {
			t.Errorf("id %q: %v", bad, err)
		}
	}
}

// writeMCP replaces a link planted at the room's mcp.json or at a folder
// on the way; the mcp.json removal of a room without servers never
// removes through a linked folder.
func TestWriteMCPReplacesLinks(t *testing.T) {
	base := t.TempDir()
	victim := filepath.Join(base, "victim")
	if err := os.MkdirAll(victim, 0o700); err != nil {
		t.Fatal(err)
	}
	file, dir := filepath.Base(agents.OMPMCPFile), filepath.Dir(agents.OMPMCPFile)
	vfile := filepath.Join(victim, file)
	if err := os.WriteFile(vfile, []byte("the victim's"), 0o600); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(base, "home")
	plant := func() {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(home, filepath.Dir(dir)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(victim, filepath.Join(home, dir)); err != nil {
			t.Fatal(err)
		}
	}
	plant()
	d, err := agentfs.Open(home, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := writeMCP(d, map[string]room.MCPServer{"s": {Command: []string{"srv"}}}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(vfile); string(b) != "the victim's" {
		t.Fatalf("the victim's file: %q", b)
	}
	b, err := os.ReadFile(filepath.Join(home, agents.OMPMCPFile))
	if err != nil || !strings.Contains(string(b), `"srv"`) {
		t.Fatalf("the room's MCP file: %q, %v", b, err)
	}
	if err := d.Remove(agents.OMPMCPFile); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(home, dir)); err != nil {
		t.Fatal(err)
	}
	plant()
	if err := d.Remove(agents.OMPMCPFile); !errors.Is(err, agentfs.ErrLink) {
		t.Fatalf("a removal through a link: %v", err)
	}
	if b, _ := os.ReadFile(vfile); string(b) != "the victim's" {
		t.Fatalf("the victim's file after the removal: %q", b)
	}
}
