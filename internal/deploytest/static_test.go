package deploytest

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/lockbench/shop/internal/testenv"
)

// TestImageBinary builds cmd/shop with the environment and flags of the
// Dockerfile's build line, read from the Dockerfile itself so that the two
// cannot drift, with its build arguments set as docker build --build-arg
// would. "go" is the toolchain running the test: go test puts it first in
// PATH.
func TestImageBinary(t *testing.T) {
	if runtime.GOOS != "linux" {
		testenv.Missing(t, "a linux host: the image is linux, and an ELF check elsewhere proves nothing")
	}
	root := repoRoot(t)
	if _, err := os.Stat(filepath.Join(root, "cmd", "shop")); err != nil {
		testenv.Missing(t, "cmd/shop is not in the tree yet")
	}
	buildArgs := map[string]string{"VERSION": "v0.0.0-test-3-gfeedbee", "REVISION": "feedbeefeedbeefeedbee"}
	b := dockerfileBuild(t)
	out := filepath.Join(t.TempDir(), "shop")
	args := append([]string{"build"}, b.flags...)
	args = append(args, "-o", out, b.pkg)
	for i := range args {
		args[i] = os.Expand(args[i], func(k string) string { return buildArgs[k] })
	}
	cmd := exec.CommandContext(t.Context(), "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), b.env...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v %v: %v\n%s", b.env, cmd.Args, err, msg)
	}
	t.Run("is-static", func(t *testing.T) { checkStatic(t, out) })
	t.Run("prints-the-version-of-its-build-args", func(t *testing.T) {
		// .dockerignore leaves .git out of the build context: only the
		// build arguments can tell the binary what it is.
		got, err := exec.CommandContext(t.Context(), out, "version").Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range buildArgs {
			if !strings.Contains(string(got), want) {
				t.Errorf("shop version in the image prints %q, without the build argument %q", got, want)
			}
		}
	})
}

// checkStatic: the ELF asks for no dynamic loader and no shared library:
// the distroless/static image has neither, and a dynamic binary there
// fails with a baffling "no such file or directory".
func checkStatic(t *testing.T, out string) {
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("the binary names a dynamic loader (PT_INTERP): it is not static")
		}
		if p.Type == elf.PT_DYNAMIC {
			t.Errorf("the binary has a dynamic section (PT_DYNAMIC)")
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	if len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %v", libs)
	}
	// -s -w strip the symbol table: checks the flags reached the linker.
	if s := f.Section(".symtab"); s != nil {
		t.Errorf("the binary has a symbol table: -ldflags='-s -w' did not apply")
	}
}
