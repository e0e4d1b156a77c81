package confine

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// needLandlock skips on a kernel without Landlock (nothing to launch
// into); New's tests cover that case.
func needLandlock(t *testing.T) {
	t.Helper()
	if KernelABI() < 1 {
		t.Skip("this kernel has no Landlock")
	}
}

// run runs argv confined by p through this test binary as the launcher.
func run(t *testing.T, p *Policy, dir string, argv ...string) (string, string, error) {
	t.Helper()
	argv, env, err := p.Wrap(argv, os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = env, dir
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// The launcher confines the command and what it starts: its own folders
// read and written, the system read, another folder, the server's
// process and the network denied.
func TestLaunch(t *testing.T) {
	needLandlock(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	abstract := "agenthost-confine-test-" + strconv.Itoa(os.Getpid())
	uln, err := net.Listen("unix", "@"+abstract)
	if err != nil {
		t.Fatal(err)
	}
	defer uln.Close()
	c, err := New(Options{Mode: ModeLandlock, Net: []uint16{}, Exe: exe})
	if err != nil {
		t.Fatal(err)
	}
	ws, home, other := t.TempDir(), t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "secret"), []byte("other's"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(other, "secret"), filepath.Join(ws, "link")); err != nil {
		t.Fatal(err)
	}
	// A command of the room's (an MCP server) outside the allowed folders
	// runs; the folder it is in stays closed.
	bins := t.TempDir()
	b, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(bins, "true")
	if err := os.WriteFile(bin, b, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bins, "beside"), []byte("beside"), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := c.Policy(AgentRoom(ws, home, []string{"sh", bin}, nil))
	if err != nil {
		t.Fatal(err)
	}
	script := bin + ` && echo exec=ran
cat ` + filepath.Join(bins, "beside") + ` >/dev/null 2>&1 || echo beside=denied
echo mine > own && cat own
head -c 4 /etc/passwd; echo
echo tmp > "$TMPDIR/t" && cat "$TMPDIR/t"
cat ` + filepath.Join(other, "secret") + ` 2>&1 || echo other=denied
cat link 2>&1 || echo link=denied
echo x > ` + filepath.Join(other, "new") + ` 2>&1 || echo write=denied
sh -c 'kill -0 ` + strconv.Itoa(os.Getpid()) + `' 2>&1 || echo signal=denied
(exec 3<>/dev/tcp/127.0.0.1/` + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port) + `) 2>&1 || echo connect=denied
perl -MIO::Socket::UNIX -e 'IO::Socket::UNIX->new(Peer => "\0` + abstract + `") or die "$!\n"' 2>&1 || echo abstract=denied
echo $` + PolicyEnv + `
`
	out, errOut, err := run(t, p, ws, "bash", "-c", script)
	if err != nil {
		t.Fatalf("%v: %s", err, errOut)
	}
	for _, want := range []string{"exec=ran", "beside=denied", "mine\n", "root\n", "tmp\n", "other=denied", "link=denied", "write=denied", "signal=denied", "connect=denied", "abstract=denied"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "other's") || strings.Contains(out, `"rules"`) {
		t.Errorf("the other folder was read, or the policy reached the command:\n%s", out)
	}
	if !strings.Contains(strings.ToLower(out), "permission denied") {
		t.Errorf("no denial says permission denied:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(other, "new")); err == nil {
		t.Error("the command wrote into another folder")
	}
}

// A launcher that cannot apply its policy exits 126 and never runs the
// command unconfined.
func TestLaunch_RefusesABadPolicy(t *testing.T) {
	needLandlock(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ws := t.TempDir()
	marker := filepath.Join(ws, "ran")
	for name, env := range map[string]string{
		"missing folder": `{"abi":1,"rules":[{"path":"/no/such/folder","access":"rw"}]}`,
		"unknown access": `{"abi":1,"rules":[{"path":"/usr","access":"all"}]}`,
		"ABI too new":    `{"abi":99,"rules":[]}`,
		"not JSON":       `{`,
	} {
		cmd := exec.Command(exe, LauncherArg, "--", "/bin/sh", "-c", "touch "+marker)
		cmd.Env = append(os.Environ(), PolicyEnv+"="+env)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 126 || !strings.Contains(string(out), LauncherArg) {
			t.Errorf("%s: %v %s", name, err, out)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("%s: the command ran", name)
		}
	}
	cmd := exec.Command(exe, LauncherArg, "--", "/bin/sh", "-c", "touch "+marker)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "no policy") {
		t.Errorf("no policy: %v %s", err, out)
	}
}

// BenchmarkLaunch is the launcher's cost per agent start: /bin/true run
// through it (restrict, then exec) against /bin/true run directly.
func BenchmarkLaunch(b *testing.B) {
	if KernelABI() < 1 {
		b.Skip("this kernel has no Landlock")
	}
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	c, err := New(Options{Mode: ModeLandlock, Exe: exe})
	if err != nil {
		b.Fatal(err)
	}
	p, err := c.Policy(AgentRoom(b.TempDir(), b.TempDir(), []string{"true"}, nil))
	if err != nil {
		b.Fatal(err)
	}
	for _, confined := range []bool{false, true} {
		argv, env := []string{"/bin/true"}, os.Environ()
		if confined {
			if argv, env, err = p.Wrap(argv, env); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(map[bool]string{false: "direct", true: "confined"}[confined], func(b *testing.B) {
			for b.Loop() {
				cmd := exec.Command(argv[0], argv[1:]...)
				cmd.Env = env
				if err := cmd.Run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPolicy is the server's share of each agent start: the policy
// of a room whose TMPDIR the last start left holding files (set aside and
// removed, then made again).
func BenchmarkPolicy(b *testing.B) {
	if KernelABI() < 1 {
		b.Skip("this kernel has no Landlock")
	}
	c, err := New(Options{Mode: ModeLandlock})
	if err != nil {
		b.Fatal(err)
	}
	home := filepath.Join(b.TempDir(), "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		b.Fatal(err)
	}
	r := AgentRoom(b.TempDir(), home, []string{"true"}, nil)
	for b.Loop() {
		p, err := c.Policy(r)
		if err != nil {
			b.Fatal(err)
		}
		for i := range 10 {
			if err := os.WriteFile(filepath.Join(p.Tmp, strconv.Itoa(i)), nil, 0o600); err != nil {
				b.Fatal(err)
			}
		}
	}
}
