// Package agents locates the installed coding agents (omp and pi) and prepares a home directory
// that points them at a scripted model.
package agents

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
)

// Kind names an agent.
type Kind string

// The agents agenthost hosts.
const (
	// OMP is oh-my-pi (npm @oh-my-pi/pi-coding-agent), run on Bun.
	OMP Kind = "omp"
	// Pi is pi (npm @mariozechner/pi-coding-agent), run on Node.
	Pi Kind = "pi"
)

// ToolsEnv names the environment variable that overrides where [Find] looks.
const ToolsEnv = "AGENTHOST_TOOLS"

// Sentinel errors; match them with errors.Is.
var (
	// ErrNotFound means the tools folder, an agent package or a runtime is missing.
	ErrNotFound = errors.New("agents: not found")
	// ErrKind means a Kind other than OMP or Pi.
	ErrKind = errors.New("agents: unknown agent kind")
)

// packages maps each kind to its npm package folder under node_modules.
var packages = map[Kind]string{
	OMP: filepath.Join("@oh-my-pi", "pi-coding-agent"),
	Pi:  filepath.Join("@mariozechner", "pi-coding-agent"),
}

// Install is a tools folder holding node_modules with the agents and Bun. Its methods only read
// the file system and are safe for concurrent use.
type Install struct {
	// Dir is the absolute path of the tools folder (the one named ".tools" in a checkout).
	Dir string
}

// Find locates the tools folder: $AGENTHOST_TOOLS if set; otherwise the first ".tools" folder
// containing node_modules found walking up from the working directory, then from the
// executable's directory. The error names what was searched and advises `make setup`.
func Find() (*Install, error) {
	if dir := os.Getenv(ToolsEnv); dir != "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return nil, fmt.Errorf("agents: %s=%q: %w", ToolsEnv, dir, err)
		}
		if !isDir(filepath.Join(abs, "node_modules")) {
			return nil, fmt.Errorf("%w: %s=%q has no node_modules folder; run `make setup` or fix %s",
				ErrNotFound, ToolsEnv, dir, ToolsEnv)
		}
		return &Install{Dir: abs}, nil
	}
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		starts = append(starts, filepath.Dir(exe))
	}
	for _, start := range starts {
		for dir := start; ; dir = filepath.Dir(dir) {
			tools := filepath.Join(dir, ".tools")
			if isDir(filepath.Join(tools, "node_modules")) {
				return &Install{Dir: tools}, nil
			}
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	return nil, fmt.Errorf("%w: no .tools/node_modules above %q; run `make setup` in the agenthost checkout, or set %s to the tools folder",
		ErrNotFound, starts, ToolsEnv)
}

// Argv returns the command that starts agent k, without its arguments: for OMP
// [<abs bun> --config=/dev/null --no-env-file <abs package>/dist/cli.js], for Pi
// [<abs node from PATH> <abs package>/dist/cli.js]. Bun would otherwise read the bunfig.toml (whose
// preload modules run before omp) and the .env files of its working directory. It fails with
// [ErrNotFound] if the runtime or the package is missing.
func (in *Install) Argv(k Kind) ([]string, error) {
	if _, ok := packages[k]; !ok {
		return nil, fmt.Errorf("%w: %q", ErrKind, k)
	}
	pkg, err := in.pkgDir(k)
	if err != nil {
		return nil, err
	}
	cli := filepath.Join(pkg, "dist", "cli.js")
	if !isFile(cli) {
		return nil, fmt.Errorf("%w: %s has no dist/cli.js; run `make setup`", ErrNotFound, pkg)
	}
	var runtime string
	switch k {
	case OMP:
		runtime = filepath.Join(in.Dir, "node_modules", ".bin", "bun")
		if !isExecutable(runtime) {
			return nil, fmt.Errorf("%w: bun at %s is missing or not executable; run `make setup`", ErrNotFound, runtime)
		}
	case Pi:
		if runtime, err = nodePath(); err != nil {
			return nil, err
		}
	}
	if k == OMP {
		return []string{runtime, bunNoConfig, "--no-env-file", cli}, nil
	}
	return []string{runtime, cli}, nil
}

// bunNoConfig points Bun at an empty configuration instead of the working directory's bunfig.toml.
const bunNoConfig = "--config=/dev/null"

// NodeNoWasmTrapHandler is the Node flag (Node 20.15, 22.2 and newer) that has V8 bounds-check
// WebAssembly memory accesses in the compiled code instead of catching them with a signal handler
// in guard regions. With the handler each Wasm memory reserves about 10 GiB of address space
// (measured: under RLIMIT_AS of 4 or 16 GiB, Node 20.20 fails `new WebAssembly.Memory({initial:
// 1})`), so under RLIMIT_AS no Wasm can start, Node's own fetch (undici's llhttp) included; with
// the flag a memory reserves what it holds, and RLIMIT_AS bounds it like any other allocation.
// Wasm code runs somewhat slower (Node's docs: up to about 10%).
const NodeNoWasmTrapHandler = "--disable-wasm-trap-handler"

// nodePath returns the absolute path of node on PATH.
func nodePath() (string, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return "", fmt.Errorf("%w: node is not on PATH (pi and the ACP agents run on Node 20 or newer): %w", ErrNotFound, err)
	}
	abs, err := filepath.Abs(node)
	if err != nil {
		return "", fmt.Errorf("agents: node path %q: %w", node, err)
	}
	return abs, nil
}

// Version returns the version of agent k (any kind, the ACP agents included) from its
// package.json, e.g. "18.2.3" for OMP.
func (in *Install) Version(k Kind) (string, error) {
	pkg, err := in.pkgDir(k)
	if err != nil {
		return "", err
	}
	return readVersion(filepath.Join(pkg, "package.json"))
}

// BunVersion returns the version of the installed npm package bun, e.g. "1.3.14".
func (in *Install) BunVersion() (string, error) {
	return readVersion(filepath.Join(in.Dir, "node_modules", "bun", "package.json"))
}

// PackageDir returns the absolute folder of agent k's npm package (any kind, the ACP agents
// included), failing with [ErrNotFound] when it is not installed.
func (in *Install) PackageDir(k Kind) (string, error) { return in.pkgDir(k) }

// pkgDir returns the package folder of agent k. The ACP-only agents live
// in the acp project (see EnsureACP); a tools folder from before that split
// has them in its own node_modules, which is looked at second.
func (in *Install) pkgDir(k Kind) (string, error) {
	if rel, ok := acpPackages[k]; ok {
		dir := filepath.Join(in.ACPDir(), "node_modules", rel)
		if isDir(dir) {
			return dir, nil
		}
		if old := filepath.Join(in.Dir, "node_modules", rel); isDir(old) {
			return old, nil
		}
		return "", fmt.Errorf("%w: %s package at %s; run `make setup-acp`", ErrNotFound, k, dir)
	}
	rel, ok := packages[k]
	if !ok {
		return "", fmt.Errorf("%w: %q", ErrKind, k)
	}
	dir := filepath.Join(in.Dir, "node_modules", rel)
	if !isDir(dir) {
		return "", fmt.Errorf("%w: %s package at %s; run `make setup`", ErrNotFound, k, dir)
	}
	return dir, nil
}

func readVersion(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%w: %s; run `make setup`", ErrNotFound, path)
		}
		return "", fmt.Errorf("agents: reading %s: %w", path, err)
	}
	var pj struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(data, &pj); err != nil {
		return "", fmt.Errorf("agents: parsing %s: %w", path, err)
	}
	if pj.Version == "" {
		return "", fmt.Errorf("agents: %s has no version", path)
	}
	return pj.Version, nil
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}
