package deploytest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMakeHelpIsPlainTextInAPipe: make help's output read by a program or
// saved to a file carries no colour codes, and every make variable in a
// target's description is shown with its value.
func TestMakeHelpIsPlainTextInAPipe(t *testing.T) {
	mk, err := exec.LookPath("make")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("no make on PATH")
		}
		t.Skip("no make on PATH")
	}
	cmd := exec.CommandContext(t.Context(), mk, "--no-print-directory", "help")
	cmd.Dir = repoRoot(t)
	out, err := cmd.Output() // stdout is a pipe, not a terminal
	if err != nil {
		t.Fatalf("make help: %v\n%s", err, out)
	}
	help := string(out)
	if strings.Contains(help, "\x1b[") {
		t.Errorf("make help into a pipe prints colour codes:\n%q", help)
	}
	if strings.Contains(help, "$(") {
		t.Errorf("make help shows a make variable unexpanded:\n%s", help)
	}
	if !strings.Contains(help, "test") || !strings.Contains(help, "20s of fuzzing") {
		t.Errorf("make help lacks the test target or the fuzzing time's value:\n%s", help)
	}
}
