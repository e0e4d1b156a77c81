//go:build !unix

package warmpool

import "os"

func merge(*os.File, string, Pair) error { return ErrUnsupported }
func renameOnto(Pair) error              { return ErrUnsupported }
func removeAll(path string) error        { return os.RemoveAll(path) }
func moveBack(Pair, string) error        { return ErrUnsupported }
func syncDir(string) error               { return nil }

// SameDevice: never, here (Bind is not supported).
func SameDevice(a, b string) (bool, error) { return false, ErrUnsupported }
