//go:build linux && (amd64 || arm64)

package confine

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The test binary plays two more parts, chosen by roleEnv: the confined
// agent that probes its own confinement ("agent": agentProbe), and a
// server run as uid 65534 that launches it ("nonroot": nonRootServer).
const roleEnv = "AGENTHOST_CONFINE_TEST_ROLE"

// Parameters of the agent's probe, in its environment.
const (
	probeConnectOK     = "PROBE_CONNECT_OK"     // host:port it may connect to
	probeConnectDenied = "PROBE_CONNECT_DENIED" // host:port it may not
	probeTerminals     = "PROBE_TERMINALS"      // device paths it must not open, ':'-separated
	probeSecret        = "PROBE_SECRET"         // a root 0600 file it may not read nor chmod (agent uid)
	probePID           = "PROBE_PID"            // a process whose environ it may not read
	probeWrite         = "PROBE_WRITE"          // folders it writes, ':'-separated
	probeHidden        = "PROBE_HIDDEN"         // paths it must not see, ':'-separated
	probeNode          = "PROBE_NODE"           // "1": run node with a worker thread
	probeNetRestricted = "PROBE_NET_RESTRICTED" // "1": the policy restricts the network
	probeShmHost       = "PROBE_SHM_HOST"       // key of a SysV shared memory segment of the host's (0666) it must not find
	probeShmMake       = "PROBE_SHM_MAKE"       // key of a segment it makes (0666), which must not outlive it
)

func testRole(m *testing.M) bool {
	switch os.Getenv(roleEnv) {
	case "agent":
		agentProbe()
		os.Exit(0)
	case "nonroot":
		os.Exit(nonRootServer())
	case "tmprace":
		os.Exit(tmpRaceServer())
	case "nosysadmin":
		os.Exit(withoutSysAdmin())
	}
	return false
}

// withoutSysAdmin executes its arguments (after "--") as root without
// CAP_SYS_ADMIN, as a restricted container's root is: dropped from the
// bounding set on this thread, so the executed program lacks it.
func withoutSysAdmin() int {
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_CAPBSET_DROP, unix.CAP_SYS_ADMIN, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	args := os.Args[slices.Index(os.Args, "--")+1:]
	err := syscall.Exec(args[0], args, os.Environ())
	fmt.Fprintln(os.Stderr, err)
	return 2
}

// errName is err's errno name ("ok" for nil).
func errName(err error) string {
	var e unix.Errno
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &e):
		return unix.ErrnoName(e)
	}
	return err.Error()
}

// agentProbe runs inside the confinement, and prints name=result lines:
// its status, each syscall the filter denies (with the high bits of a 32
// bit argument set too), and ordinary work that must still succeed.
func agentProbe() {
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	say := func(name string, err error) { fmt.Fprintf(out, "%s=%s\n", name, errName(err)) }
	status, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(status), "\n") {
		name, v, ok := strings.Cut(l, ":")
		if ok && (strings.HasPrefix(name, "Cap") || name == "Uid" || name == "Gid" || name == "NoNewPrivs" || name == "Seccomp") {
			fmt.Fprintf(out, "status.%s=%s\n", name, strings.Fields(v)[0])
		}
	}
	const high = 1 << 32
	sock := func(name string, domain, typ, proto uintptr) {
		fd, _, e := unix.Syscall(unix.SYS_SOCKET, domain, typ, proto)
		if e == 0 {
			unix.Close(int(fd))
			say(name, nil)
			return
		}
		say(name, e)
	}
	sock("socket.packet", unix.AF_PACKET, unix.SOCK_RAW, 0x0300)
	sock("socket.packet-dgram", unix.AF_PACKET, unix.SOCK_DGRAM, 0x0300)
	sock("socket.packet-high", unix.AF_PACKET|high, unix.SOCK_RAW, 0x0300)
	sock("socket.raw", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
	sock("socket.raw-high", unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC|high, unix.IPPROTO_ICMP)
	sock("socket.raw6", unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6)
	sock("socket.sockpacket", unix.AF_INET, unix.SOCK_PACKET, 0x0300)
	sock("socket.netlink", unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	sock("socket.unix", unix.AF_UNIX, unix.SOCK_STREAM, 0)
	sock("socket.tcp", unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK, 0)
	sock("socket.tcp6", unix.AF_INET6, unix.SOCK_STREAM, unix.IPPROTO_TCP)
	sock("socket.mptcp", unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP)
	sock("socket.mptcp-high", unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP|high)
	sock("socket.mptcp6", unix.AF_INET6, unix.SOCK_STREAM, unix.IPPROTO_MPTCP)
	sock("socket.udp", unix.AF_INET, unix.SOCK_DGRAM, 0)
	sock("socket.udp6", unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if os.Getenv(probeNetRestricted) == "1" {
		// Only where the filter refuses them: elsewhere the kernel
		// could load a protocol's module for the attempt.
		sock("socket.sctp", unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
		sock("socket.vsock", unix.AF_VSOCK, unix.SOCK_STREAM, 0)
	}

	cwd := unix.AT_FDCWD
	node := func(name string, mode uint32, high uintptr) {
		p, _ := unix.BytePtrFromString(name)
		_, _, e := unix.Syscall6(unix.SYS_MKNODAT, uintptr(cwd), uintptr(unsafe.Pointer(p)), uintptr(mode)|high, uintptr(unix.Mkdev(1, 3)), 0, 0)
		os.Remove(name)
		if e == 0 {
			say("mknodat."+name, nil)
			return
		}
		say("mknodat."+name, e)
	}
	node("chr", unix.S_IFCHR|0o600, 0)
	node("blk", unix.S_IFBLK|0o600, 0)
	node("chr-high", unix.S_IFCHR|0o600, high)
	node("fifo", unix.S_IFIFO|0o600, 0)
	if nr := sysMknod; nr >= 0 {
		p, _ := unix.BytePtrFromString("chr2")
		_, _, e := unix.Syscall(uintptr(nr), uintptr(unsafe.Pointer(p)), unix.S_IFCHR|0o600|high, uintptr(unix.Mkdev(1, 3)))
		os.Remove("chr2")
		say("mknod.chr", errOrNil(e))
	}

	var pfd [2]int
	if err := unix.Pipe(pfd[:]); err == nil {
		var n int32
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(pfd[0]), unix.TIOCINQ, uintptr(unsafe.Pointer(&n)))
		say("ioctl.fionread", errOrNil(e))
		c := byte('x')
		for name, req := range map[string]uintptr{"tiocsti": unix.TIOCSTI, "tiocsti-high": unix.TIOCSTI | high, "tioclinux": unix.TIOCLINUX, "tioclinux-high": unix.TIOCLINUX | high} {
			_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(pfd[0]), req, uintptr(unsafe.Pointer(&c)))
			say("ioctl."+name, errOrNil(e))
		}
		unix.Close(pfd[0])
		unix.Close(pfd[1])
	}

	var params [120]byte
	fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params)), 0)
	if e == 0 {
		unix.Close(int(fd))
	}
	say("io_uring_setup", errOrNil(e))
	say("unshare.user", unix.Unshare(unix.CLONE_NEWUSER))
	_, _, e = unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)
	say("clone3", errOrNil(e))
	session := unix.KEY_SPEC_SESSION_KEYRING
	_, _, e = unix.Syscall(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, uintptr(session), 0)
	say("keyctl", errOrNil(e))
	_, _, e = unix.Syscall6(unix.SYS_ADD_KEY, 0, 0, 0, 0, 0, 0)
	say("add_key", errOrNil(e))
	_, _, e = unix.Syscall(unix.SYS_BPF, unix.BPF_MAP_CREATE, 0, 0)
	say("bpf", errOrNil(e))
	_, _, e = unix.Syscall6(unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0, 0)
	say("perf_event_open", errOrNil(e))
	say("mount", unix.Mount("none", "/", "tmpfs", 0, ""))
	_, err := unix.Fsopen("tmpfs", 0)
	say("fsopen", err)
	_, _, e = unix.Syscall(unix.SYS_FINIT_MODULE, ^uintptr(0), 0, 0)
	say("finit_module", errOrNil(e))
	if x32Bit != 0 {
		_, _, e = unix.Syscall(uintptr(x32Bit)|unix.SYS_GETPID, 0, 0, 0)
		say("x32", errOrNil(e))
	}
	// Another process of the room (here the probe's own child, which a
	// parent may trace unless the filter says no): no attaching, no
	// reading its memory, no copying its descriptors.
	if child := exec.Command("sleep", "60"); child.Start() == nil {
		pid := uintptr(child.Process.Pid)
		_, _, e = unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, pid, 0, 0, 0, 0)
		say("ptrace.seize", errOrNil(e))
		_, _, e = unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_ATTACH, pid, 0, 0, 0, 0)
		say("ptrace.attach", errOrNil(e))
		var buf [8]byte
		local := []unix.Iovec{{Base: &buf[0], Len: 8}}
		remote := []unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&buf[0])), Len: 8}}
		_, err := unix.ProcessVMReadv(int(pid), local, remote, 0)
		say("process_vm_readv", err)
		if pidfd, err := unix.PidfdOpen(int(pid), 0); err == nil {
			_, err = unix.PidfdGetfd(pidfd, 0, 0)
			say("pidfd_getfd", err)
			unix.Close(pidfd)
		} else {
			say("pidfd_getfd", err)
		}
		child.Process.Kill()
		child.Wait()
	}

	// Ordinary work.
	cmd := exec.Command("sh", "-c", "echo forked")
	b, err := cmd.Output()
	if err == nil && string(b) != "forked\n" {
		err = fmt.Errorf("sh said %q", b)
	}
	say("sh", err)
	for _, d := range filepath.SplitList(os.Getenv(probeWrite)) {
		f := filepath.Join(d, "probe-wrote")
		err := os.WriteFile(f, []byte("x"), 0o600)
		if err == nil {
			_, err = os.ReadFile(f)
		}
		say("write."+d, err)
	}
	for _, p := range filepath.SplitList(os.Getenv(probeHidden)) {
		_, err := os.Lstat(p)
		say("see."+p, err)
	}
	for _, p := range filepath.SplitList(os.Getenv(probeTerminals)) {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err == nil {
			f.Close()
		}
		say("open."+p, err)
	}
	if s := os.Getenv(probeSecret); s != "" {
		_, err := os.ReadFile(s)
		say("secret.read", err)
		say("secret.chmod", os.Chmod(s, 0o644))
		say("secret.chown", os.Chown(s, os.Getuid(), os.Getgid()))
	}
	if k, err := strconv.Atoi(os.Getenv(probeShmHost)); err == nil {
		_, err := unix.SysvShmGet(k, 0, 0)
		say("shm.host", err)
	}
	if k, err := strconv.Atoi(os.Getenv(probeShmMake)); err == nil {
		_, err := unix.SysvShmGet(k, 4096, unix.IPC_CREAT|unix.IPC_EXCL|0o666)
		say("shm.make", err)
	}
	if pid := os.Getenv(probePID); pid != "" {
		_, err := os.ReadFile("/proc/" + pid + "/environ")
		say("environ", err)
	}
	dial := func(name, addr string) {
		if addr == "" {
			return
		}
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err == nil {
			c.Close()
		}
		say(name, err)
	}
	dial("connect.allowed", os.Getenv(probeConnectOK))
	dial("connect.denied", os.Getenv(probeConnectDenied))
	if os.Getenv(probeNode) == "1" {
		script := `const { Worker } = require("worker_threads");
new Worker("require('worker_threads').parentPort.postMessage(6*7)", { eval: true }).on("message", (m) => console.log("worker said " + m));`
		b, err := exec.Command("node", "-e", script).CombinedOutput()
		if err == nil && !bytes.Contains(b, []byte("worker said 42")) {
			err = fmt.Errorf("node said %q", b)
		}
		say("node.worker", err)
	}
}

func errOrNil(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// probeResults runs the probe agent confined by p (as this test binary)
// in dir with env's parameters, and returns its name=result lines.
func probeResults(t *testing.T, p *Policy, dir string, env ...string) map[string]string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return probeResultsOf(t, exe, p, dir, env...)
}

// probeResultsOf is probeResults with exe, a copy of this test binary, as
// the agent's command.
func probeResultsOf(t *testing.T, exe string, p *Policy, dir string, env ...string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	out, err := runProbe(ctx, exe, p, dir, env...)
	if err != nil {
		t.Fatalf("the probe: %v\n%s", err, out)
	}
	return parseResults(out)
}

// runProbe is probeResults' run: the agent's output.
func runProbe(ctx context.Context, exe string, p *Policy, dir string, env ...string) (string, error) {
	argv, wenv, err := p.Wrap([]string{exe}, append([]string{"PATH=" + os.Getenv("PATH"), roleEnv + "=agent"}, env...))
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = wenv, dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

// Parameters of the non-root server (nonRootServer).
const (
	nonRootDir  = "AGENTHOST_CONFINE_TEST_DIR"  // its folder, its own
	nonRootPort = "AGENTHOST_CONFINE_TEST_PORT" // the TCP port its agent may reach
)

// nonRootServer is a server run as a uid other than root: it confines
// the probe agent as it would a room's, and prints the agent's results.
func nonRootServer() int {
	dir := os.Getenv(nonRootDir)
	port, err := strconv.ParseUint(os.Getenv(nonRootPort), 10, 16)
	if err != nil {
		fmt.Fprintln(os.Stderr, "no port:", err)
		return 2
	}
	c, err := New(Options{Mode: ModeLandlock, Net: []uint16{uint16(port)}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ws, room := filepath.Join(dir, "ws"), filepath.Join(dir, "room")
	home := filepath.Join(room, "home")
	for _, d := range []string{ws, room, home} {
		if err := os.Mkdir(d, 0o700); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	p, err := c.Policy(AgentRoom(ws, home, []string{exe}, nil))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := runProbe(ctx, exe, p, ws, probeNetRestricted+"=1", probeWrite+"="+strings.Join([]string{ws, home, p.Tmp}, ":"),
		probeConnectOK+"=127.0.0.1:"+strconv.Itoa(int(port)))
	fmt.Print(out)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func parseResults(s string) map[string]string {
	res := map[string]string{}
	for _, l := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			res[k] = v
		}
	}
	return res
}

// want checks res against expected results.
func want(t *testing.T, res map[string]string, exp map[string]string) {
	t.Helper()
	for k, v := range exp {
		if res[k] != v {
			t.Errorf("%s: %q, want %q", k, res[k], v)
		}
	}
}

// The privilege a launcher leaves the agent, and the syscalls it may no
// longer make, each tried with a 32-bit argument's high bits set too.
var deniedAlways = map[string]string{
	"status.CapInh": "0000000000000000", "status.CapPrm": "0000000000000000", "status.CapEff": "0000000000000000",
	"status.CapAmb": "0000000000000000", "status.NoNewPrivs": "1", "status.Seccomp": "2",
	"socket.packet": "EPERM", "socket.packet-dgram": "EPERM", "socket.packet-high": "EPERM", "socket.raw": "EPERM",
	"socket.raw-high": "EPERM", "socket.raw6": "EPERM", "socket.sockpacket": "EPERM",
	"mknodat.chr": "EPERM", "mknodat.blk": "EPERM", "mknodat.chr-high": "EPERM",
	"ioctl.tiocsti": "EPERM", "ioctl.tiocsti-high": "EPERM", "ioctl.tioclinux": "EPERM", "ioctl.tioclinux-high": "EPERM",
	"io_uring_setup": "EPERM", "unshare.user": "EPERM", "clone3": "ENOSYS", "keyctl": "EPERM", "add_key": "EPERM",
	"bpf": "EPERM", "perf_event_open": "EPERM", "mount": "EPERM", "fsopen": "EPERM", "finit_module": "EPERM",
	"ptrace.seize": "EPERM", "ptrace.attach": "EPERM", "process_vm_readv": "EPERM", "pidfd_getfd": "EPERM",
	// Ordinary work.
	"socket.netlink": "ok", "socket.unix": "ok", "socket.tcp": "ok", "socket.tcp6": "ok",
	"mknodat.fifo": "ok", "ioctl.fionread": "ok", "sh": "ok",
}

func init() {
	if sysMknod >= 0 {
		deniedAlways["mknod.chr"] = "EPERM"
	}
	if x32Bit != 0 {
		deniedAlways["x32"] = "EPERM"
	}
}
