//go:build !linux

package procd

import (
	"errors"
	"net"
)

// peerUID: without SO_PEERCRED every peer is refused (fail closed).
func peerUID(c *net.UnixConn) (int, error) {
	return -1, errors.ErrUnsupported
}
