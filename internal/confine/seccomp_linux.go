//go:build linux && (amd64 || arm64)

package confine

import (
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The seccomp filter closes what Landlock does not mediate: it is
// assembled here, with exact comparisons of the low 32 bits of the
// arguments the kernel reads as int or unsigned int (socket's domain,
// type and protocol, ioctl's request, mknod's mode): the kernel truncates
// those to 32 bits, so a filter comparing all 64 would let a caller set a
// high bit and pass (the libraries we could use compare all 64).

const seccompSupported = true

// Denied syscalls fail with EPERM; clone3 with ENOSYS, so that the C
// library falls back to clone, whose flags the filter can read (clone3's
// are in memory it cannot).
var seccompDenied = []struct {
	name string
	nr   int
}{
	{"keyctl", unix.SYS_KEYCTL}, {"add_key", unix.SYS_ADD_KEY}, {"request_key", unix.SYS_REQUEST_KEY},
	{"bpf", unix.SYS_BPF}, {"perf_event_open", unix.SYS_PERF_EVENT_OPEN},
	{"kexec_load", unix.SYS_KEXEC_LOAD}, {"kexec_file_load", unix.SYS_KEXEC_FILE_LOAD},
	{"init_module", unix.SYS_INIT_MODULE}, {"finit_module", unix.SYS_FINIT_MODULE}, {"delete_module", unix.SYS_DELETE_MODULE},
	{"mount", unix.SYS_MOUNT}, {"umount2", unix.SYS_UMOUNT2}, {"pivot_root", unix.SYS_PIVOT_ROOT},
	{"fsopen", unix.SYS_FSOPEN}, {"fsmount", unix.SYS_FSMOUNT}, {"fsconfig", unix.SYS_FSCONFIG}, {"fspick", unix.SYS_FSPICK},
	{"move_mount", unix.SYS_MOVE_MOUNT}, {"open_tree", unix.SYS_OPEN_TREE}, {"open_tree_attr", unix.SYS_OPEN_TREE_ATTR},
	{"mount_setattr", unix.SYS_MOUNT_SETATTR},
	// io_uring makes sockets (and opens files) without the syscalls
	// this filter reads.
	{"io_uring_setup", unix.SYS_IO_URING_SETUP}, {"io_uring_enter", unix.SYS_IO_URING_ENTER}, {"io_uring_register", unix.SYS_IO_URING_REGISTER},
	// Another process's memory and descriptors (see ptrace below).
	{"process_vm_readv", unix.SYS_PROCESS_VM_READV}, {"process_vm_writev", unix.SYS_PROCESS_VM_WRITEV},
	{"pidfd_getfd", unix.SYS_PIDFD_GETFD},
}

// seccomp_data's layout: nr (int), arch (u32), ip (u64), args (6 x u64).
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// argLow is the offset of argument i's low 32 bits (little-endian, as
// amd64 and arm64 are).
func argLow(i int) uint32 { return offArgs + 8*uint32(i) }

// Socket and terminal constants, the same on amd64 and arm64.
const (
	sockTypeMask = 0xf // type & SOCK_TYPE_MASK, the rest is SOCK_NONBLOCK|SOCK_CLOEXEC
	dnsPort      = 53
)

// seccompFilter is p's filter: every item of the package doc, and with a
// restricted network (p.Net set) socket() limited to unix, netlink, and
// IPv4/IPv6 TCP (protocol 0 or TCP: not MPTCP, SCTP or anything else),
// plus IPv4/IPv6 UDP (protocol 0 or UDP) when port 53 is allowed (DNS;
// then UDP to any port, as seccomp cannot see the port).
func seccompFilter(p *Policy) ([]unix.SockFilter, error) {
	var a bpfAsm
	eperm := uint32(unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)&unix.SECCOMP_RET_DATA)
	enosys := uint32(unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)&unix.SECCOMP_RET_DATA)
	allow := uint32(unix.SECCOMP_RET_ALLOW)

	// Another architecture's syscalls (i386 on amd64, arm32 on arm64)
	// have other numbers: all refused.
	a.ld(offArch)
	a.jeq(auditArch, "", "eperm")
	a.ld(offNr)
	if x32Bit != 0 {
		// x32 syscalls: the native arch with this bit in the number.
		a.jge(x32Bit, "eperm", "")
	}
	for _, s := range seccompDenied {
		a.jeq(uint32(s.nr), "eperm", "")
	}
	a.jeq(unix.SYS_CLONE3, "enosys", "")
	a.jeq(unix.SYS_SOCKET, "socket", "")
	a.jeq(unix.SYS_IOCTL, "ioctl", "")
	a.jeq(unix.SYS_MKNODAT, "mknodat", "")
	if nr := sysMknod; nr >= 0 {
		a.jeq(uint32(nr), "mknod", "")
	}
	a.jeq(unix.SYS_CLONE, "newuser", "")
	a.jeq(unix.SYS_UNSHARE, "newuser", "")
	a.jeq(unix.SYS_PTRACE, "ptrace", "")
	a.ret(allow)

	// socket(domain, type, protocol)
	a.label("socket")
	a.ld(argLow(0))
	a.jeq(unix.AF_PACKET, "eperm", "")
	a.ld(argLow(1))
	a.and(sockTypeMask)
	a.jeq(unix.SOCK_PACKET, "eperm", "")
	a.jeq(unix.SOCK_RAW, "", "socket-ok")
	// Netlink's ordinary type is SOCK_RAW (getifaddrs uses it).
	a.ld(argLow(0))
	a.jeq(unix.AF_NETLINK, "socket-ok", "eperm")
	a.label("socket-ok")
	if p.Net == nil {
		a.ret(allow)
	} else {
		a.ld(argLow(2))
		a.jeq(unix.IPPROTO_MPTCP, "eperm", "")
		a.ld(argLow(0))
		a.jeq(unix.AF_UNIX, "allow", "")
		a.jeq(unix.AF_NETLINK, "allow", "")
		a.jeq(unix.AF_INET, "inet", "")
		a.jeq(unix.AF_INET6, "inet", "eperm")
		a.label("inet")
		a.ld(argLow(1))
		a.and(sockTypeMask)
		if slices.Contains(p.Net, dnsPort) {
			a.jeq(unix.SOCK_DGRAM, "udp", "")
		}
		a.jeq(unix.SOCK_STREAM, "", "eperm")
		a.ld(argLow(2))
		a.jeq(0, "allow", "")
		a.jeq(unix.IPPROTO_TCP, "allow", "eperm")
		if slices.Contains(p.Net, dnsPort) {
			a.label("udp")
			a.ld(argLow(2))
			a.jeq(0, "allow", "")
			a.jeq(unix.IPPROTO_UDP, "allow", "eperm")
		}
	}

	// ioctl(fd, request): typing into a terminal, and the console's
	// own commands (which include reading its screen).
	a.label("ioctl")
	a.ld(argLow(1))
	a.jeq(unix.TIOCSTI, "eperm", "")
	a.jeq(unix.TIOCLINUX, "eperm", "allow")

	// mknod(path, mode, dev), mknodat(dirfd, path, mode, dev): no
	// character or block device (mode is 16 bits for the kernel; S_IFMT
	// is within them).
	a.label("mknodat")
	a.ld(argLow(2))
	a.ja("mknod-mode")
	if nr := sysMknod; nr >= 0 {
		a.label("mknod")
		a.ld(argLow(1))
	}
	a.label("mknod-mode")
	a.and(unix.S_IFMT)
	a.jeq(unix.S_IFCHR, "eperm", "")
	a.jeq(unix.S_IFBLK, "eperm", "allow")

	// clone(flags, ...), unshare(flags): no user namespace (which would
	// give the agent capabilities over namespaces of its own, and the
	// kernel surface they open).
	a.label("newuser")
	a.ld(argLow(0))
	a.jset(unix.CLONE_NEWUSER, "eperm", "allow")

	// ptrace(request, pid, ...): no process of the room attaches to
	// another, the room's agent above all (same uid, same Landlock
	// domain): it would take the agent's channel to the host (its stdio
	// sockets) and so answer the room's approvals. PTRACE_TRACEME, a
	// child offering itself to its parent, stays. request is a long;
	// refusing on the low 32 bits alone refuses more, never less.
	a.label("ptrace")
	a.ld(argLow(0))
	a.jeq(unix.PTRACE_ATTACH, "eperm", "")
	a.jeq(unix.PTRACE_SEIZE, "eperm", "allow")

	a.label("allow")
	a.ret(allow)
	a.label("eperm")
	a.ret(eperm)
	a.label("enosys")
	a.ret(enosys)
	return a.assemble()
}

// installSeccomp installs filter on the calling thread (the launcher's
// locked one, which then executes the agent); no_new_privs must be set.
func installSeccomp(filter []unix.SockFilter) error {
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog)))
	runtime.KeepAlive(filter)
	if errno != 0 {
		return fmt.Errorf("installing the seccomp filter: %w", errno)
	}
	return nil
}

// bpfAsm assembles classic BPF with forward jumps to labels ("" is the
// next instruction).
type bpfAsm struct {
	ins    []bpfIns
	labels map[string]int
}

type bpfIns struct {
	code   uint16
	k      uint32
	jt, jf string
	ja     string
}

func (a *bpfAsm) add(i bpfIns) { a.ins = append(a.ins, i) }

func (a *bpfAsm) label(name string) {
	if a.labels == nil {
		a.labels = map[string]int{}
	}
	a.labels[name] = len(a.ins)
}

func (a *bpfAsm) ld(off uint32) { a.add(bpfIns{code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, k: off}) }
func (a *bpfAsm) and(k uint32)  { a.add(bpfIns{code: unix.BPF_ALU | unix.BPF_AND | unix.BPF_K, k: k}) }
func (a *bpfAsm) ret(k uint32)  { a.add(bpfIns{code: unix.BPF_RET | unix.BPF_K, k: k}) }
func (a *bpfAsm) ja(to string)  { a.add(bpfIns{code: unix.BPF_JMP | unix.BPF_JA, ja: to}) }
func (a *bpfAsm) jeq(k uint32, jt, jf string) {
	a.add(bpfIns{code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, k: k, jt: jt, jf: jf})
}
func (a *bpfAsm) jge(k uint32, jt, jf string) {
	a.add(bpfIns{code: unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K, k: k, jt: jt, jf: jf})
}
func (a *bpfAsm) jset(k uint32, jt, jf string) {
	a.add(bpfIns{code: unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K, k: k, jt: jt, jf: jf})
}

// assemble resolves the labels: each jump goes forward, within 255
// instructions for a conditional one.
func (a *bpfAsm) assemble() ([]unix.SockFilter, error) {
	out := make([]unix.SockFilter, len(a.ins))
	offset := func(pc int, to string, limit int) (int, error) {
		if to == "" {
			return 0, nil
		}
		t, ok := a.labels[to]
		if !ok {
			return 0, fmt.Errorf("seccomp filter: no label %q", to)
		}
		d := t - pc - 1
		if d < 0 || d > limit {
			return 0, fmt.Errorf("seccomp filter: jump from %d to %q (%d) out of range", pc, to, t)
		}
		return d, nil
	}
	for pc, in := range a.ins {
		f := unix.SockFilter{Code: in.code, K: in.k}
		if in.code == unix.BPF_JMP|unix.BPF_JA {
			d, err := offset(pc, in.ja, 1<<31)
			if err != nil {
				return nil, err
			}
			f.K = uint32(d)
		} else if in.code&0x07 == unix.BPF_JMP {
			jt, err := offset(pc, in.jt, 255)
			if err != nil {
				return nil, err
			}
			jf, err := offset(pc, in.jf, 255)
			if err != nil {
				return nil, err
			}
			f.Jt, f.Jf = uint8(jt), uint8(jf)
		}
		out[pc] = f
	}
	if len(out) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp filter: %d instructions", len(out))
	}
	return out, nil
}
