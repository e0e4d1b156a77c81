package procd

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Files under DIR/procd.
const (
	subdir      = "procd"
	serviceFile = "service.json"
	lockFile    = "service.lock"
	ticketFile  = "handoff.json"
	logFile     = "daemon.log"
	// sockDirFile names the private temp dir holding the socket of a
	// daemon whose data dir is too deep for a socket path: a daemon that
	// died leaves it, and the next one removes it.
	sockDirFile = "sockdir"
	// tempSockPrefix starts such a temp dir's name.
	tempSockPrefix = "agenthost-procd-"
)

// service is the registration file's content. Protocol is the oldest
// version the daemon speaks (a client before negotiation demands it
// exactly), Protocols the whole range (absent from a protocol 8 daemon).
type service struct {
	InstanceID string `json:"instance_id"`
	PID        int    `json:"pid"`
	Protocol   int    `json:"protocol"`
	Protocols  *Range `json:"protocols,omitempty"`
	Socket     string `json:"socket"`
	Token      string `json:"token"`

	// speak is the version a client negotiated with this daemon (0 until
	// it pinged it): sent with every request.
	speak int
}

// versions is the range a registration or a pong says the daemon speaks.
func versions(protocol int, protocols *Range) Range {
	if protocols != nil {
		return *protocols
	}
	return Range{protocol, protocol}
}

func procdDir(dataDir string) string { return filepath.Join(dataDir, subdir) }

// readJSON reads a small 0600 file of ours into v.
func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrProtocol, filepath.Base(path), err)
	}
	return nil
}

// writeJSON writes v to path (0600) by temp file and rename, so a reader
// never sees half a file.
func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return writeFile(path, b)
}

// writeFile writes b to path (0600) by temp file and rename.
func writeFile(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	if err := f.Chmod(0o600); err == nil {
		_, err = f.Write(b)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp, path)
		}
		if err == nil {
			return nil
		}
	} else {
		f.Close()
	}
	os.Remove(tmp)
	return err
}

func readService(dataDir string) (service, error) {
	var s service
	err := readJSON(filepath.Join(procdDir(dataDir), serviceFile), &s)
	return s, err
}

func readTicket(dataDir string) (Ticket, error) {
	var t Ticket
	err := readJSON(filepath.Join(procdDir(dataDir), ticketFile), &t)
	return t, err
}
