//go:build unix

package main

import (
	"os"
	"syscall"
)

// restartSignals ask `serve --daemon` for a planned restart.
var restartSignals = []os.Signal{syscall.SIGUSR2}
