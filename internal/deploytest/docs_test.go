package deploytest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestShellExamplesRunEverywhere: the README's and docs' shell examples
// must run with the curl of Debian 12 (7.88) and Ubuntu 22.04 (7.81, which
// lacks --json, added in 7.82), and pasting them must not overwrite a
// variable the shell itself relies on.
func TestShellExamplesRunEverywhere(t *testing.T) {
	root := repoRoot(t)
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append(files, filepath.Join(root, "README.md"))
	block := regexp.MustCompile("(?s)```(?:sh|bash|console)\n(.*?)```")
	shellVar := regexp.MustCompile(`(?m)^\s*(?:export\s+)?(USER|HOME|PATH|PWD|SHELL|LANG|TERM|HOSTNAME|LOGNAME|IFS)=`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for _, m := range block.FindAllStringSubmatch(string(b), -1) {
			for _, line := range strings.Split(m[1], "\n") {
				if strings.HasPrefix(strings.TrimSpace(line), "#") {
					continue
				}
				if strings.Contains(line, "--json") {
					t.Errorf("%s: curl --json needs curl 7.82 (Ubuntu 22.04 has 7.81); use -H 'Content-Type: application/json' -d: %s", rel, line)
				}
				if v := shellVar.FindStringSubmatch(line); v != nil {
					t.Errorf("%s: the example overwrites the shell's $%s: %s", rel, v[1], line)
				}
			}
		}
	}
}
