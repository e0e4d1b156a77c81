package main

import "golang.org/x/sys/unix"

// memTotal is the machine's memory in bytes (0 if unknown).
func memTotal() int64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
}
