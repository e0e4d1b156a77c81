//go:build !unix

package main

import "os"

// restartSignals: none where there is no SIGUSR2 (nor the daemon).
var restartSignals []os.Signal
