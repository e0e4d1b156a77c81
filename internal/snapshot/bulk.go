package snapshot

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// bulkFiles is how many files a snapshot must read for it to store them
// through one `git fast-import` pack instead of one loose object file
// each: on a first snapshot the loose files cost seconds of system time
// per ten thousand (fast-import's own threshold for keeping a pack is
// 100 objects).
const bulkFiles = 256

// bulkUpdate records plan's paths in the index, storing the files' and
// links' contents as one pack: the engine reads each (inside the
// workspace's root, bounded by MaxFileSize) and streams it to git
// fast-import, then sets the index entries from the object names git
// gives back and lets git fill in their stat data. Files that vanish,
// outgrow the bound or cannot be read meanwhile are dropped (and the
// latter two reported).
func (r *Repo) bulkUpdate(ctx context.Context, p *plan) error {
	root, err := os.OpenRoot(r.workspace)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrWorkspace, err)
	}
	defer root.Close()
	marks := filepath.Join(r.dir, "fast-import.marks")
	defer os.Remove(marks)
	args := []string{"fast-import", "--quiet", "--done", "--export-marks=" + marks}
	cmd, stderr := r.command(ctx, args...)
	in, err := cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return wrap(ctx, args, stderr, err)
	}
	stored, streamErr := r.streamBlobs(root, p, in)
	_ = in.Close()
	if err := wrap(ctx, args, stderr, cmd.Wait()); err != nil {
		return err
	}
	if streamErr != nil {
		return streamErr
	}
	names, err := readMarks(marks)
	if err != nil {
		return err
	}
	// One index-info record per path: the stored object, or mode 0 to
	// drop a path that is gone.
	var info bytes.Buffer
	for _, path := range p.update {
		s, ok := stored[path]
		switch {
		case !ok:
			info.WriteString("0 " + strings.Repeat("0", 40) + "\t" + path + "\x00")
		case names[s.mark] == "":
			return fmt.Errorf("snapshot: git fast-import gave no object for %s", path)
		default:
			info.WriteString(s.mode + " " + names[s.mark] + "\t" + path + "\x00")
		}
	}
	if err := r.run(ctx, info.Bytes(), "update-index", "-z", "--index-info"); err != nil {
		return err
	}
	// The entries have no stat data yet: git reads each file once more to
	// confirm it and fill it in, so the next snapshot is incremental.
	return r.run(ctx, nil, "update-index", "-q", "--refresh")
}

// storedBlob is a path's content sent to fast-import under mark.
type storedBlob struct {
	mark int
	mode string
}

// streamBlobs writes a fast-import stream of plan's files to w and says
// which paths it stored; it fails only when the stream does.
func (r *Repo) streamBlobs(root *os.Root, p *plan, w io.Writer) (map[string]storedBlob, error) {
	bw := bufio.NewWriterSize(w, 256<<10)
	stored := map[string]storedBlob{}
	buf := make([]byte, 0, 64<<10)
	for i, f := range p.files {
		var err error
		// A path not stored is dropped from the index.
		if buf, err = r.readEntry(root, f, buf[:0]); err != nil {
			switch {
			case errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
				// Gone meanwhile.
			case errors.Is(err, errTooLarge):
				p.skipped = append(p.skipped, Skipped{Path: f.path, Reason: ReasonTooLarge, Size: int64(len(buf))})
			default:
				// Unreadable now, or its directory became a link out of the
				// workspace.
				p.skipped = append(p.skipped, Skipped{Path: f.path, Reason: ReasonUnreadable})
			}
			continue
		}
		mark := i + 1
		fmt.Fprintf(bw, "blob\nmark :%d\ndata %d\n", mark, len(buf))
		bw.Write(buf)
		if _, err := bw.WriteString("\n"); err != nil {
			return nil, fmt.Errorf("snapshot: git fast-import: %w", err)
		}
		stored[f.path] = storedBlob{mark: mark, mode: f.mode}
	}
	bw.WriteString("done\n")
	if err := bw.Flush(); err != nil {
		return nil, fmt.Errorf("snapshot: git fast-import: %w", err)
	}
	return stored, nil
}

var errTooLarge = errors.New("over the size bound")

// readEntry reads a file's content or a link's target into buf.
func (r *Repo) readEntry(root *os.Root, f planned, buf []byte) ([]byte, error) {
	name := filepath.FromSlash(f.path)
	if f.mode == "120000" {
		target, err := root.Readlink(name)
		if err != nil {
			return buf, fmt.Errorf("snapshot: %w", err)
		}
		return append(buf, target...), nil
	}
	file, err := root.Open(name)
	if err != nil {
		return buf, fmt.Errorf("snapshot: %w", err)
	}
	defer file.Close()
	b := bytes.NewBuffer(buf)
	n, err := b.ReadFrom(io.LimitReader(file, r.opts.MaxFileSize+1))
	if err != nil {
		return b.Bytes(), fmt.Errorf("snapshot: %w", err)
	}
	if n > r.opts.MaxFileSize {
		return b.Bytes(), errTooLarge
	}
	return b.Bytes(), nil
}

// readMarks reads fast-import's exported marks: ":<mark> <object>" lines.
func readMarks(path string) (map[int]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("snapshot: git fast-import marks: %w", err)
	}
	names := map[int]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		mark, name, ok := strings.Cut(strings.TrimPrefix(line, ":"), " ")
		n, err := strconv.Atoi(mark)
		if !ok || err != nil || !ID(name).valid() {
			return nil, fmt.Errorf("snapshot: git fast-import marks: unexpected line %q", line)
		}
		names[n] = name
	}
	return names, nil
}
