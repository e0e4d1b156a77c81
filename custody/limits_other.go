//go:build !linux

package custody

// Other platforms have no cgroups: Support says nothing is enforced and
// Usage counts only the processes custody saw.

type resources struct{ support Support }

func newResources() *resources {
	return &resources{support: Support{Memory: ByNothing, Pids: ByNothing, CPU: ByNothing,
		Why: "limits need Linux (cgroups, or resource limits per process)"}}
}

type scopeRes struct{}

func (r *resources) prepare(string, *cgroup, Limits) (*scopeRes, error) { return nil, nil }

func (sr *scopeRes) start(start func() error) error { return start() }
func (sr *scopeRes) started(int)                    {}
func (sr *scopeRes) usage() Usage                   { return Usage{} }
func (sr *scopeRes) resetPeak() error               { return nil }
func (sr *scopeRes) keep()                          {}
func (sr *scopeRes) removeV1() error                { return nil }
