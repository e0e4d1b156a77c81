package snapshot

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// No git configuration of the user, the system, the environment or the
// workspace changes what the engine stores or makes it run a program:
// filters, fsmonitor, hooks, excludes and attributes files, line-ending
// and ident conversions, and GIT_* variables are all without effect.
// Even a filter defined in the shadow repository's own config (which
// nothing but the engine should write) is not run, because the engine's
// attributes reset every workspace .gitattributes.
func TestRepo_HostileConfig(t *testing.T) {
	ctx := testCtx(t)
	base := t.TempDir()
	marker := filepath.Join(base, "RAN")
	script := filepath.Join(base, "evil.sh")
	write(t, base, "evil.sh", "#!/bin/sh\necho ran \"$@\" >> "+marker+"\ncat\n")
	if err := os.Chmod(script, 0o755); err != nil {
		t.Fatal(err)
	}
	evilConfig := fmt.Sprintf(`[filter "evil"]
	clean = %[1]s clean
	smudge = %[1]s smudge
	required = true
[core]
	fsmonitor = %[1]s
	hooksPath = %[2]s
	excludesFile = %[3]s
	attributesFile = %[4]s
	autocrlf = true
	ignoreCase = true
[diff]
	external = %[1]s
[diff "evil"]
	textconv = %[1]s
`, script, filepath.Join(base, "hooks"), filepath.Join(base, "ignore"), filepath.Join(base, "attributes"))
	write(t, base, "ignore", "*.txt\n")
	write(t, base, "attributes", "* filter=evil diff=evil\n")
	for _, hook := range []string{"pre-commit", "post-commit", "post-index-change", "reference-transaction"} {
		write(t, base, "hooks/"+hook, "#!/bin/sh\necho hook >> "+marker+"\n")
		if err := os.Chmod(filepath.Join(base, "hooks", hook), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The user's files, by every name git looks for them.
	home := filepath.Join(base, "home")
	write(t, home, ".gitconfig", evilConfig)
	write(t, home, ".config/git/config", evilConfig)
	write(t, home, ".config/git/ignore", "*.txt\n")
	write(t, home, ".config/git/attributes", "* filter=evil\n")
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	write(t, base, "global.config", evilConfig)
	t.Setenv("GIT_CONFIG_GLOBAL", filepath.Join(base, "global.config"))
	t.Setenv("GIT_CONFIG_SYSTEM", filepath.Join(base, "global.config"))
	t.Setenv("GIT_CONFIG_PARAMETERS", "'filter.evil.clean'='"+script+"'")
	t.Setenv("GIT_CONFIG_COUNT", "1")
	t.Setenv("GIT_CONFIG_KEY_0", "core.fsmonitor")
	t.Setenv("GIT_CONFIG_VALUE_0", script)
	t.Setenv("GIT_DIR", filepath.Join(base, "decoy"))
	t.Setenv("GIT_INDEX_FILE", filepath.Join(base, "decoy-index"))
	t.Setenv("GIT_WORK_TREE", base)
	t.Setenv("GIT_EXTERNAL_DIFF", script)

	// The workspace: a repository whose own config and attributes ask for
	// the filter and for conversions.
	ws := filepath.Join(base, "ws")
	if err := os.MkdirAll(filepath.Join(ws, ".git"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, ws, ".git/config", evilConfig)
	write(t, ws, ".git/info/exclude", "*.txt\n")
	write(t, ws, ".git/info/attributes", "* filter=evil\n")
	write(t, ws, ".gitattributes", "* filter=evil diff=evil text eol=crlf ident working-tree-encoding=UTF-16\n*.bin -diff\n")
	crlf := "line one\r\nline two\r\n"
	ident := "$Id: 0123456789012345678901234567890123456789 $\n$Id$\n"
	write(t, ws, "crlf.txt", crlf)
	write(t, ws, "ident.txt", ident)
	write(t, ws, "text.bin", "plain text\n")
	for i := range bulkFiles { // so the first snapshot stores in bulk, the second file by file
		write(t, ws, fmt.Sprintf("many/%d.txt", i), "x\r\n")
	}

	dir := filepath.Join(base, "snapshots")
	r := openRepoAt(t, dir, ws)
	before, rep := snap(t, r)
	if rep.Updated != bulkFiles+4 || len(rep.Skipped) != 0 {
		t.Errorf("read %d, left out %v: the user's or the workspace's excludes were read", rep.Updated, rep.Skipped)
	}
	if got := blobOf(t, r, before, "crlf.txt"); got != crlf {
		t.Errorf("recorded crlf.txt as %q, want its bytes %q", got, crlf)
	}
	if got := blobOf(t, r, before, "many/0.txt"); got != "x\r\n" {
		t.Errorf("recorded many/0.txt as %q", got)
	}
	if _, rep := snap(t, r); rep.Updated != 0 {
		t.Errorf("unchanged: read %d paths again, want 0", rep.Updated)
	}
	if got := blobOf(t, r, before, "ident.txt"); got != ident {
		t.Errorf("recorded ident.txt as %q, want its bytes %q", got, ident)
	}

	// A filter in the shadow repository's own config.
	f, err := os.OpenFile(filepath.Join(dir, "config"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(evilConfig); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	write(t, ws, "crlf.txt", "changed\r\n")
	write(t, ws, "ident.txt", "changed $Id$\n")
	write(t, ws, "text.bin", "plain text, changed\n")
	after, _ := snap(t, r)
	d, err := r.Diff(ctx, before, after, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(d.Patch, "+plain text, changed") || !strings.Contains(d.Patch, "-line one\r") {
		t.Errorf("the patch is not git's own text diff of the bytes:\n%s", d.Patch)
	}
	if _, err := r.Restore(ctx, before); err != nil {
		t.Fatal(err)
	}
	got := state(t, ws, false)
	if got["crlf.txt"] != "file 0644 "+crlf || got["ident.txt"] != "file 0644 "+ident {
		t.Errorf("restored %q and %q, want the bytes recorded", got["crlf.txt"], got["ident.txt"])
	}
	if b, err := os.ReadFile(marker); err == nil {
		t.Errorf("a configured program ran: %s", b)
	}
	if _, err := os.Stat(filepath.Join(base, "decoy")); err == nil {
		t.Error("GIT_DIR from the environment was used")
	}
}
