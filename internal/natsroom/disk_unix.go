//go:build unix

package natsroom

import "golang.org/x/sys/unix"

// diskSpace is the free space (for an unprivileged writer) and the size
// of the file system holding dir.
func diskSpace(dir string) (free, size uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	return uint64(st.Bavail) * uint64(st.Bsize), uint64(st.Blocks) * uint64(st.Bsize), nil
}
