//go:build !linux

package acpagent

// peerLimitPrompt: the limits' prompts are Linux's (limits_linux_test.go).
func peerLimitPrompt(string) (string, bool) { return "", false }
