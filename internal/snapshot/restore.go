package snapshot

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
)

// maxLinkTarget bounds a symbolic link's recorded target read back on
// restore (PATH_MAX on Linux).
const maxLinkTarget = 4096

// Restored tells what a Restore did.
type Restored struct {
	// Before is the snapshot Restore took of the workspace first:
	// restoring to it undoes the restore.
	Before ID `json:"before"`
	// Paths are the paths Restore removed or wrote, sorted.
	Paths []string `json:"paths"`
	// Kept are the paths the snapshot holds that Restore left alone
	// because something it never touches (a file over the size bound, a
	// nested repository, a folder that is not empty, a special file)
	// occupies them or their parent directory, sorted. An ignored file or
	// link there is no reason: it is replaced.
	Kept []string `json:"kept,omitempty"`
}

// Restore brings the workspace back to snapshot to: files added since are
// removed, deleted ones come back, modified ones are reverted (content,
// executable bit, symbolic links as links). Every file to holds comes
// back, whatever the ignore files say now: an ignored file or link where
// one goes (or where a folder above one goes) is replaced. Otherwise what
// snapshots leave out (ignored paths, files over the size bound, nested
// repositories, special files) is left untouched, and nothing is written
// through a symbolic link or outside the workspace. Restore first snapshots the workspace
// (Restored.Before); it waits behind the Repo's other snapshots and
// restores, and ctx bounds the wait and the work.
//
// On an error, the paths restored so far are returned with it; the
// workspace is then between the two states, and restoring to
// Restored.Before (when set) or to to again finishes or undoes it.
func (r *Repo) Restore(ctx context.Context, to ID) (res Restored, err error) {
	ctx, end, err := r.begin(ctx)
	if err != nil {
		return Restored{}, err
	}
	defer end()
	if err := r.checkIDs(ctx, to); err != nil {
		return Restored{}, err
	}
	if err := r.acquire(ctx); err != nil {
		return Restored{}, err
	}
	defer r.release()
	first, err := r.snapshot(ctx, nil)
	if err != nil {
		return Restored{}, err
	}
	before := first.id
	res = Restored{Before: before, Paths: []string{}}
	defer func() { // on every return, errors included
		slices.Sort(res.Paths)
		slices.Sort(res.Kept)
	}()
	if before == to {
		return res, nil
	}
	cs, err := r.rawDiff(ctx, before, to, false)
	if err != nil {
		return res, err
	}
	root, err := os.OpenRoot(r.workspace)
	if err != nil {
		return res, fmt.Errorf("%w: %w", ErrWorkspace, err)
	}
	defer root.Close()
	w := &restorer{root: root, res: &res, ignored: first.ignored, owner: folderOwner(root)}
	// Removals first, so a directory can take a removed file's place and
	// a file an emptied directory's.
	for _, c := range cs {
		if c.Status == StatusDeleted {
			if err := w.remove(c.Path); err != nil {
				return res, err
			}
		}
	}
	var blobs *catFile
	defer func() {
		if blobs != nil {
			blobs.close()
		}
	}()
	for _, c := range cs {
		if c.Status == StatusDeleted {
			continue
		}
		if blobs == nil {
			if blobs, err = r.catFile(ctx); err != nil {
				return res, err
			}
		}
		if err := w.write(c, blobs); err != nil {
			if ctx.Err() != nil {
				err = fmt.Errorf("snapshot: restore: %w", ctxErr(ctx))
			}
			return res, err
		}
	}
	if blobs != nil {
		if err := blobs.close(); err != nil {
			return res, err
		}
		blobs = nil
	}
	// Record the restored state (the files written are recorded again,
	// even where an ignore rule matches them), so the index's stat data is
	// fresh and the next snapshot stays incremental.
	if _, err := r.snapshot(ctx, w.written); err != nil {
		return res, err
	}
	return res, nil
}

// restorer applies one restore's changes inside the workspace's root.
type restorer struct {
	root *os.Root
	res  *Restored
	// ignored are the paths the snapshot before the restore left out as
	// ignored (a folder with a trailing slash).
	ignored map[string]bool
	// written are the files written.
	written []string
	// owner gets what the restore creates (the workspace's owner, when
	// the host is root and that is another user: an agent running as a
	// uid of its own); nil: the host's user.
	owner *[2]int
}

// isIgnored says whether p, or a folder above it, was left out as ignored.
func (w *restorer) isIgnored(p string) bool {
	if w.ignored[p] || w.ignored[p+"/"] {
		return true
	}
	for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
		if w.ignored[dir+"/"] {
			return true
		}
	}
	return false
}

// own gives name (a link itself) to w's owner.
func (w *restorer) own(name string) error {
	if w.owner == nil {
		return nil
	}
	if err := w.root.Lchown(name, w.owner[0], w.owner[1]); err != nil {
		return fmt.Errorf("snapshot: restore: %w", err)
	}
	return nil
}

// safe refuses a path git would never record: absolute, with empty, "."
// or ".." components, or a .git component in any case.
func safe(p string) bool {
	if p == "" || strings.HasPrefix(p, "/") {
		return false
	}
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." || c == ".." || strings.EqualFold(c, ".git") {
			return false
		}
	}
	return true
}

// remove removes a file the target snapshot does not have, then the
// directories that removal left empty.
func (w *restorer) remove(p string) error {
	if !safe(p) {
		return nil
	}
	if err := w.root.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("snapshot: restore: %w", err)
	}
	w.res.Paths = append(w.res.Paths, p)
	for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
		if fi, err := w.root.Lstat(dir); err != nil || !fi.IsDir() || w.root.Remove(dir) != nil {
			break // not empty (or not ours to remove): its parents are not empty either
		}
	}
	return nil
}

// write brings one file back to its content in the target snapshot.
func (w *restorer) write(c change, blobs *catFile) error {
	p := c.Path
	if !safe(p) || c.newMode == "160000" {
		return nil
	}
	if c.Status == StatusAdded {
		// Not in the snapshot just taken, yet present: something snapshots
		// leave out is there. An ignored file or link is replaced (the
		// rename below fails on a folder); what else (too large, special)
		// wins.
		if _, err := w.root.Lstat(p); err == nil && !w.isIgnored(p) {
			w.res.Kept = append(w.res.Kept, p)
			return nil
		}
	}
	dir := path.Dir(p)
	if ok, err := w.mkdirs(dir); err != nil || !ok {
		if !ok && err == nil {
			w.res.Kept = append(w.res.Kept, p)
		}
		return err
	}
	tmp := path.Join(dir, ".agenthost-restore-"+randomName())
	if err := w.create(tmp, c, blobs); err != nil {
		_ = w.root.Remove(tmp)
		return err
	}
	// Rename replaces a file or a link itself, never what a link points at.
	if err := w.root.Rename(tmp, p); err != nil {
		_ = w.root.Remove(tmp)
		if fi, lerr := w.root.Lstat(p); lerr == nil && fi.IsDir() {
			w.res.Kept = append(w.res.Kept, p) // a directory that is not empty
			return nil
		}
		return fmt.Errorf("snapshot: restore: %w", err)
	}
	w.res.Paths = append(w.res.Paths, p)
	w.written = append(w.written, p)
	return nil
}

// mkdirs makes dir and its parents real directories, following no
// symbolic link: an ignored file or link in the way is removed; it reports
// false when a component is something else (then the path is kept as it
// is).
func (w *restorer) mkdirs(dir string) (bool, error) {
	if dir == "." {
		return true, nil
	}
	parts := strings.Split(dir, "/")
	for i := range parts {
		d := strings.Join(parts[:i+1], "/")
		fi, err := w.root.Lstat(d)
		switch {
		case err == nil && fi.IsDir():
			continue
		case err == nil && w.isIgnored(d):
			if err := w.root.Remove(d); err != nil {
				return false, fmt.Errorf("snapshot: restore: %w", err)
			}
			w.res.Paths = append(w.res.Paths, d)
		case err == nil:
			return false, nil
		case !errors.Is(err, os.ErrNotExist):
			return false, fmt.Errorf("snapshot: restore: %w", err)
		}
		if err := w.root.Mkdir(d, 0o777); err != nil {
			return false, fmt.Errorf("snapshot: restore: %w", err)
		}
		if err := w.own(d); err != nil {
			return false, err
		}
	}
	return true, nil
}

// create writes the blob of c at tmp: a file with its mode, or a link.
func (w *restorer) create(tmp string, c change, blobs *catFile) error {
	size, err := blobs.open(c.newBlob)
	if err != nil {
		return err
	}
	if c.newMode == "120000" {
		if size > maxLinkTarget {
			blobs.skip(size)
			return fmt.Errorf("snapshot: restore %s: link target of %d bytes", c.Path, size)
		}
		target := make([]byte, size)
		if err := blobs.read(target); err != nil {
			return err
		}
		if err := w.root.Symlink(string(target), tmp); err != nil {
			return fmt.Errorf("snapshot: restore: %w", err)
		}
		return w.own(tmp)
	}
	perm := os.FileMode(0o666)
	if c.newMode == "100755" {
		perm = 0o777
	}
	f, err := w.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		blobs.skip(size)
		return fmt.Errorf("snapshot: restore: %w", err)
	}
	if err := blobs.copy(f, size); err != nil {
		_ = f.Close()
		return err
	}
	if w.owner != nil {
		if err := f.Chown(w.owner[0], w.owner[1]); err != nil {
			_ = f.Close()
			return fmt.Errorf("snapshot: restore: %w", err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("snapshot: restore: %w", err)
	}
	return nil
}

func randomName() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// catFile streams blobs out of the shadow repository: one `git cat-file
// --batch` for a whole restore.
type catFile struct {
	cmd    interface{ Wait() error }
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *headBuffer
	ctx    context.Context
	stop   context.CancelFunc // kills git
	broken error              // set once the stream is out of step
}

func (r *Repo) catFile(ctx context.Context) (*catFile, error) {
	ctx, stop := context.WithCancel(ctx)
	args := []string{"cat-file", "--batch"}
	cmd, stderr := r.command(ctx, args...)
	in, err := cmd.StdinPipe()
	if err != nil {
		stop()
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		stop()
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if err := cmd.Start(); err != nil {
		stop()
		return nil, wrap(ctx, args, stderr, err)
	}
	return &catFile{cmd: cmd, in: in, out: bufio.NewReaderSize(out, 64<<10), stderr: stderr, ctx: ctx, stop: stop}, nil
}

func (b *catFile) fail(err error) error {
	if b.broken == nil {
		if b.ctx.Err() != nil {
			err = fmt.Errorf("snapshot: git cat-file: %w", ctxErr(b.ctx))
		}
		b.broken = err
	}
	return b.broken
}

// open asks for blob and returns its size; its content must then be read
// whole (read, copy or skip) before the next open.
func (b *catFile) open(blob string) (int64, error) {
	if b.broken != nil {
		return 0, b.broken
	}
	if _, err := io.WriteString(b.in, blob+"\n"); err != nil {
		return 0, b.fail(&GitError{Command: "cat-file", Stderr: b.stderr.String(), Err: err})
	}
	line, err := b.out.ReadString('\n')
	if err != nil {
		return 0, b.fail(&GitError{Command: "cat-file", Stderr: b.stderr.String(), Err: err})
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != blob || f[1] != "blob" {
		return 0, b.fail(fmt.Errorf("snapshot: git cat-file: unexpected answer %q", strings.TrimSpace(line)))
	}
	size, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil || size < 0 {
		return 0, b.fail(fmt.Errorf("snapshot: git cat-file: unexpected answer %q", strings.TrimSpace(line)))
	}
	return size, nil
}

// copy writes the open blob's size bytes to w, then consumes the newline
// that ends it.
func (b *catFile) copy(w io.Writer, size int64) error {
	dst := &errWriter{w: w}
	if _, err := io.CopyN(dst, b.out, size); err != nil {
		if dst.err != nil { // the workspace's side: a full disk, a quota
			return b.fail(fmt.Errorf("snapshot: restore: %w", dst.err))
		}
		return b.fail(&GitError{Command: "cat-file", Stderr: b.stderr.String(), Err: err})
	}
	return b.skipNewline()
}

// errWriter remembers its writer's error, to tell it from the reader's.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil {
		e.err = err
	}
	return n, err
}

func (b *catFile) read(p []byte) error {
	if _, err := io.ReadFull(b.out, p); err != nil {
		return b.fail(&GitError{Command: "cat-file", Stderr: b.stderr.String(), Err: err})
	}
	return b.skipNewline()
}

func (b *catFile) skip(size int64) {
	if _, err := b.out.Discard(int(size)); err != nil {
		b.fail(&GitError{Command: "cat-file", Stderr: b.stderr.String(), Err: err})
		return
	}
	_ = b.skipNewline()
}

func (b *catFile) skipNewline() error {
	if c, err := b.out.ReadByte(); err != nil || c != '\n' {
		return b.fail(fmt.Errorf("snapshot: git cat-file: stream out of step"))
	}
	return nil
}

// close ends the stream and waits for git (killed first when the stream
// broke: it may be blocked writing what is no longer read).
func (b *catFile) close() error {
	defer b.stop()
	if b.broken != nil {
		b.stop()
	}
	_ = b.in.Close()
	err := b.cmd.Wait()
	if b.broken != nil {
		return b.broken
	}
	if err != nil {
		return b.fail(wrap(b.ctx, []string{"cat-file"}, b.stderr, err))
	}
	return nil
}
