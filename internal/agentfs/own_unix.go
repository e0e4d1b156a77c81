//go:build unix

package agentfs

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"syscall"
)

const ownersSupported = true

const (
	oNonblock = syscall.O_NONBLOCK
	oNoFollow = syscall.O_NOFOLLOW
)

var errNotDir error = syscall.ENOTDIR

// MaxDepth bounds how deep OwnTree walks: folders deeper are left as
// they are (Owned.Deep).
const MaxDepth = 256

// Owned is what OwnTree did.
type Owned struct {
	// Entries were given to the owner: folders, files, links (the link
	// itself), FIFOs and sockets, the folder itself included.
	Entries int
	// Linked are regular files with more than one name, left as they
	// were: another of their names may be outside the folder (a file of
	// the server's that a privileged agent linked in), and giving the
	// file to the agent would give it that file too.
	Linked int
	// Devices are device nodes, removed: only a privileged agent could
	// make one, and an agent running as another user would then open it
	// through its mode (the kernel's log, a disk).
	Devices int
	// Skipped are folders left as they were: deeper than MaxDepth, or
	// swapped for something else while the walk looked at them.
	Skipped int
}

// OwnTree gives the folder path (see Open) and everything beneath it to
// o (chown, the server being root), never through a link: each folder is
// entered as Open's walk enters one (a folder swapped for a link meanwhile
// is skipped), each entry is changed by its descriptor or, a link, by
// itself, so a process racing the walk can make it miss an entry, never
// reach one outside path. Regular files with more than one name are left
// alone, device nodes removed (see Owned).
func OwnTree(path string, o Owner) (Owned, error) {
	return OwnTreeFrom(path, o, -1)
}

// OwnTreeFrom is OwnTree, but files with several names that are the uid
// from's are given to o too: from is the uid the tree was given to before
// (a room's earlier agent uid), which had them already, and which is then
// freed for another room (-1: none).
func OwnTreeFrom(path string, o Owner, from int) (Owned, error) {
	d, err := Open(path, &o)
	if err != nil {
		return Owned{}, err
	}
	defer d.Close()
	w := &ownWalk{d: d, seen: map[fileID]bool{}, from: from}
	err = w.folder(d.root, 0)
	return w.res, err
}

// OwnFolder gives the folder path itself (see Open) to o, by its
// descriptor.
func OwnFolder(path string, o Owner) error {
	d, err := Open(path, &o)
	if err != nil {
		return err
	}
	defer d.Close()
	f, err := d.root.Open(".")
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Chown(o.UID, o.GID)
}

type fileID struct{ dev, ino uint64 }

type ownWalk struct {
	d    *Dir
	seen map[fileID]bool // folders walked: a folder moved during the walk is walked once
	res  Owned
	from int // files of several names that are this uid's are given too (-1: none)
}

// folder gives the folder r and its entries to the owner.
func (w *ownWalk) folder(r *os.Root, depth int) error {
	f, err := r.Open(".")
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	id := idOf(st)
	if w.seen[id] {
		return nil
	}
	w.seen[id] = true
	if err := f.Chown(w.d.owner.UID, w.d.owner.GID); err != nil {
		return err
	}
	w.res.Entries++
	for {
		ents, err := f.ReadDir(256)
		for _, e := range ents {
			if err := w.entry(r, e, depth); err != nil {
				return err
			}
		}
		if err == io.EOF || len(ents) == 0 {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// entry gives one entry of the folder r to the owner. An entry gone
// meanwhile is no error.
func (w *ownWalk) entry(r *os.Root, e fs.DirEntry, depth int) error {
	name, o := e.Name(), w.d.owner
	fi, err := r.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	gone := func(err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	switch t := fi.Mode().Type(); {
	case t == fs.ModeDir:
		if depth+1 >= MaxDepth {
			w.res.Skipped++
			return nil
		}
		sub, err := r.OpenRoot(name)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ELOOP) {
				w.res.Skipped++
				return nil
			}
			return err
		}
		defer sub.Close()
		if sameDir(sub, fi) != nil {
			w.res.Skipped++
			return nil
		}
		return w.folder(sub, depth+1)
	case t&(fs.ModeDevice|fs.ModeCharDevice) != 0:
		w.res.Devices++
		return gone(r.Remove(name))
	case t == 0: // a regular file
		f, err := r.OpenFile(name, os.O_RDONLY|oNonblock|oNoFollow, 0)
		if err != nil {
			return gone(err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if !os.SameFile(fi, st) || !st.Mode().IsRegular() {
			w.res.Skipped++
			return nil
		}
		if s, ok := st.Sys().(*syscall.Stat_t); ok && s.Nlink > 1 && !w.wasFrom(s) {
			w.res.Linked++
			return nil
		}
		w.res.Entries++
		return f.Chown(o.UID, o.GID)
	default: // a link (itself), a FIFO, a socket
		w.res.Entries++
		return gone(r.Lchown(name, o.UID, o.GID))
	}
}

// wasFrom: the file is the uid from's, or the owner's already (its other
// name given first).
func (w *ownWalk) wasFrom(s *syscall.Stat_t) bool {
	return w.from >= 0 && (int(s.Uid) == w.from || int(s.Uid) == w.d.owner.UID)
}

func idOf(fi fs.FileInfo) fileID {
	if s, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fileID{uint64(s.Dev), uint64(s.Ino)}
	}
	return fileID{}
}
