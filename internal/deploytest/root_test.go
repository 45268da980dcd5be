package deploytest

import (
	"os"
	"path/filepath"
	"testing"
)

// repoRoot is the module root: go test runs in the package directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod two levels above the package: %v", err)
	}
	return root
}

// skipUnlessCI skips with reason when something the test needs is not there
// yet, and fails in CI, where nothing may be skipped.
func skipUnlessCI(t *testing.T, reason string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(reason + " (CI=true: not skipping)")
	}
	t.Skip(reason)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
