package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// maxConfigBytes bounds a config file.
const maxConfigBytes = 1 << 20

// readConfig reads a flat config file of flag names and values: TOML for
// a .toml file, YAML otherwise.
func readConfig(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if len(b) > maxConfigBytes {
		return nil, fmt.Errorf("config %s: over %d bytes", filepath.Base(path), maxConfigBytes)
	}
	if strings.EqualFold(filepath.Ext(path), ".toml") {
		return parseTOML(filepath.Base(path), b)
	}
	var raw map[string]any
	if err := yaml.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("config %s: %w", filepath.Base(path), err)
	}
	out := map[string]string{}
	for k, v := range raw {
		switch v := v.(type) {
		case string, int, float64, bool:
			out[k] = fmt.Sprint(v)
		default:
			return nil, fmt.Errorf("config %s: %q must be a plain value", filepath.Base(path), k)
		}
	}
	return out, nil
}

// parseTOML reads the flat subset of TOML the settings need: key = value
// lines (strings, numbers, booleans) and comments; no tables.
func parseTOML(name string, b []byte) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.HasPrefix(line, "[") {
			return nil, fmt.Errorf("config %s:%d: want key = value (tables are not supported)", name, n)
		}
		k, v = strings.Trim(strings.TrimSpace(k), `"`), strings.TrimSpace(v)
		switch {
		case strings.HasPrefix(v, `"`):
			end := strings.LastIndex(v, `"`)
			if end == 0 {
				return nil, fmt.Errorf("config %s:%d: unterminated string", name, n)
			}
			if rest := strings.TrimSpace(v[end+1:]); rest != "" && !strings.HasPrefix(rest, "#") {
				return nil, fmt.Errorf("config %s:%d: text after the string", name, n)
			}
			s, err := strconv.Unquote(v[:end+1])
			if err != nil {
				return nil, fmt.Errorf("config %s:%d: %v", name, n, err)
			}
			v = s
		case strings.HasPrefix(v, "'"):
			end := strings.LastIndex(v, "'")
			if end == 0 {
				return nil, fmt.Errorf("config %s:%d: unterminated string", name, n)
			}
			v = v[1:end]
		default:
			if i := strings.Index(v, "#"); i >= 0 {
				v = strings.TrimSpace(v[:i])
			}
		}
		out[k] = v
	}
	return out, sc.Err()
}
