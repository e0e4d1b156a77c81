// Package confine confines a room's agent, and everything it starts, to
// what that room may touch: Landlock for files, TCP ports, signals and
// abstract unix sockets (the system read-only, the installed agents read
// and execute, the room's own workspace, agent home and temporary folder
// read and write), no capability and no_new_privs, a seccomp filter for
// what Landlock does not mediate (raw and packet sockets, device nodes,
// terminal input injection, keys, BPF, mounts, io_uring, user namespaces;
// MPTCP and, unless DNS is allowed, UDP when the network is restricted),
// no terminal, and, when the server runs as root, a uid of the room's own.
//
// A restriction must be in place before the agent runs and covers its
// descendants, so it is applied by a launcher: the host's own program
// re-executed (Launch, called first in main and in a test binary's
// TestMain) that restricts itself and then executes the agent. Wrap turns
// an agent's command line into the launcher's. The policy travels to the
// launcher in the environment (PolicyEnv), which the launcher removes.
//
// The rules are given as absolute, canonical paths, and the launcher binds
// each to what it opened itself without following any link (a path that
// names a link, or passes through one, is refused, never followed); the
// room's own folders must be real folders of the agent's owner. A path
// the agent could have swapped between the server's check and the
// launcher's open therefore gets the agent nothing. An agent started ahead
// of its room is confined to its slot's own folders; renaming those into a
// new room's place (the host does it, on the same file system) hands the
// confined agent that room and nothing else. A room that already has
// folders needs a freshly started agent.
package confine

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/agenthost/agenthost/internal/agentfs"
)

// Mode is the --confine setting.
type Mode string

// Modes.
const (
	// ModeAuto confines with Landlock when the kernel has it, and runs
	// unconfined with a warning otherwise.
	ModeAuto Mode = "auto"
	// ModeLandlock confines with Landlock, and refuses to start where the
	// kernel lacks it.
	ModeLandlock Mode = "landlock"
	// ModeOff runs agents unconfined.
	ModeOff Mode = "off"
)

// ParseMode reads a --confine value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeLandlock, ModeOff:
		return m, nil
	case "":
		return ModeAuto, nil
	}
	return "", fmt.Errorf("confine: mode %q: want auto, landlock or off", s)
}

// ParseNet reads a --confine-net value: "any" (nil: the network is not
// restricted) or a comma list of TCP ports the agents may connect to.
func ParseNet(s string) ([]uint16, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "any" {
		return nil, nil
	}
	ports := []uint16{}
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 16)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("confine: net %q: want any, or TCP ports (1-65535) separated by commas", s)
		}
		ports = append(ports, uint16(n))
	}
	return sortPorts(ports), nil
}

// MaxABI is the highest Landlock ABI whose rights agenthost uses: later
// ABIs (pathname unix sockets, UDP) are not restricted yet.
const MaxABI = 7

// Landlock ABIs that bring what a policy uses.
const (
	abiRefer   = 2 // renaming and linking between folders
	abiNet     = 4 // TCP bind and connect
	abiIoctl   = 5 // ioctl on devices
	abiScoping = 6 // signals and abstract unix sockets
)

// ErrUnsupported is returned by New for ModeLandlock on a kernel without
// Landlock (or without what the network policy needs).
var ErrUnsupported = errors.New("confine: the kernel cannot enforce this confinement")

// Options configure a Confiner. The zero value confines with Landlock
// where the kernel has it (ModeAuto), the network left open.
type Options struct {
	Mode Mode
	// Net is nil for any network, else the TCP ports agents may connect
	// to (bind is then denied); Ports are added to them (the built-in
	// model's).
	Net, Ports []uint16
	// Tools is the installed agents' folder (read and execute).
	Tools string
	// Exe is the launcher: this program, which must call Launch first
	// in main (default: os.Executable).
	Exe string
	// KernelABI reports the kernel's Landlock ABI (default: the
	// running kernel's; tests simulate others).
	KernelABI func() int
	// AgentUIDs is the range of uids (and gids) rooms' agents run as,
	// one each, when the server runs as root (see RoomUser); the zero
	// range: agents run as the server's own user.
	AgentUIDs UIDRange
	// Read are folders every agent may read, never write or execute
	// (serve --confine-read: a custom agent's interpreter installed in a
	// user's home); absolute and existing. The caller keeps the server's
	// own folders out of it (see CheckRead).
	Read []string
}

// UIDRange is an inclusive range of uids.
type UIDRange struct{ First, Last int }

// User is a uid and gid an agent runs as instead of the server's own.
type User struct {
	UID int `json:"uid"`
	GID int `json:"gid"`

	// file is the room's agent-uid file (RoomUser's; "" for a User made
	// otherwise), owned whether the room's folders were given to the uid
	// whole since it was allocated (see ownFolders).
	file  string
	owned bool
}

// Owner is the owner of what the server writes into the agent's folders
// (nil for a nil User: the server's user).
func (u *User) Owner() *agentfs.Owner {
	if u == nil {
		return nil
	}
	return &agentfs.Owner{UID: u.UID, GID: u.GID}
}

// Confiner builds each agent's confinement from the server's settings. It
// is immutable after New (but for the rooms' uids, which RoomUser
// allocates under its own lock) and safe for concurrent use; a nil
// *Confiner confines nothing.
type Confiner struct {
	opts    Options
	kernel  int // the kernel's ABI
	abi     int // min(kernel, MaxABI), the rules in force; 0 when not enforced
	warning string
	euid    int        // the server's (tests pretend)
	users   *roomUsers // nil: the range is empty
}

// New resolves opts.Mode on this kernel: ModeAuto falls back to none (see
// Warning), ModeLandlock fails with ErrUnsupported.
func New(opts Options) (*Confiner, error) {
	mode, err := ParseMode(string(opts.Mode))
	if err != nil {
		return nil, err
	}
	opts.Mode = mode
	if opts.KernelABI == nil {
		opts.KernelABI = KernelABI
	}
	if opts.Net != nil {
		opts.Net = sortPorts(append(slices.Clone(opts.Net), opts.Ports...))
	}
	c := &Confiner{opts: opts, kernel: opts.KernelABI(), euid: os.Geteuid()}
	if !opts.AgentUIDs.Empty() {
		if _, err := ParseUIDs(opts.AgentUIDs.String()); err != nil {
			return nil, err
		}
		c.users = &roomUsers{rng: opts.AgentUIDs}
	}
	if mode == ModeOff {
		return c, nil
	}
	switch {
	case c.kernel < 1 && mode == ModeLandlock:
		return nil, fmt.Errorf("%w: --confine landlock, and this kernel has no Landlock (it needs Linux 5.13 or later with Landlock enabled)", ErrUnsupported)
	case c.kernel < 1:
		c.warning = "this kernel has no Landlock: the rooms' agents run unconfined (--confine landlock refuses to start instead)"
		return c, nil
	case opts.Net != nil && c.kernel < abiNet && mode == ModeLandlock:
		return nil, fmt.Errorf("%w: --confine-net needs Landlock ABI %d, this kernel has %d", ErrUnsupported, abiNet, c.kernel)
	case opts.Net != nil && c.kernel < abiNet:
		c.warning = fmt.Sprintf("Landlock ABI %d cannot restrict the network (ABI %d): --confine-net is not enforced", c.kernel, abiNet)
		c.opts.Net = nil
	}
	if c.opts.Exe == "" {
		if c.opts.Exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("confine: the launcher: %w", err)
		}
	}
	// The launcher opens rule paths without following links: the tools
	// folder's are resolved once, here.
	if c.opts.Tools != "" {
		if t, err := filepath.Abs(c.opts.Tools); err == nil {
			c.opts.Tools = t
		}
		if t, err := filepath.EvalSymlinks(c.opts.Tools); err == nil {
			c.opts.Tools = t
		}
	}
	c.opts.Read = nil
	for _, d := range opts.Read {
		real, err := readFolder(d)
		if err != nil {
			return nil, err
		}
		c.opts.Read = append(c.opts.Read, real)
	}
	c.abi = min(c.kernel, MaxABI)
	return c, nil
}

// readFolder is d, a folder every agent may read, absolute with its links
// resolved (the launcher follows none).
func readFolder(d string) (string, error) {
	if !filepath.IsAbs(d) {
		return "", fmt.Errorf("confine: the read-only folder %q is not absolute", d)
	}
	real, err := filepath.EvalSymlinks(d)
	if err != nil {
		return "", fmt.Errorf("confine: the read-only folder: %w", err)
	}
	if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("confine: the read-only folder %s is not a folder", d)
	}
	return real, nil
}

// CheckRead refuses a folder every agent would read (Options.Read) that is,
// holds or lies in one of private (the server's data dir, the rooms'
// workspaces): read access there would show each room every other room.
func CheckRead(dirs, private []string) error {
	for _, d := range dirs {
		real, err := readFolder(d)
		if err != nil {
			return err
		}
		for _, p := range private {
			pr, err := filepath.Abs(p)
			if err != nil {
				return err
			}
			if r, err := filepath.EvalSymlinks(pr); err == nil {
				pr = r
			}
			if under(real, []string{pr}) || under(pr, []string{real}) {
				return fmt.Errorf("confine: the read-only folder %s would show the agents %s, the server's own", d, p)
			}
		}
	}
	return nil
}

// Reads reports whether p lets the agent read path (an absolute path, its
// links resolved): a rule covers it. A nil policy reads everything.
func (p *Policy) Reads(path string) bool {
	if p == nil {
		return true
	}
	for _, r := range p.Rules {
		if under(path, []string{r.Path}) {
			return true
		}
	}
	return false
}

// Enforced reports whether agents run confined.
func (c *Confiner) Enforced() bool { return c != nil && c.abi > 0 }

// Warning says why ModeAuto (or the network policy) is not enforced; "" when
// everything asked for is.
func (c *Confiner) Warning() string {
	if c == nil {
		return ""
	}
	return c.warning
}

// Report is what confines the agents, as rooms show it:
// {"mode": "landlock"|"none", "abi": N, "signals": bool, "net": "any"|[ports]}.
type Report struct {
	// Mode is "landlock" or "none".
	Mode string
	// ABI is the Landlock ABI whose rules are in force (landlock), or the
	// highest this kernel would allow (none; 0 without Landlock).
	ABI int
	// Signals: signals and abstract unix sockets are scoped to the room's
	// own processes (ABI 6).
	Signals bool
	// Net is nil for any network, else the TCP ports agents may connect to.
	Net []uint16
}

// Report modes.
const (
	ReportLandlock = "landlock"
	ReportNone     = "none"
)

// MarshalJSON writes the contract's shape.
func (r Report) MarshalJSON() ([]byte, error) {
	var net any = "any"
	if r.Net != nil {
		net = r.Net
	}
	return json.Marshal(struct {
		Mode    string `json:"mode"`
		ABI     int    `json:"abi"`
		Signals bool   `json:"signals"`
		Net     any    `json:"net"`
	}{r.Mode, r.ABI, r.Signals, net})
}

// Report is the server-wide confinement (an agent's adds its own ports).
func (c *Confiner) Report() Report {
	if !c.Enforced() {
		abi := 0
		if c != nil {
			abi = min(c.kernel, MaxABI)
		} else {
			abi = min(KernelABI(), MaxABI)
		}
		return Report{Mode: ReportNone, ABI: max(abi, 0)}
	}
	return Report{Mode: ReportLandlock, ABI: c.abi, Signals: c.abi >= abiScoping, Net: c.opts.Net}
}

// Room is what one agent may use besides the system and the tools.
type Room struct {
	// Workspace and Home are read and written (absolute, existing; no
	// Home: "").
	Workspace, Home string
	// Tmp is the agent's TMPDIR (created if missing, a folder of the
	// agent's owner), read and written; FreshTmp empties it first. Its
	// parent must be a folder the agent cannot write (see AgentRoom).
	Tmp      string
	FreshTmp bool
	// Exec are more executable files the agent may run (the agent's own
	// command, the room's MCP servers), looked up on PATH: each must be a
	// regular file with an execute bit, which the agent may then read and
	// execute (the kernel reads what it executes), nothing beside it.
	Exec []string
	// Ports are more TCP ports the agent may connect to (the room's
	// tools), when the network is restricted.
	Ports []uint16
	// Read are more folders the agent may read, never write or execute
	// (a git workspace's shared objects); absolute and existing.
	Read []string
	// User, when set, is who the agent runs as (see RoomUser): its
	// workspace, home and TMPDIR are its own; nil: the server's user.
	User *User
}

// AgentRoom is the Room of a room's agent: its workspace and home, a
// TMPDIR emptied at each start, the commands it runs (its own, its MCP
// servers') and the ports it reaches (the room's tools).
//
// The TMPDIR is "tmp" beside the home, in the home's parent: that must be
// the room's own folder, which the server owns and the agent cannot write
// (Landlock grants it nothing there), so the agent can empty its TMPDIR
// but never rename or replace it, and the name is the same at every start
// (an attached agent's launch is compared with the one it had).
func AgentRoom(workspace, home string, exec []string, ports []uint16) Room {
	return Room{Workspace: workspace, Home: home, Tmp: agentTmp(home), FreshTmp: true, Exec: exec, Ports: ports}
}

// agentTmp is the TMPDIR AgentRoom gives the agent whose home is home.
func agentTmp(home string) string { return filepath.Join(filepath.Dir(home), "tmp") }

// Access is what a rule allows.
type Access string

// Accesses.
const (
	// AccessRead: read files, list folders.
	AccessRead Access = "r"
	// AccessReadExec: AccessRead and execute files.
	AccessReadExec Access = "rx"
	// AccessReadWrite: everything on files and folders beneath, executing,
	// renaming and linking within and between such folders included,
	// but making a device node.
	AccessReadWrite Access = "rw"
)

// Rule allows Access beneath Path.
type Rule struct {
	Path   string `json:"path"`
	Access Access `json:"access"`
	// Optional: a Path that does not exist is skipped.
	Optional bool `json:"optional,omitempty"`
	// Own: one of the room's own folders (workspace, home, TMPDIR),
	// which must be a folder owned by the agent's user (Policy.User's
	// uid, else the launcher's).
	Own bool `json:"own,omitempty"`
}

// Policy is one agent's confinement, as the launcher applies it.
type Policy struct {
	// ABI is the Landlock ABI whose rights are handled.
	ABI   int    `json:"abi"`
	Rules []Rule `json:"rules"`
	// Net is nil for any network, else the TCP ports connect may reach
	// (bind is denied).
	Net []uint16 `json:"net"`
	// Tmp is the agent's TMPDIR.
	Tmp string `json:"tmp"`
	// User, when set, is the uid and gid the launcher switches to
	// before it executes the agent (the launcher must run as root); it
	// then has no supplementary group.
	User *User `json:"user,omitempty"`

	exe string
}

// System are the folders every agent reads and executes (those missing
// are skipped).
var System = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt"}

// Kernel are the folders every agent reads, never executes.
var Kernel = []string{"/proc", "/sys"}

// Devices are the device nodes every agent reads and writes (those
// missing are skipped). No terminal: an agent's stdio are pipes, and a
// terminal an agent could open is someone's (the operator's shell).
var Devices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"}

// Policy builds the agent's policy for r; nil (and no error) when agents
// run unconfined. It creates r.Tmp (emptied first with r.FreshTmp), a
// folder of r.User's when set, and copies r.User into the policy.
func (c *Confiner) Policy(r Room) (*Policy, error) {
	if !c.Enforced() {
		return nil, nil
	}
	// The launcher may run elsewhere (the process daemon) and opens each
	// path without following links: absolute and canonical. The links of
	// the folders holding the room's own (the server's folders) are
	// resolved here; the room's own folder itself never is (the agent
	// may have made it a link, which the launcher refuses).
	var own []string
	for _, f := range []struct{ what, path string }{{"workspace", r.Workspace}, {"TMPDIR", r.Tmp}, {"home", r.Home}} {
		if f.path == "" && f.what == "home" {
			continue
		}
		d, err := canonical(f.path)
		if err != nil {
			return nil, fmt.Errorf("confine: the agent's %s %q: %w", f.what, f.path, err)
		}
		own = append(own, d)
	}
	tmp := own[1]
	if err := prepareTmp(tmp, r.FreshTmp, r.User); err != nil {
		return nil, fmt.Errorf("confine: the agent's TMPDIR %s: %w", tmp, err)
	}
	for _, d := range own {
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("confine: %s is not a folder", d)
		}
	}
	p := &Policy{ABI: c.abi, Tmp: tmp, exe: c.opts.Exe}
	if r.User != nil {
		// The agent's own folders are its uid's (everything beneath too,
		// the first time: a room from before it had one).
		if err := ownFolders(r.User, own...); err != nil {
			return nil, err
		}
		u := *r.User
		p.User = &u
	}
	add := func(a Access, optional bool, paths ...string) {
		for _, path := range paths {
			p.Rules = append(p.Rules, Rule{Path: path, Access: a, Optional: optional})
		}
	}
	system := existing(System)
	add(AccessReadExec, true, system...)
	add(AccessRead, true, existing(Kernel)...)
	add(AccessReadWrite, true, existing(Devices)...)
	// /etc/resolv.conf is often a link into /run, which is not read.
	if t, err := filepath.EvalSymlinks("/etc/resolv.conf"); err == nil && !under(t, system) {
		add(AccessRead, true, t)
	}
	if c.opts.Tools != "" {
		add(AccessReadExec, false, c.opts.Tools)
	}
	for _, d := range c.opts.Read {
		add(AccessRead, false, d)
	}
	for _, e := range r.Exec {
		path, err := executable(e)
		if err != nil {
			return nil, err
		}
		if !under(path, system) && !(c.opts.Tools != "" && under(path, []string{c.opts.Tools})) {
			add(AccessReadExec, false, path)
		}
	}
	for _, d := range r.Read {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("confine: the agent's read-only folder %q is not absolute", d)
		}
		real, err := filepath.EvalSymlinks(d)
		if err != nil {
			return nil, fmt.Errorf("confine: the agent's read-only folder: %w", err)
		}
		add(AccessRead, false, real)
	}
	for _, d := range own {
		p.Rules = append(p.Rules, Rule{Path: d, Access: AccessReadWrite, Own: true})
	}
	if c.opts.Net != nil {
		p.Net = sortPorts(append(slices.Clone(c.opts.Net), r.Ports...))
	}
	return p, nil
}

// canonical is path absolute, with the links of the folders above it
// resolved and its own last element kept as it is.
func canonical(path string) (string, error) {
	if path == "" {
		return "", errors.New("no path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if abs == "/" {
		return abs, nil
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, filepath.Base(abs)), nil
}

// existing is paths with their links resolved, those missing left out,
// and those beneath one already listed too (merged-/usr systems' /bin is
// /usr/bin).
func existing(paths []string) []string {
	var out []string
	for _, path := range paths {
		real, err := filepath.EvalSymlinks(path)
		if err != nil || under(real, out) {
			continue
		}
		out = append(out, real)
	}
	return out
}

// executable resolves a command name (on PATH) to its file, links
// followed: a regular file with an execute bit (exec.LookPath checks it),
// so that naming a private file makes it no command and no rule.
func executable(name string) (string, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("confine: %w", err)
	}
	if path, err = filepath.Abs(path); err != nil {
		return "", fmt.Errorf("confine: %w", err)
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", fmt.Errorf("confine: %w", err)
	}
	return real, nil
}

// under reports whether path is one of dirs or beneath one.
func under(path string, dirs []string) bool {
	for _, d := range dirs {
		if path == d || strings.HasPrefix(path, strings.TrimSuffix(d, "/")+"/") {
			return true
		}
	}
	return false
}

// Report is the agent's confinement as rooms show it (nil policy: none).
func (p *Policy) Report() Report {
	if p == nil {
		return Report{Mode: ReportNone, ABI: min(max(KernelABI(), 0), MaxABI)}
	}
	return Report{Mode: ReportLandlock, ABI: p.ABI, Signals: p.ABI >= abiScoping, Net: p.Net}
}

// PolicyEnv carries the policy (JSON) to the launcher, which removes it.
const PolicyEnv = "AGENTHOST_CONFINE_POLICY"

// LauncherArg, as a program's first argument, makes Launch the launcher:
// PROGRAM LauncherArg -- COMMAND ARGS...
const LauncherArg = "confine-exec"

// Wrap returns the command line and environment that run argv confined by
// p: the launcher with the policy, then argv[0] (resolved on this
// process's PATH, as exec.Command does) and its arguments. env (nil: this
// process's) gets TMPDIR. A nil policy returns argv and env as given.
func (p *Policy) Wrap(argv, env []string) ([]string, []string, error) {
	if p == nil {
		return argv, env, nil
	}
	if len(argv) == 0 {
		return nil, nil, errors.New("confine: empty command")
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, nil, fmt.Errorf("confine: %w", err)
	}
	if path, err = filepath.Abs(path); err != nil {
		return nil, nil, fmt.Errorf("confine: %w", err)
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, nil, fmt.Errorf("confine: %w", err)
	}
	if env == nil {
		env = os.Environ()
	}
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if name != "TMPDIR" && name != PolicyEnv {
			out = append(out, kv)
		}
	}
	out = append(out, "TMPDIR="+p.Tmp, PolicyEnv+"="+string(b))
	args := append([]string{p.exe, LauncherArg, "--", path}, argv[1:]...)
	return args, out, nil
}

func sortPorts(ports []uint16) []uint16 {
	slices.Sort(ports)
	return slices.Compact(ports)
}

// Enforces says, one line each, what a confined agent is held to on a
// kernel of Landlock ABI abi (nothing below 1) on this architecture.
func Enforces(abi int) []string {
	if abi < 1 {
		return nil
	}
	out := []string{
		"files: the room's workspace, agent home and TMPDIR read and written (no device node made there); the system and the agents' folder read (and executed); /proc and /sys read; nothing else; each rule bound to the folder the launcher opened itself, a link refused",
		"terminals: none (no /dev/tty, /dev/ptmx or /dev/pts)",
		"privilege: no capability (effective, permitted, inheritable, ambient; as root also the bounding set, and securebits locked so that uid 0 gains none by executing) and no_new_privs; as root each room's agent runs as a uid of its own (serve --agent-uids), in a view of only its own folders where the server's are closed to it and of only its own processes in /proc, and with an IPC namespace of its own (SysV IPC and POSIX message queues: none of the host's, and what it makes goes with it)",
	}
	if seccompSupported {
		out = append(out, "seccomp: refused (EPERM): AF_PACKET, raw and packet sockets; mknod of devices; TIOCSTI, TIOCLINUX; keyctl, add_key, request_key; bpf; perf_event_open; kexec; kernel modules; mount, umount, pivot_root and the new mount API; io_uring; user namespaces (clone3 answers ENOSYS); ptrace attach, process_vm_readv/writev and pidfd_getfd (within the room too); other architectures' and x32 syscalls")
	} else {
		out = append(out, "seccomp: none on this architecture (amd64 and arm64 only): raw and packet sockets and device nodes still need capabilities the agent lacks, but io_uring, user namespaces, TIOCSTI, MPTCP and UDP are not refused")
	}
	if abi < abiRefer {
		out = append(out, "renaming or linking between folders fails with EXDEV (ABI 2 allows it within the room's folders)")
	}
	if abi < 3 {
		out = append(out, "truncating a file the agent may read is not restricted (ABI 3)")
	}
	switch {
	case abi >= abiNet && seccompSupported:
		out = append(out, "network: any, or with --confine-net PORTS TCP connect to those ports only and no TCP bind; then sockets are unix, netlink and IPv4/IPv6 TCP only (no MPTCP, SCTP, ICMP or raw), and UDP only when 53 is among the ports (DNS; then UDP to any port)")
	case abi >= abiNet:
		out = append(out, "network: any, or with --confine-net PORTS TCP connect to those ports only and no TCP bind (UDP and MPTCP are not restricted on this architecture)")
	default:
		out = append(out, "network: not restricted (ABI 4); --confine-net is refused by landlock, ignored with a warning by auto")
	}
	if abi >= abiIoctl {
		out = append(out, "device ioctls: none")
	}
	if abi >= abiScoping {
		out = append(out, "signals and abstract unix sockets: the room's own processes only (not the server, not other rooms)")
	} else {
		out = append(out, "signals and abstract unix sockets: not scoped (ABI 6)")
	}
	return out
}
