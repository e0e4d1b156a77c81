//go:build !unix

package agentfs

import "syscall"

const ownersSupported = false

const (
	oNonblock = 0
	oNoFollow = 0
)

var errNotDir error = syscall.ENOTDIR

// MaxDepth bounds how deep OwnTree walks (see the Unix build).
const MaxDepth = 256

// Owned is what OwnTree did (see the Unix build).
type Owned struct{ Entries, Linked, Devices, Skipped int }

// OwnTree is not supported here: ErrOwner.
func OwnTree(path string, o Owner) (Owned, error) { return Owned{}, ErrOwner }

// OwnTreeFrom is not supported here: ErrOwner.
func OwnTreeFrom(path string, o Owner, from int) (Owned, error) { return Owned{}, ErrOwner }

// OwnFolder is not supported here: ErrOwner.
func OwnFolder(path string, o Owner) error { return ErrOwner }
