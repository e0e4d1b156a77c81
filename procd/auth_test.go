//go:build linux

package procd

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// dialEnv makes the test binary a one-shot client: dial the socket in
// PROCD_TEST_DIAL, send a ping with the token in PROCD_TEST_TOKEN, print
// the reply (or the error) and exit.
const dialEnv = "PROCD_TEST_DIAL"

func init() {
	if sock := os.Getenv(dialEnv); sock != "" {
		conn, err := net.Dial("unix", sock)
		if err != nil {
			os.Stdout.WriteString("dial error: " + err.Error())
			os.Exit(0)
		}
		env, _ := json.Marshal(map[string]any{"token": os.Getenv("PROCD_TEST_TOKEN"), "request": map[string]string{"op": "ping"}})
		_ = writeFrame(conn, json.RawMessage(env))
		b, err := readFrame(conn)
		if err != nil {
			os.Stdout.WriteString("read error: " + err.Error())
			os.Exit(0)
		}
		os.Stdout.Write(b)
		os.Exit(0)
	}
}

func TestAuth_Token(t *testing.T) {
	t.Parallel()
	dir, _ := startDaemon(t)
	svc, err := readService(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{"no token": "", "wrong token": strings.Repeat("0", len(svc.Token))} {
		r := rawRequest(t, dir, tok, `{"op":"ping"}`)
		if r.Type != TypeError || r.Code != codeForbidden {
			t.Errorf("%s: %+v", name, r)
		}
	}
	if r := rawRequest(t, dir, svc.Token, `{"op":"ping"}`); r.Type != TypePong {
		t.Fatalf("right token: %+v", r)
	}
	// The files that hold the token and the socket are private.
	for path, want := range map[string]os.FileMode{
		filepath.Join(procdDir(dir), serviceFile): 0o600,
		filepath.Dir(svc.Socket):                  0o700 | os.ModeDir,
		svc.Socket:                                0o600 | os.ModeSocket,
	} {
		fi, err := os.Stat(path)
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v (%v), want %v", filepath.Base(path), fi.Mode(), err, want)
		}
	}
}

// TestAuth_OtherUID: a client of another user is refused twice over: the
// socket's directory keeps it out, and with that loosened (test only) the
// daemon's peer check (SO_PEERCRED) still refuses it, right token or not.
func TestAuth_OtherUID(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("needs root to run a client as another uid (the tests run as root in CI)")
	}
	dir, _ := startDaemon(t)
	svc, _ := readService(dir)
	// The test binary, copied where another user may run it.
	binDir, err := os.MkdirTemp("", "procd-client-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(binDir) })
	bin := filepath.Join(binDir, "client")
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	dst, err := os.OpenFile(bin, os.O_WRONLY|os.O_CREATE, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(dst, src)
	src.Close()
	dst.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	asNobody := func() string {
		cmd := exec.Command(bin)
		cmd.Env = []string{dialEnv + "=" + svc.Socket, "PROCD_TEST_TOKEN=" + svc.Token}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		cmd.WaitDelay = 10 * time.Second
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("client as uid 65534: %v", err)
		}
		return string(out)
	}
	if out := asNobody(); !strings.Contains(out, "permission denied") {
		t.Fatalf("through the 0700 socket dir: %s", out)
	}
	for d := filepath.Dir(svc.Socket); d != filepath.Clean(os.TempDir()) && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(svc.Socket, 0o666); err != nil {
		t.Fatal(err)
	}
	out := asNobody()
	var r Reply
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Type != TypeError || r.Code != codeForbidden || !strings.Contains(r.Message, "peer") {
		t.Fatalf("another uid with the right token: %s", out)
	}
}

// TestFrame_OverLimit: a frame over MaxFrame is answered with an error, not
// dropped silently, and the daemon serves on.
func TestFrame_OverLimit(t *testing.T) {
	t.Parallel()
	dir, c := startDaemon(t)
	svc, _ := readService(dir)
	conn, err := net.Dial("unix", svc.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	var h [4]byte
	h[0], h[1], h[2], h[3] = 0, 0x80, 0, 1 // 8 MiB + 1
	if _, err := conn.Write(h[:]); err != nil {
		t.Fatal(err)
	}
	b, err := readFrame(conn)
	if err != nil {
		t.Fatalf("no answer to an oversized frame: %v", err)
	}
	var r Reply
	if err := json.Unmarshal(b, &r); err != nil || r.Type != TypeError || r.Code != codeInvalid {
		t.Fatalf("reply %s", b)
	}
	if err := c.Ping(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}
