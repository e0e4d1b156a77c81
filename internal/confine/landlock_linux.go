package confine

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
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

// rights are each Access's rights on a folder (fileRights of them on a file).
var rights = map[Access]landlock.AccessFSSet{
	AccessRead:     ll.AccessFSReadFile | ll.AccessFSReadDir,
	AccessReadExec: ll.AccessFSReadFile | ll.AccessFSReadDir | ll.AccessFSExecute,
	AccessReadWrite: ll.AccessFSExecute | ll.AccessFSWriteFile | ll.AccessFSReadFile | ll.AccessFSReadDir |
		ll.AccessFSRemoveDir | ll.AccessFSRemoveFile | ll.AccessFSMakeChar | ll.AccessFSMakeDir | ll.AccessFSMakeReg |
		ll.AccessFSMakeSock | ll.AccessFSMakeFifo | ll.AccessFSMakeBlock | ll.AccessFSMakeSym | ll.AccessFSRefer |
		ll.AccessFSTruncate,
	AccessDevice: ll.AccessFSReadFile | ll.AccessFSReadDir | ll.AccessFSWriteFile | ll.AccessFSTruncate | ll.AccessFSIoctlDev,
}

// config is the Landlock configuration of p, and its rules.
func config(p *Policy) (landlock.Config, []landlock.Rule, error) {
	if p.ABI < 1 || p.ABI > len(configs) {
		return landlock.Config{}, nil, fmt.Errorf("the policy is for Landlock ABI %d; this build enforces 1 to %d", p.ABI, len(configs))
	}
	cfg := configs[p.ABI-1]
	var rules []landlock.Rule
	if p.Net == nil {
		cfg.HandledAccessNet = 0
	} else {
		if p.ABI < abiNet {
			return landlock.Config{}, nil, fmt.Errorf("a network policy needs Landlock ABI %d, the policy is for %d", abiNet, p.ABI)
		}
		// Bind is handled and never allowed: no listening socket.
		cfg.HandledAccessNet = ll.AccessNetBindTCP | ll.AccessNetConnectTCP
		for _, port := range p.Net {
			rules = append(rules, landlock.ConnectTCP(port))
		}
	}
	for _, r := range p.Rules {
		set, ok := rights[r.Access]
		if !ok {
			return landlock.Config{}, nil, fmt.Errorf("rule for %s: unknown access %q", r.Path, r.Access)
		}
		fi, err := os.Stat(r.Path)
		if errors.Is(err, os.ErrNotExist) && r.Optional {
			continue
		}
		if err != nil {
			return landlock.Config{}, nil, fmt.Errorf("rule for %s: %w", r.Path, err)
		}
		if !fi.IsDir() {
			set &= fileRights
		}
		rules = append(rules, landlock.PathAccess(set&cfg.HandledAccessFS, r.Path))
	}
	return cfg, rules, nil
}

// restrict restricts this process (every thread) by p.
func restrict(p *Policy) error {
	cfg, rules, err := config(p)
	if err != nil {
		return err
	}
	if err := cfg.Restrict(rules...); err != nil {
		return fmt.Errorf("restricting with Landlock: %w", err)
	}
	return nil
}

func execve(path string, argv, env []string) error {
	err := syscall.Exec(path, argv, env)
	return fmt.Errorf("executing %s: %w", path, err)
}
