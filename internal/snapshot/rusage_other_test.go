//go:build !unix

package snapshot

import "time"

// childCPU is not measured here.
func childCPU() time.Duration { return 0 }
