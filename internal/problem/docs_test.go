package problem

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestEveryTypeHasItsHeading: every problem type the code can answer with
// (a slug given to New, or set as an Error's or a table Mapping's Slug
// anywhere in the module) links to a heading that exists in docs/api.md,
// so a client following the type lands on its explanation; and every
// heading of the docs' Problems section is a type the code answers with,
// so the docs explain no problem that cannot happen.
func TestEveryTypeHasItsHeading(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(TypeBase, "/docs/api.md#") {
		t.Fatalf("TypeBase %s does not point into docs/api.md; teach this test where", TypeBase)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*$`).FindAllStringSubmatch(string(doc), -1) {
		anchors[githubAnchor(m[1])] = true
	}
	slugs := usedSlugs(t, root)
	if len(slugs) < 10 {
		t.Fatalf("found only %d problem slugs in the source: the scan is broken", len(slugs))
	}
	for slug, where := range slugs {
		if !anchors[slug] {
			t.Errorf("%s: problem type %s%s has no heading \"### %s\" in docs/api.md", where, TypeBase, slug, slug)
		}
	}
	documented := problemHeadings(string(doc))
	if len(documented) < 10 {
		t.Fatalf("found only %d headings under \"## Problems\" in docs/api.md: the scan is broken", len(documented))
	}
	for _, heading := range documented {
		if _, ok := slugs[githubAnchor(heading)]; !ok {
			t.Errorf("docs/api.md documents problem type %q, which no code answers with", heading)
		}
	}
}

// problemHeadings are the headings of the "## Problems" section of doc.
func problemHeadings(doc string) []string {
	_, section, _ := strings.Cut(doc, "\n## Problems\n")
	section, _, _ = strings.Cut(section, "\n## ")
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^###\s+(.+?)\s*$`).FindAllStringSubmatch(section, -1) {
		out = append(out, m[1])
	}
	return out
}

// githubAnchor is the id GitHub gives a Markdown heading.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// usedSlugs finds every constant slug in the module's non-test Go source.
func usedSlugs(t *testing.T, root string) map[string]string {
	t.Helper()
	scan := slugScan{fset: token.NewFileSet(), found: map[string]string{}}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		return scan.file(path)
	})
	if err != nil {
		t.Fatal(err)
	}
	return scan.found
}

// slugScan collects the slugs of the files it reads, each with where it was seen.
type slugScan struct {
	fset  *token.FileSet
	found map[string]string
}

// file adds the slugs given to New, or set as a Slug field, in one Go file.
func (s *slugScan) file(path string) error {
	f, err := parser.ParseFile(s.fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return err
	}
	inProblem := f.Name.Name == "problem"
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if calledName(n, inProblem) == "New" && len(n.Args) > 1 {
				s.add(n.Args[1])
			}
		case *ast.KeyValueExpr:
			if k, ok := n.Key.(*ast.Ident); ok && (k.Name == "Slug" || k.Name == "slug") {
				s.add(n.Value)
			}
		}
		return true
	})
	return nil
}

// calledName is the name of problem's function that call calls (problem.X
// outside the package, a bare X inside it), or "" for any other call.
func calledName(call *ast.CallExpr, inProblem bool) string {
	switch fn := call.Fun.(type) {
	case *ast.SelectorExpr:
		if x, ok := fn.X.(*ast.Ident); ok && x.Name == "problem" {
			return fn.Sel.Name
		}
	case *ast.Ident:
		if inProblem {
			return fn.Name
		}
	}
	return ""
}

// add records e if it is a non-empty string literal.
func (s *slugScan) add(e ast.Expr) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return
	}
	if v, err := strconv.Unquote(lit.Value); err == nil && v != "" {
		s.found[v] = s.fset.Position(lit.Pos()).String()
	}
}
