package acpagent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/roomtest"
	"github.com/agenthost/agenthost/room"
)

// A server run as root with agent uids: omp acp's room gets a uid of its
// own (recorded in its folder), which owns its workspace, its home and
// what the recipe wrote there (the overlay, models.yml), and the turn
// settles; a second room gets another uid.
func TestRealACPRoomUser(t *testing.T) {
	rng := confine.UIDRange{First: 3100000, Last: 3100009}
	if cf, err := confine.New(confine.Options{Mode: confine.ModeLandlock, AgentUIDs: rng}); err != nil || cf.AgentUsers().Empty() {
		t.Skipf("rooms get no uid of their own here (a server not run as root, or a launcher that does not switch users): %v", err)
	}
	t.Parallel()
	h := roomtest.Start(t, "", nil, room.Options{}, func(cust *custody.Custodian, in *agents.Install, url string) (room.Transport, error) {
		cf, err := confine.New(confine.Options{Mode: confine.ModeLandlock, Tools: in.Dir, AgentUIDs: rng})
		if err != nil {
			return nil, err
		}
		return New(Options{Custodian: cust, Install: in, ModelURL: url, Confine: cf})
	})
	uids := map[int]bool{}
	for _, r := range []string{"a", "b"} {
		if got := h.Settled(r, h.Submit(r, "hello")); got != "ok: hello" {
			t.Fatalf("room %s: %q", r, got)
		}
		dirs, _ := filepath.Glob(filepath.Join(h.Root, r+"-*"))
		if len(dirs) != 1 {
			t.Fatalf("room %s: %v", r, dirs)
		}
		b, err := os.ReadFile(filepath.Join(dirs[0], "agent-uid"))
		var rec struct{ UID int }
		if err != nil || json.Unmarshal(b, &rec) != nil || rec.UID < 3100000 || rec.UID > 3100009 || uids[rec.UID] {
			t.Fatalf("room %s's agent-uid: %s, %v (taken: %v)", r, b, err, uids)
		}
		uids[rec.UID] = true
		home := filepath.Join(dirs[0], "home")
		for _, p := range []string{home, filepath.Join(dirs[0], "workspace"), filepath.Join(home, agents.OMPOverlayName),
			filepath.Join(home, ".omp", "agent", "models.yml")} {
			fi, err := os.Lstat(p)
			if err != nil {
				t.Fatal(err)
			}
			if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != rec.UID || int(st.Gid) != rec.UID {
				t.Errorf("room %s: %s owned by %d:%d, want %d", r, p, st.Uid, st.Gid, rec.UID)
			}
		}
	}
}
