//go:build !linux

package main

import "os"

// Elsewhere attach relays without raw mode or resizes.
func makeRaw(fd int) (restore func(), ok bool)     { return nil, false }
func termSize(fd int) (cols, rows uint16, ok bool) { return 0, 0, false }
func notifyResize(ch chan<- os.Signal)             {}

var hangup []os.Signal
