package confine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/agenthost/agenthost/internal/agentfs"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// start is the launcher's work on its locked thread, in order: open the
// command and what the rules name, checked (as the launcher's user: root
// reaches any folder), make the agent's view of them when it gets a uid
// of its own, give it an IPC namespace of its own (as root), build the
// Landlock ruleset and the seccomp filter, drop every privilege, set
// no_new_privs, restrict, filter, execute.
func start(p *Policy, argv, env []string) error {
	cmd, err := openCommand(argv[0])
	if err != nil {
		return err
	}
	euid := os.Geteuid()
	owner, covered := euid, ""
	if p.User != nil {
		if euid != 0 {
			return fmt.Errorf("the policy runs the agent as uid %d, which needs the launcher to run as root (it runs as uid %d)", p.User.UID, euid)
		}
		if p.User.UID <= 0 || p.User.GID <= 0 {
			return fmt.Errorf("the policy's user %d:%d is not an agent's uid and gid", p.User.UID, p.User.GID)
		}
		owner = p.User.UID
		if covered, err = needsView(p, p.User); err != nil {
			return err
		}
		// The rules are opened in the new namespace, so that they can
		// be bound there (and /proc's rule to the agent's own /proc).
		if err := enterView(p.User, covered); err != nil {
			return err
		}
	}
	if euid == 0 {
		if err := isolateIPC(p.User); err != nil {
			return err
		}
	}
	rules, err := openRules(p, owner)
	if err != nil {
		return err
	}
	if covered != "" {
		if err := buildView(p.User, rules); err != nil {
			return err
		}
	}
	ruleset, err := landlockRuleset(p, rules)
	if err != nil {
		return err
	}
	for _, r := range rules {
		unix.Close(r.fd)
	}
	filter, err := seccompFilter(p)
	if err != nil {
		return err
	}
	if err := dropPrivilege(p.User); err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
	// This thread only: it executes the agent, and the others end then.
	if err := ll.LandlockRestrictSelf(ruleset, 0); err != nil {
		return fmt.Errorf("restricting with Landlock: %w", err)
	}
	unix.Close(ruleset)
	if filter != nil {
		if err := installSeccomp(filter); err != nil {
			return err
		}
	}
	return cmd.exec(argv, env)
}

// isolateIPC gives the calling thread an IPC namespace of its own. SysV
// shared memory, semaphores and message queues (and POSIX message
// queues) are neither files nor sockets: Landlock does not see them, a
// uid's mode bits are all that guard them, and they outlive the processes
// that made them. Without a namespace a room's agent reads and writes
// what root's other processes keep there (as root) or another room left
// open to it, and leaves objects behind that fill the host's limits. In
// its own namespace what it makes is its room's and goes when the room's
// last process ends. Refused (a restricted container's root) it is an
// error where the agent runs as a uid of its own, which would otherwise
// share the namespace with every other room's; a root agent (agent uids
// off) goes on without it.
func isolateIPC(u *User) error {
	err := unix.Unshare(unix.CLONE_NEWIPC)
	if err == nil || u == nil {
		return nil
	}
	return fmt.Errorf("uid %d: an IPC namespace of its own was refused (%w): "+
		"agents cannot run as uids of their own on this host (serve --agent-uids off runs them as the server's user)", u.UID, err)
}

// setAsideTmp moves the last start's TMPDIR out of the way (renamed in
// its folder, then removed with what earlier starts left there): a
// process left in the room keeps writing into it (its rule is bound to
// that folder), which made a removal in place fail (ENOTEMPTY, or EACCES
// where it made a folder of it unreadable) and the room's next start with
// it. The rename cannot be stopped: the folder holding the TMPDIR is the
// server's (AgentRoom), not the agent's to write. What cannot be removed
// yet stays aside for a later start.
func setAsideTmp(tmp string) error {
	dir, name := filepath.Split(tmp)
	aside, err := os.MkdirTemp(dir, name+asideTmp)
	if err != nil {
		return err
	}
	// A folder replaces the empty one made for its name (rename(2):
	// os.Rename refuses an existing folder).
	if err := unix.Rename(tmp, aside); err != nil && !errors.Is(err, unix.ENOENT) {
		// Not a folder: removed where it is.
		os.Remove(aside)
		if err := os.RemoveAll(tmp); err != nil {
			return err
		}
	}
	d, err := agentfs.Open(dir, nil)
	if err != nil {
		return nil // tried again at the next start
	}
	defer d.Close()
	ents, _ := d.ReadDir(".")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), name+asideTmp) {
			removeTree(d, e.Name())
		}
	}
	return nil
}

// asideTmp is the suffix of a TMPDIR set aside (setAsideTmp), before its
// random part.
const asideTmp = ".old-"

// removeTree removes name in d, a folder the agent wrote, never through
// a link; its folders the agent made unreadable or unwritable are opened
// again first (the agent's own: a non-root server could not remove them).
func removeTree(d *agentfs.Dir, name string) {
	if d.RemoveAll(name) == nil {
		return
	}
	openUp(d, name, 0)
	_ = d.RemoveAll(name)
}

// openUp makes the folder name in d and the folders beneath it (to a
// bounded depth) searchable and writable by their owner, never through a
// link.
func openUp(d *agentfs.Dir, name string, depth int) {
	if depth > agentfs.MaxDepth || d.Chmod(name, 0o700) != nil {
		return
	}
	ents, err := d.ReadDir(name)
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.IsDir() {
			openUp(d, filepath.Join(name, e.Name()), depth+1)
		}
	}
}

// command is the agent's executable, opened by the launcher (as root
// when the agent gets a uid of its own, which may not reach it by path).
type command struct {
	path string // as given (argv[0])
	fd   int
	// script is a #! script's own path, links resolved: the interpreter
	// opens the script by the path it is given, so it is executed by
	// that path (the same file the launcher opened) rather than by fd.
	script string
}

// openCommand opens path (absolute, as Wrap gives it), links followed:
// what it leads to runs only where a rule lets the agent execute it.
func openCommand(path string) (*command, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EACCES) {
		// Execute-only (not root): no script then.
		fd, err = unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("the command %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("the command %s: not a file (%v)", path, err)
	}
	c := &command{path: path, fd: fd}
	var magic [2]byte
	if n, _ := unix.Pread(fd, magic[:], 0); n == 2 && string(magic[:]) == "#!" {
		real, err := filepath.EvalSymlinks(path)
		if err != nil {
			return nil, fmt.Errorf("the command %s: %w", path, err)
		}
		sfd, err := openNoLinks(real, false)
		if err != nil {
			return nil, fmt.Errorf("the command %s: %w", real, err)
		}
		var sst unix.Stat_t
		err = unix.Fstat(sfd, &sst)
		unix.Close(sfd)
		if err != nil || sst.Dev != st.Dev || sst.Ino != st.Ino {
			return nil, fmt.Errorf("the command %s changed while it was opened", path)
		}
		c.script = real
	}
	return c, nil
}

// exec executes the command with argv and env: a script by its path, a
// binary by the file the launcher opened (fexecve through /proc/self/fd,
// as the C library does, so that Go's exec bookkeeping holds: no thread
// created during it, the file limit restored).
func (c *command) exec(argv, env []string) error {
	if c.script != "" {
		return fmt.Errorf("executing %s: %w", c.script, syscall.Exec(c.script, argv, env))
	}
	err := syscall.Exec("/proc/self/fd/"+strconv.Itoa(c.fd), argv, env)
	if errors.Is(err, unix.ENOENT) {
		// No /proc here: the path, which the rules let the agent reach.
		err = syscall.Exec(c.path, argv, env)
	}
	return fmt.Errorf("executing %s: %w", c.path, err)
}

// prepareTmp makes tmp (emptied first when fresh) a folder of the agent's
// owner (u, else this process's user), never following a link: os.RemoveAll
// opens nothing through one, and the folder made is checked, not its
// name.
func prepareTmp(tmp string, fresh bool, u *User) error {
	if fresh {
		if err := setAsideTmp(tmp); err != nil {
			return err
		}
	}
	if err := unix.Mkdir(tmp, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	fd, err := unix.Open(tmp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return fmt.Errorf("not a folder (%w)", err)
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	uid, gid := os.Geteuid(), int(st.Gid)
	if u != nil {
		uid, gid = u.UID, u.GID
	}
	if int(st.Uid) != uid || int(st.Gid) != gid {
		if err := unix.Fchown(fd, uid, gid); err != nil {
			return fmt.Errorf("giving it to uid %d: %w", uid, err)
		}
	}
	return nil
}
