package custody

// Orphan is a process that carries an agenthost marker whose owning host is
// gone (crashed or killed), left behind for Reap. Finding orphans needs
// /proc: on other platforms FindOrphans returns ErrUnsupported.
type Orphan struct {
	PID     int    `json:"pid"`
	Cmdline string `json:"cmdline"`
	Marker  string `json:"marker"`
	// Host is the pid the owning host had.
	Host  int    `json:"host"`
	start uint64 // with PID, the identity checked before a signal (Linux)
}
