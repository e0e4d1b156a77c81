//go:build unix

package agents

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/agenthost/agenthost/internal/agentfs"
)

// What the server writes into an agent's home at every start (omp's
// models.yml, config.yml and overlay, pi's models.json, the ACP peers'
// settings) replaces a link the agent planted there, at the file or at a
// folder on the way, instead of writing through it: the link's target (a
// file of another room, the store) stays as it was. With an owner, what
// is written is the owner's.
func TestHomeReplacesPlantedLinks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		links map[string]bool // home path -> the link aims at the victim's folder (else its file)
		write func(home string, owner *agentfs.Owner) error
		files []string
	}{
		{"omp", map[string]bool{".omp/agent/models.yml": false, ".omp/agent/config.yml": false, OMPOverlayName: false},
			func(home string, owner *agentfs.Owner) error {
				if _, err := HomeWith(home, OMP, "http://127.0.0.1:1/v1", HomeOptions{Owner: owner}); err != nil {
					return err
				}
				_, err := WriteOMPOverlayAs(home, OMPOverlay{}, owner)
				return err
			}, []string{".omp/agent/models.yml", ".omp/agent/config.yml", OMPOverlayName}},
		{"omp, a linked folder", map[string]bool{".omp": true},
			func(home string, owner *agentfs.Owner) error {
				_, err := HomeWith(home, OMP, "http://127.0.0.1:1/v1", HomeOptions{Owner: owner})
				return err
			}, []string{".omp/agent/models.yml", ".omp/agent/config.yml"}},
		{"pi", map[string]bool{".pi/agent/models.json": false},
			func(home string, owner *agentfs.Owner) error {
				_, err := HomeWith(home, Pi, "http://127.0.0.1:1/v1", HomeOptions{Owner: owner})
				return err
			}, []string{".pi/agent/models.json"}},
		{"pi, a linked folder", map[string]bool{".pi/agent": true},
			func(home string, owner *agentfs.Owner) error {
				_, err := HomeWith(home, Pi, "http://127.0.0.1:1/v1", HomeOptions{Owner: owner})
				return err
			}, []string{".pi/agent/models.json"}},
		{"claude and codex", map[string]bool{".claude/settings.json": false, ".codex": true},
			func(home string, owner *agentfs.Owner) error {
				if err := writeJSON(home, owner, filepath.Join(".claude", "settings.json"), map[string]any{}); err != nil {
					return err
				}
				return writeFile(home, owner, filepath.Join(".codex", "config.toml"), []byte("x"))
			}, []string{".claude/settings.json", ".codex/config.toml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			victim := filepath.Join(base, "victim")
			if err := os.MkdirAll(victim, 0o700); err != nil {
				t.Fatal(err)
			}
			precious := map[string]string{}
			for _, n := range []string{"notes.txt", "models.yml", "config.yml", "models.json", "config.toml"} {
				precious[filepath.Join(victim, n)] = "the victim's " + n
				if err := os.WriteFile(filepath.Join(victim, n), []byte("the victim's "+n), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			home := filepath.Join(base, "home")
			for link, dir := range tc.links {
				p := filepath.Join(home, link)
				if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
					t.Fatal(err)
				}
				target := filepath.Join(victim, "notes.txt")
				if dir {
					target = victim
				}
				if err := os.Symlink(target, p); err != nil {
					t.Fatal(err)
				}
			}
			var owner *agentfs.Owner
			if os.Geteuid() == 0 {
				owner = &agentfs.Owner{UID: 4711, GID: 4712}
			}
			if err := tc.write(home, owner); err != nil {
				t.Fatal(err)
			}
			for p, want := range precious {
				if b, err := os.ReadFile(p); err != nil || string(b) != want {
					t.Errorf("%s: %q, %v", p, b, err)
				}
			}
			if ents, _ := os.ReadDir(victim); len(ents) != len(precious) {
				t.Errorf("the victim's folder holds %d entries", len(ents))
			}
			for _, n := range tc.files {
				fi, err := os.Lstat(filepath.Join(home, n))
				if err != nil || !fi.Mode().IsRegular() {
					t.Fatalf("%s: %v, %v", n, fi, err)
				}
				if st := fi.Sys().(*syscall.Stat_t); owner != nil && (int(st.Uid) != owner.UID || int(st.Gid) != owner.GID) {
					t.Errorf("%s: owned by %d:%d", n, st.Uid, st.Gid)
				}
			}
		})
	}
}
