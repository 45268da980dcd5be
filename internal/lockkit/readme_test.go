package lockkit_test

import (
	"os"
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
