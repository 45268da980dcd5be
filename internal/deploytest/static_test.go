package deploytest

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/lockbench/shop/internal/testenv"
)

// TestBinaryIsStatic builds cmd/shop with the environment and flags of the
// Dockerfile's build line, read from the Dockerfile itself so that the two
// cannot drift, and checks the ELF asks for no dynamic loader and no
// shared library: the distroless/static image has neither, and a dynamic
// binary there fails with a baffling "no such file or directory". "go" is
// the toolchain running the test: go test puts it first in PATH.
func TestBinaryIsStatic(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the image is linux; an ELF check elsewhere proves nothing")
	}
	root := repoRoot(t)
	if _, err := os.Stat(filepath.Join(root, "cmd", "shop")); err != nil {
		testenv.Missing(t, "cmd/shop is not in the tree yet")
	}
	b := dockerfileBuild(t)
	out := filepath.Join(t.TempDir(), "shop")
	args := append([]string{"build"}, b.flags...)
	args = append(args, "-o", out, b.pkg)
	cmd := exec.CommandContext(t.Context(), "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), b.env...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v %v: %v\n%s", b.env, cmd.Args, err, msg)
	}

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
