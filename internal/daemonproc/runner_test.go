package daemonproc

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// inotifyInstances counts this process's inotify instances.
func inotifyInstances(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// Every process a host runs in the daemon shares the Runner's one inotify
// instance (each took two of the user's 128, so about 60 agents were the
// most a host could start).
func TestRunner_OneInotifyInstance(t *testing.T) {
	c, dir := daemon(t)
	before := inotifyInstances(t)
	r := runner(t, c)
	var ps []*Process
	for range 8 {
		ps = append(ps, echo(t, r, dir))
	}
	if got := inotifyInstances(t) - before; got != 1 {
		t.Fatalf("%d inotify instances for %d processes, want 1", got, len(ps))
	}
	for i, p := range ps {
		if _, err := fmt.Fprintf(p.Stdin(), "n%d\n", i); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range ps {
		if got := readLine(t, bufio.NewReader(p.Stdout())); got != fmt.Sprintf("got:n%d\n", i) {
			t.Fatalf("process %d: %q", i, got)
		}
		if err := p.Stop(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// The launch fingerprint covers the whole request (argv, working dir, the
// environment the host set, the settings), and leaves out the arguments
// that only choose the session, what the host inherited unchanged, and
// where the output goes. Start records it in the handle.
func TestStarter_Fingerprint(t *testing.T) {
	c, dir := daemon(t)
	r := runner(t, c)
	host := os.Environ()
	cmd := func(args []string, env ...string) *exec.Cmd {
		x := exec.Command("/bin/sh", append([]string{"-c", `while read l; do echo "got:$l"; done`, "sh"}, args...)...)
		x.Dir, x.Env = dir, append(append([]string(nil), host...), env...)
		return x
	}
	st := func(settings any, resume ...string) *Starter {
		return &Starter{Runner: r, Dir: filepath.Join(dir, "out"), Settings: settings, Resume: resume}
	}
	fp := func(s *Starter, x *exec.Cmd) string {
		f, err := s.Fingerprint(x)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	base := fp(st("m"), cmd([]string{"--approval-mode", "always-ask"}, "HOME=/h"))
	same := map[string]string{
		"the same launch":   fp(st("m"), cmd([]string{"--approval-mode", "always-ask"}, "HOME=/h")),
		"a resumed session": fp(st("m", "--resume", "/s/1.jsonl"), cmd([]string{"--approval-mode", "always-ask", "--resume", "/s/1.jsonl"}, "HOME=/h")),
		"the env in another order": fp(st("m"), func() *exec.Cmd {
			x := cmd([]string{"--approval-mode", "always-ask"})
			x.Env = append([]string{"HOME=/h"}, x.Env...)
			return x
		}()),
	}
	for what, f := range same {
		if f != base {
			t.Errorf("%s: fingerprint differs", what)
		}
	}
	other := map[string]string{
		"another approval mode": fp(st("m"), cmd([]string{"--approval-mode", "yolo"}, "HOME=/h")),
		"another variable set":  fp(st("m"), cmd([]string{"--approval-mode", "always-ask"}, "HOME=/h", "PROVIDER_KEY=x")),
		"another home":          fp(st("m"), cmd([]string{"--approval-mode", "always-ask"}, "HOME=/other")),
		"other settings":        fp(st("n"), cmd([]string{"--approval-mode", "always-ask"}, "HOME=/h")),
		"another working dir": fp(st("m"), func() *exec.Cmd {
			x := cmd([]string{"--approval-mode", "always-ask"}, "HOME=/h")
			x.Dir = t.TempDir()
			return x
		}()),
	}
	for what, f := range other {
		if f == base {
			t.Errorf("%s: same fingerprint", what)
		}
	}
	x := cmd([]string{"--approval-mode", "always-ask"}, "HOME=/h")
	rp, err := st("m").Start(ctxT(t), x)
	if err != nil {
		t.Fatal(err)
	}
	p := rp.(*Process)
	defer p.Stop(ctxT(t))
	if p.Handle().Launch != base {
		t.Fatalf("the handle records %q, want %q", p.Handle().Launch, base)
	}
}

// Discard ends a recorded process and removes its files; for a handle of
// another daemon instance it only removes the files.
func TestRunner_Discard(t *testing.T) {
	c, dir := daemon(t)
	r := runner(t, c)
	p := echo(t, r, dir)
	h := p.Handle()
	p.Detach()
	r.Discard(h)
	if _, err := c.Get(ctxT(t), h.ID); err == nil {
		t.Fatal("the discarded process is still there")
	}
	for _, f := range []string{h.Output, h.Stderr} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Fatalf("%s is left (%v)", f, err)
		}
	}
	other := Handle{Instance: "0123456789abcdef", ID: "p-x", Output: filepath.Join(dir, "o.out"), Stderr: filepath.Join(dir, "o.err")}
	for _, f := range []string{other.Output, other.Stderr} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r.Discard(other)
	for _, f := range []string{other.Output, other.Stderr} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Fatalf("%s is left (%v)", f, err)
		}
	}
}

// Trim passes the committed offset on to the daemon once TrimEvery bytes
// gathered: the output file's blocks before it are released.
func TestProcess_Trim(t *testing.T) {
	c, dir := daemon(t)
	r := runner(t, c)
	const n = 3 << 20
	x := exec.Command("/bin/sh", "-c", fmt.Sprintf("yes 0123456789abcdef | head -c %d; echo; exec cat", n))
	x.Dir = dir
	rp, err := (&Starter{Runner: r, Dir: filepath.Join(dir, "out")}).Start(ctxT(t), x)
	if err != nil {
		t.Fatal(err)
	}
	p := rp.(*Process)
	defer p.Stop(ctxT(t))
	br := bufio.NewReaderSize(p.Stdout(), 64<<10)
	read := 0
	for read < n+1 {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		read += len(l)
	}
	p.Trim(int64(read))
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := c.Get(ctxT(t), p.ID())
		if err != nil {
			t.Fatal(err)
		}
		if info.Pipe.OutputTrimmed > int64(read)-4096 { // whole pages only
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("trimmed %d of %d", info.Pipe.OutputTrimmed, read)
		}
		time.Sleep(10 * time.Millisecond) // the trim is sent in the background: polled, bounded
	}
}
