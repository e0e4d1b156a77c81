//go:build unix

package gitws

import (
	"fmt"
	"os"
	"syscall"

	"github.com/agenthost/agenthost/internal/agentfs"
)

// giveToOwner gives a worktree just checked out (its files and its
// .git, which the engine created as root) to the user who owns its
// folder, when the engine runs as root and that is another user: a room's
// agent running as a uid of its own edits its files and runs git there
// (git refuses a repository another user owns). The folder is the
// agent's: the walk never follows a link.
func giveToOwner(dir string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("gitws: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Uid == 0 {
		return nil
	}
	if _, err := agentfs.OwnTree(dir, agentfs.Owner{UID: int(st.Uid), GID: int(st.Gid)}); err != nil {
		return fmt.Errorf("gitws: giving the worktree to its folder's owner: %w", err)
	}
	return nil
}
