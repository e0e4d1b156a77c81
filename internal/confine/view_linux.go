package confine

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// An agent run as a uid of its own must reach its folders at the paths
// its policy names, but they may lie under folders that uid cannot search
// (the data dir under a 0700 /root, a test's 0700 temporary folder, an
// operator's checkout holding the tools), and nothing outside the data
// dir may be chmodded. So the launcher, as root, gives the agent a mount
// namespace of its own in which each folder the uid cannot search and
// that holds a rule's path is covered by a small tmpfs (root's, 0755)
// holding only the chain of folders down to those paths, each path
// bind-mounted back from what the launcher opened. The agent sees the
// same paths and nothing else of the covered folder (it could search
// none of it anyway); the Landlock rules, bound to inodes, hold there
// as they do anywhere. Its /proc there shows its own processes only.

// viewTmpfs is the covering tmpfs's options: root's, searchable, small,
// nothing executed or opened as a device from it.
const (
	viewTmpfs      = "mode=0755,size=64k,nr_inodes=4096"
	viewTmpfsFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
)

// needsView reports the first folder above a rule's path that u cannot
// search ("" when none: no namespace is needed).
func needsView(p *Policy, u *User) (string, error) {
	for _, r := range p.Rules {
		for _, a := range ancestors(r.Path) {
			var st unix.Stat_t
			if err := unix.Lstat(a, &st); err != nil {
				if errors.Is(err, unix.ENOENT) && r.Optional {
					break
				}
				return "", fmt.Errorf("rule for %s: %s: %w", r.Path, a, err)
			}
			if !searchable(&st, u) {
				return a, nil
			}
		}
	}
	return "", nil
}

// enterView gives the calling thread a mount namespace of its own whose
// mounts do not propagate to the host's, with a /proc of its own that
// shows u only its own processes (hidepid=invisible): the host's /proc
// shows every process's command line and status to every uid, and a
// room's agent's command line carries the room's instructions, its model
// and its folders. covered is the folder u cannot search ("" when none).
func enterView(u *User, covered string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return viewRefused(u, covered, "the mount namespace that would show it its folders was refused", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return viewRefused(u, covered, "making its mounts private was refused", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", viewProcFlags, viewProc); err != nil {
		return viewRefused(u, covered, "a /proc of its own was refused", err)
	}
	return nil
}

// viewProc is the agent's /proc's options: other uids' processes (the
// server's, other rooms') are not there at all.
const (
	viewProc      = "hidepid=invisible"
	viewProcFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
)

// viewRefused says that this host cannot give u a view of its own, and
// the way out.
func viewRefused(u *User, covered, what string, err error) error {
	holds := ""
	if covered != "" {
		holds = fmt.Sprintf(" cannot search %s, which holds its folders, and", covered)
	}
	return fmt.Errorf("uid %d%s: %s (%w): "+
		"agents cannot run as uids of their own on this host (serve --agent-uids off runs them as the server's user)", u.UID, holds, what, err)
}

// buildView covers each folder above a rule's path that u cannot search
// and binds the rules' paths back (see the comment above); it runs in the
// namespace enterView made, the rules opened there. The working folder is
// kept (moved to the same path in the new view when it is the same
// folder there).
func buildView(u *User, rules []openedRule) error {
	cwd, err := unix.Open(".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the working folder: %w", err)
	}
	defer unix.Close(cwd)
	wd, wdErr := unix.Getwd()

	items := slices.Clone(rules)
	slices.SortFunc(items, func(a, b openedRule) int { return strings.Compare(a.Path, b.Path) })
	// mounts are the tmpfs (covering) and bind mounts made, by path: the
	// deepest one above a path says whether it is ours to fill.
	mounts := map[string]bool{} // path -> covering tmpfs
	inTmpfs := func(path string) bool {
		for a := filepath.Dir(path); ; a = filepath.Dir(a) {
			if tmpfs, ok := mounts[a]; ok {
				return tmpfs
			}
			if a == "/" {
				return false
			}
		}
	}
	for _, r := range items {
		if _, done := mounts[r.Path]; done {
			continue
		}
		for _, a := range ancestors(r.Path) {
			var st unix.Stat_t
			err := unix.Lstat(a, &st)
			if errors.Is(err, unix.ENOENT) && inTmpfs(a) {
				if err := unix.Mkdir(a, 0o755); err != nil {
					return fmt.Errorf("the agent's view: %s: %w", a, err)
				}
				continue
			}
			if err != nil {
				return fmt.Errorf("the agent's view: %s: %w", a, err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return fmt.Errorf("the agent's view: %s is not a folder", a)
			}
			if searchable(&st, u) {
				continue
			}
			if err := unix.Mount("tmpfs", a, "tmpfs", viewTmpfsFlags, viewTmpfs); err != nil {
				return viewRefused(u, a, "covering it with a tmpfs was refused", err)
			}
			mounts[a] = true
		}
		if !inTmpfs(r.Path) {
			continue // reachable as it is
		}
		if err := unix.Lstat(r.Path, new(unix.Stat_t)); errors.Is(err, unix.ENOENT) {
			if r.dir {
				err = unix.Mkdir(r.Path, 0o755)
			} else {
				var fd int
				if fd, err = unix.Open(r.Path, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644); err == nil {
					unix.Close(fd)
				}
			}
			if err != nil {
				return fmt.Errorf("the agent's view: %s: %w", r.Path, err)
			}
		}
		if err := bindFD(r.fd, r.Path); err != nil {
			return fmt.Errorf("the view of uid %d's folders: binding %s: %w (serve --agent-uids off runs agents as the server's user)", u.UID, r.Path, err)
		}
		mounts[r.Path] = false
	}
	// The working folder: the same path, if it is the same folder here.
	var was, now unix.Stat_t
	if wdErr == nil && unix.Fstat(cwd, &was) == nil && unix.Stat(wd, &now) == nil && was.Dev == now.Dev && was.Ino == now.Ino {
		return unix.Chdir(wd)
	}
	return unix.Fchdir(cwd)
}

// bindFD mounts what fd names (opened in this namespace) at target.
func bindFD(fd int, target string) error {
	tree, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH|unix.AT_RECURSIVE)
	if errors.Is(err, unix.ENOSYS) {
		return unix.Mount(fmt.Sprintf("/proc/self/fd/%d", fd), target, "", unix.MS_BIND|unix.MS_REC, "")
	}
	if err != nil {
		return err
	}
	defer unix.Close(tree)
	return unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH)
}

// ancestors are the folders above path, from the topmost down ("/"
// left out: it is never covered).
func ancestors(path string) []string {
	var out []string
	for a := filepath.Dir(path); a != "/" && a != "."; a = filepath.Dir(a) {
		out = append(out, a)
	}
	slices.Reverse(out)
	return out
}

// searchable reports whether u (its uid and gid, no other group) may
// search the folder st describes, by its mode bits (an ACL is not read:
// one that denies u leaves the folder unreachable, never more reachable).
func searchable(st *unix.Stat_t, u *User) bool {
	switch {
	case int(st.Uid) == u.UID:
		return st.Mode&0o100 != 0
	case int(st.Gid) == u.GID:
		return st.Mode&0o010 != 0
	}
	return st.Mode&0o001 != 0
}
