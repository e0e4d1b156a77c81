// Package pooltest holds what the warm pools' tests (internal/rpcagent's
// and internal/acpagent's) set up and read alike: a room's workspace, the
// confinement probe's setup, and as root the agent-uid records and the
// owners of files. Each test keeps its own assertions. Tests only.
package pooltest

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/agenthost/agenthost/internal/roomtest"
)

// RoomWorkspace is the workspace of roomID under root (the rooms'
// folder).
func RoomWorkspace(t testing.TB, root, roomID string) string {
	t.Helper()
	ws, _ := filepath.Glob(filepath.Join(root, roomID+"-*", "workspace"))
	if len(ws) != 1 {
		t.Fatalf("room %s's workspace: %v", roomID, ws)
	}
	return ws[0]
}

// WriteProbe writes roomtest's confinement probe into ws: what it must
// not reach is another room's file under root, the store beside root,
// this process and a port something listens on (until the test's end).
func WriteProbe(t testing.TB, root, ws string) {
	t.Helper()
	other := filepath.Join(root, "another-room", "workspace")
	if err := os.MkdirAll(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "secret.txt"), []byte("the other room's secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	probe := roomtest.Probe{Other: filepath.Join(other, "secret.txt"), Store: Store(root), PID: os.Getpid(), Port: ln.Addr().(*net.TCPAddr).Port}
	probe.WriteProbe(t, ws)
}

// Store is the server's store of a host whose rooms' folder is root.
func Store(root string) string { return filepath.Join(filepath.Dir(root), "agenthost.db") }
