package main

import (
	"strings"
	"testing"
)

// TestVersionPrintsWhatTheLinkerStamped: the Makefile and the Docker build
// stamp the version and revision with -ldflags -X; shop version and the
// build info metric show them, not the module's "(devel)".
func TestVersionPrintsWhatTheLinkerStamped(t *testing.T) {
	oldV, oldR := version, revision
	t.Cleanup(func() { version, revision = oldV, oldR })
	version, revision = "v1.2.3-4-gabcdef0-dirty", "abcdef0123456789"
	b := readBuildInfo()
	if b.Version != version || b.Revision != revision {
		t.Fatalf("readBuildInfo = %+v, want version %q revision %q", b, version, revision)
	}
	if s := b.String(); !strings.Contains(s, "v1.2.3-4-gabcdef0-dirty") || !strings.Contains(s, "abcdef0123456789") {
		t.Errorf("shop version prints %q", s)
	}
}
