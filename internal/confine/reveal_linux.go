package confine

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// Reveal makes each of folders (absolute paths in the server's view) reach
// the same folder at the same path in the view of the running agent pid,
// which the launcher built (see buildView): a warm pool's agent, started
// before its room was known, sees only its slot's folders there, and is
// then handed the room's, whose paths its view lacks. Each folder is
// cloned here (open_tree) and mounted into the agent's namespace at its
// path, the folders on the way made only in the launcher's covering
// tmpfs; a path that already leads to the folder there is left as it is.
// Nothing is followed through a link on either side. The caller must be
// root; pid must be its child, not yet reaped (its pid not reused).
func Reveal(pid int, folders ...string) error {
	type item struct {
		path string
		tree int
		st   unix.Stat_t
	}
	var items []item
	defer func() {
		for _, it := range items {
			unix.Close(it.tree)
		}
	}()
	for _, f := range folders {
		fd, err := unix.Open(f, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("confine: revealing %s: %w", f, err)
		}
		it := item{path: f}
		err = unix.Fstat(fd, &it.st)
		if err == nil {
			it.tree, err = unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH|unix.AT_RECURSIVE)
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("confine: revealing %s: %w", f, err)
		}
		items = append(items, it)
	}
	ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("confine: the agent's view: %w", err)
	}
	defer unix.Close(ns)
	errc := make(chan error, 1)
	go func() {
		// This thread enters the agent's namespace and is never unlocked:
		// it ends with the goroutine, and no other code runs on it.
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				return err
			}
			if err := unix.Setns(ns, unix.CLONE_NEWNS); err != nil {
				return err
			}
			for _, it := range items {
				if err := revealAt(it.path, it.tree, &it.st); err != nil {
					return fmt.Errorf("%s: %w", it.path, err)
				}
			}
			return nil
		}()
	}()
	if err := <-errc; err != nil {
		return fmt.Errorf("confine: revealing the room's folders to the agent: %w", err)
	}
	return nil
}

// revealAt mounts tree (the folder want describes) at path, in the
// namespace this thread is in, unless path leads to that folder already.
func revealAt(path string, tree int, want *unix.Stat_t) error {
	var st unix.Stat_t
	chain := append(ancestors(path), path)
	for i, a := range chain {
		err := unix.Lstat(a, &st)
		if errors.Is(err, unix.ENOENT) {
			// Only in the launcher's cover (root's tmpfs): nothing of
			// the host is made in the agent's view.
			var fs unix.Statfs_t
			if err := unix.Statfs(filepath.Dir(a), &fs); err != nil {
				return err
			}
			var pst unix.Stat_t
			if err := unix.Lstat(filepath.Dir(a), &pst); err != nil {
				return err
			}
			if fs.Type != unix.TMPFS_MAGIC || pst.Uid != 0 {
				return fmt.Errorf("%s is missing outside the launcher's view", a)
			}
			if err := unix.Mkdir(a, 0o755); err != nil {
				return err
			}
			if err := unix.Lstat(a, &st); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return fmt.Errorf("%s is not a folder", a)
		}
		if i == len(chain)-1 && st.Dev == want.Dev && st.Ino == want.Ino {
			return nil // reached as it is
		}
	}
	return unix.MoveMount(tree, "", unix.AT_FDCWD, path, unix.MOVE_MOUNT_F_EMPTY_PATH)
}
