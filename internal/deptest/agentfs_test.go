package deptest

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// agentFolderPackages write or read in folders a room's agent can write
// (its home, workspace, TMPDIR): every such operation goes through
// internal/agentfs, which never acts through a link the agent planted.
var agentFolderPackages = []string{"internal/agents", "internal/rpcagent", "internal/rpcagent/piext", "internal/acpagent", "internal/slotuid", "internal/slotpool"}

// fileCall is a direct file operation of the os or path/filepath package.
var fileCall = regexp.MustCompile(`\b(os\.(WriteFile|ReadFile|MkdirAll|Mkdir|Remove|RemoveAll|OpenFile|Create|CreateTemp|MkdirTemp|Open|Rename|Symlink|Link|ReadDir|Chmod|Chown|Lchown|Truncate|Chtimes)|filepath\.(Glob|Walk|WalkDir))\(`)

// agentFolderExceptions are the direct calls that touch no agent's
// folder, per file, with why.
var agentFolderExceptions = map[string][]string{
	// The tools folder (the installed agents) and its lock: the server's.
	"internal/agents/install.go":      {"os.ReadFile(", "os.MkdirAll("},
	"internal/agents/install_unix.go": {"os.MkdirAll(", "os.OpenFile("},
	"internal/agents/agents.go":       {"os.ReadFile("}, // a package.json in the tools folder
	// checkCopilotHooks counts the entries of the workspace's
	// .github/hooks (and of its git root's): it reads no file.
	"internal/agents/acppeers.go": {"os.ReadDir("},
	// SeedHome reads the user's own configuration (~/.omp/agent,
	// ~/.pi/agent) to copy into a prompt's throwaway home; no agent
	// writes there.
	"internal/agents/reseed.go": {"os.ReadFile("},
	// pi's package in the tools folder, which the home's copy links to.
	"internal/rpcagent/piext/piext.go": {"os.ReadFile(", "os.ReadDir("},
	// The warm pools' own folders (the server's: the slots' parents, the
	// journals, the links from a bound slot's paths to its room's) and
	// a slot's folders made before its agent starts; removals never
	// follow a link (os.RemoveAll removes one itself). The bind's moves
	// are internal/warmpool's, by descriptors opened O_NOFOLLOW.
	"internal/slotpool/slotpool.go": {"filepath.Glob(", "os.Mkdir(", "os.MkdirAll(", "os.ReadDir(", "os.Remove(", "os.RemoveAll(", "os.RemoveAll(", "os.RemoveAll(", "os.Symlink("},
	// The acp pool's: the slot's name it records in the room's folder
	// (the server's: the agent writes only beneath its home, workspace
	// and TMPDIR) with the link made from that name to a woken room's
	// home under .pool, whose folder (the server's, under .pool, which no
	// agent can write) is made searchable only as root.
	"internal/acpagent/pool.go": {"os.Chmod(", "os.Mkdir(", "os.MkdirAll(", "os.ReadFile(", "os.Remove(", "os.RemoveAll(", "os.Symlink(", "os.WriteFile("},
	// The pools as root (shared by both): the uid journal, in a slot's
	// own folder (the server's, which the agent cannot reach), and the
	// count of a room's entries before a bind (WalkDir: names only, no
	// link followed, nothing read or written). Giving the folders to a
	// uid is agentfs.OwnTree's.
	"internal/slotuid/slotuid.go": {"filepath.Glob(", "filepath.WalkDir(", "os.Open(", "os.OpenFile(", "os.ReadFile(", "os.Remove(", "os.Remove(", "os.Remove(", "os.Rename("},
}

// TestAgentFoldersThroughAgentfs: the packages that write agents' homes
// make no direct file call beyond the listed ones, so that a new writer
// there cannot forget agentfs (add to the list only what never touches an
// agent's folder, with why).
func TestAgentFoldersThroughAgentfs(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range agentFolderPackages {
		files, err := filepath.Glob(filepath.Join(root, pkg, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: %v %v", pkg, files, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(root, f)
			rel = filepath.ToSlash(rel)
			got := fileCall.FindAllString(string(b), -1)
			slices.Sort(got)
			want := slices.Clone(agentFolderExceptions[rel])
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("%s: direct file calls %v, want %v (use internal/agentfs in an agent's folder)", rel, got, want)
			}
		}
	}
}
