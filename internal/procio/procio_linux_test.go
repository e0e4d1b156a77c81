//go:build linux

package procio

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func init() {
	// turn tries to use each of its stdio descriptors the other way (write
	// stdin, read stdout and stderr) and reports what happened on stdout,
	// then waits for stdin's EOF.
	helpers["turn"] = func() {
		_, werr := syscall.Write(0, []byte(`{"type":"prompt"}`+"\n"))
		buf := make([]byte, 64)
		n1, rerr1 := syscall.Read(1, buf)
		n2, rerr2 := syscall.Read(2, buf)
		fmt.Printf("write 0: %v; read 1: %d %v; read 2: %d %v\n", werr, n1, rerr1, n2, rerr2)
		_, _ = io.Copy(io.Discard, os.Stdin)
	}
}

// TestStart_NotReopenableThroughProc: the command's stdin, stdout and
// stderr cannot be opened through /proc/PID/fd, for reading or writing,
// even by root: a process of the same user cannot write frames into the
// command's stdin or read its stdout before the host does. A pipe can (the
// control, so the test fails if the channels go back to pipes).
func TestStart_NotReopenableThroughProc(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	reopened, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", r.Fd()), os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("control: a pipe's read end not reopened for writing: %v", err)
	}
	reopened.Close()
	r.Close()
	w.Close()

	cmd := helper("echo")
	p, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for fd := range 3 {
		path := fmt.Sprintf("/proc/%d/fd/%d", cmd.Process.Pid, fd)
		if l, err := os.Readlink(path); err != nil || !strings.HasPrefix(l, "socket:") {
			t.Errorf("%s is %q (%v), want a socket", path, l, err)
		}
		for _, flag := range []int{os.O_RDONLY, os.O_WRONLY, os.O_RDWR} {
			f, err := os.OpenFile(path, flag, 0)
			if err == nil {
				f.Close()
				t.Errorf("%s opened with flags %#x", path, flag)
			} else if !errors.Is(err, syscall.ENXIO) {
				t.Errorf("%s with flags %#x: %v, want ENXIO", path, flag, err)
			}
		}
	}
	p.Stdin.Close()
	_, _ = io.Copy(io.Discard, p.Stdout)
	_, _ = io.Copy(io.Discard, p.Stderr)
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
}

// TestStart_UnusedDirectionsShut: the command cannot write into its stdin
// or read from its stdout and stderr (so nothing that inherits them can
// turn them around), and the host cannot read its stdin end or write its
// output ends.
func TestStart_UnusedDirectionsShut(t *testing.T) {
	cmd := helper("turn")
	p, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	line, err := bufio.NewReader(p.Stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if want := "write 0: broken pipe; read 1: 0 <nil>; read 2: 0 <nil>\n"; line != want {
		t.Errorf("the command's stdio the wrong way: %q, want %q", line, want)
	}
	if n, err := p.Stdin.Read(make([]byte, 64)); n != 0 || err != io.EOF {
		t.Errorf("host read of stdin: %d, %v; want EOF", n, err)
	}
	for _, f := range []*os.File{p.Stdout, p.Stderr} {
		if _, err := f.Write([]byte("x\n")); !errors.Is(err, syscall.EPIPE) {
			t.Errorf("host write into %s: %v, want EPIPE", f.Name(), err)
		}
	}
	p.Stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
}

// TestStart_DescendantHoldingTheEnds: Wait returns when the command exits
// although a descendant still holds its stdin and stdout; closing the
// host's stdin end is that descendant's EOF too, and the host reads what it
// writes until it exits.
func TestStart_DescendantHoldingTheEnds(t *testing.T) {
	// fd 3: an asynchronous list's stdin is /dev/null in a shell without
	// job control.
	cmd := exec.Command("/bin/sh", "-c", "exec 3<&0; (cat <&3 >/dev/null; echo descendant saw EOF) & echo started")
	p, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	out := bufio.NewReader(p.Stdout)
	if line, err := out.ReadString('\n'); err != nil || line != "started\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		p.Stdin.Close() // releases the descendant, and then Wait
		<-waited
		t.Fatal("Wait waited for the descendant holding the command's stdio")
	}
	p.Stdin.Close()
	rest, err := io.ReadAll(out)
	if err != nil || string(rest) != "descendant saw EOF\n" {
		t.Fatalf("after stdin closed: %q, %v", rest, err)
	}
}

// TestStart_CloseAndDeadlines: the host's ends are served by Go's poller
// like a pipe's: a write deadline ends a write the command does not read,
// and Close ends a blocked read.
func TestStart_CloseAndDeadlines(t *testing.T) {
	cmd := exec.Command("sleep", "600")
	p, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		p.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	if err := p.Stdin.SetWriteDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Stdin.Write(make([]byte, 16<<20)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a write nobody reads: %v, want the deadline", err)
	}
	read := make(chan error, 1)
	go func() {
		_, err := p.Stdout.Read(make([]byte, 64))
		read <- err
	}()
	p.Stdout.Close()
	if err := <-read; !errors.Is(err, os.ErrClosed) {
		t.Fatalf("a read when its end closed: %v, want ErrClosed", err)
	}
}
