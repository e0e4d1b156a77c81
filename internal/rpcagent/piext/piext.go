// Package piext is agenthost's extension for pi (agenthost.ts, embedded) and the wire between it
// and the host: Write puts the extension, the room's policy and tools, and a copy of pi's package
// manifest into a room's agent home, and returns the arguments and environment that make pi load
// that extension and nothing from the repository it works in.
//
// pi has no approvals, questions or host tools of its own; its extensions can intercept tool calls
// and open dialogs over RPC (extension_ui_request). The extension uses exactly that: approvals are
// select dialogs shaped like omp's ("Allow tool: NAME\nDETAIL", Approve or Deny), questions are
// select or input dialogs, and a room tool's call is an input dialog titled [ToolPrefix]+NAME whose
// placeholder holds the arguments (JSON) and whose answer is [ToolResult]'s.
package piext

import (
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agenthost/agenthost/internal/agentfs"
)

//go:embed agenthost.ts
var source []byte

// The wire with agenthost.ts, which holds the same constants.
const (
	// Flag names the room file on pi's command line (--agenthost-room=PATH).
	Flag = "agenthost-room"
	// ToolPrefix starts the title of a room tool call's input dialog.
	ToolPrefix = "agenthost.tool:"
	// ModeYolo is the one approval mode that asks nothing; any other asks.
	ModeYolo = "yolo"
)

// Tool is a room tool as the model sees it.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// Room is what the extension keeps for a room.
type Room struct {
	// ApprovalMode is the room's: ModeYolo asks for nothing, anything
	// else (room's always-ask) asks for every tool but the read-only ones.
	ApprovalMode string `json:"approval_mode"`
	Tools        []Tool `json:"tools"`
}

// Setup is how to run pi with the extension.
type Setup struct {
	// Args go after pi's own (--mode rpc ...).
	Args []string
	// Env goes last in pi's environment, so that nothing before it (a
	// room's own variables included) can move what it sets.
	Env []string
}

// The files Write puts under a home, relative to it.
const (
	dirName     = "agenthost-pi"
	extName     = "agenthost.ts"
	roomName    = "room.json"
	packageName = "package"
)

// Write writes the extension and room into home (a pi room's own agent home, created if needed),
// with a manifest of pi's package at pkgDir whose project folder is renamed, and returns the
// setup that loads them: see WriteAs.
func Write(home, pkgDir string, room Room) (Setup, error) {
	return WriteAs(home, pkgDir, room, nil)
}

// WriteAs is Write giving what it writes to owner (nil: the server's user). Everything it writes is
// rewritten at every call, so what a tool changed there in an earlier run does not last, and
// through agentfs: a link the agent planted in the home is removed or replaced, never followed.
//
// pi reads a project folder (.pi) in its working directory: settings (the shell it runs, its
// command prefix, packages), extensions, skills, prompt templates, themes and SYSTEM.md. Its flags
// switch off only some of them, so pi's own rebranding hook renames the folder instead: PI_PACKAGE_DIR
// points pi at a copy of its package whose manifest names another folder (random per call, so no
// repository can hold it) and links the package's files. The agent's own folder stays
// HOME/.pi/agent (PI_CODING_AGENT_DIR). The repository's AGENTS.md and CLAUDE.md are still read:
// they are text for the model, as omp reads them.
func WriteAs(home, pkgDir string, room Room, owner *agentfs.Owner) (Setup, error) {
	if room.Tools == nil {
		room.Tools = []Tool{}
	}
	d, err := agentfs.Create(home, 0o700, owner)
	if err != nil {
		return Setup{}, fmt.Errorf("piext: %w", err)
	}
	defer d.Close()
	// A clean folder each time: nothing a tool left there survives.
	if err := d.RemoveAll(dirName); err != nil {
		return Setup{}, fmt.Errorf("piext: %w", err)
	}
	pkg := filepath.Join(dirName, packageName)
	if err := d.MkdirAll(pkg, 0o700); err != nil {
		return Setup{}, fmt.Errorf("piext: %w", err)
	}
	ext := filepath.Join(dirName, extName)
	if err := d.WriteFile(ext, source, 0o600); err != nil {
		return Setup{}, fmt.Errorf("piext: writing the extension: %w", err)
	}
	b, err := json.Marshal(room)
	if err != nil {
		return Setup{}, fmt.Errorf("piext: %w", err)
	}
	roomFile := filepath.Join(dirName, roomName)
	if err := d.WriteFile(roomFile, b, 0o600); err != nil {
		return Setup{}, fmt.Errorf("piext: writing the room file: %w", err)
	}
	if err := shadowPackage(d, pkg, pkgDir); err != nil {
		return Setup{}, err
	}
	return Setup{
		Args: []string{
			"--no-extensions", "--no-skills", "--no-prompt-templates", "--no-themes",
			"--extension", filepath.Join(home, ext), "--" + Flag + "=" + filepath.Join(home, roomFile),
		},
		Env: []string{
			"PI_PACKAGE_DIR=" + filepath.Join(home, pkg),
			"PI_CODING_AGENT_DIR=" + filepath.Join(home, ".pi", "agent"),
			// pi compiles extensions with jiti, which by default keeps the
			// result in a cache shared through the temporary folder: any
			// process (another room's tool) could plant a copy there that
			// pi would load instead of the extension.
			"JITI_FS_CACHE=false",
		},
	}, nil
}

// shadowPackage makes dst (in the home d) stand for pi's package at src: its manifest with a
// project folder nobody has (pi reads its name, version and project folder from there), and links
// to the rest (pi finds its themes, docs and templates under the package folder).
func shadowPackage(d *agentfs.Dir, dst, src string) error {
	data, err := os.ReadFile(filepath.Join(src, "package.json"))
	if err != nil {
		return fmt.Errorf("piext: pi's package: %w", err)
	}
	var manifest map[string]any
	if err := json.Unmarshal(data, &manifest); err != nil {
		return fmt.Errorf("piext: pi's package.json: %w", err)
	}
	cfg, _ := manifest["piConfig"].(map[string]any)
	if cfg == nil {
		cfg = map[string]any{}
	}
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return fmt.Errorf("piext: %w", err)
	}
	// A dot folder: should pi ever create it, it stays out of sight.
	cfg["configDir"] = ".agenthost-no-project-" + hex.EncodeToString(nonce[:])
	manifest["piConfig"] = cfg
	out, err := json.MarshalIndent(manifest, "", "  ")
	if err != nil {
		return fmt.Errorf("piext: %w", err)
	}
	if err := d.WriteFile(filepath.Join(dst, "package.json"), out, 0o600); err != nil {
		return fmt.Errorf("piext: %w", err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("piext: pi's package: %w", err)
	}
	for _, e := range ents {
		if e.Name() == "package.json" {
			continue
		}
		if err := d.Symlink(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return fmt.Errorf("piext: linking pi's package: %w", err)
		}
	}
	return nil
}

// ToolCall reports whether an input dialog is the extension's call of a room tool, and which
// tool with which arguments.
func ToolCall(method, title, placeholder string) (name string, args json.RawMessage, ok bool) {
	name, ok = strings.CutPrefix(title, ToolPrefix)
	if method != "input" || !ok || name == "" {
		return "", nil, false
	}
	if placeholder == "" {
		placeholder = "{}"
	}
	return name, json.RawMessage(placeholder), true
}

// ToolResult is the answer to a room tool call: the tool's text, or its error.
func ToolResult(text string, err error) string {
	v := map[string]string{"text": text}
	if err != nil {
		msg := err.Error()
		if msg == "" {
			msg = "the tool failed"
		}
		v = map[string]string{"error": msg}
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// Gap is a room promise pi cannot keep, even with the extension, measured
// on the pi version agenthost pins.
type Gap struct {
	// Claim is the promise's id in the support matrix.
	Claim string
	// Reason says why, and what a room meets instead.
	Reason string
}

// Gaps lists the promises pi rooms cannot keep: the support matrix shows
// each, and serve --agent pi names them when it starts.
func Gaps() []Gap {
	return []Gap{{Claim: "mcp", Reason: "pi has no MCP client (its README: \"build an extension that adds MCP support\"), " +
		"so a pi room that configures MCP servers fails its agent's start"}}
}

// ErrNoTool is a room tool call naming a tool the room does not have.
var ErrNoTool = errors.New("piext: the room has no such tool")
