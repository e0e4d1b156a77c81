package procd

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Files under DIR/procd.
const (
	subdir      = "procd"
	serviceFile = "service.json"
	lockFile    = "service.lock"
	ticketFile  = "handoff.json"
	logFile     = "daemon.log"
)

// service is the registration file's content.
type service struct {
	InstanceID string `json:"instance_id"`
	PID        int    `json:"pid"`
	Protocol   int    `json:"protocol"`
	Socket     string `json:"socket"`
	Token      string `json:"token"`
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

// lockService takes the exclusive lock a daemon holds for its whole life;
// ok is false when another daemon holds it.
func lockService(dataDir string) (f *os.File, ok bool, err error) {
	if err := os.MkdirAll(procdDir(dataDir), 0o700); err != nil {
		return nil, false, err
	}
	f, err = os.OpenFile(filepath.Join(procdDir(dataDir), lockFile), os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, false, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, err
	}
	return f, true, nil
}

// lockFree reports whether no daemon holds dataDir's lock.
func lockFree(dataDir string) (bool, error) {
	f, ok, err := lockService(dataDir)
	if ok {
		f.Close()
	}
	return ok, err
}
