//go:build linux

package procd

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agenthost/agenthost/custody"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestWire_Golden pins the JSON of every reply and event type: the wire is
// protocol 8 with protocol 9's negotiation and protocol 10's limits and
// usage added, and must not drift by
// accident. Lines are only ever added: a frame of an older protocol stays
// what clients and daemons of older builds send.
func TestWire_Golden(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 5, 0, 0, 0, time.UTC)
	exit := &Exit{ID: "p-1", Code: 137, Signal: "KILL", ExitedAt: at, OutputLines: 2, OutputError: "write out: no space left on device", FinalOffset: 12}
	pipe := ProcessInfo{ID: "p-1", Mode: ModePipe, Argv: []string{"sh", "-c", "echo"}, Cwd: "/w", PID: 42, StartedAt: at, ExitedAt: &at, Exit: exit,
		Metadata: json.RawMessage(`{"room":"r"}`), Watchers: 1,
		Pipe: &PipeInfo{OutputPath: "/w/out", StderrPath: "/w/err", OutputBytes: 12, OutputLines: 2, OutputError: exit.OutputError}}
	pty := ProcessInfo{ID: "t-1", Mode: ModePTY, Argv: []string{"sh"}, Cwd: "/", PID: 43, Running: true, StartedAt: at,
		PTY: &PTYInfo{Cols: 80, Rows: 24, Offset: 5, Controller: true}}
	limited := pipe
	limited.Limits = &custody.Limits{Memory: 4 << 30, Pids: 4096, CPU: 1.5}
	rec := custody.Receipt{Scope: "s1", Containment: custody.ContainPortable, Duration: time.Second,
		Processes: []custody.Entry{{PID: 42, Cmdline: "sh", Found: custody.FoundLeader, Ended: custody.EndedKill, At: at, Reaped: true}}}
	replies := []Reply{
		{Type: TypePong, Protocol: 8, InstanceID: "i1"}, // a protocol 8 daemon's
		{Type: TypeError, Code: codeUnsupported, Message: "unsupported request: x"},
		{Type: TypeOK},
		{Type: TypeProcess, Process: &pipe},
		{Type: TypeProcesses, Processes: []ProcessInfo{pty}},
		{Type: TypeProcesses, Processes: []ProcessInfo{pty}, Next: "7"},
		{Type: TypeExited, Exit: exit},
		{Type: TypeTerminated, Receipt: &rec},
		{Type: TypeShutdown, Receipts: []custody.Receipt{rec}},
		{Type: TypeOwned, InstanceID: "i1"},
		{Type: TypeHandoff, Ticket: &Ticket{InstanceID: "i1", Ticket: "t", ExpiresAt: at}},
		{Type: TypeAttached, Offset: 0, Data: []byte("$ "), Truncated: true, Cols: 80, Rows: 24, Controller: true},
		{Type: TypeOutput, Offset: 2, Data: []byte("hi\r\n")},
		{Type: TypeResized, Cols: 100, Rows: 30},
		{Type: TypeControllerChanged},
		{Type: TypeDropped, Message: "subscriber too slow"},
		// Protocol 9: ping's range, and a request in a version the daemon
		// does not speak.
		{Type: TypePong, Protocol: 8, Protocols: &Range{8, 9}, InstanceID: "i1"},
		{Type: TypeError, Code: codeProtocol, Message: "unsupported protocol 7: this daemon speaks protocol 8-9"},
		// Protocol 10: a process's limits, and what its scope used.
		{Type: TypeProcess, Process: &limited},
		{Type: TypeUsage, Usage: &custody.Usage{CPU: 1500 * time.Millisecond, PeakMemory: 300 << 20, Processes: 7, OOMKills: 1, ForksRefused: 2, Metered: true}},
	}
	var got bytes.Buffer
	for _, r := range replies {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		got.Write(b)
		got.WriteByte('\n')
		var back Reply
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("%s does not round-trip: %v", b, err)
		}
	}
	path := filepath.Join("testdata", "replies.golden.jsonl")
	if *update {
		if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("the wire changed (go test -run TestWire_Golden -update ./procd to accept):\n got %s\nwant %s", got.Bytes(), want)
	}
}

// TestWire_GoldenPongVersions: the pongs frozen in the golden file say
// which versions their daemon speaks: protocol 8 alone for a daemon
// before negotiation, its range for one after.
func TestWire_GoldenPongVersions(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("testdata", "replies.golden.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var got []Range
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var r Reply
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if r.Type == TypePong {
			got = append(got, versions(r.Protocol, r.Protocols))
		}
	}
	if len(got) != 2 || got[0] != (Range{8, 8}) || got[1] != (Range{8, 9}) {
		t.Fatalf("pong versions %v, want [8-8 8-9]", got)
	}
}
