package snapshot

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Defaults for Limits.
const (
	// DefaultMaxPatchBytes bounds a Diff's patch: enough to read a
	// turn's edits, small enough for one HTTP answer and a page.
	DefaultMaxPatchBytes = 1 << 20
	// DefaultMaxFiles bounds the files a Diff lists.
	DefaultMaxFiles = 1000
)

// Limits bound a Diff. The zero value is usable.
type Limits struct {
	// MaxPatchBytes bounds the patch (default 1 MiB); a longer one is cut
	// at a line's end and Diff.Truncated is set.
	MaxPatchBytes int
	// MaxFiles bounds Diff.Files (default 1000); the rest are counted in
	// Diff.FilesOmitted (and in Changes).
	MaxFiles int
}

func (l *Limits) fill() {
	if l.MaxPatchBytes <= 0 {
		l.MaxPatchBytes = DefaultMaxPatchBytes
	}
	if l.MaxFiles <= 0 {
		l.MaxFiles = DefaultMaxFiles
	}
}

// Status is how a file changed between two snapshots.
type Status string

// Statuses of a changed file. A file replaced by a symbolic link (or the
// reverse) is modified; a rename is a deletion and an addition.
const (
	StatusAdded    Status = "added"
	StatusModified Status = "modified"
	StatusDeleted  Status = "deleted"
)

func (s Status) String() string { return string(s) }

// File is one changed file.
type File struct {
	// Path is relative to the workspace, with forward slashes.
	Path       string `json:"path"`
	Status     Status `json:"status"`
	Insertions int    `json:"insertions"`
	Deletions  int    `json:"deletions"`
	// Binary is set for a file git does not diff as text; its lines are
	// not counted and the patch only names it.
	Binary bool `json:"binary,omitempty"`
}

// Changes are the totals of a diff.
type Changes struct {
	Files      int `json:"files"`
	Insertions int `json:"insertions"`
	Deletions  int `json:"deletions"`
}

// Diff is what changed between two snapshots.
type Diff struct {
	// Files are the changed files, sorted by path, at most
	// Limits.MaxFiles.
	Files []File `json:"files"`
	// FilesOmitted counts the changed files beyond Limits.MaxFiles.
	FilesOmitted int `json:"files_omitted,omitempty"`
	// Changes counts every changed file.
	Changes Changes `json:"changes"`
	// Patch is the unified diff (binary files named, not inlined), at
	// most Limits.MaxPatchBytes.
	Patch string `json:"patch"`
	// Truncated is set when Patch was cut.
	Truncated bool `json:"truncated,omitempty"`
}

// change is one entry of `git diff-tree --raw`.
type change struct {
	File
	oldMode, newMode string
	newBlob          string
}

// Changes counts the files, inserted and deleted lines between two
// snapshots, without a patch. It runs beside snapshots and restores.
func (r *Repo) Changes(ctx context.Context, from, to ID) (Changes, error) {
	ctx, end, err := r.begin(ctx)
	if err != nil {
		return Changes{}, err
	}
	defer end()
	if err := r.checkIDs(ctx, from, to); err != nil {
		return Changes{}, err
	}
	cs, err := r.rawDiff(ctx, from, to, true)
	if err != nil {
		return Changes{}, err
	}
	return total(cs), nil
}

// Diff tells what changed from one snapshot to another: each file with
// its line counts, and a unified patch, both bounded by lim. It runs
// beside snapshots and restores.
func (r *Repo) Diff(ctx context.Context, from, to ID, lim Limits) (Diff, error) {
	lim.fill()
	ctx, end, err := r.begin(ctx)
	if err != nil {
		return Diff{}, err
	}
	defer end()
	if err := r.checkIDs(ctx, from, to); err != nil {
		return Diff{}, err
	}
	d := Diff{Files: []File{}}
	if from == to {
		return d, nil
	}
	cs, err := r.rawDiff(ctx, from, to, true)
	if err != nil {
		return Diff{}, err
	}
	d.Changes = total(cs)
	for i, c := range cs {
		if i == lim.MaxFiles {
			d.FilesOmitted = len(cs) - i
			break
		}
		d.Files = append(d.Files, c.File)
	}
	patch, truncated, err := r.outputLimit(ctx, lim.MaxPatchBytes, "diff-tree", "-r", "-p", "--no-renames",
		"--no-ext-diff", "--no-textconv", "--no-color", string(from), string(to))
	if err != nil {
		return Diff{}, err
	}
	if truncated {
		// Cut at the end of the last whole line.
		if i := bytes.LastIndexByte(patch, '\n'); i >= 0 {
			patch = patch[:i+1]
		}
		d.Truncated = true
	}
	d.Patch = string(patch)
	return d, nil
}

func total(cs []change) Changes {
	t := Changes{Files: len(cs)}
	for _, c := range cs {
		t.Insertions += c.Insertions
		t.Deletions += c.Deletions
	}
	return t
}

// rawDiff lists the files that differ between two snapshots, sorted by
// path, with line counts when numstat is set.
func (r *Repo) rawDiff(ctx context.Context, from, to ID, numstat bool) ([]change, error) {
	args := []string{"diff-tree", "-r", "-z", "--raw", "--no-abbrev", "--no-renames", "--no-ext-diff", "--no-textconv"}
	if numstat {
		args = append(args, "--numstat")
	}
	out, err := r.output(ctx, nil, append(args, string(from), string(to))...)
	if err != nil {
		return nil, err
	}
	return parseRawDiff(out)
}

// parseRawDiff reads `git diff-tree -r -z --raw [--numstat]` output:
// ":<old mode> <new mode> <old blob> <new blob> <status>\0<path>\0" for
// each file, then "<insertions>\t<deletions>\t<path>\0" for each ("-" for
// both when binary).
func parseRawDiff(out []byte) ([]change, error) {
	var cs []change
	byPath := map[string]int{}
	fields := bytes.Split(bytes.TrimSuffix(out, []byte{0}), []byte{0})
	if len(out) == 0 {
		fields = nil
	}
	for i := 0; i < len(fields); i++ {
		f := fields[i]
		if len(f) > 0 && f[0] == ':' {
			h := strings.Fields(string(f[1:]))
			if len(h) != 5 || i+1 >= len(fields) || len(fields[i+1]) == 0 {
				return nil, fmt.Errorf("snapshot: unexpected git diff-tree output %q", f)
			}
			i++
			c := change{File: File{Path: string(fields[i]), Status: StatusModified}, oldMode: h[0], newMode: h[1], newBlob: h[3]}
			switch h[4] {
			case "A":
				c.Status = StatusAdded
			case "D":
				c.Status = StatusDeleted
			}
			byPath[c.Path] = len(cs)
			cs = append(cs, c)
			continue
		}
		ins, rest, ok1 := bytes.Cut(f, []byte{'\t'})
		del, path, ok2 := bytes.Cut(rest, []byte{'\t'})
		j, known := byPath[string(path)]
		if !ok1 || !ok2 || !known {
			return nil, fmt.Errorf("snapshot: unexpected git diff-tree output %q", f)
		}
		if string(ins) == "-" {
			cs[j].Binary = true
			continue
		}
		n, err1 := strconv.Atoi(string(ins))
		m, err2 := strconv.Atoi(string(del))
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("snapshot: unexpected git diff-tree output %q", f)
		}
		cs[j].Insertions, cs[j].Deletions = n, m
	}
	slices.SortFunc(cs, func(a, b change) int { return strings.Compare(a.Path, b.Path) })
	return cs, nil
}
