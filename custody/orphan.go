package custody

// Orphan is a process that carries an agenthost marker whose owning host is
// gone (crashed or killed), left behind for Reap. Finding orphans needs
// /proc: on other platforms FindOrphans returns ErrUnsupported.
type Orphan struct {
	PID     int    `json:"pid"`
	Cmdline string `json:"cmdline"`
	Marker  string `json:"marker"`
	// Host is the pid the owning host had.
	Host int `json:"host"`
	// Cgroup is the dead host's cgroup directory it was found in, if any.
	Cgroup string `json:"cgroup,omitempty"`
	start  uint64 // with PID, the identity checked before a signal (Linux)
}
