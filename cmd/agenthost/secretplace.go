package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
)

// agentReadable are the folders confined agents may read, whoever runs
// them: the system's (confine.System and confine.Kernel), the agents'
// own install, and the rooms' workspaces, folders and git mirrors under
// the data dir (the data dir itself, and what else is in it, they cannot
// list or read).
func agentReadable(f serveFlags) []string {
	dirs := append(append([]string{}, confine.System...), confine.Kernel...)
	dirs = append(dirs, f.workspaces, filepath.Join(f.data, "rooms"), filepath.Join(f.data, "git"))
	if in, err := agents.Find(); err == nil {
		dirs = append(dirs, in.Dir)
	}
	return dirs
}

// checkSecretPlaces refuses a cluster secret (the embedded cluster's, or
// --nats-creds) kept where confined agents may read it: an agent that
// reads it joins the cluster and writes into any room, with no API token.
// A warning would scroll by in a log while every room's agent could read
// the key; moving a file is cheap.
func checkSecretPlaces(f serveFlags) error {
	readable := agentReadable(f)
	check := func(flag, path, fix string) error {
		if path == "" {
			return nil
		}
		if dir, ok := underAny(path, readable); ok {
			return fmt.Errorf("serve: %s %s lies in %s, which the rooms' agents may read: anyone with it joins the cluster; %s", flag, path, dir, fix)
		}
		return nil
	}
	if f.natsEmbedded {
		flag, path := "--nats-secret-file", f.natsSecretFile
		if path == "" {
			flag, path = "the cluster secret (in --data)", filepath.Join(f.data, natsSecretFile)
		}
		if err := check(flag, path, "keep it in the data dir (the default, "+natsSecretFile+" there) or in a folder of the server's own outside the system's (mode 0700)"); err != nil {
			return err
		}
	}
	return check("--nats-creds", f.natsCreds, "keep it in the data dir or in a folder of the server's own outside the system's (mode 0700)")
}

// underAny reports whether path, with its links resolved (a file not made yet
// by its folder's), is one of dirs or beneath one, and which.
func underAny(path string, dirs []string) (string, bool) {
	real, err := resolve(path)
	if err != nil {
		real = filepath.Clean(path)
	}
	for _, d := range dirs {
		if d == "" {
			continue
		}
		forms := []string{filepath.Clean(d)}
		if rd, err := resolve(d); err == nil && rd != forms[0] {
			forms = append(forms, rd)
		}
		for _, fd := range forms {
			if real == fd || strings.HasPrefix(real, strings.TrimSuffix(fd, "/")+"/") {
				return d, true
			}
		}
	}
	return "", false
}

// resolve is path made absolute with its links resolved; for a path that
// does not exist yet, its folder's.
func resolve(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(abs)
	if errors.Is(err, os.ErrNotExist) {
		dir, derr := resolve(filepath.Dir(abs)) // ends at "/", which exists
		if derr != nil {
			return abs, derr
		}
		return filepath.Join(dir, filepath.Base(abs)), nil
	}
	return real, err
}
