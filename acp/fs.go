package acp

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// MaxFileBytes bounds a file read or written for the agent: the answer
// must fit one line.
const MaxFileBytes = 4 << 20

// ErrOutsideRoot: an fs request named a path outside the workspace (after
// resolving "..", and symlinks, which os.Root follows only inside it).
var ErrOutsideRoot = errors.New("acp: path outside the workspace")

// fsRoot serves fs/* requests inside one directory through os.Root, so a
// symlink or ".." can never lead out of it.
type fsRoot struct {
	mu    sync.Mutex
	dirs  []string // the root as given and with symlinks resolved (and its later names: MoveFSRoot)
	root  *os.Root
	owner *FileOwner // gets what write creates; nil: the host's user
}

// FileOwner is a user and group that get files (see Options.FSOwner).
type FileOwner struct{ UID, GID int }

func openFSRoot(dir string) (*fsRoot, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("acp: fs root: %w", err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("acp: fs root: %w", err)
	}
	r, err := os.OpenRoot(real)
	if err != nil {
		return nil, fmt.Errorf("acp: fs root: %w", err)
	}
	return &fsRoot{dirs: []string{abs, real}, root: r}, nil
}

// moved names dir the root's path from now on: the folder it opened was
// renamed there (a warm pool's slot bound to a room). The old names no
// longer lead into it.
func (f *fsRoot) moved(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("acp: fs root: %w", err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return fmt.Errorf("acp: fs root: %w", err)
	}
	f.mu.Lock()
	f.dirs = []string{abs, real}
	f.mu.Unlock()
	return nil
}

func (f *fsRoot) close() {
	if f != nil {
		f.root.Close()
	}
}

// rel maps an absolute path the agent sent to one relative to the root.
func (f *fsRoot) rel(path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("%w: not an absolute path", ErrOutsideRoot)
	}
	path = filepath.Clean(path)
	f.mu.Lock()
	dirs := f.dirs
	f.mu.Unlock()
	for _, d := range dirs {
		r, err := filepath.Rel(d, path)
		if err == nil && r != ".." && !strings.HasPrefix(r, ".."+string(filepath.Separator)) {
			return r, nil
		}
	}
	return "", ErrOutsideRoot
}

// escaped tells an os.Root refusal from other errors.
func escaped(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "escapes") {
		return fmt.Errorf("%w: %s", ErrOutsideRoot, pe.Err)
	}
	return err
}

// ErrNotRegular: an fs request named something other than a regular file
// (a FIFO, socket or device would block the request, or never end).
var ErrNotRegular = errors.New("acp: not a regular file")

// openRegular opens rel inside the root without blocking (a FIFO without a
// writer would hold the open forever) and refuses anything but a regular
// file. O_NONBLOCK changes nothing for a regular file's reads and writes.
func (f *fsRoot) openRegular(rel string, flag int) (*os.File, error) {
	fh, err := f.root.OpenFile(rel, flag|syscall.O_NONBLOCK, 0o644)
	if err != nil {
		if errors.Is(err, syscall.ENXIO) {
			// A FIFO opened for writing with no reader.
			return nil, fmt.Errorf("%w: %s", ErrNotRegular, rel)
		}
		return nil, escaped(err)
	}
	fi, err := fh.Stat()
	if err != nil {
		fh.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		fh.Close()
		return nil, fmt.Errorf("%w: %s", ErrNotRegular, rel)
	}
	return fh, nil
}

func (f *fsRoot) read(path string, line, limit *int) (string, error) {
	rel, err := f.rel(path)
	if err != nil {
		return "", err
	}
	fh, err := f.openRegular(rel, os.O_RDONLY)
	if err != nil {
		return "", err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, MaxFileBytes+1))
	if err != nil {
		return "", err
	}
	if len(data) > MaxFileBytes {
		return "", fmt.Errorf("acp: file larger than %d bytes", MaxFileBytes)
	}
	text := string(data)
	if line == nil && limit == nil {
		return text, nil
	}
	return lineRange(strings.SplitAfter(text, "\n"), line, limit), nil
}

// lineRange joins the lines from line (1-based; nil or below 2: the first)
// for at most limit lines (nil or negative: all). Any int is a valid bound:
// the agent chooses both.
func lineRange(lines []string, line, limit *int) string {
	start := 0
	if line != nil && *line > 1 {
		start = min(*line-1, len(lines))
	}
	end := len(lines)
	// Compared to what is left, so a huge limit cannot overflow start+limit.
	if limit != nil && *limit >= 0 && *limit < len(lines)-start {
		end = start + *limit
	}
	return strings.Join(lines[start:end], "")
}

func (f *fsRoot) write(path, content string) error {
	if len(content) > MaxFileBytes {
		return fmt.Errorf("acp: content larger than %d bytes", MaxFileBytes)
	}
	rel, err := f.rel(path)
	if err != nil {
		return err
	}
	if err := f.mkdirs(filepath.Dir(rel)); err != nil {
		return escaped(err)
	}
	// Truncated only once it is known to be a regular file; a new one is
	// the owner's, an existing one keeps its own.
	fh, err := f.openRegular(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL)
	if err == nil && f.owner != nil {
		err = fh.Chown(f.owner.UID, f.owner.GID)
		if err != nil {
			fh.Close()
		}
	} else if errors.Is(err, os.ErrExist) {
		fh, err = f.openRegular(rel, os.O_WRONLY)
	}
	if err != nil {
		return err
	}
	defer fh.Close()
	if err := fh.Truncate(0); err != nil {
		return err
	}
	if _, err := fh.WriteString(content); err != nil {
		return err
	}
	return fh.Close()
}

// mkdirs makes dir's missing folders (0755, the owner's).
func (f *fsRoot) mkdirs(dir string) error {
	if dir == "." {
		return nil
	}
	if err := f.mkdirs(filepath.Dir(dir)); err != nil {
		return err
	}
	err := f.root.Mkdir(dir, 0o755)
	switch {
	case errors.Is(err, os.ErrExist):
		return nil
	case err == nil && f.owner != nil:
		return f.root.Lchown(dir, f.owner.UID, f.owner.GID)
	}
	return err
}
