//go:build !unix

package gitws

import "os/exec"

// setGroup leaves cmd as it is: elsewhere than Unix a cancel kills git itself (exec's default)
// and WaitDelay bounds how long its helpers may hold the pipes.
func setGroup(*exec.Cmd) {}
