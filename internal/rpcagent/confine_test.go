package rpcagent

import (
	"encoding/json"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/roomtest"
	"github.com/agenthost/agenthost/room"
)

// pi's whole process tree is confined to its room: the probe's tool call
// reads and writes its own workspace and reads the system, and everything
// else (another room's file, the store, a symlink into the other room, the
// server's process, a TCP port, a listening socket) is an ordinary tool
// error while the turn settles; agent.started and the room's state say so.
// Unconfined (--confine off), the same probe reaches everything: what
// every room's agent could do before confinement. (The claims table runs
// the confined probe on every path; pi's is the quickest to start twice.)
func TestRealPiConfinement(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode confine.Mode
	}{{"landlock", confine.ModeLandlock}, {"off", confine.ModeOff}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var report room.Confinement
			h := roomtest.Start(t, dir, nil, room.Options{Config: room.Config{Agent: "pi", ApprovalMode: room.ApprovalYolo}},
				func(cust *custody.Custodian, in *agents.Install, modelURL string) (room.Transport, error) {
					// Only the model's port: the probe's connect is denied.
					cf, err := confine.New(confine.Options{Mode: tc.mode, Net: []uint16{}, Ports: []uint16{port(t, modelURL)}, Tools: in.Dir})
					if err != nil {
						return nil, err
					}
					tr, err := New(Options{Custodian: cust, Install: in, ModelURL: modelURL, Confine: cf})
					if err == nil {
						report = tr.Confinement()
					}
					return tr, err
				})
			other := filepath.Join(dir, "rooms", "another-room", "workspace")
			if err := os.MkdirAll(other, 0o700); err != nil {
				t.Fatal(err)
			}
			secret := filepath.Join(other, "secret.txt")
			if err := os.WriteFile(secret, []byte("the other room's secret"), 0o600); err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()

			first := h.Submit("a", "hello")
			_, started := h.Wait("a", first.Seq, "agent.started", nil)
			h.Settled("a", first)
			ws, _ := filepath.Glob(filepath.Join(h.Root, "a-*", "workspace"))
			if len(ws) != 1 {
				t.Fatalf("room a's workspace: %v", ws)
			}
			probe := roomtest.Probe{Other: secret, Store: filepath.Join(dir, "agenthost.db"), PID: os.Getpid(),
				Port: ln.Addr().(*net.TCPAddr).Port}
			probe.WriteProbe(t, ws[0])
			h.Settled("a", h.Submit("a", "Probe: "+roomtest.BashCall("bash "+roomtest.ProbeScript)))
			res := roomtest.ProbeResults(h.Sim)

			st, err := h.M.State(t.Context(), "a")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(started["confinement"])
			var got room.Confinement
			if err := json.Unmarshal(b, &got); err != nil || st.Confinement == nil {
				t.Fatalf("agent.started %v, state %+v: %v", started, st.Confinement, err)
			}
			if tc.mode == confine.ModeOff {
				roomtest.CheckUnconfined(t, res)
				if got.Mode != "none" || st.Confinement.Mode != "none" || report.Mode != "none" {
					t.Fatalf("off: agent.started %+v, state %+v, transport %+v", got, *st.Confinement, report)
				}
				return
			}
			roomtest.CheckConfined(t, res, true)
			want := room.Confinement{Mode: "landlock", ABI: min(confine.KernelABI(), confine.MaxABI), Signals: confine.KernelABI() >= 6,
				Net: []uint16{port(t, h.Sim.URL())}}
			for what, c := range map[string]room.Confinement{"agent.started": got, "state": *st.Confinement, "transport": report} {
				if c.Mode != want.Mode || c.ABI != want.ABI || c.Signals != want.Signals || len(c.Net) != 1 || c.Net[0] != want.Net[0] {
					t.Errorf("%s: %+v, want %+v", what, c, want)
				}
			}
		})
	}
}

// port is the TCP port of the scripted model's URL.
func port(t *testing.T, raw string) uint16 {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(u.Port(), 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	return uint16(n)
}
