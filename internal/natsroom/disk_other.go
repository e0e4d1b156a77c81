//go:build !unix

package natsroom

import "errors"

// diskSpace is not known here: the store's test write alone decides.
func diskSpace(dir string) (free, size uint64, err error) {
	return 0, 0, errors.New("natsroom: free space is not known on this platform")
}
