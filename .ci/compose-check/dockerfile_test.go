package composecheck

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/mattn/go-shellwords"
)

const dockerfile = repoRoot + "/Dockerfile"

// dockerfileLines returns the Dockerfile's instructions with continuation
// lines joined and comments dropped.
func dockerfileLines(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	cur := ""
	for line := range strings.Lines(string(raw)) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") || (line == "" && cur == "") {
			continue
		}
		if body, cont := strings.CutSuffix(line, `\`); cont {
			cur += body + " "
			continue
		}
		lines = append(lines, strings.Join(strings.Fields(cur+line), " "))
		cur = ""
	}
	return lines
}

func programs(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(repoRoot + "/cmd")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names
}

func TestDockerfileShipsEveryProgramOnDistroless(t *testing.T) {
	lines := dockerfileLines(t)
	want := []*regexp.Regexp{
		regexp.MustCompile(`^FROM (--platform=\S+ )?golang:(\$\{GO_VERSION\}|1\.26[.\d]*\S*) AS build$`),
		regexp.MustCompile(`^ARG GO_VERSION=1\.26(\.\d+)?$`),
		regexp.MustCompile(`^RUN --mount=type=cache,target=/go/pkg/mod .*go mod download`),
		regexp.MustCompile(`^RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build .*go build`),
		regexp.MustCompile(`^FROM gcr\.io/distroless/static-debian12:nonroot$`),
		regexp.MustCompile(`^COPY --from=build /out/ ` + binDir + `$`),
		regexp.MustCompile(`^USER nonroot:nonroot$`),
	}
	for _, re := range want {
		if !slices.ContainsFunc(lines, re.MatchString) {
			t.Errorf("Dockerfile: no instruction matches %s", re)
		}
	}
	// The final stage copies binaries only.
	final := slices.IndexFunc(lines, want[4].MatchString)
	for _, l := range lines[max(final, 0):] {
		if strings.HasPrefix(l, "COPY ") && !strings.HasPrefix(l, "COPY --from=build /out/") || strings.HasPrefix(l, "RUN ") {
			t.Errorf("Dockerfile: the runtime stage should only copy the binaries, got %q", l)
		}
	}
	p := load(t, envExampleValues(t))
	for _, s := range p.Services {
		if prog := program(s); s.Build != nil && !slices.Contains(programs(t), prog) {
			t.Errorf("%s: entrypoint %q is not one of cmd/%q", s.Name, s.Entrypoint, programs(t))
		}
	}
}

// TestDockerfileBuildCommandBuildsHere runs the Dockerfile's `go build`, as
// written there, on this machine: the one part of the image build that needs no
// Docker engine. The binaries must be static, as distroless/static has no libc.
func TestDockerfileBuildCommandBuildsHere(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the four programs")
	}
	i := slices.IndexFunc(dockerfileLines(t), func(l string) bool { return strings.Contains(l, " go build ") })
	if i < 0 {
		t.Fatal("Dockerfile: no go build")
	}
	line := dockerfileLines(t)[i]
	words, err := shellwords.Parse(line[strings.Index(line, "CGO_ENABLED="):])
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir() + "/"
	var env, args []string
	for _, w := range words {
		switch {
		case len(args) == 0 && strings.Contains(w, "="):
			if !strings.Contains(w, "$") { // GOOS=$TARGETOS: the build platform here
				env = append(env, w)
			}
		case w == "/out/":
			args = append(args, out)
		default:
			args = append(args, w)
		}
	}
	if !slices.Contains(env, "CGO_ENABLED=0") || len(args) < 2 || args[0] != "go" || args[1] != "build" {
		t.Fatalf("Dockerfile: want `CGO_ENABLED=0 ... go build ...`, got %q", line)
	}
	var pkgs []string
	for _, p := range programs(t) {
		pkgs = append(pkgs, "./cmd/"+p)
	}
	for _, p := range pkgs {
		if !slices.Contains(args, p) {
			t.Errorf("Dockerfile: go build does not build %s", p)
		}
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goBin, args[1:]...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), append(env, "GOWORK=off")...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(append(env, args...), " "), err, b)
	}
	var total int64
	for _, p := range programs(t) {
		path := filepath.Join(out, p)
		fi, err := os.Stat(path)
		if err != nil {
			t.Errorf("%s was not built: %v", p, err)
			continue
		}
		total += fi.Size()
		t.Logf("%-16s %5.1f MB", p, float64(fi.Size())/1e6)
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				t.Errorf("%s is dynamically linked; distroless/static has no libc", p)
			}
		}
		f.Close()
	}
	t.Logf("%-16s %5.1f MB (plus ~2 MB of distroless/static)", "total", float64(total)/1e6)
}
