// Package agentfs is how the server reads and writes files in folders a
// room's agent can write: its home (sessions, configuration), its
// workspace, its TMPDIR. Anything there may be a link the agent planted,
// or be swapped for one by a process of the room at any moment, while the
// server may read and write what the agent may not (the store, the token,
// other rooms' folders): a write through a planted link overwrites the
// link's target, a read through one copies the target into the room.
//
// Every operation goes through a Dir, an os.Root on the folder, and walks
// the name one folder at a time, each opened as a root of its own and
// checked to be the folder it looked at (not a link, not swapped since):
// the kernel resolves every step relative to a descriptor of a real
// folder inside the Dir, so nothing outside it is reached whatever links
// or renames race the operation, and no link inside it is followed
// either:
//
//   - a read opens only a regular file that is not a link (ErrLink,
//     ErrNotRegular), never blocks on a FIFO, and stops at a size limit
//     (ErrTooLarge);
//   - a write goes to a new file in the same folder that is then renamed
//     over the name: a link or anything else there is replaced, never
//     written through;
//   - writes create missing parent folders and replace a link where a
//     parent folder must be by a folder; reads and removals refuse one
//     (ErrLink);
//   - Glob lists regular files only, as the folder's entries say (no
//     link followed);
//   - Remove and RemoveAll remove a link itself, never what it names.
//
// With an Owner (the server runs as root, the agent as a uid of its own)
// what a Dir creates is given to that owner, so that the agent may read
// and change it; OwnTree gives a whole folder (see there).
//
// Linux and other Unix systems: as said. Windows: the same operations
// through os.Root; owners are not supported there (ErrOwner).
package agentfs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Errors; every error of this package carries the name it is about (an
// *fs.PathError) and matches these with errors.Is.
var (
	// ErrLink: a link (or a folder swapped while it was opened) where a
	// file or folder was to be read, removed or walked through.
	ErrLink = errors.New("agentfs: a link where a file or folder is expected")
	// ErrNotRegular: a read named something other than a regular file (a
	// FIFO, a socket, a device or a folder).
	ErrNotRegular = errors.New("agentfs: not a regular file")
	// ErrTooLarge: a read passed its size limit, or a Glob its match
	// limit.
	ErrTooLarge = errors.New("agentfs: over the limit")
	// ErrName: a name that is not a path inside the folder (absolute,
	// with "..", or empty).
	ErrName = errors.New("agentfs: not a name inside the folder")
	// ErrOwner: owners are not supported on this platform.
	ErrOwner = errors.New("agentfs: file owners are not supported on this platform")
)

// MaxGlob bounds the matches of one Glob (a folder the agent fills).
const MaxGlob = 4096

// maxReplace bounds how often a write replaces a link the agent puts
// back where a parent folder must be before it gives up (ErrLink).
const maxReplace = 8

// Owner is the user and group that get what a Dir creates.
type Owner struct {
	UID, GID int
}

// Dir is a folder an agent can write, opened for the server's file
// operations. Names are relative to it, in the platform's separator. A
// Dir is safe for concurrent use; Close it when done.
type Dir struct {
	root  *os.Root
	path  string
	owner *Owner
}

// Open opens the folder path, which must be a folder and not a link
// (its parents are followed: they are the server's own), for operations
// that give what they create to owner (nil: the server's user).
func Open(path string, owner *Owner) (*Dir, error) {
	if owner != nil && !ownersSupported {
		return nil, &fs.PathError{Op: "open", Path: path, Err: ErrOwner}
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return nil, &fs.PathError{Op: "open", Path: path, Err: ErrLink}
	}
	if !fi.IsDir() {
		return nil, &fs.PathError{Op: "open", Path: path, Err: errNotDir}
	}
	r, err := os.OpenRoot(path)
	if err != nil {
		return nil, err
	}
	if err := sameDir(r, fi); err != nil {
		r.Close()
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return &Dir{root: r, path: path, owner: owner}, nil
}

// Create is Open after creating path and its missing parents (the
// server's own: os.MkdirAll) with perm; path itself, when Create made it,
// is given to owner.
func Create(path string, perm fs.FileMode, owner *Owner) (*Dir, error) {
	made := false
	if err := os.Mkdir(path, perm); err == nil {
		made = true
	} else if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(path), perm); err != nil {
			return nil, err
		}
		if err := os.Mkdir(path, perm); err == nil {
			made = true
		} else if !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
	} else if !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	d, err := Open(path, owner)
	if err != nil {
		return nil, err
	}
	if made && owner != nil {
		if err := d.chown(d.root, "."); err != nil {
			d.Close()
			return nil, err
		}
	}
	return d, nil
}

// Path is the folder's path as given to Open.
func (d *Dir) Path() string { return d.path }

// Close releases the folder.
func (d *Dir) Close() error { return d.root.Close() }

// ReadFile reads the regular file name, at most limit bytes (more:
// ErrTooLarge).
func (d *Dir) ReadFile(name string, limit int64) ([]byte, error) {
	f, err := d.OpenFile(name, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: d.join(name), Err: err}
	}
	if int64(len(data)) > limit {
		return nil, &fs.PathError{Op: "read", Path: d.join(name), Err: fmt.Errorf("%w: more than %d bytes", ErrTooLarge, limit)}
	}
	return data, nil
}

// OpenFile opens the existing regular file name with flag (os.O_RDONLY,
// or os.O_WRONLY or os.O_RDWR with os.O_APPEND; never O_CREATE or
// O_TRUNC: a new file is WriteFile's): not through a link, in the file's
// own place (ErrLink), only a regular file (ErrNotRegular), without
// blocking on a FIFO.
func (d *Dir) OpenFile(name string, flag int) (*os.File, error) {
	if flag&(os.O_CREATE|os.O_TRUNC) != 0 {
		return nil, &fs.PathError{Op: "open", Path: d.join(name), Err: errors.New("agentfs: OpenFile opens existing files only")}
	}
	parent, base, err := d.walk("open", name, false)
	if err != nil {
		return nil, err
	}
	defer d.release(parent)
	fi, err := parent.Lstat(base)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.join(name), Err: unwrap(err)}
	}
	if err := regular(fi); err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.join(name), Err: err}
	}
	f, err := parent.OpenFile(base, flag|oNonblock|oNoFollow, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.join(name), Err: unwrap(err)}
	}
	got, err := f.Stat()
	if err == nil && !os.SameFile(fi, got) {
		err = fmt.Errorf("%w: swapped while it was opened", ErrLink)
	} else if err == nil {
		err = regular(got)
	}
	if err != nil {
		f.Close()
		return nil, &fs.PathError{Op: "open", Path: d.join(name), Err: err}
	}
	return f, nil
}

// WriteFile writes data to name with perm (exactly: the umask aside),
// creating missing parent folders (0700): see WriteFrom.
func (d *Dir) WriteFile(name string, data []byte, perm fs.FileMode) error {
	return d.WriteFrom(name, strings.NewReader(string(data)), perm)
}

// WriteFrom writes what r yields to name: into a new file beside it,
// renamed over name once complete, so that a link or any other file there
// is replaced (never written through) and a reader sees all of it or the
// previous file. Missing parent folders are created (0700), a link where
// one must be replaced by a folder. A folder at name is an error.
func (d *Dir) WriteFrom(name string, r io.Reader, perm fs.FileMode) error {
	parent, base, err := d.walk("write", name, true)
	if err != nil {
		return err
	}
	defer d.release(parent)
	tmp := "." + base + ".agentfs-" + nonce()
	f, err := parent.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|oNoFollow, 0o600)
	if err != nil {
		return &fs.PathError{Op: "write", Path: d.join(name), Err: unwrap(err)}
	}
	_, err = io.Copy(f, r)
	if err == nil && d.owner != nil {
		err = f.Chown(d.owner.UID, d.owner.GID)
	}
	if err == nil {
		err = f.Chmod(perm)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// Both names are in parent itself: nothing is resolved but them.
		err = parent.Rename(tmp, base)
	}
	if err != nil {
		_ = parent.Remove(tmp)
		return &fs.PathError{Op: "write", Path: d.join(name), Err: unwrap(err)}
	}
	return nil
}

// MkdirAll creates the folder name and its missing parents with perm,
// replacing a link where a folder must be.
func (d *Dir) MkdirAll(name string, perm fs.FileMode) error {
	if name == "." {
		return nil
	}
	parent, err := d.walkAll("mkdir", name, true, perm)
	if err != nil {
		return err
	}
	d.release(parent)
	return nil
}

// Symlink creates name as a link to target (which is not resolved); its
// parent folders must exist and not be links.
func (d *Dir) Symlink(target, name string) error {
	parent, base, err := d.walk("symlink", name, false)
	if err != nil {
		return err
	}
	defer d.release(parent)
	err = parent.Symlink(target, base)
	if err == nil && d.owner != nil {
		err = d.chown(parent, base)
	}
	if err != nil {
		return &fs.PathError{Op: "symlink", Path: d.join(name), Err: unwrap(err)}
	}
	return nil
}

// Lstat describes name itself (a link is not followed); its parent
// folders must not be links.
func (d *Dir) Lstat(name string) (fs.FileInfo, error) {
	parent, base, err := d.walk("lstat", name, false)
	if err != nil {
		return nil, err
	}
	defer d.release(parent)
	fi, err := parent.Lstat(base)
	if err != nil {
		return nil, &fs.PathError{Op: "lstat", Path: d.join(name), Err: unwrap(err)}
	}
	return fi, nil
}

// Remove removes name (a file, a link itself, an empty folder); its
// parent folders must not be links (ErrLink: nothing is removed).
func (d *Dir) Remove(name string) error {
	parent, base, err := d.walk("remove", name, false)
	if err != nil {
		return err
	}
	defer d.release(parent)
	if err := parent.Remove(base); err != nil {
		return &fs.PathError{Op: "remove", Path: d.join(name), Err: unwrap(err)}
	}
	return nil
}

// RemoveAll removes name and everything beneath it, no link followed
// (a link is removed itself); a name that does not exist is no error. Its
// parent folders must not be links (ErrLink: nothing is removed).
func (d *Dir) RemoveAll(name string) error {
	parent, base, err := d.walk("removeall", name, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer d.release(parent)
	if err := parent.RemoveAll(base); err != nil {
		return &fs.PathError{Op: "removeall", Path: d.join(name), Err: unwrap(err)}
	}
	return nil
}

// Glob returns the regular files whose names match pattern (a folder,
// then a filepath.Match pattern for the last element), sorted, as names
// relative to d. A folder that does not exist matches nothing; one that
// is a link is ErrLink. Links, folders and special files never match;
// more than MaxGlob matches is ErrTooLarge.
func (d *Dir) Glob(pattern string) ([]string, error) {
	dir, pat := filepath.Split(pattern)
	if _, err := filepath.Match(pat, ""); err != nil || pat == "" {
		return nil, &fs.PathError{Op: "glob", Path: d.join(pattern), Err: filepath.ErrBadPattern}
	}
	dir = filepath.Clean(dir)
	folder, err := d.walkAll("glob", dir, false, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer d.release(folder)
	f, err := folder.Open(".")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	for {
		ents, err := f.ReadDir(256)
		for _, e := range ents {
			if ok, _ := filepath.Match(pat, e.Name()); !ok || !e.Type().IsRegular() {
				continue
			}
			if len(out) == MaxGlob {
				return nil, &fs.PathError{Op: "glob", Path: d.join(pattern), Err: fmt.Errorf("%w: more than %d matches", ErrTooLarge, MaxGlob)}
			}
			out = append(out, filepath.Join(dir, e.Name()))
		}
		if err == io.EOF || len(ents) == 0 {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	slices.Sort(out)
	return out, nil
}

// ReadDir lists the folder name ("." is d itself), sorted by name; the
// folder and its parents must not be links (ErrLink).
func (d *Dir) ReadDir(name string) ([]fs.DirEntry, error) {
	dir, err := d.walkAll("readdir", filepath.Clean(name), false, 0)
	if err != nil {
		return nil, err
	}
	defer d.release(dir)
	f, err := dir.Open(".")
	if err != nil {
		return nil, &fs.PathError{Op: "readdir", Path: d.join(name), Err: unwrap(err)}
	}
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return nil, &fs.PathError{Op: "readdir", Path: d.join(name), Err: unwrap(err)}
	}
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return ents, nil
}

// Chmod sets the mode of the folder or regular file name, never through a
// link (ErrLink, for name or a parent). The mode is set by name once
// name was seen not to be a link: an entry swapped for a link in that
// instant is followed only within d (os.Root), never outside.
func (d *Dir) Chmod(name string, mode fs.FileMode) error {
	parent, base, err := d.walk("chmod", name, false)
	if err != nil {
		return err
	}
	defer d.release(parent)
	fi, err := parent.Lstat(base)
	if err != nil {
		return &fs.PathError{Op: "chmod", Path: d.join(name), Err: unwrap(err)}
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return &fs.PathError{Op: "chmod", Path: d.join(name), Err: ErrLink}
	}
	if !fi.IsDir() && !fi.Mode().IsRegular() {
		return &fs.PathError{Op: "chmod", Path: d.join(name), Err: ErrNotRegular}
	}
	if err := parent.Chmod(base, mode); err != nil {
		return &fs.PathError{Op: "chmod", Path: d.join(name), Err: unwrap(err)}
	}
	return nil
}

// walk checks name and opens the folder it is in (create: making missing
// folders and replacing links, as WriteFrom), returning that folder's
// root (release it) and name's last element.
func (d *Dir) walk(op, name string, create bool) (*os.Root, string, error) {
	if !filepath.IsLocal(name) || name != filepath.Clean(name) || name == "." {
		return nil, "", &fs.PathError{Op: op, Path: name, Err: ErrName}
	}
	parent, err := d.walkAll(op, filepath.Dir(name), create, 0o700)
	if err != nil {
		return nil, "", err
	}
	return parent, filepath.Base(name), nil
}

// walkAll opens the folder dir ("." is d itself) one element at a time,
// each checked to be a folder and not a link, and to be the folder it
// looked at once opened (a folder swapped for a link meanwhile is
// ErrLink); with create, a missing folder is made (perm, given to the
// owner) and a link replaced by one.
func (d *Dir) walkAll(op, dir string, create bool, perm fs.FileMode) (*os.Root, error) {
	if !filepath.IsLocal(dir) || dir != filepath.Clean(dir) {
		return nil, &fs.PathError{Op: op, Path: dir, Err: ErrName}
	}
	cur := d.root
	if dir == "." {
		return cur, nil
	}
	fail := func(err error) (*os.Root, error) {
		d.release(cur)
		return nil, err
	}
	done := ""
	for _, elem := range strings.Split(dir, string(filepath.Separator)) {
		done = filepath.Join(done, elem)
		next, err := d.enter(cur, elem, create, perm)
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return fail(&fs.PathError{Op: op, Path: d.join(done), Err: err})
		}
		d.release(cur)
		cur = next
	}
	return cur, nil
}

// enter opens the folder elem of cur (see walkAll).
func (d *Dir) enter(cur *os.Root, elem string, create bool, perm fs.FileMode) (*os.Root, error) {
	for range maxReplace {
		fi, err := cur.Lstat(elem)
		switch {
		case create && errors.Is(err, fs.ErrNotExist):
			if err := cur.Mkdir(elem, perm); err != nil && !errors.Is(err, fs.ErrExist) {
				return nil, err
			} else if err == nil && d.owner != nil {
				if err := d.chown(cur, elem); err != nil {
					return nil, err
				}
			}
			continue
		case err != nil:
			return nil, err
		case create && fi.Mode()&fs.ModeSymlink != 0:
			// The link itself goes (never what it names); the folder
			// takes its place at the next try.
			if err := cur.Remove(elem); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
			continue
		case fi.Mode()&fs.ModeSymlink != 0:
			return nil, ErrLink
		case !fi.IsDir():
			return nil, errNotDir
		}
		next, err := cur.OpenRoot(elem)
		if err != nil {
			return nil, err
		}
		if err := sameDir(next, fi); err != nil {
			next.Close()
			if create {
				continue
			}
			return nil, err
		}
		return next, nil
	}
	return nil, fmt.Errorf("%w: replaced %d times, and back again", ErrLink, maxReplace)
}

// release closes r unless it is d's own root.
func (d *Dir) release(r *os.Root) {
	if r != nil && r != d.root {
		r.Close()
	}
}

// sameDir checks that the folder r opened is the one fi describes (not
// a link's target, not a folder swapped in since).
func sameDir(r *os.Root, fi fs.FileInfo) error {
	got, err := r.Stat(".")
	if err != nil {
		return err
	}
	if !os.SameFile(fi, got) {
		return fmt.Errorf("%w: swapped while it was opened", ErrLink)
	}
	return nil
}

// chown gives name in r (a link itself) to d's owner.
func (d *Dir) chown(r *os.Root, name string) error {
	return r.Lchown(name, d.owner.UID, d.owner.GID)
}

func (d *Dir) join(name string) string { return filepath.Join(d.path, name) }

// regular checks that fi is a regular file, not a link.
func regular(fi fs.FileInfo) error {
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return ErrLink
	case !fi.Mode().IsRegular():
		return ErrNotRegular
	}
	return nil
}

// unwrap strips os's *PathError (whose path is relative to a folder the
// caller never named) so the caller's names the whole path.
func unwrap(err error) error {
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		return pe.Err
	case errors.As(err, &le):
		return le.Err
	}
	return err
}

func nonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
