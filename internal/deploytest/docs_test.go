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

// TestDocsNameTestsThatExist: a test named in the README or docs as the
// proof of a claim must exist, or the claim has lost its proof. A name
// with a subtest (TestLine/OnePollerPerLocker) needs the subtest's name as
// a string in the sources too (shared suites such as locktest run theirs
// from ordinary files); TestX* names a family, at least one of which exists.
func TestDocsNameTestsThatExist(t *testing.T) {
	root := repoRoot(t)
	tests, sources := goSources(t, root)
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	docs = append(docs, filepath.Join(root, "README.md"))
	named := regexp.MustCompile(`\b(Test[A-Z][A-Za-z0-9_]*)(\*?)((?:/[A-Za-z0-9_-]+)*)`)
	for _, f := range docs {
		rel, _ := filepath.Rel(root, f)
		for _, m := range named.FindAllStringSubmatch(readFile(t, f), -1) {
			family := map[string]string{"*": `[A-Za-z0-9_]*`}[m[2]]
			if !regexp.MustCompile(`func ` + m[1] + family + `\(`).MatchString(tests) {
				t.Errorf("%s names %s, which no _test.go defines", rel, m[0])
				continue
			}
			for _, sub := range strings.Split(strings.Trim(m[3], "/"), "/") {
				if sub != "" && !strings.Contains(sources, `"`+strings.ReplaceAll(sub, "_", " ")) &&
					!strings.Contains(sources, `"`+sub) {
					t.Errorf("%s names %s, whose subtest %q nothing runs", rel, m[0], sub)
				}
			}
		}
	}
}

// goSources is the module's _test.go files and all its .go files, each
// concatenated.
func goSources(t *testing.T, root string) (tests, all string) {
	t.Helper()
	var testsB, allB strings.Builder
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if strings.HasSuffix(path, ".go") {
			src := readFile(t, path)
			allB.WriteString(src)
			if strings.HasSuffix(path, "_test.go") {
				testsB.WriteString(src)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return testsB.String(), allB.String()
}
