package room

import (
	"context"
	"strings"
	"testing"
)

// TestManager_DropEndsTheRoomAtOnce: a host that lost a room's lease
// drops it: the running turn ends (failed, the lease reason), the agent is
// released, the queued message is left for the next holder (not run here),
// and a later Adopt recovers it.
func TestManager_DropEndsTheRoomAtOnce(t *testing.T) {
	h := newHarness(t, Options{})
	hang := h.submit("r", "hang")
	h.waitEvent("r", hang.Seq, "turn.started", nil)
	queued := h.submit("r", "after")
	h.m.Drop("r", "lease lost: test")
	d := h.turnEnded("r", hang)
	if d["outcome"] != OutcomeFailed || !strings.Contains(d["reason"].(string), "room lease lost") {
		t.Fatalf("the cut turn ended %v", d)
	}
	if n := h.f.resident(); n != 0 {
		t.Fatalf("%d agents still resident after Drop", n)
	}
	msgs, err := h.m.Messages(t.Context(), "r", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if msgs[1].ID != queued.ID || msgs[1].Status != "queued" {
		t.Fatalf("the queued message after Drop: %+v", msgs[1])
	}
	// The next holder (here the same host) adopts the room: the queue
	// runs on.
	if err := h.m.Adopt(t.Context(), "r", "worker lost"); err != nil {
		t.Fatal(err)
	}
	if d := h.turnEnded("r", queued); d["outcome"] != OutcomeSettled {
		t.Fatalf("the queued message after Adopt: %v", d)
	}
}

// forgettingSnapshots records the rooms whose snapshots were let go.
type forgettingSnapshots struct {
	*fakeSnapshots
	forgot chan string
}

func (f *forgettingSnapshots) Forget(ctx context.Context, p SnapshotPlace) error {
	f.forgot <- p.Room
	return nil
}

// TestManager_DropLetsGoOfTheRoomsSnapshots: a dropped room's shadow
// repository is let go, so the next holder (another node on the shared
// data dir) can open it while this host runs on.
func TestManager_DropLetsGoOfTheRoomsSnapshots(t *testing.T) {
	snaps := &forgettingSnapshots{fakeSnapshots: newFakeSnapshots(), forgot: make(chan string, 4)}
	h := newHarness(t, Options{Snapshots: snaps})
	h.turnEnded("r", h.submit("r", "write"))
	h.m.Drop("r", "lease lost: test")
	select {
	case got := <-snaps.forgot:
		if got != "r" {
			t.Fatalf("forgot %q", got)
		}
	default:
		t.Fatal("Drop returned holding the room's snapshots")
	}
}
