package procio

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// helperEnv makes the test binary a helper command (see helpers) instead
// of running the tests.
const helperEnv = "PROCIO_TEST_HELPER"

func TestMain(m *testing.M) {
	if name := os.Getenv(helperEnv); name != "" {
		h, ok := helpers[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "no helper %q\n", name)
			os.Exit(2)
		}
		h()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// helpers are the commands the test binary plays; more are added on Linux.
var helpers = map[string]func(){
	// echo copies stdin to stdout until EOF, then says so on stderr.
	"echo": func() {
		_, _ = io.Copy(os.Stdout, os.Stdin)
		fmt.Fprintln(os.Stderr, "stdin EOF")
	},
}

// helper is the test binary as the helper command name.
func helper(name string) *exec.Cmd {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+name)
	return cmd
}

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

// TestStart_EOFBothWays: closing the host's stdin end is the command's EOF
// (it reads to the end and exits by itself), and its exit is EOF on the
// host's stdout and stderr ends, with everything it wrote before.
func TestStart_EOFBothWays(t *testing.T) {
	cmd := helper("echo")
	p, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	want := strings.Repeat("a frame of the protocol\n", 1000)
	wrote := make(chan error, 1)
	go func() {
		_, err := io.WriteString(p.Stdin, want)
		if cerr := p.Stdin.Close(); err == nil {
			err = cerr
		}
		wrote <- err
	}()
	errOut := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(p.Stderr); errOut <- b }()
	out, err := io.ReadAll(p.Stdout)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if string(out) != want {
		t.Fatalf("read back %d bytes, want %d", len(out), len(want))
	}
	if got := strings.TrimSpace(string(<-errOut)); got != "stdin EOF" {
		t.Fatalf("stderr %q", got)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
}

// TestStartCombined: stderr comes on the stdout channel, in order.
func TestStartCombined(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "echo one; echo two >&2; echo three")
	p, err := StartCombined(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Stderr != nil {
		t.Fatal("a stderr channel of its own")
	}
	p.Stdin.Close()
	out, _ := io.ReadAll(p.Stdout)
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if string(out) != "one\ntwo\nthree\n" {
		t.Fatalf("out %q", out)
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
