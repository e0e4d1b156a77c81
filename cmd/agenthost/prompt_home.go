package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/agenthost/agenthost/internal/agents"
)

// seedUserHome gives prompt's throwaway home (an agent of kind on a named model) a copy of the
// user's configuration for that agent: settings, models and credentials, without commands and
// without tools, extensions or plugins (agents.SeedHome). The user's own folder is only read: a
// confined agent writes its throwaway home, and whatever it plants there is gone with it.
func seedUserHome(home string, kind agents.Kind) error {
	src := userAgentDir(kind)
	if src == "" {
		return nil
	}
	if err := agents.SeedHome(home, kind, src); err != nil {
		return err
	}
	if kind == agents.OMP {
		return copyOMPCredentials(filepath.Join(src, "agent.db"), filepath.Join(home, ".omp", "agent", "agent.db"))
	}
	return nil
}

// userAgentDir is the user's own folder of agent kind (omp's ~/.omp/agent, pi's ~/.pi/agent, or
// where PI_CODING_AGENT_DIR moves it), "" when there is none.
func userAgentDir(kind agents.Kind) string {
	dir := os.Getenv("PI_CODING_AGENT_DIR")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		dir = filepath.Join(home, "."+string(kind), "agent")
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return ""
	}
	return dir
}

// copyOMPCredentials copies omp's credentials database (with its write-ahead log) from src to dst
// and deletes from the copy every credential holding a value of the form "!command" (omp runs it
// to get the key), and the settings it keeps there. A database that cannot be cleaned is not
// kept: the agent then finds its key in the environment only.
func copyOMPCredentials(src, dst string) error {
	if _, err := os.Stat(src); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	for _, suffix := range []string{"", "-wal"} {
		if err := copyRegular(src+suffix, dst+suffix); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("copying omp's credentials: %w", err)
		}
	}
	if err := cleanOMPCredentials(dst); err != nil {
		for _, suffix := range []string{"", "-wal", "-shm"} {
			_ = os.Remove(dst + suffix)
		}
	}
	return nil
}

func cleanOMPCredentials(path string) error {
	db, err := sql.Open("sqlite", path)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx := context.Background()
	rows, err := db.QueryContext(ctx, "SELECT id, data FROM auth_credentials")
	if err != nil {
		return err
	}
	var drop []int64
	for rows.Next() {
		var id int64
		var data string
		if err := rows.Scan(&id, &data); err != nil {
			rows.Close()
			return err
		}
		if hasCommand(data) {
			drop = append(drop, id)
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return err
	}
	for _, id := range drop {
		if _, err := db.ExecContext(ctx, "DELETE FROM auth_credentials WHERE id = ?", id); err != nil {
			return err
		}
	}
	// Settings omp moves from here into its settings file at start: the copy's settings are
	// the user's config.yml, cleaned (agents.SeedHome).
	if _, err := db.ExecContext(ctx, "DELETE FROM settings"); err != nil {
		return err
	}
	_, err = db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)")
	return err
}

// hasCommand reports whether a credential's JSON holds a string of the form "!command" (or is not
// JSON, which is not kept either).
func hasCommand(data string) bool {
	var v any
	if json.Unmarshal([]byte(data), &v) != nil {
		return true
	}
	var walk func(any) bool
	walk = func(v any) bool {
		switch x := v.(type) {
		case string:
			return agents.IsCommandValue(x)
		case map[string]any:
			for _, e := range x {
				if walk(e) {
					return true
				}
			}
		case []any:
			for _, e := range x {
				if walk(e) {
					return true
				}
			}
		}
		return false
	}
	return walk(v)
}

// copyRegular copies the regular file src to dst (0600); anything else at src is not copied.
func copyRegular(src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}
