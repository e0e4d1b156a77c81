// Package buildinfo names the running build of agenthost: its module
// version and VCS revision, from the build information the Go toolchain
// records in the binary.
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// Info is what the binary records about its build.
type Info struct {
	// Version is the one-line name of the build (see Version).
	Version string `json:"version"`
	// Module is the main module's version: a tag, a pseudo-version
	// (v0.0.0-DATE-REVISION, "+dirty" for a modified tree) or "(devel)".
	Module string `json:"module"`
	// Revision, Time and Modified come from the VCS ("" and false when
	// the build had none, e.g. go test or -buildvcs=false).
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified"`
	Go       string `json:"go"`
	Platform string `json:"platform"`
}

// Read returns the running binary's Info.
func Read() Info {
	in := Info{Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		in.Module = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				in.Revision = s.Value
			case "vcs.time":
				in.Time = s.Value
			case "vcs.modified":
				in.Modified = s.Value == "true"
			}
		}
	}
	in.Version = name(in.Module, in.Revision, in.Modified)
	return in
}

// Version is the running build's one-line name: the module version, with
// the VCS revision (12 hex digits) and "dirty" added as build metadata
// when the version does not carry them already. For example
// "v0.0.0-20261201154500-f82a31f0c2d1+dirty" (a build from a modified
// checkout), "v1.2.0+f82a31f0c2d1" or "devel" (no build information).
func Version() string { return Read().Version }

func name(module, rev string, modified bool) string {
	v := module
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	add := func(s string) {
		if strings.Contains(v, "+") {
			v += "." + s
		} else {
			v += "+" + s
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" && !strings.Contains(v, rev) {
		add(rev)
	}
	if modified && !strings.Contains(v, "dirty") {
		add("dirty")
	}
	return v
}
