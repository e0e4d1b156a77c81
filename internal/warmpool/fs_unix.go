//go:build unix

package warmpool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// openDir opens the folder name under dirfd (unix.AT_FDCWD: a path)
// without following a link.
func openDir(dirfd int, name string) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: name, Err: err}
	}
	return fd, nil
}

// lstatAt is name's own status under dirfd (ok false: it does not exist).
func lstatAt(dirfd int, name string) (st unix.Stat_t, ok bool, err error) {
	err = unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return st, false, nil
	}
	if err != nil {
		return st, false, &os.PathError{Op: "lstat", Path: name, Err: err}
	}
	return st, true, nil
}

func isDir(st unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFDIR }

// names lists the entries of the folder fd (fd stays open).
func names(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	if _, err := f.Seek(0, 0); err != nil {
		return nil, err
	}
	return f.Readdirnames(-1)
}

// merge moves the room folder's entries into the slot folder's (see the
// package doc), recording each move in j first.
func merge(j *os.File, folder string, pr Pair) error {
	slot, err := openDir(unix.AT_FDCWD, pr.Slot)
	if err != nil {
		return fmt.Errorf("warmpool: the slot's folder: %w", err)
	}
	defer unix.Close(slot)
	rm, err := openDir(unix.AT_FDCWD, pr.Room)
	if errors.Is(err, unix.ENOENT) {
		return nil // nothing to move
	}
	if err != nil {
		return fmt.Errorf("warmpool: the room's folder: %w", err)
	}
	defer unix.Close(rm)
	if err := mergeDir(j, folder, "", slot, rm); err != nil {
		return fmt.Errorf("warmpool: moving the room's %s: %w", folder, err)
	}
	return nil
}

func mergeDir(j *os.File, folder, prefix string, slot, rm int) error {
	entries, err := names(rm)
	if err != nil {
		return err
	}
	for _, e := range entries {
		rel := filepath.Join(prefix, e)
		rst, ok, err := lstatAt(rm, e)
		if err != nil || !ok {
			if err != nil {
				return err
			}
			continue
		}
		sst, inSlot, err := lstatAt(slot, e)
		if err != nil {
			return err
		}
		if inSlot && isDir(sst) && isDir(rst) {
			if err := mergeSub(j, folder, rel, slot, rm, e); err != nil {
				return err
			}
			continue
		}
		if err := record(j, folder, rel); err != nil {
			return err
		}
		if inSlot && (isDir(sst) || isDir(rst)) {
			// A file over a folder or the other way round: the slot's
			// goes (a link is removed itself, never followed).
			if err := removeAt(slot, e); err != nil {
				return err
			}
		}
		if err := unix.Renameat(rm, e, slot, e); err != nil {
			return &os.PathError{Op: "rename", Path: rel, Err: err}
		}
	}
	return nil
}

// mergeSub merges the folder e present in both, then removes the room's
// (now empty) one.
func mergeSub(j *os.File, folder, rel string, slot, rm int, e string) error {
	s, err := openDir(slot, e)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	r, err := openDir(rm, e)
	if err != nil {
		return err
	}
	defer unix.Close(r)
	if err := mergeDir(j, folder, rel, s, r); err != nil {
		return err
	}
	if err := unix.Unlinkat(rm, e, unix.AT_REMOVEDIR); err != nil {
		return &os.PathError{Op: "rmdir", Path: rel, Err: err}
	}
	return nil
}

// removeAt removes name under dirfd and, for a folder, all in it, never
// following a link.
func removeAt(dirfd int, name string) error {
	st, ok, err := lstatAt(dirfd, name)
	if err != nil || !ok {
		return err
	}
	if !isDir(st) {
		if err := unix.Unlinkat(dirfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return &os.PathError{Op: "remove", Path: name, Err: err}
		}
		return nil
	}
	fd, err := openDir(dirfd, name)
	if err != nil {
		return err
	}
	entries, err := names(fd)
	if err == nil {
		for _, e := range entries {
			if err = removeAt(fd, e); err != nil {
				break
			}
		}
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "rmdir", Path: name, Err: err}
	}
	return nil
}

// removeAll removes path and all in it (a link itself).
func removeAll(path string) error {
	if err := removeAt(unix.AT_FDCWD, path); err != nil {
		return fmt.Errorf("warmpool: %w", err)
	}
	return nil
}

// renameOnto renames the slot's folder onto the room's (absent, or an
// empty folder: rename(2) replaces it atomically).
func renameOnto(pr Pair) error {
	if err := unix.Rename(pr.Slot, pr.Room); err != nil {
		return fmt.Errorf("warmpool: renaming %s onto %s: %w", pr.Slot, pr.Room, err)
	}
	return nil
}

// moveBack moves rel from the slot's folder back into the room's, when it
// is still in the first and not in the second (the folders on its way are
// made in the room's, never followed through a link).
func moveBack(pr Pair, rel string) error {
	slot, err := openDir(unix.AT_FDCWD, pr.Slot)
	if errors.Is(err, unix.ENOENT) {
		return nil // renamed onto the room's already: the room is whole
	}
	if err != nil {
		return fmt.Errorf("warmpool: recovering: %w", err)
	}
	defer func() { unix.Close(slot) }()
	if err := os.MkdirAll(pr.Room, 0o700); err != nil {
		return fmt.Errorf("warmpool: recovering: %w", err)
	}
	rm, err := openDir(unix.AT_FDCWD, pr.Room)
	if err != nil {
		return fmt.Errorf("warmpool: recovering: %w", err)
	}
	defer func() { unix.Close(rm) }()
	parts := strings.Split(filepath.Clean(rel), string(filepath.Separator))
	for _, p := range parts[:len(parts)-1] {
		s, err := openDir(slot, p)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("warmpool: recovering %s: %w", rel, err)
		}
		unix.Close(slot)
		slot = s
		if err := unix.Mkdirat(rm, p, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("warmpool: recovering %s: %w", rel, err)
		}
		r, err := openDir(rm, p)
		if err != nil {
			return fmt.Errorf("warmpool: recovering %s: %w", rel, err)
		}
		unix.Close(rm)
		rm = r
	}
	last := parts[len(parts)-1]
	if _, ok, err := lstatAt(slot, last); err != nil || !ok {
		return err
	}
	if _, ok, err := lstatAt(rm, last); err != nil || ok {
		return err // the room's is there: the slot's is its own
	}
	if err := unix.Renameat(slot, last, rm, last); err != nil {
		return fmt.Errorf("warmpool: recovering %s: %w", rel, err)
	}
	return nil
}

func syncDir(path string) error {
	fd, err := openDir(unix.AT_FDCWD, path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsync(fd)
}

// SameDevice reports whether a and b are on one file system (a bind
// renames between them).
func SameDevice(a, b string) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		return false, err
	}
	if err := unix.Stat(b, &sb); err != nil {
		return false, err
	}
	return sa.Dev == sb.Dev, nil
}
