//go:build linux

package procd

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPipe_RoundTrip(t *testing.T) {
	t.Parallel()
	_, c := startDaemon(t)
	ctx := testCtx(t)
	spec := pipeSpec(t, `while read l; do echo "got $l"; done; echo bye >&2; exit 3`)
	spec.Metadata = json.RawMessage(`{"room":"r1"}`)
	info, err := c.CreatePipe(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode != ModePipe || !info.Running || info.PID <= 0 || info.Pipe == nil || info.StartedAt.IsZero() {
		t.Fatalf("created: %+v", info)
	}
	if err := c.Write(ctx, info.ID, []byte("a\nb\n")); err != nil {
		t.Fatal(err)
	}
	// Over one request's cap: several requests, in order.
	long := strings.Repeat("x", maxWrite+10)
	if err := c.Write(ctx, info.ID, []byte(long+"\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseStdin(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	exit, err := c.Wait(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := "got a\ngot b\ngot " + long + "\nbye\n"
	if exit.Code != 3 || exit.OutputLines != 4 || exit.OutputError != "" || exit.FinalOffset != int64(len(want)) {
		t.Fatalf("exit: %+v", exit)
	}
	b, _ := os.ReadFile(spec.OutputPath)
	if string(b) != want {
		t.Fatalf("output file: %d bytes, want %d", len(b), len(want))
	}
	got, err := c.Get(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Running || got.ExitedAt == nil || got.Exit == nil || got.Exit.Code != 3 || got.Pipe.OutputLines != 4 || string(got.Metadata) != `{"room":"r1"}` {
		t.Fatalf("get: %+v", got)
	}
	// Waiting again on an exited process answers at once.
	if again, err := c.Wait(ctx, info.ID); err != nil || again.Code != 3 {
		t.Fatalf("second wait: %+v %v", again, err)
	}
	pipes, err := c.List(ctx, ModePipe)
	if err != nil || len(pipes) != 1 || pipes[0].ID != info.ID {
		t.Fatalf("list pipe: %+v %v", pipes, err)
	}
	ptys, err := c.List(ctx, ModePTY)
	if err != nil || len(ptys) != 0 {
		t.Fatalf("list pty: %+v %v", ptys, err)
	}
	// The exact environment: nothing of the daemon's but custody's marker.
	env := pipeSpec(t, `env | sort`)
	env.Env = []string{"ONLY=1"}
	ei, err := c.CreatePipe(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, ei.ID); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(env.OutputPath)
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l != "ONLY=1" && !strings.HasPrefix(l, "AGENTHOST_SCOPE=") && !strings.HasPrefix(l, "PWD=") {
			t.Errorf("unexpected variable in the child's environment: %q", l)
		}
	}
}

func TestPipe_SeparateStderr(t *testing.T) {
	t.Parallel()
	_, c := startDaemon(t)
	ctx := testCtx(t)
	spec := pipeSpec(t, `echo out; echo err >&2`)
	spec.StderrPath = filepath.Join(filepath.Dir(spec.OutputPath), "err")
	// An older file there, left readable: the process's output is its
	// owner's alone all the same.
	if err := os.WriteFile(spec.StderrPath, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	info, err := c.CreatePipe(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	exit, err := c.Wait(ctx, info.ID)
	if err != nil || exit.OutputLines != 1 {
		t.Fatalf("exit %+v %v", exit, err)
	}
	o, _ := os.ReadFile(spec.OutputPath)
	e, _ := os.ReadFile(spec.StderrPath)
	if string(o) != "out\n" || string(e) != "err\n" {
		t.Fatalf("out %q err %q", o, e)
	}
	for _, p := range []string{spec.OutputPath, spec.StderrPath} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", p, fi.Mode(), err)
		}
	}
}

func TestCreatePipe_Invalid(t *testing.T) {
	t.Parallel()
	dir, c := startDaemon(t)
	ctx := testCtx(t)
	base := pipeSpec(t, "true")
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	big := `"` + strings.Repeat("a", MaxMetadata-2) + `"` // exactly MaxMetadata
	cases := []struct {
		name string
		mod  func(*PipeSpec)
		want string
	}{
		{"no argv", func(s *PipeSpec) { s.Argv = nil }, "argv is required"},
		{"relative cwd", func(s *PipeSpec) { s.Cwd = "tmp" }, "cwd must be an absolute path"},
		{"missing cwd", func(s *PipeSpec) { s.Cwd = "/nonexistent/dir" }, "cwd is not a directory"},
		{"no output", func(s *PipeSpec) { s.OutputPath = "" }, "output_path is required"},
		{"relative output", func(s *PipeSpec) { s.OutputPath = "out" }, "output_path must be an absolute path"},
		{"symlinked output", func(s *PipeSpec) { s.OutputPath = link }, "output_path is a symlink"},
		{"output is a dir", func(s *PipeSpec) { s.OutputPath = t.TempDir() }, "output_path is not a regular file"},
		{"bad env", func(s *PipeSpec) { s.Env = []string{"NOEQUALS"} }, "env entries must be KEY=VALUE"},
		{"metadata 1 MiB + 1", func(s *PipeSpec) { s.Metadata = json.RawMessage(big[:1] + "a" + big[1:]) }, "metadata is 1048577 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := base
			tc.mod(&s)
			_, err := c.CreatePipe(ctx, s)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "invalid create_pipe request: "+tc.want) {
				t.Fatalf("err = %v, want ErrInvalid with %q", err, tc.want)
			}
		})
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Fatalf("the symlink's target was touched: %q", b)
	}
	// Exactly MaxMetadata is accepted.
	s := base
	s.Metadata = json.RawMessage(big)
	info, err := c.CreatePipe(ctx, s)
	if err != nil {
		t.Fatalf("metadata of exactly %d bytes: %v", MaxMetadata, err)
	}
	if _, err := c.Wait(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	// A command that cannot start.
	s = base
	s.Argv = []string{"/nonexistent/binary"}
	if _, err := c.CreatePipe(ctx, s); !errors.Is(err, ErrFailed) {
		t.Fatalf("unstartable command: %v", err)
	}
	svc, _ := readService(dir)
	// Unknown fields and unknown ops are answered, not dropped.
	r := rawRequest(t, dir, svc.Token, `{"op":"create_pipe","argv":["true"],"bogus":1}`)
	if r.Type != TypeError || !strings.HasPrefix(r.Message, "invalid create_pipe request: ") {
		t.Fatalf("unknown field: %+v", r)
	}
	r = rawRequest(t, dir, svc.Token, `{"op":"frobnicate"}`)
	if r.Type != TypeError || r.Message != "unsupported request: frobnicate" || r.Code != codeUnsupported {
		t.Fatalf("unknown op: %+v", r)
	}
	r = rawRequest(t, dir, svc.Token, `{"op":"list"}`)
	if r.Type != TypeError || !strings.HasPrefix(r.Message, "invalid list request: mode") {
		t.Fatalf("list without mode: %+v", r)
	}
	r = rawRequest(t, dir, svc.Token, `{"op":"ping"}`)
	if r.Type != TypePong || r.Protocol != MinProtocol || r.Protocols == nil || *r.Protocols != Versions() {
		t.Fatalf("ping: %+v", r)
	}
}

func TestRequests_UnknownID(t *testing.T) {
	t.Parallel()
	_, c := startDaemon(t)
	ctx := testCtx(t)
	checks := map[string]error{}
	_, checks["get"] = c.Get(ctx, "p-nope")
	_, checks["wait"] = c.Wait(ctx, "p-nope")
	checks["write"] = c.Write(ctx, "p-nope", []byte("x"))
	checks["signal"] = c.Signal(ctx, "p-nope", SigTerm)
	checks["set_metadata"] = c.SetMetadata(ctx, "p-nope", json.RawMessage(`1`))
	_, checks["terminate"] = c.Terminate(ctx, "p-nope")
	checks["resize"] = c.Resize(ctx, "p-nope", 10, 10)
	for op, err := range checks {
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("%s: %v, want ErrNotFound", op, err)
		}
	}
	if _, err := c.Get(ctx, ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("get without id: %v", err)
	}
}

// TestPipe_OutputWriteError: a write to the output file that fails (here
// a file size limit, as a full disk would) sets output_error; the process
// still runs to its exit, which is published.
func TestPipe_OutputWriteError(t *testing.T) {
	t.Parallel()
	_, c := startDaemon(t, "--fsize", "4096")
	ctx := testCtx(t)
	info, err := c.CreatePipe(ctx, pipeSpec(t, `i=0; while [ $i -lt 200 ]; do echo "line $i of some length to pass the limit"; i=$((i+1)); done; exit 0`))
	if err != nil {
		t.Fatal(err)
	}
	exit, err := c.Wait(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if exit.Code != 0 || exit.OutputError == "" || exit.FinalOffset > 4096 || exit.OutputLines == 0 {
		t.Fatalf("exit: %+v", exit)
	}
	got, err := c.Get(ctx, info.ID)
	if err != nil || got.Pipe.OutputError == "" {
		t.Fatalf("get: %+v %v", got.Pipe, err)
	}
}

// TestPipe_BackgroundChildHoldsStdout: a background child that inherited
// stdout cannot hold the exit back past ExitDrain.
func TestPipe_BackgroundChildHoldsStdout(t *testing.T) {
	t.Parallel()
	_, c := startDaemon(t)
	ctx := testCtx(t)
	info, err := c.CreatePipe(ctx, pipeSpec(t, `sleep 300 & echo started`))
	if err != nil {
		t.Fatal(err)
	}
	exit, err := c.Wait(ctx, info.ID)
	if err != nil || exit.Code != 0 || exit.OutputLines != 1 {
		t.Fatalf("exit: %+v %v", exit, err)
	}
	rec, err := c.Terminate(ctx, info.ID)
	if err != nil || len(rec.Processes) < 2 {
		t.Fatalf("terminate: %v %v", rec, err)
	}
}
