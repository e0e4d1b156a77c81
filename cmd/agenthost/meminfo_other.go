//go:build !linux

package main

// memTotal is 0 (unknown) off Linux: the default room memory is 4 GiB.
func memTotal() int64 { return 0 }
