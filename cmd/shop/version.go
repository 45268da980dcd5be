package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version and revision are stamped by the Makefile and the Docker build
// (-ldflags "-X main.version=... -X main.revision=...", from git describe):
// the image is built without .git, so Go's own VCS stamp is not there.
var version, revision string

// buildInfo is what `shop version` prints and shop_build_info exports.
type buildInfo struct {
	Version   string // git describe's, or else the module version go build stamped ("(devel)" outside a tagged checkout)
	Revision  string // the VCS commit, with "+dirty" for uncommitted changes; empty when built without either
	GoVersion string
}

func readBuildInfo() buildInfo {
	b := buildInfo{Version: "(devel)", GoVersion: runtime.Version()}
	if version != "" {
		return buildInfo{Version: version, Revision: revision, GoVersion: b.GoVersion}
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if info.Main.Version != "" {
		b.Version = info.Main.Version
	}
	var dirty bool
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && b.Revision != "" {
		b.Revision += "+dirty"
	}
	return b
}

func (b buildInfo) String() string {
	rev := b.Revision
	if rev == "" {
		rev = "unknown revision"
	}
	return fmt.Sprintf("shop %s (%s, %s)", b.Version, rev, b.GoVersion)
}
