package lockkit_test

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README's lockkit section quotes example_test.go, which go test runs:
// a quote that drifted from the file would show code nobody compiled.
func TestREADMEQuotesTheExamples(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	const heading = "## Taking lockkit into your own service\n"
	_, section, ok := strings.Cut(string(readme), heading)
	if !ok {
		t.Fatalf("README has no %q", strings.TrimSpace(heading))
	}
	if next := strings.Index(section, "\n## "); next >= 0 {
		section = section[:next]
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(section, -1)
	if len(blocks) == 0 {
		t.Fatal("the README's lockkit section quotes no Go code")
	}
	for _, b := range blocks {
		if !strings.Contains(string(example), b[1]) {
			t.Errorf("README quotes code that is not in example_test.go:\n%s", b[1])
		}
	}
}

// The README says what to copy to take lockkit into another module. This
// does it: those files alone, their imports rewritten, must build and vet
// (tests included) in a module of another name, with nothing of shop's
// left behind.
func TestLiftedAsTheREADMESaysBuildsInAnotherModule(t *testing.T) {
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("builds a copy of lockkit: not with -short, except in CI, where nothing is skipped")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	root, dst := filepath.Join("..", ".."), t.TempDir()
	const shop, lifted = "github.com/lockbench/shop/", "example.com/svc/"
	copyTree(t, root, dst, "internal/lockkit", func(rel string, d fs.DirEntry) bool {
		return !d.IsDir() && filepath.Ext(rel) == ".go" && d.Name() != "readme_test.go"
	})
	for _, dir := range []string{"backend", "locktest", "local",
		"etcdlock", "memcachedlock", "mysqllock", "redislock", "redlock", "zklock"} {
		copyTree(t, root, dst, "internal/lockkit/"+dir, nil)
	}
	copyTree(t, root, dst, "internal/testenv", nil)
	copyTree(t, root, dst, "third_party/go-zookeeper-zk", nil) // zklock's client, as go.mod's replace names it
	mod := strings.Replace(readText(t, filepath.Join(root, "go.mod")), "module github.com/lockbench/shop", "module example.com/svc", 1)
	writeText(t, filepath.Join(dst, "go.mod"), mod)
	writeText(t, filepath.Join(dst, "go.sum"), readText(t, filepath.Join(root, "go.sum")))
	_ = filepath.WalkDir(dst, func(path string, d fs.DirEntry, err error) error {
		if err == nil && filepath.Ext(path) == ".go" {
			writeText(t, path, strings.ReplaceAll(readText(t, path), shop, lifted))
		}
		return err
	})

	cmd := exec.Command(goTool, "vet", "./...")
	cmd.Dir = dst
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the copy the README describes does not build: %v\n%s", err, out)
	}
}

// copyTree copies dir (relative to from) into to, every file under it, or
// only the files keep accepts, keep seeing each path relative to dir.
func copyTree(t *testing.T, from, to, dir string, keep func(rel string, d fs.DirEntry) bool) {
	t.Helper()
	base := filepath.Join(from, dir)
	err := filepath.WalkDir(base, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(base, path)
		if d.IsDir() {
			if keep != nil && rel != "." {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(to, dir, rel), 0o755)
		}
		if keep != nil && !keep(rel, d) {
			return nil
		}
		writeText(t, filepath.Join(to, dir, rel), readText(t, path))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func readText(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeText(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}
