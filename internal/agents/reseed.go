package agents

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/agenthost/agenthost/internal/agentfs"
	"go.yaml.in/yaml/v3"
)

// What an agent must never set in its own home. A room's agent may write its home (a yolo turn, an
// approved command, a process left running), and the agent reads that home at its next start: a
// file it planted there would run unasked then, or ride along on every approved command, even after
// the room went back to always-ask. [ResetHome] removes or rewrites all of it at each start and
// keeps the agent's own state (its sessions, its memory). Measured with omp 18.2.3 and pi 0.73.1:
//
//   - omp: tool, extension, hook and command modules, plugins (~/.omp/plugins, loaded whatever
//     the settings say), its settings (a shellPath or python interpreter of the agent's runs
//     every approved command), its credentials database (an API key "!command" runs at start),
//     .env files (omp loads HOME/.env and its config folders' into its own environment), the
//     XDG folders omp moves to when they exist, and the shell startup files omp's bash tool
//     sources;
//   - pi: settings.json's shellPath, shellCommandPrefix (run with every approved command),
//     packages and npmCommand (run at start), extensions, skills, prompts and themes; auth.json
//     and models.json values of the form "!command" (run at start to get a key); the managed
//     fd and rg in its bin folder (run by the grep and find tools, which are never asked).

// ompKeep is what of HOME/.omp survives a start (relative paths): the agent's memory, the blobs
// and history its sessions refer to, and omp's logs; omp's models file is kept too, cleaned.
var ompKeep = []string{
	"agent/memories", "agent/blobs", "agent/history.db", "agent/terminal-sessions",
	"agent/custom-session-files", "agent/sessions", "agent/models.yml", "logs",
}

// shellStartup are the shell startup files omp's bash tool sources (its shell snapshot runs the
// user's rc file to capture aliases and functions) before each command it runs.
var shellStartup = []string{
	".bashrc", ".bash_profile", ".bash_login", ".profile", ".zshrc", ".zshenv", ".zprofile", ".zlogin",
}

// piSettingsDenied are pi's settings that run a command or load code (pi 0.73.1's settings.json):
// they are dropped, every other setting is kept.
var piSettingsDenied = []string{
	"shellPath", "shellCommandPrefix", "npmCommand", "packages", "extensions", "skills", "prompts",
	"themes", "sessionDir",
}

// ResetHome makes home (an agent of kind k's, omp or pi; anything else is left alone) safe to start
// the agent in: see the package's note on what an agent must never set. It runs before each start,
// never while the agent runs (an attach keeps the running agent's home as it is). It works through
// agentfs: a link the agent planted is removed, never followed, and what it writes back replaces
// the file (given to owner, nil: the server's user).
func ResetHome(home string, k Kind, owner *agentfs.Owner) error {
	if k != OMP && k != Pi {
		return nil
	}
	d, err := agentfs.Open(home, owner)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil {
		defer d.Close()
		if k == OMP {
			err = resetOMPHome(d)
		} else {
			err = resetPiHome(d)
		}
	}
	if err != nil {
		return fmt.Errorf("agents: resetting the agent's home: %w", err)
	}
	return nil
}

func resetOMPHome(d *agentfs.Dir) error {
	remove := append([]string{".env", "bunfig.toml", ".bunfig.toml"}, shellStartup...)
	// omp moves its data, state and cache (plugins among them) under $XDG_*_HOME/omp when that
	// folder exists.
	remove = append(remove, ".local/share/omp", ".local/state/omp", ".cache/omp")
	for _, rel := range remove {
		if err := removeUnder(d, rel); err != nil {
			return err
		}
	}
	if ok, err := dirUnder(d, ".omp"); err != nil || !ok {
		return err
	}
	if err := pruneTree(d, ".omp", "", ompKeep); err != nil {
		return err
	}
	return cleanUnder(d, ".omp/agent/models.yml", cleanYAML)
}

func resetPiHome(d *agentfs.Dir) error {
	for _, rel := range []string{".pi/agent/bin", ".pi/agent/extensions"} {
		if err := removeUnder(d, rel); err != nil {
			return err
		}
	}
	if err := cleanUnder(d, ".pi/agent/settings.json", cleanPiSettings); err != nil {
		return err
	}
	if err := cleanUnder(d, ".pi/agent/auth.json", cleanAuthJSON); err != nil {
		return err
	}
	return cleanUnder(d, ".pi/agent/models.json", cleanJSONCommands)
}

// maxConfig bounds a configuration file the reset reads (a bigger one is removed).
const maxConfig = 8 << 20

// dirUnder reports whether rel (a slash path in d) and every folder on the way is a folder and not
// a link; a link on the way is removed (it was planted: the home's folders are made as folders),
// and ok is then false.
func dirUnder(d *agentfs.Dir, rel string) (ok bool, err error) {
	if rel == "" {
		return true, nil
	}
	path := ""
	for _, name := range strings.Split(rel, "/") {
		path = filepath.Join(path, name)
		fi, err := d.Lstat(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return false, nil
		case err != nil:
			return false, err
		case fi.Mode()&fs.ModeSymlink != 0:
			return false, removeAll(d, path)
		case !fi.IsDir():
			return false, nil
		}
	}
	return true, nil
}

// removeUnder removes rel in d (a link there, not what it names) unless a folder on the way is
// missing or a link.
func removeUnder(d *agentfs.Dir, rel string) error {
	dir, _ := pathSplit(rel)
	if ok, err := dirUnder(d, dir); err != nil || !ok {
		return err
	}
	return removeAll(d, filepath.FromSlash(rel))
}

// cleanUnder is cleanFile of rel in d, unless a folder on the way is missing or a link.
func cleanUnder(d *agentfs.Dir, rel string, clean func([]byte) []byte) error {
	dir, _ := pathSplit(rel)
	if ok, err := dirUnder(d, dir); err != nil || !ok {
		return err
	}
	return cleanFile(d, filepath.FromSlash(rel), clean)
}

// pathSplit splits a slash path into its folder ("" for none) and its last name.
func pathSplit(rel string) (dir, base string) {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return "", rel
	}
	return rel[:i], rel[i+1:]
}

// pruneTree removes everything under root/rel in d that is neither in keep (slash paths relative
// to root) nor a folder on the way to something in keep. A link is removed, never followed.
func pruneTree(d *agentfs.Dir, root, rel string, keep []string) error {
	dir := filepath.Join(root, filepath.FromSlash(rel))
	ents, err := d.ReadDir(dir)
	if errors.Is(err, fs.ErrPermission) {
		// The agent's own folder, made unreadable: it is the agent's to open again.
		if d.Chmod(dir, 0o700) == nil {
			ents, err = d.ReadDir(dir)
		}
	}
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		name := path.Join(rel, e.Name())
		if slices.Contains(keep, name) {
			continue
		}
		if e.Type().IsDir() && slices.ContainsFunc(keep, func(k string) bool { return strings.HasPrefix(k, name+"/") }) {
			if err := pruneTree(d, root, name, keep); err != nil {
				return err
			}
			continue
		}
		if err := removeAll(d, filepath.Join(root, filepath.FromSlash(name))); err != nil {
			return err
		}
	}
	return nil
}

// cleanFile rewrites name in d through clean (which returns the new content, or nil to remove the
// file); a missing file is left missing, anything but a regular file (a link) or one too big is
// removed.
func cleanFile(d *agentfs.Dir, name string, clean func([]byte) []byte) error {
	fi, err := d.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return removeAll(d, name)
	}
	data, err := d.ReadFile(name, maxConfig)
	if errors.Is(err, agentfs.ErrTooLarge) {
		return removeAll(d, name)
	}
	if err != nil {
		return err
	}
	out := clean(data)
	if out == nil {
		return removeAll(d, name)
	}
	if string(out) == string(data) {
		return nil
	}
	return d.WriteFile(name, out, 0o600)
}

// removeAll removes name in d and what is under it (a link, not what it names). A folder the agent
// made unwritable (its own, mode 0500) is made writable first: the agent could otherwise keep what
// it planted there and stop its room's every start.
func removeAll(d *agentfs.Dir, name string) error {
	err := d.RemoveAll(name)
	if errors.Is(err, fs.ErrPermission) {
		openUp(d, name, 0)
		err = d.RemoveAll(name)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// openUp makes the folder name in d, and the folders beneath it, writable by their owner (never
// through a link), to a bounded depth.
func openUp(d *agentfs.Dir, name string, depth int) {
	if depth > agentfs.MaxDepth || d.Chmod(name, 0o700) != nil {
		return
	}
	ents, err := d.ReadDir(name)
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.IsDir() {
			openUp(d, filepath.Join(name, e.Name()), depth+1)
		}
	}
}

// cleanPiSettings drops pi's settings that run a command or load code (nil: not a JSON object,
// which pi would refuse as well).
func cleanPiSettings(data []byte) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil || m == nil {
		return nil
	}
	n := len(m)
	for _, k := range piSettingsDenied {
		delete(m, k)
	}
	if len(m) == n {
		return data
	}
	out, _ := json.MarshalIndent(m, "", "  ")
	return append(out, '\n')
}

// cleanJSONCommands drops every value of the form "!command" (the agents run it to get a key or a
// header) from a JSON document, with its key (nil: not JSON).
func cleanJSONCommands(data []byte) []byte {
	var v any
	if json.Unmarshal(data, &v) != nil {
		return nil
	}
	w, dropped := dropCommands(v)
	if !dropped {
		return data
	}
	out, _ := json.MarshalIndent(w, "", "  ")
	return append(out, '\n')
}

// cleanAuthJSON drops from pi's auth.json every provider's entry that holds a value of the form
// "!command" (nil: not a JSON object). The whole entry goes: pi takes an entry without its key as
// the provider's credential and would not fall back to the key in models.json or the environment.
func cleanAuthJSON(data []byte) []byte {
	var m map[string]any
	if json.Unmarshal(data, &m) != nil || m == nil {
		return nil
	}
	n := len(m)
	for k, v := range m {
		if _, dropped := dropCommands(v); dropped {
			delete(m, k)
		} else if s, ok := v.(string); ok && IsCommandValue(s) {
			delete(m, k)
		}
	}
	if len(m) == n {
		return data
	}
	out, _ := json.MarshalIndent(m, "", "  ")
	return append(out, '\n')
}

// cleanYAML is cleanJSONCommands for omp's models.yml (written back as JSON, which is YAML).
func cleanYAML(data []byte) []byte {
	var v any
	if yaml.Unmarshal(data, &v) != nil {
		return nil
	}
	w, dropped := dropCommands(v)
	if !dropped {
		return data
	}
	out, err := json.MarshalIndent(w, "", "  ")
	if err != nil {
		return nil // keys JSON cannot hold: omp's file is not kept
	}
	return append(out, '\n')
}

// IsCommandValue reports whether an agent's configuration value is a command it would run ("!cmd":
// omp and pi run it through a shell to get an API key or a header).
func IsCommandValue(s string) bool { return strings.HasPrefix(strings.TrimSpace(s), "!") }

// dropCommands returns v without the map entries and list items whose value is a command string.
func dropCommands(v any) (any, bool) {
	dropped := false
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && IsCommandValue(s) {
				delete(x, k)
				dropped = true
				continue
			}
			w, d := dropCommands(e)
			x[k], dropped = w, dropped || d
		}
	case []any:
		out := x[:0]
		for _, e := range x {
			if s, ok := e.(string); ok && IsCommandValue(s) {
				dropped = true
				continue
			}
			w, d := dropCommands(e)
			dropped = dropped || d
			out = append(out, w)
		}
		return out, dropped
	}
	return v, dropped
}

// SeedHome copies into home (a throwaway home of an agent of kind k) the configuration of the
// agent's own folder src (the user's ~/.omp/agent or ~/.pi/agent): settings without what loads
// code (omp's extensions; pi's as ResetHome drops them), models and, for pi, credentials, each
// without values of the form "!command". Tools, extensions, plugins and anything else in src are
// not copied; omp's credentials live in a database the caller copies. A file src lacks is skipped.
func SeedHome(home string, k Kind, src string) error {
	type file struct {
		name  string
		clean func([]byte) []byte
	}
	var files []file
	var dst string // in home
	switch k {
	case OMP:
		dst = filepath.Join(".omp", "agent")
		files = []file{{"config.yml", cleanOMPSettings}, {"models.yml", cleanYAML}}
	case Pi:
		dst = filepath.Join(".pi", "agent")
		files = []file{{"settings.json", cleanPiSettings}, {"models.json", cleanJSONCommands}, {"auth.json", cleanAuthJSON}}
	default:
		return fmt.Errorf("%w: %q", ErrKind, k)
	}
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(src, f.name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("agents: copying the agent's configuration: %w", err)
		}
		out := f.clean(data)
		if out == nil {
			continue
		}
		if err := writeFile(home, nil, filepath.Join(dst, f.name), out); err != nil {
			return err
		}
	}
	return nil
}

// cleanOMPSettings drops omp's extension list (modules it would load) from its settings and the
// values of the form "!command" (written back as JSON; nil: not a YAML mapping).
func cleanOMPSettings(data []byte) []byte {
	var m map[string]any
	if yaml.Unmarshal(data, &m) != nil || m == nil {
		return nil
	}
	delete(m, "extensions")
	w, _ := dropCommands(m)
	out, err := json.MarshalIndent(w, "", "  ")
	if err != nil {
		return nil
	}
	return append(out, '\n')
}
