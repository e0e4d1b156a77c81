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
// protocol 8 and must not drift by accident.
func TestWire_Golden(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 5, 0, 0, 0, time.UTC)
	exit := &Exit{ID: "p-1", Code: 137, Signal: "KILL", ExitedAt: at, OutputLines: 2, OutputError: "write out: no space left on device", FinalOffset: 12}
	pipe := ProcessInfo{ID: "p-1", Mode: ModePipe, Argv: []string{"sh", "-c", "echo"}, Cwd: "/w", PID: 42, StartedAt: at, ExitedAt: &at, Exit: exit,
		Metadata: json.RawMessage(`{"room":"r"}`), Watchers: 1,
		Pipe: &PipeInfo{OutputPath: "/w/out", StderrPath: "/w/err", OutputBytes: 12, OutputLines: 2, OutputError: exit.OutputError}}
	pty := ProcessInfo{ID: "t-1", Mode: ModePTY, Argv: []string{"sh"}, Cwd: "/", PID: 43, Running: true, StartedAt: at,
		PTY: &PTYInfo{Cols: 80, Rows: 24, Offset: 5, Controller: true}}
	rec := custody.Receipt{Scope: "s1", Containment: custody.ContainPortable, Duration: time.Second,
		Processes: []custody.Entry{{PID: 42, Cmdline: "sh", Found: custody.FoundLeader, Ended: custody.EndedKill, At: at, Reaped: true}}}
	replies := []Reply{
		{Type: TypePong, Protocol: Protocol, InstanceID: "i1"},
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
