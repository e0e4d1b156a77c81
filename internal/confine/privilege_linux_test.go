//go:build linux && (amd64 || arm64)

package confine

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// agentTestUID is the uid (and gid) the tests run agents as: unused on
// a test machine, neither root nor the server's.
const agentTestUID = 3999001

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (the server as root); as non-root TestLaunch_NoPrivilege is the non-root case")
	}
}

// listen is a TCP listener on 127.0.0.1, closed at the end of the test.
func listen(t *testing.T) (net.Listener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln, ln.Addr().String()
}

func port(addr string) uint16 {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return uint16(n)
}

// terminal opens a pty pair, as an operator's terminal would be; its
// device is what the agent must not open.
func terminal(t *testing.T) string {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ptmx.Close(); tty.Close() })
	return tty.Name()
}

// A launched agent holds no capability, has no_new_privs and a seccomp
// filter, and every syscall the filter denies is refused, with high bits
// set in 32-bit arguments too; ordinary work (a shell, its folders, TCP
// to an allowed port, fork and exec, threads in Go and in node) works.
// With a restricted network MPTCP, SCTP and other families are refused,
// and UDP unless port 53 is allowed; with any network they are not.
func TestLaunch_NoPrivilege(t *testing.T) {
	needLandlock(t)
	_, allowed := listen(t)
	_, denied := listen(t)
	pts := terminal(t)
	ws, home := t.TempDir(), t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	launch := func(net []uint16) (*Policy, map[string]string) {
		c, err := New(Options{Mode: ModeLandlock, Net: net})
		if err != nil {
			t.Fatal(err)
		}
		p, err := c.Policy(AgentRoom(ws, home, []string{exe}, nil))
		if err != nil {
			t.Fatal(err)
		}
		restricted := "0"
		if net != nil {
			restricted = "1"
		}
		return p, probeResults(t, p, ws, probeNetRestricted+"="+restricted, probeConnectOK+"="+allowed, probeConnectDenied+"="+denied,
			probeTerminals+"="+strings.Join([]string{pts, "/dev/ptmx", "/dev/tty"}, ":"),
			probeWrite+"="+strings.Join([]string{ws, home, agentTmp(home)}, ":"), probeNode+"=1")
	}

	p, res := launch([]uint16{port(allowed)})
	exp := maps.Clone(deniedAlways)
	maps.Copy(exp, map[string]string{
		"socket.mptcp": "EPERM", "socket.mptcp-high": "EPERM", "socket.mptcp6": "EPERM", "socket.sctp": "EPERM",
		"socket.udp": "EPERM", "socket.udp6": "EPERM", "socket.vsock": "EPERM",
		"connect.allowed": "ok", "connect.denied": "EACCES",
		"open." + pts: "EACCES", "open./dev/ptmx": "EACCES", "open./dev/tty": "EACCES",
		"write." + ws: "ok", "write." + home: "ok", "write." + p.Tmp: "ok", "node.worker": "ok",
		"status.Uid": strconv.Itoa(os.Geteuid()),
	})
	if os.Geteuid() == 0 {
		exp["status.CapBnd"] = "0000000000000000"
	}
	want(t, res, exp)

	// DNS allowed: UDP is, MPTCP still is not.
	_, res = launch([]uint16{port(allowed), 53})
	want(t, res, map[string]string{"socket.udp": "ok", "socket.udp6": "ok", "socket.mptcp": "EPERM", "socket.sctp": "EPERM", "connect.allowed": "ok"})

	// Any network: the filter leaves sockets to the kernel.
	_, res = launch(nil)
	want(t, res, map[string]string{"socket.udp": "ok", "socket.tcp": "ok", "connect.denied": "ok", "socket.packet": "EPERM", "socket.raw": "EPERM"})
	if res["socket.mptcp"] == "EPERM" {
		t.Error("any network: MPTCP refused by the filter")
	}
}

// A server run as root gives each agent its own uid: the agent runs as
// it (no group, no capability, not even in its bounding set), reaches
// its folders at their own paths although they, and its command, lie
// under folders that uid cannot search (0700, root's), sees nothing else
// of those, and cannot read, chmod or chown the server's 0600 files nor
// see the server's process at all (its /proc shows its own uid's only).
func TestLaunch_AsAgentUser(t *testing.T) {
	needLandlock(t)
	needRoot(t)
	u := &User{UID: agentTestUID, GID: agentTestUID}
	dir := t.TempDir() // 0700, in a 0700 folder: the uid cannot search it
	room, ws, sibling := filepath.Join(dir, "room"), filepath.Join(dir, "ws"), filepath.Join(dir, "sibling")
	home := filepath.Join(room, "home")
	for _, d := range []string{room, ws, sibling, home} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{ws, home} {
		if err := os.Chown(d, u.UID, u.GID); err != nil {
			t.Fatal(err)
		}
	}
	// A server's file in the agent's own workspace: Landlock lets the
	// agent at it, the uid does not.
	secret := filepath.Join(ws, "server-secret")
	if err := os.WriteFile(secret, []byte("the server's"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The command, where only root can reach it (an operator's checkout
	// under /root).
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o700); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(bin, "agent")
	if err := copyFile(self, exe); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "beside"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{Mode: ModeLandlock, Net: []uint16{}})
	if err != nil {
		t.Fatal(err)
	}
	r := AgentRoom(ws, home, []string{exe}, nil)
	r.User = u
	p, err := c.Policy(r)
	if err != nil {
		t.Fatal(err)
	}
	if p.User == nil || *p.User != *u {
		t.Fatalf("the policy's user: %+v", p.User)
	}
	if fi, err := os.Lstat(p.Tmp); err != nil || fi.Sys().(*syscall.Stat_t).Uid != uint32(u.UID) {
		t.Fatalf("the TMPDIR is not the agent's: %v", err)
	}
	pts := terminal(t)
	server := "/proc/" + strconv.Itoa(os.Getpid())
	res := probeResultsOf(t, exe, p, ws, probeNetRestricted+"=1", probeWrite+"="+strings.Join([]string{ws, home, p.Tmp}, ":"),
		probeHidden+"="+strings.Join([]string{sibling, filepath.Join(dir, "nothing"), filepath.Join(bin, "beside"), server}, ":"),
		probeSecret+"="+secret, probePID+"="+strconv.Itoa(os.Getpid()), probeTerminals+"="+pts, probeNode+"=1")
	exp := maps.Clone(deniedAlways)
	maps.Copy(exp, map[string]string{
		"status.Uid": strconv.Itoa(u.UID), "status.Gid": strconv.Itoa(u.GID), "status.CapBnd": "0000000000000000",
		"write." + ws: "ok", "write." + home: "ok", "write." + p.Tmp: "ok",
		"see." + sibling: "ENOENT", "see." + filepath.Join(dir, "nothing"): "ENOENT", "see." + filepath.Join(bin, "beside"): "ENOENT",
		"see." + server: "ENOENT", // its /proc shows its own processes only
		"secret.read":   "EACCES", "secret.chmod": "EPERM", "secret.chown": "EPERM", "environ": "ENOENT",
		"open." + pts: "EACCES", "node.worker": "ok",
		"socket.udp": "EPERM", "socket.mptcp": "EPERM",
	})
	want(t, res, exp)
	for _, d := range []string{ws, home, p.Tmp} {
		fi, err := os.Lstat(filepath.Join(d, "probe-wrote"))
		if err != nil || fi.Sys().(*syscall.Stat_t).Uid != uint32(u.UID) {
			t.Errorf("%s: the agent's file: %v", d, err)
		}
	}
	if fi, err := os.Stat(secret); err != nil || fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("the server's file changed: %v %v", fi.Mode(), err)
	}
}

// Where the launcher may not make a mount namespace (root without
// CAP_SYS_ADMIN, as in a restricted container), an agent uid whose
// folders it cannot search is refused, naming the way out.
func TestLaunch_AsAgentUserWithoutMountNamespace(t *testing.T) {
	needLandlock(t)
	needRoot(t)
	u := &User{UID: agentTestUID, GID: agentTestUID}
	dir := t.TempDir()
	ws, home := filepath.Join(dir, "ws"), filepath.Join(dir, "room", "home")
	for _, d := range []string{ws, filepath.Dir(home), home} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{ws, home} {
		if err := os.Chown(d, u.UID, u.GID); err != nil {
			t.Fatal(err)
		}
	}
	c, err := New(Options{Mode: ModeLandlock})
	if err != nil {
		t.Fatal(err)
	}
	r := AgentRoom(ws, home, []string{"sh"}, nil)
	r.User = u
	p, err := c.Policy(r)
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(dir, "ran")
	argv, env, err := p.Wrap([]string{"sh", "-c", "touch " + marker}, os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), self, append([]string{"--"}, argv...)...)
	cmd.Env = append(env, roleEnv+"=nosysadmin")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 126 || !strings.Contains(string(out), "--agent-uids off") || !strings.Contains(string(out), "mount namespace") {
		t.Fatalf("%v: %s", err, out)
	}
	t.Logf("%s", out)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran")
	}
}

// SysV IPC is no file: Landlock does not see it and it outlives the
// processes that made it. Launched by root, as a uid of its own or as
// root (agent uids off), the agent finds no segment of the host's (not
// even one open to every uid), and the segment it makes goes with it:
// nothing a room leaves there reaches another room, root's processes or
// the host's limits.
func TestLaunch_IPCNamespace(t *testing.T) {
	needLandlock(t)
	needRoot(t)
	base := 0x61680000 | (os.Getpid()&0xfff)<<4
	host := base
	id, err := unix.SysvShmGet(host, 4096, unix.IPC_CREAT|unix.IPC_EXCL|0o666)
	if err != nil {
		t.Fatalf("the host's segment: %v", err)
	}
	t.Cleanup(func() { _, _ = unix.SysvShmCtl(id, unix.IPC_RMID, nil) })
	c, err := New(Options{Mode: ModeLandlock})
	if err != nil {
		t.Fatal(err)
	}
	for i, u := range []*User{nil, {UID: agentTestUID, GID: agentTestUID}} {
		made := base + 1 + i
		ws, room := t.TempDir(), t.TempDir()
		home := filepath.Join(room, "home")
		if err := os.Mkdir(home, 0o700); err != nil {
			t.Fatal(err)
		}
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		r := AgentRoom(ws, home, []string{exe}, nil)
		r.User = u
		p, err := c.Policy(r)
		if err != nil {
			t.Fatal(err)
		}
		res := probeResults(t, p, ws, probeShmHost+"="+strconv.Itoa(host), probeShmMake+"="+strconv.Itoa(made))
		who := "root"
		if u != nil {
			who = "uid " + strconv.Itoa(u.UID)
		}
		if res["shm.host"] != "ENOENT" || res["shm.make"] != "ok" {
			t.Errorf("as %s: the host's segment %q (want ENOENT), its own %q (want ok)", who, res["shm.host"], res["shm.make"])
		}
		if left, err := unix.SysvShmGet(made, 0, 0); !errors.Is(err, unix.ENOENT) {
			_, _ = unix.SysvShmCtl(left, unix.IPC_RMID, nil)
			t.Errorf("as %s: the agent's segment outlived it on the host: %v", who, err)
		}
	}
}

// A #! script as the command runs (the interpreter is given its path),
// as the agent's uid from a folder only root can search, and as root.
func TestLaunch_Script(t *testing.T) {
	needLandlock(t)
	bins := t.TempDir()
	script := filepath.Join(bins, "agent.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho \"script $0 as $(id -u) in $PWD\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{Mode: ModeLandlock})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []*User{nil, {UID: agentTestUID, GID: agentTestUID}} {
		if u != nil && os.Geteuid() != 0 {
			continue // a uid of its own needs root
		}
		dir := t.TempDir()
		ws, home := filepath.Join(dir, "ws"), filepath.Join(dir, "room", "home")
		for _, d := range []string{ws, filepath.Dir(home), home} {
			if err := os.Mkdir(d, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		uid := os.Geteuid()
		if u != nil {
			uid = u.UID
			for _, d := range []string{ws, home} {
				if err := os.Chown(d, u.UID, u.GID); err != nil {
					t.Fatal(err)
				}
			}
		}
		r := AgentRoom(ws, home, []string{script}, nil)
		r.User = u
		p, err := c.Policy(r)
		if err != nil {
			t.Fatal(err)
		}
		out, errOut, err := run(t, p, ws, script)
		if want := "script " + script + " as " + strconv.Itoa(uid) + " in " + ws + "\n"; err != nil || out != want {
			t.Errorf("user %v: %q %v %s; want %q", u, out, err, errOut, want)
		}
	}
}

// The non-root server: what a launcher not run as root drops (all it
// holds) and what remains (its bounding set), the same filter.
func TestLaunch_NonRoot(t *testing.T) {
	needLandlock(t)
	needRoot(t)
	const nobody = 65534
	base, err := os.MkdirTemp("", "agenthost-confine-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary, where uid 65534 can execute it.
	copyExe := filepath.Join(base, "confine.test")
	if err := copyFile(exe, copyExe); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(base, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(data, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	_, allowed := listen(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, copyExe)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), roleEnv + "=nonroot", nonRootDir + "=" + data, nonRootPort + "=" + strconv.Itoa(int(port(allowed)))}
	cmd.Dir = data
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("the non-root server: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	res := parseResults(stdout.String())
	exp := maps.Clone(deniedAlways)
	maps.Copy(exp, map[string]string{"status.Uid": strconv.Itoa(nobody), "connect.allowed": "ok", "socket.mptcp": "EPERM", "socket.udp": "EPERM"})
	want(t, res, exp)
	// What remains: the bounding set a non-root process cannot drop
	// (no_new_privs and an empty permitted set make it moot).
	t.Logf("non-root agent: CapBnd %s", res["status.CapBnd"])
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// A rule folder swapped for a link (or moved under one) after Policy, as
// a process left in the room could, is refused: the launcher exits 126
// naming it, and the command never runs. So is a folder not the agent's.
func TestLaunch_RefusesSwappedFolders(t *testing.T) {
	needLandlock(t)
	c, err := New(Options{Mode: ModeLandlock})
	if err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "secret"), []byte("other's"), 0o600); err != nil {
		t.Fatal(err)
	}
	type room struct{ dir, ws, home, tmp string }
	newRoom := func() (room, *Policy) {
		dir := t.TempDir()
		r := room{dir: dir, ws: filepath.Join(dir, "ws"), home: filepath.Join(dir, "room", "home")}
		for _, d := range []string{r.ws, filepath.Dir(r.home), r.home} {
			if err := os.Mkdir(d, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		p, err := c.Policy(AgentRoom(r.ws, r.home, []string{"sh"}, nil))
		if err != nil {
			t.Fatal(err)
		}
		r.tmp = p.Tmp
		return r, p
	}
	swap := func(path, target string) {
		if err := os.Rename(path, path+".moved"); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, path); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(name string, p *Policy, ws, reason string) {
		t.Helper()
		marker := filepath.Join(other, "ran-"+strings.ReplaceAll(name, " ", "-"))
		out, errOut, err := run(t, p, "/", "sh", "-c", "cat "+filepath.Join(ws, "secret")+"; touch "+marker)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 126 || !strings.Contains(errOut, reason) {
			t.Errorf("%s: %v, stderr %q, want exit 126 saying %q", name, err, errOut, reason)
		}
		if strings.Contains(out, "other's") {
			t.Errorf("%s: the link's target was read", name)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Errorf("%s: the command ran", name)
		}
	}
	for _, which := range []string{"workspace", "home", "TMPDIR"} {
		r, p := newRoom()
		path := map[string]string{"workspace": r.ws, "home": r.home, "TMPDIR": r.tmp}[which]
		swap(path, other)
		refused(which+" swapped", p, path, "link")
	}
	// A folder above one, the room's, made a link.
	r, p := newRoom()
	moved := filepath.Join(t.TempDir(), "room")
	if err := os.Rename(filepath.Dir(r.home), moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(moved, filepath.Dir(r.home)); err != nil {
		t.Fatal(err)
	}
	refused("room swapped", p, r.home, "link")
	// A folder of another user's.
	r, p = newRoom()
	if err := os.Chown(r.ws, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		refused("workspace not the agent's", p, r.ws, "uid 65534's, not the agent's")
	}
	// A file where a folder was.
	r, p = newRoom()
	if err := os.Remove(r.tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(r.tmp, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	refused("TMPDIR a file", p, r.tmp, "not a directory")
}

// The launcher's open without links, when openat2 is refused: each
// element opened with O_NOFOLLOW, a link anywhere refused.
func TestWalkNoLinks(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "a", "b"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "a", "f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "a"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "a", "b"), filepath.Join(dir, "a", "blink")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		dir  bool
		err  error
	}{
		{filepath.Join(dir, "a", "b"), true, nil},
		{filepath.Join(dir, "a", "f"), false, nil},
		{filepath.Join(dir, "a", "f"), true, unix.ENOTDIR},
		{filepath.Join(dir, "a", "f", "x"), false, unix.ENOTDIR},
		{filepath.Join(dir, "link"), true, unix.ELOOP},
		{filepath.Join(dir, "link", "b"), true, unix.ELOOP},
		{filepath.Join(dir, "a", "blink"), false, unix.ELOOP},
		{filepath.Join(dir, "missing"), false, unix.ENOENT},
	} {
		for name, open := range map[string]func(string, bool) (int, error){"walk": walkNoLinks, "openat2": openNoLinks} {
			fd, err := open(tc.path, tc.dir)
			if err == nil {
				var want, got unix.Stat_t
				if unix.Fstat(fd, &got) != nil || unix.Stat(tc.path, &want) != nil || got.Ino != want.Ino {
					t.Errorf("%s %s: opened something else", name, tc.path)
				}
				unix.Close(fd)
			}
			if !errors.Is(err, tc.err) && !(tc.err == nil && err == nil) {
				t.Errorf("%s %s (dir %v): %v, want %v", name, tc.path, tc.dir, err, tc.err)
			}
		}
	}
	if _, err := openNoLinks(dir+"/a/../a", true); err == nil {
		t.Error("a path with .. was opened")
	}
}

// The filter program itself, run on seccomp data the kernel would give
// it: other architectures and x32 refused, each rule decided on the low
// 32 bits of int arguments only, the rest allowed.
func TestSeccompFilter(t *testing.T) {
	const high = 1 << 32
	type call struct {
		name string
		arch uint32
		nr   int
		args []uint64
		want uint32
	}
	eperm := uint32(unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM))
	enosys := uint32(unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS))
	allow := uint32(unix.SECCOMP_RET_ALLOW)
	calls := []call{
		{"getpid", auditArch, unix.SYS_GETPID, nil, allow},
		{"other arch", unix.AUDIT_ARCH_I386, 20, nil, eperm},
		{"other arch, socketcall", unix.AUDIT_ARCH_ARM, 102, nil, eperm},
		{"clone3", auditArch, unix.SYS_CLONE3, nil, enosys},
		{"packet", auditArch, unix.SYS_SOCKET, []uint64{unix.AF_PACKET, unix.SOCK_RAW}, eperm},
		{"packet, high bits", auditArch, unix.SYS_SOCKET, []uint64{unix.AF_PACKET | high, unix.SOCK_DGRAM}, eperm},
		{"raw", auditArch, unix.SYS_SOCKET, []uint64{unix.AF_INET6, unix.SOCK_RAW | unix.SOCK_CLOEXEC | high}, eperm},
		{"SOCK_PACKET", auditArch, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_PACKET}, eperm},
		{"netlink raw", auditArch, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW}, allow},
		{"netlink raw, high bits", auditArch, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK | high, unix.SOCK_RAW}, allow},
		{"tcp, high bits", auditArch, unix.SYS_SOCKET, []uint64{unix.AF_INET | high, unix.SOCK_STREAM, high}, allow},
		{"mptcp, any network", auditArch, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP}, allow},
		{"TIOCSTI", auditArch, unix.SYS_IOCTL, []uint64{0, unix.TIOCSTI}, eperm},
		{"TIOCSTI, high bits", auditArch, unix.SYS_IOCTL, []uint64{0, unix.TIOCSTI | high}, eperm},
		{"TIOCLINUX, high bits", auditArch, unix.SYS_IOCTL, []uint64{0, unix.TIOCLINUX | 0xffffffff00000000}, eperm},
		{"TIOCGWINSZ", auditArch, unix.SYS_IOCTL, []uint64{0, unix.TIOCGWINSZ}, allow},
		{"mknodat chr", auditArch, unix.SYS_MKNODAT, []uint64{0, 0, unix.S_IFCHR | 0o600}, eperm},
		{"mknodat blk, high bits", auditArch, unix.SYS_MKNODAT, []uint64{0, 0, unix.S_IFBLK | high}, eperm},
		{"mknodat fifo", auditArch, unix.SYS_MKNODAT, []uint64{0, 0, unix.S_IFIFO | 0o600}, allow},
		{"mknodat reg", auditArch, unix.SYS_MKNODAT, []uint64{0, 0, unix.S_IFREG | 0o600}, allow},
		{"clone newuser", auditArch, unix.SYS_CLONE, []uint64{unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}, eperm},
		{"clone thread", auditArch, unix.SYS_CLONE, []uint64{unix.CLONE_VM | unix.CLONE_THREAD | unix.CLONE_SIGHAND | unix.CLONE_FS | unix.CLONE_FILES}, allow},
		{"unshare newuser", auditArch, unix.SYS_UNSHARE, []uint64{unix.CLONE_NEWUSER | unix.CLONE_NEWNS}, eperm},
		{"unshare newns", auditArch, unix.SYS_UNSHARE, []uint64{unix.CLONE_NEWNS}, allow},
	}
	for _, s := range seccompDenied {
		calls = append(calls, call{s.name, auditArch, s.nr, nil, eperm})
	}
	if x32Bit != 0 {
		calls = append(calls, call{"x32 getpid", auditArch, x32Bit | unix.SYS_GETPID, nil, eperm})
	}
	if nr := sysMknod; nr >= 0 {
		calls = append(calls, call{"mknod chr", auditArch, nr, []uint64{0, unix.S_IFCHR}, eperm}, call{"mknod fifo", auditArch, nr, []uint64{0, unix.S_IFIFO}, allow})
	}
	any, err := seccompFilter(&Policy{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range calls {
		if got := runBPF(t, any, c.arch, c.nr, c.args); got != c.want {
			t.Errorf("%s: %#x, want %#x", c.name, got, c.want)
		}
	}
	// A restricted network.
	for _, tc := range []struct {
		net  []uint16
		args []uint64
		want uint32
	}{
		{[]uint16{443}, []uint64{unix.AF_INET, unix.SOCK_STREAM, 0}, allow},
		{[]uint16{443}, []uint64{unix.AF_INET6, unix.SOCK_STREAM | unix.SOCK_NONBLOCK, unix.IPPROTO_TCP}, allow},
		{[]uint16{443}, []uint64{unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP}, eperm},
		{[]uint16{443}, []uint64{unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP | high}, eperm},
		{[]uint16{443}, []uint64{unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP}, eperm},
		{[]uint16{443}, []uint64{unix.AF_INET, unix.SOCK_SEQPACKET, 0}, eperm},
		{[]uint16{443}, []uint64{unix.AF_INET, unix.SOCK_DGRAM, 0}, eperm},
		{[]uint16{443}, []uint64{unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP}, eperm},
		{[]uint16{443}, []uint64{unix.AF_VSOCK, unix.SOCK_STREAM, 0}, eperm},
		{[]uint16{443}, []uint64{unix.AF_UNIX, unix.SOCK_DGRAM, 0}, allow},
		{[]uint16{443}, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, 0}, allow},
		{[]uint16{53, 443}, []uint64{unix.AF_INET6, unix.SOCK_DGRAM, 0}, allow},
		{[]uint16{53, 443}, []uint64{unix.AF_INET, unix.SOCK_DGRAM | unix.SOCK_CLOEXEC, unix.IPPROTO_UDP}, allow},
		{[]uint16{53, 443}, []uint64{unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP}, eperm},
		{[]uint16{53, 443}, []uint64{unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_UDPLITE}, eperm},
		{[]uint16{53, 443}, []uint64{unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP}, eperm},
	} {
		f, err := seccompFilter(&Policy{Net: tc.net})
		if err != nil {
			t.Fatal(err)
		}
		if got := runBPF(t, f, auditArch, unix.SYS_SOCKET, tc.args); got != tc.want {
			t.Errorf("net %v, socket%v: %#x, want %#x", tc.net, tc.args, got, tc.want)
		}
	}
}

// runBPF runs a seccomp filter on the data of one syscall (the opcodes
// the assembler emits).
func runBPF(t *testing.T, prog []unix.SockFilter, arch uint32, nr int, args []uint64) uint32 {
	t.Helper()
	data := make([]byte, 64)
	binary.LittleEndian.PutUint32(data[0:], uint32(nr))
	binary.LittleEndian.PutUint32(data[4:], arch)
	for i, a := range args {
		binary.LittleEndian.PutUint64(data[16+8*i:], a)
	}
	var acc uint32
	for pc := 0; pc < len(prog); pc++ {
		in := prog[pc]
		jump := func(cond bool) {
			if cond {
				pc += int(in.Jt)
			} else {
				pc += int(in.Jf)
			}
		}
		switch in.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			acc = binary.LittleEndian.Uint32(data[in.K:])
		case unix.BPF_ALU | unix.BPF_AND | unix.BPF_K:
			acc &= in.K
		case unix.BPF_JMP | unix.BPF_JA:
			pc += int(in.K)
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K:
			jump(acc == in.K)
		case unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K:
			jump(acc >= in.K)
		case unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			jump(acc&in.K != 0)
		case unix.BPF_RET | unix.BPF_K:
			return in.K
		default:
			t.Fatalf("opcode %#x at %d", in.Code, pc)
		}
	}
	t.Fatal("the filter ran off its end")
	return 0
}
