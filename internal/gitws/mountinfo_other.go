//go:build !linux

package gitws

// sameFSWithin is false where there is no mountinfo: a bind mount of a folder inside a denied
// one is then not recognised (a mount of the denied folder itself still is, by identity).
func sameFSWithin(p, d string) bool { return false }
