package procio

import (
	"io"
	"os/exec"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStart_RoundTrip(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "cat; echo err >&2")
	p, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := io.WriteString(p.Stdin, "hello\n"); err != nil {
		t.Fatal(err)
	}
	p.Stdin.Close()
	out, _ := io.ReadAll(p.Stdout)
	errOut, _ := io.ReadAll(p.Stderr)
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if string(out) != "hello\n" || strings.TrimSpace(string(errOut)) != "err" {
		t.Fatalf("out %q err %q", out, errOut)
	}
}

func TestStart_Errors(t *testing.T) {
	if _, err := Start(exec.Command("/nonexistent/binary")); err == nil {
		t.Fatal("started a missing binary")
	}
	cmd := exec.Command("/bin/true")
	cmd.Stdout = io.Discard
	if _, err := Start(cmd); err == nil {
		t.Fatal("accepted a command with its stdout set")
	}
}
