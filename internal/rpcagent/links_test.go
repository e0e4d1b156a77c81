package rpcagent

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/roomtest"
	"github.com/agenthost/agenthost/room"
)

// The regression tests of ../shared/repro/confine 02 and 03: a room's
// agent (real omp and pi, confined, on the built-in model) plants links in
// its home aimed at what the server may read and write and the agent may
// not (the API token, the store, another room's files), then its agent is
// released; the server's next start of it never reads or writes through
// them, and the turn settles.

// startConfined hosts rooms on agent in dir, confined with Landlock.
func startConfined(t *testing.T, dir, agent string) *host {
	t.Helper()
	return roomtest.Start(t, dir, nil, room.Options{Config: room.Config{Agent: agent, ApprovalMode: room.ApprovalYolo}},
		func(cust *custody.Custodian, in *agents.Install, modelURL string) (room.Transport, error) {
			cf, err := confine.New(confine.Options{Mode: confine.ModeLandlock, Tools: in.Dir})
			if err != nil {
				return nil, err
			}
			return New(Options{Custodian: cust, Install: in, ModelURL: modelURL, Confine: cf})
		})
}

// runTool has the room's agent run cmd in its bash tool and returns the
// tool's output; the turn settles.
func runTool(h *host, roomID, cmd string) string {
	h.T.Helper()
	acc := h.Submit(roomID, "Run it: "+roomtest.BashCall(cmd))
	_, tool := h.Wait(roomID, acc.Seq, "tool.ended", nil)
	h.Settled(roomID, acc)
	out, _ := tool["output"].(string)
	return out
}

// restart releases the room's agent and runs a turn on a new one, which
// resumes the room's session: it settles.
func restart(h *host, roomID string) {
	h.T.Helper()
	if err := h.M.Release(h.T.Context(), roomID); err != nil {
		h.T.Fatal(err)
	}
	acc := h.Submit(roomID, "hello again")
	_, started := h.Wait(roomID, acc.Seq, "agent.started", nil)
	if started["resumed"] != true {
		h.T.Fatalf("the new agent did not resume the session: %v", started)
	}
	if got := h.Settled(roomID, acc); got != "ok: hello again" {
		h.T.Fatalf("the turn after the restart: %q", got)
	}
}

// roomFiles is the content of every regular file beneath the room's
// folders (home and workspace).
func roomFiles(t *testing.T, h *host, roomID string) map[string][]byte {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(h.Root, roomID+"-*"))
	if len(dirs) != 1 {
		t.Fatalf("room %s's folder: %v", roomID, dirs)
	}
	out := map[string][]byte{}
	err := filepath.WalkDir(dirs[0], func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		out[p] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func storeHeader(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 16)
	if _, err := f.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// Repro 02: links named like the agent's session file (sorting after it)
// to the token and to the store, and a FIFO: the server's resume finds the
// real session, reads nothing through the links (no copy of the token or
// the store appears in the room), and the token is unchanged.
func TestRealSessionLinksAreNeverRead(t *testing.T) {
	for _, agent := range []string{"omp", "pi"} {
		t.Run(agent, func(t *testing.T) {
			dir := t.TempDir()
			token := filepath.Join(dir, "token")
			secret := []byte("5108cbac3c084992b68a2ca33609b7f5ec639dc82acba013\n")
			if err := os.WriteFile(token, secret, 0o600); err != nil {
				t.Fatal(err)
			}
			store := filepath.Join(dir, "agenthost.db")
			h := startConfined(t, dir, agent)
			// Another room's words, in the store (and its WAL).
			const private = "victim private message: launch code 4711"
			h.Settled("victim", h.Submit("victim", private))
			h.Settled("attacker", h.Submit("attacker", "hello"))
			out := runTool(h, "attacker", `cd ~/sessions && f=$(ls *.jsonl | head -1) && id=${f#*_} && `+
				`ln -s `+token+` zzzz_$id && ln -s `+store+` zzzy_$id && ln -s `+store+`-wal zzzw_$id && mkfifo zzzx_$id && `+
				`echo "direct: $(cat `+token+` 2>&1)" && echo planted`)
			if !strings.Contains(out, "planted") || strings.Contains(out, string(secret[:20])) {
				t.Fatalf("the plant: %q", out)
			}
			restart(h, "attacker")
			for p, b := range roomFiles(t, h, "attacker") {
				if bytes.Contains(b, secret[:40]) || bytes.Contains(b, []byte("launch code 4711")) || strings.HasSuffix(p, ".torn") {
					t.Errorf("%s holds the token or the store: %.60q", p, b)
				}
			}
			if b, _ := os.ReadFile(token); !bytes.Equal(b, secret) {
				t.Fatalf("the token changed: %q", b)
			}
			if got := storeHeader(t, store); string(got) != "SQLite format 3\x00" {
				t.Fatalf("the store: %q", got)
			}
			// The links are where the agent put them: never followed,
			// never needed.
			for _, n := range []string{"zzzz_", "zzzy_", "zzzw_"} {
				m, _ := filepath.Glob(filepath.Join(h.Root, "attacker-*", "home", "sessions", n+"*"))
				if len(m) != 1 {
					t.Fatalf("%s*: %v", n, m)
				}
				if fi, err := os.Lstat(m[0]); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
					t.Fatalf("%s: %v %v", m[0], fi, err)
				}
			}
		})
	}
}

// Repro 03: links in the agent's home where the server writes its files at
// every start (omp's overlay, models.yml and config.yml, the folder of its
// mcp.json; pi's models.json and its folder) aimed at the store and at
// another room's files: each start replaces them with the server's own
// files, the targets stay byte-identical, the store stays a working store,
// and the turns settle.
func TestRealHomeLinksAreReplaced(t *testing.T) {
	for _, tc := range []struct {
		agent string
		// plants are the links of each round: home path -> "store",
		// "victim" (a file of another room) or "victimdir" (its folder).
		plants []map[string]string
		// written are the files the server writes at each start.
		written []string
	}{
		{"omp", []map[string]string{
			{"agenthost-overlay.yml": "store", ".omp/agent/models.yml": "victim", ".omp/agent/config.yml": "victim"},
			{".omp": "victimdir"},
		}, []string{"agenthost-overlay.yml", ".omp/agent/models.yml", ".omp/agent/config.yml"}},
		{"pi", []map[string]string{
			{".pi/agent/models.json": "store", "agenthost-pi": "victimdir"},
			{".pi/agent": "victimdir"},
		}, []string{".pi/agent/models.json", "agenthost-pi/room.json", "agenthost-pi/agenthost.ts"}},
	} {
		t.Run(tc.agent, func(t *testing.T) {
			dir := t.TempDir()
			store := filepath.Join(dir, "agenthost.db")
			victimDir := filepath.Join(dir, "rooms", "victim-0123456789abcdef0123", "workspace")
			victimFiles := map[string][]byte{}
			for _, n := range []string{"notes.txt", "models.yml", "config.yml", "mcp.json", "models.json", "room.json"} {
				victimFiles[filepath.Join(victimDir, n)] = []byte("precious work of the victim room: " + n + "\n")
			}
			if err := os.MkdirAll(victimDir, 0o700); err != nil {
				t.Fatal(err)
			}
			for p, b := range victimFiles {
				if err := os.WriteFile(p, b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			h := startConfined(t, dir, tc.agent)
			h.Settled("attacker", h.Submit("attacker", "hello"))
			for round, plants := range tc.plants {
				var cmd strings.Builder
				for link, what := range plants {
					target := map[string]string{"store": store, "victim": filepath.Join(victimDir, "notes.txt"), "victimdir": victimDir}[what]
					cmd.WriteString("rm -rf ~/" + link + " && mkdir -p $(dirname ~/" + link + ") && ln -s " + target + " ~/" + link + " && ")
				}
				cmd.WriteString("echo planted")
				if out := runTool(h, "attacker", cmd.String()); !strings.Contains(out, "planted") {
					t.Fatalf("round %d, the plant: %q", round, out)
				}
				restart(h, "attacker")
				for p, b := range victimFiles {
					if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, b) {
						t.Fatalf("round %d: %s: %q, %v", round, p, got, err)
					}
				}
				if ents, _ := os.ReadDir(victimDir); len(ents) != len(victimFiles) {
					t.Fatalf("round %d: the victim's folder holds %d entries", round, len(ents))
				}
				if got := storeHeader(t, store); string(got) != "SQLite format 3\x00" {
					t.Fatalf("round %d: the store: %q", round, got)
				}
				if _, err := h.M.State(t.Context(), "attacker"); err != nil {
					t.Fatalf("round %d: the store after: %v", round, err)
				}
				homes, _ := filepath.Glob(filepath.Join(h.Root, "attacker-*", "home"))
				for _, n := range tc.written {
					fi, err := os.Lstat(filepath.Join(homes[0], n))
					if err != nil || !fi.Mode().IsRegular() {
						t.Fatalf("round %d: %s is %v, %v: want the server's regular file", round, n, fi, err)
					}
				}
			}
		})
	}
}
