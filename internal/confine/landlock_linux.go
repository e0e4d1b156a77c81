package confine

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// KernelABI returns the running kernel's Landlock ABI (0: none, or
// disabled at boot).
func KernelABI() int {
	v, err := ll.LandlockGetABIVersion()
	if err != nil {
		return 0
	}
	return v
}

// configs are go-landlock's presets by ABI (index 0 is ABI 1), each
// handling every right of its ABI.
var configs = []landlock.Config{landlock.V1, landlock.V2, landlock.V3, landlock.V4, landlock.V5, landlock.V6, landlock.V7}

// fileRights are the rights that apply to files (the rest are folders').
const fileRights = ll.AccessFSExecute | ll.AccessFSWriteFile | ll.AccessFSReadFile | ll.AccessFSTruncate | ll.AccessFSIoctlDev

// rights are each Access's rights on a folder (fileRights of them on a
// file). Read-write folders get no device nodes (MakeChar, MakeBlock).
var rights = map[Access]uint64{
	AccessRead:     ll.AccessFSReadFile | ll.AccessFSReadDir,
	AccessReadExec: ll.AccessFSReadFile | ll.AccessFSReadDir | ll.AccessFSExecute,
	AccessReadWrite: ll.AccessFSExecute | ll.AccessFSWriteFile | ll.AccessFSReadFile | ll.AccessFSReadDir |
		ll.AccessFSRemoveDir | ll.AccessFSRemoveFile | ll.AccessFSMakeDir | ll.AccessFSMakeReg |
		ll.AccessFSMakeSock | ll.AccessFSMakeFifo | ll.AccessFSMakeSym | ll.AccessFSRefer | ll.AccessFSTruncate,
}

// openedRule is a rule with what the launcher opened for it.
type openedRule struct {
	Rule
	fd  int // O_PATH
	dir bool
}

// openRules opens each rule's path without following links (see
// openNoLinks); the room's own folders must be folders of owner. A
// missing optional path is left out.
func openRules(p *Policy, owner int) ([]openedRule, error) {
	var out []openedRule
	for _, r := range p.Rules {
		if _, ok := rights[r.Access]; !ok {
			return nil, fmt.Errorf("rule for %s: unknown access %q", r.Path, r.Access)
		}
		fd, err := openNoLinks(r.Path, r.Own)
		if errors.Is(err, unix.ENOENT) && r.Optional {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("rule for %s: %w", r.Path, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("rule for %s: %w", r.Path, err)
		}
		o := openedRule{Rule: r, fd: fd, dir: st.Mode&unix.S_IFMT == unix.S_IFDIR}
		if r.Own && int(st.Uid) != owner {
			unix.Close(fd)
			return nil, fmt.Errorf("rule for %s: the folder is uid %d's, not the agent's (uid %d): refused", r.Path, st.Uid, owner)
		}
		out = append(out, o)
	}
	return out, nil
}

// openNoLinks opens path (absolute and canonical) with O_PATH, refusing
// a link anywhere in it (ELOOP): openat2 with RESOLVE_NO_SYMLINKS, or
// where that is refused a walk of O_NOFOLLOW opens from the root. dir
// also refuses anything but a folder.
func openNoLinks(path string, dir bool) (int, error) {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return -1, fmt.Errorf("%q is not an absolute, canonical path", path)
	}
	flags := uint64(unix.O_PATH | unix.O_CLOEXEC)
	if dir {
		flags |= unix.O_DIRECTORY
	}
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{Flags: flags, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		// A kernel before 5.6, or a container's seccomp profile.
		fd, err = walkNoLinks(path, dir)
	}
	if errors.Is(err, unix.ELOOP) {
		return -1, fmt.Errorf("%w: it is a link, or beneath one (refused: a rule is bound to the folder itself)", err)
	}
	return fd, err
}

// walkNoLinks is openNoLinks one element at a time.
func walkNoLinks(path string, dir bool) (int, error) {
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil || path == "/" {
		return fd, err
	}
	elems := strings.Split(path[1:], "/")
	for i, e := range elems {
		next, err := unix.Openat(fd, e, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		var st unix.Stat_t
		if err := unix.Fstat(next, &st); err != nil {
			unix.Close(next)
			return -1, err
		}
		switch mode := st.Mode & unix.S_IFMT; {
		case mode == unix.S_IFLNK:
			unix.Close(next)
			return -1, unix.ELOOP
		case mode != unix.S_IFDIR && (dir || i < len(elems)-1):
			unix.Close(next)
			return -1, unix.ENOTDIR
		}
		fd = next
	}
	return fd, nil
}

// landlockRuleset is p's Landlock ruleset, each rule added on the fd the
// launcher opened for it.
func landlockRuleset(p *Policy, rules []openedRule) (int, error) {
	if p.ABI < 1 || p.ABI > len(configs) {
		return -1, fmt.Errorf("the policy is for Landlock ABI %d; this build enforces 1 to %d", p.ABI, len(configs))
	}
	cfg := configs[p.ABI-1]
	attr := ll.RulesetAttr{HandledAccessFS: uint64(cfg.HandledAccessFS), Scoped: uint64(cfg.Scoped)}
	if p.Net != nil {
		if p.ABI < abiNet {
			return -1, fmt.Errorf("a network policy needs Landlock ABI %d, the policy is for %d", abiNet, p.ABI)
		}
		// Bind is handled and never allowed: no listening socket.
		attr.HandledAccessNet = ll.AccessNetBindTCP | ll.AccessNetConnectTCP
	}
	fd, err := ll.LandlockCreateRuleset(&attr, 0)
	if err != nil {
		return -1, fmt.Errorf("creating the Landlock ruleset (ABI %d): %w", p.ABI, err)
	}
	for _, r := range rules {
		set := rights[r.Access] & attr.HandledAccessFS
		if !r.dir {
			set &= fileRights
		}
		if set == 0 {
			continue
		}
		if err := ll.LandlockAddPathBeneathRule(fd, &ll.PathBeneathAttr{AllowedAccess: set, ParentFd: r.fd}, 0); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("rule for %s: %w", r.Path, err)
		}
	}
	for _, port := range p.Net {
		if err := ll.LandlockAddNetPortRule(fd, &ll.NetPortAttr{AllowedAccess: ll.AccessNetConnectTCP, Port: uint64(port)}, 0); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("rule for port %d: %w", port, err)
		}
	}
	return fd, nil
}
