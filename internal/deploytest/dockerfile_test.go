package deploytest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, COPY…
	args string
}

// parseDockerfile reads the instructions of path, with the ARG defaults
// declared before the first FROM substituted into FROM lines (the only
// place the Dockerfile reference lets them reach).
func parseDockerfile(t *testing.T, path string) []instruction {
	t.Helper()
	var out []instruction
	var cur strings.Builder
	for line := range strings.Lines(readFile(t, path)) {
		line = strings.TrimRight(line, "\r\n")
		if trimmed := strings.TrimSpace(line); cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if body, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(strings.TrimSpace(cur.String()), " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.TrimSpace(args)})
		cur.Reset()
	}
	args := map[string]string{}
	for i, in := range out {
		switch in.cmd {
		case "ARG":
			if name, def, ok := strings.Cut(in.args, "="); ok {
				args[name] = def
			}
		case "FROM":
			for name, def := range args {
				out[i].args = strings.ReplaceAll(strings.ReplaceAll(in.args, "${"+name+"}", def), "$"+name, def)
				in.args = out[i].args
			}
		}
	}
	return out
}

// goBuild is the Dockerfile's `go build` command.
type goBuild struct {
	env    []string // NAME=value set on the command
	flags  []string // everything between "build" and the package, -o excluded
	output string
	pkg    string
}

// dockerfileBuild finds the one RUN that calls go build and splits it as
// the shell would.
func dockerfileBuild(t *testing.T) goBuild {
	t.Helper()
	var found []string
	for _, in := range parseDockerfile(t, filepath.Join(repoRoot(t), "Dockerfile")) {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			found = append(found, in.args)
		}
	}
	if len(found) != 1 {
		t.Fatalf("Dockerfile has %d RUN lines with go build, want 1", len(found))
	}
	words := shellWords(t, found[0])
	for len(words) > 0 && strings.HasPrefix(words[0], "--") { // RUN --mount=…
		words = words[1:]
	}
	var b goBuild
	for len(words) > 0 && strings.Contains(words[0], "=") {
		b.env = append(b.env, words[0])
		words = words[1:]
	}
	if len(words) < 3 || words[0] != "go" || words[1] != "build" {
		t.Fatalf("Dockerfile build line is %q; want [NAME=value…] go build [flags] package (one command, no &&)", found[0])
	}
	rest := words[2:]
	b.pkg = rest[len(rest)-1]
	for i := 0; i < len(rest)-1; i++ {
		if rest[i] == "-o" && i+1 < len(rest)-1 {
			b.output = rest[i+1]
			i++
			continue
		}
		b.flags = append(b.flags, rest[i])
	}
	return b
}

// shellWords splits s as sh would split a simple command: quotes group,
// backslashes escape, && and ; are refused (the build must be one command).
func shellWords(t *testing.T, s string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				t.Fatalf("unterminated ' in %q", s)
			}
			w.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			j := strings.IndexByte(s[i+1:], '"')
			if j < 0 {
				t.Fatalf("unterminated \" in %q", s)
			}
			w.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '\\' && i+1 < len(s):
			w.WriteByte(s[i+1])
			i++
			inWord = true
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case c == ';' || c == '&' || c == '|':
			t.Fatalf("the build line %q is more than one command", s)
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// dockerfileBinary is where the final image has the shop binary: the
// destination of the COPY --from in the last stage, which ENTRYPOINT runs.
func dockerfileBinary(t *testing.T) string {
	t.Helper()
	ins := parseDockerfile(t, filepath.Join(repoRoot(t), "Dockerfile"))
	last := 0
	for i, in := range ins {
		if in.cmd == "FROM" {
			last = i
		}
	}
	for _, in := range ins[last:] {
		if in.cmd == "COPY" && strings.HasPrefix(in.args, "--from=") {
			f := strings.Fields(in.args)
			return f[len(f)-1]
		}
	}
	t.Fatal("the Dockerfile's last stage copies no binary from the build stage")
	return ""
}

func TestDockerfile(t *testing.T) {
	root := repoRoot(t)
	ins := parseDockerfile(t, filepath.Join(root, "Dockerfile"))
	b := dockerfileBuild(t)
	checkGoBuild(t, b)
	build := checkStages(t, root, ins)
	checkRuntimeStage(t, ins, b, build)
}

// checkGoBuild: the build line makes a static, path-free ./cmd/shop binary.
func checkGoBuild(t *testing.T, b goBuild) {
	t.Helper()
	if !slices.Contains(b.env, "CGO_ENABLED=0") {
		t.Errorf("go build runs with %v, without CGO_ENABLED=0: the binary would need a libc the final image does not have", b.env)
	}
	if !slices.Contains(b.flags, "-trimpath") {
		t.Errorf("go build flags %v lack -trimpath", b.flags)
	}
	if b.pkg != "./cmd/shop" || b.output == "" {
		t.Errorf("go build builds %q into %q, want ./cmd/shop into a path the last stage copies", b.pkg, b.output)
	}
}

// checkStages: a named build stage on go.mod's toolchain and a minimal
// runtime stage. It returns the build stage's FROM fields (image AS name).
func checkStages(t *testing.T, root string, ins []instruction) []string {
	t.Helper()
	var froms []string
	for _, in := range ins {
		if in.cmd == "FROM" {
			froms = append(froms, in.args)
		}
	}
	if len(froms) < 2 {
		t.Fatalf("Dockerfile has %d stages, want a build stage and a runtime stage", len(froms))
	}
	final := strings.Fields(froms[len(froms)-1])[0]
	if final != "scratch" && !strings.HasPrefix(final, "gcr.io/distroless/static") {
		t.Errorf("runtime stage is %s, want scratch or distroless/static", final)
	}
	build := strings.Fields(froms[0])
	if len(build) != 3 || !strings.EqualFold(build[1], "AS") {
		t.Fatalf("build stage %q is not named (FROM image AS name)", froms[0])
	}
	// The toolchain in the image must be the one go.mod asks for: an older
	// one would download a newer toolchain at build time, or fail.
	gomod := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(readFile(t, filepath.Join(root, "go.mod")))
	if gomod == nil {
		t.Fatal("go.mod has no go directive")
	}
	if !strings.HasPrefix(build[0], "golang:"+gomod[1]) {
		t.Errorf("build stage uses %s, go.mod asks for go %s", build[0], gomod[1])
	}
	return build
}

// checkRuntimeStage: the last stage copies the built binary, runs it in
// exec form, and not as root.
func checkRuntimeStage(t *testing.T, ins []instruction, b goBuild, build []string) {
	t.Helper()
	bin := dockerfileBinary(t)
	var copyLine, entrypoint, user string
	for _, in := range ins {
		switch in.cmd {
		case "COPY":
			if strings.HasPrefix(in.args, "--from=") {
				copyLine = in.args
			}
		case "ENTRYPOINT":
			entrypoint = in.args
		case "USER":
			user = in.args
		}
	}
	if want := "--from=" + build[2] + " " + b.output + " " + bin; copyLine != want {
		t.Errorf("last stage copies %q, want %q", copyLine, want)
	}
	var ep []string
	if err := json.Unmarshal([]byte(entrypoint), &ep); err != nil || len(ep) == 0 || ep[0] != bin {
		t.Errorf("ENTRYPOINT %s: want the exec form [%q] (no shell in the image)", entrypoint, bin)
	}
	if user == "" || strings.HasPrefix(user, "root") || strings.HasPrefix(user, "0") {
		t.Errorf("image runs as %q, want a non-root user", user)
	}
}

func TestDockerignoreKeepsSources(t *testing.T) {
	ignore := readFile(t, filepath.Join(repoRoot(t), ".dockerignore"))
	for line := range strings.Lines(ignore) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for _, needed := range []string{"go.mod", "go.sum", "cmd", "internal", "*.go", "**/*.go"} {
			if line == needed || line == "/"+needed {
				t.Errorf(".dockerignore drops %s, which the build needs", needed)
			}
		}
	}
}

func statPath(p string) (os.FileInfo, error) { return os.Stat(p) }
