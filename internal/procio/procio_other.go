//go:build !linux

package procio

import "os"

// newChannel is a pipe: toChild, the host writes and the child reads;
// otherwise the reverse.
func newChannel(_ string, toChild bool) (host, child *os.File, err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	if toChild {
		return w, r, nil
	}
	return r, w, nil
}
