package gitws

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// maxAlternatesDepth bounds how far checkFile follows alternates (git's own bound is 5).
const maxAlternatesDepth = 5

// maxGitFile bounds a gitfile, commondir or alternates file read by checkFile.
const maxGitFile = 64 << 10

// checkFile decides whether the repository a file:// URL names may be read, and returns the
// folder to run git with: the URL's path with its links resolved, so that git opens what was
// checked. The repository must lie under one of Options.FileRoots and nowhere near the
// engine's Root or Options.Denied, which is checked:
//
//   - after resolving links, for every folder git would try to open (path/.git, path,
//     path.git/.git, path.git: upload-pack's own order), for the folder a gitfile
//     ("gitdir: ...") leads to, and for the folders the repository's commondir and alternates
//     (followed as far as git does) name, since git reads objects there too;
//   - by path, by identity (a folder of the path that is a denied folder, bind-mounted or
//     hard-linked elsewhere) and, on Linux, by place in its filesystem (a bind mount of a
//     folder inside a denied one).
//
// What remains is a race with whoever can write under a root between this check and git's
// open: roots are folders that no room's agent can write.
func (e *Engine) checkFile(rm remote) (string, error) {
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("%w: git URL %q: %s", ErrBadSpec, rm.redacted, why)
	}
	if len(e.opts.FileRoots) == 0 {
		return bad("file:// repositories are not allowed on this server (its operator lists the folders they may be in)")
	}
	real := resolve(rm.file)
	var places []string
	for _, suffix := range []string{"/.git", "", ".git/.git", ".git"} {
		places = append(places, real+suffix)
	}
	seen := map[string]bool{}
	for depth := 0; len(places) > 0; depth++ {
		if depth > maxAlternatesDepth+2 {
			return bad("its alternates go too deep")
		}
		var next []string
		for _, p := range places {
			p = resolve(p)
			if seen[p] {
				continue
			}
			seen[p] = true
			fi, err := os.Stat(p)
			if err != nil && p != real {
				continue // git tries the next place
			}
			if why := e.placeRefused(p); why != "" {
				return bad(why)
			}
			switch {
			case err != nil:
			case fi.Mode().IsRegular():
				// A gitfile: "gitdir: <folder>", relative to the file's folder.
				if dir, ok := readLine(p, "gitdir: "); ok {
					next = append(next, joinFrom(filepath.Dir(p), dir))
				}
			case fi.IsDir():
				if dir, ok := readLine(filepath.Join(p, "commondir"), ""); ok {
					next = append(next, joinFrom(p, dir))
				}
				objects := filepath.Join(p, "objects")
				for _, alt := range readLines(filepath.Join(objects, "info", "alternates")) {
					if strings.HasPrefix(alt, `"`) {
						// git reads a C-quoted path there; a repository that needs one is
						// not worth the risk of reading it differently.
						return bad("its objects/info/alternates names a quoted path")
					}
					// An alternate is an objects folder; its own alternates are read too.
					alt = joinFrom(objects, alt)
					next = append(next, filepath.Dir(alt))
				}
			}
		}
		places = next
	}
	return real, nil
}

// placeRefused says why git may not read the folder p (resolved), or "" if it may.
func (e *Engine) placeRefused(p string) string {
	for _, d := range append([]string{e.opts.Root}, e.opts.Denied...) {
		if d == "" {
			continue
		}
		if sameOrWithin(p, resolve(d)) {
			return "inside the server's own folders (its data, the rooms' workspaces and snapshots), which are never a source"
		}
	}
	for _, root := range e.opts.FileRoots {
		if within(p, resolve(root)) {
			return ""
		}
	}
	return "file:// repositories are allowed only under " + strings.Join(e.opts.FileRoots, ", ")
}

// sameOrWithin reports whether p lies in folder d: by path, or because p or one of its parents
// is d itself seen through another path (a bind mount, a hard-linked folder), or (on Linux) a
// mount of a folder inside d.
func sameOrWithin(p, d string) bool {
	if within(p, d) {
		return true
	}
	if di, err := os.Stat(d); err == nil {
		for a := p; ; a = filepath.Dir(a) {
			if ai, err := os.Stat(a); err == nil && os.SameFile(ai, di) {
				return true
			}
			if a == filepath.Dir(a) {
				break
			}
		}
	}
	return sameFSWithin(p, d)
}

// resolve is p with the links of its deepest existing folder resolved (the rest appended).
func resolve(p string) string {
	var rest []string
	for {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Join(append([]string{r}, rest...)...)
		}
		parent := filepath.Dir(p)
		if parent == p {
			return filepath.Join(append([]string{p}, rest...)...)
		}
		rest = append([]string{filepath.Base(p)}, rest...)
		p = parent
	}
}

// joinFrom is name taken relative to dir when it is not absolute.
func joinFrom(dir, name string) string {
	if filepath.IsAbs(name) {
		return filepath.Clean(name)
	}
	return filepath.Join(dir, name)
}

// readLine returns the first line of file p without prefix (which it must start with).
func readLine(p, prefix string) (string, bool) {
	lines := readLines(p)
	if len(lines) == 0 || !strings.HasPrefix(lines[0], prefix) {
		return "", false
	}
	return strings.TrimSpace(strings.TrimPrefix(lines[0], prefix)), true
}

// readLines returns the non-empty, non-comment lines of file p (none when it cannot be read).
func readLines(p string) []string {
	f, err := os.Open(p)
	if err != nil {
		return nil
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxGitFile))
	if err != nil && !errors.Is(err, io.EOF) {
		return nil
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if line := strings.TrimRight(sc.Text(), "\r"); line != "" && !strings.HasPrefix(line, "#") {
			out = append(out, line)
		}
	}
	return out
}
