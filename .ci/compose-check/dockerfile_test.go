package composecheck

import (
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/mattn/go-shellwords"
)

const (
	dockerfile = repoRoot + "/Dockerfile"
	// buildStage is the one stage that compiles; every other stage is an image.
	buildStage = "build"
	// runtimeBase is the base of every image.
	runtimeBase = "gcr.io/distroless/static-debian12:nonroot"
	// runtimeBaseSize is about what distroless static-debian12 adds to the
	// binaries.
	runtimeBaseSize = 2e6
	// maxImageSize is the project's limit for each image, in bytes. It was
	// 40 MB until the default image (payment-service with inboxctl, two
	// programs of mostly the same code) reached 40.0 MB, 42 MB until the
	// OpenTelemetry SDK and its OTLP exporter added about 3.5 MB to each
	// program (47.3 MB); one multi-call binary for the two would halve that
	// image.
	maxImageSize = 50e6
)

// wantTargets are the Dockerfile's images and the programs each one holds:
// operators run inboxctl next to the service. The last one is the default
// of `docker build .`.
var wantTargets = []struct {
	name     string
	programs []string
	expose   []string
}{
	{"fake-carrier", []string{"fake-carrier"}, []string{"8082"}},
	{"fake-gateway", []string{"fake-gateway"}, []string{"8081"}},
	{"order-publisher", []string{"order-publisher"}, nil},
	{"payment-service", []string{"inboxctl", "payment-service"}, []string{"8080"}},
	{"shipping-service", []string{"shipping-service"}, []string{"8080"}},
}

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

// stage is one FROM of the Dockerfile and its instructions.
type stage struct {
	from  string   // the FROM line
	base  string   // the image (or stage) it starts from
	name  string   // AS name, or ""
	lines []string // the instructions after FROM
}

// target is what an image stage puts together.
type target struct {
	name       string
	programs   []string // copied from the build stage into binDir, sorted
	expose     []string
	user       string
	entrypoint string
}

func dockerfileStages(t *testing.T) []stage {
	t.Helper()
	var stages []stage
	fromRE := regexp.MustCompile(`^FROM (--platform=\S+ )?(\S+)( AS (\S+))?$`)
	for _, l := range dockerfileLines(t) {
		if strings.HasPrefix(l, "FROM ") {
			m := fromRE.FindStringSubmatch(l)
			if m == nil {
				t.Fatalf("Dockerfile: cannot read %q", l)
			}
			stages = append(stages, stage{from: l, base: m[2], name: m[4]})
			continue
		}
		if len(stages) == 0 {
			continue // ARG before the first FROM
		}
		stages[len(stages)-1].lines = append(stages[len(stages)-1].lines, l)
	}
	if len(stages) == 0 {
		t.Fatal("Dockerfile: no FROM")
	}
	return stages
}

// dockerfileTargets reads every stage but the build stage as an image, and
// returns what such a stage must not do among the problems; only
// TestDockerfileTargets reports those.
func dockerfileTargets(t *testing.T) (targets []target, problems []string) {
	t.Helper()
	report := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	copyRE := regexp.MustCompile(`^COPY --from=` + buildStage + `((?: /out/[a-z0-9-]+)+) ` + binDir + `$`)
	entryRE := regexp.MustCompile(`^ENTRYPOINT \["` + binDir + `([a-z0-9-]+)"\]$`)
	stateRE := regexp.MustCompile(`^COPY --from=` + buildStage + ` --chown=nonroot:nonroot /state/([a-z0-9-]+) /var/lib/([a-z0-9-]+)$`)
	for _, s := range dockerfileStages(t) {
		if s.name == buildStage {
			continue
		}
		if s.name == genericTarget {
			checkGenericTarget(s, report)
			continue
		}
		tg := target{name: s.name}
		if s.base != runtimeBase || s.name == "" {
			report("Dockerfile: %q: every image stage must be `FROM %s AS <target>`", s.from, runtimeBase)
		}
		for _, l := range s.lines {
			instr, _, _ := strings.Cut(l, " ")
			switch instr {
			case "COPY":
				if stateRE.MatchString(l) {
					continue // an empty state directory owned by nonroot, for a named volume
				}
				m := copyRE.FindStringSubmatch(l)
				if m == nil {
					report("Dockerfile: target %s: %q; an image copies only binaries from /out/ of the build stage into %s", s.name, l, binDir)
					continue
				}
				for _, src := range strings.Fields(m[1]) {
					tg.programs = append(tg.programs, strings.TrimPrefix(src, "/out/"))
				}
			case "USER":
				tg.user = strings.TrimPrefix(l, "USER ")
			case "EXPOSE":
				tg.expose = append(tg.expose, strings.Fields(strings.TrimPrefix(l, "EXPOSE "))...)
			case "ENTRYPOINT":
				if m := entryRE.FindStringSubmatch(l); m != nil {
					tg.entrypoint = m[1]
				} else {
					report("Dockerfile: target %s: %q; want the exec form with one program of %s", s.name, l, binDir)
				}
			case "LABEL", "ARG", "ENV", "WORKDIR", "CMD", "STOPSIGNAL":
			default:
				// RUN, ADD, ...: the images hold the binaries and nothing else.
				report("Dockerfile: target %s: %q; an image only copies its binaries", s.name, l)
			}
		}
		slices.Sort(tg.programs)
		targets = append(targets, tg)
	}
	return targets, problems
}

// genericTarget is the image of any program of cmd/, chosen with a build
// argument: a new program needs no line in the Dockerfile.
const genericTarget = "program"

// checkGenericTarget holds the generic image to the rules of the others: the
// runtime base, nonroot, one binary from /out/ and nothing else.
func checkGenericTarget(s stage, report func(format string, args ...any)) {
	if s.base != runtimeBase {
		report("Dockerfile: target %s: %q, want FROM %s", genericTarget, s.from, runtimeBase)
	}
	want := []string{
		"ARG PROGRAM",
		"COPY --from=" + buildStage + " /out/${PROGRAM} " + binDir + "program",
		"USER nonroot:nonroot",
		`ENTRYPOINT ["` + binDir + `program"]`,
	}
	var got []string
	for _, l := range s.lines {
		if !strings.HasPrefix(l, "LABEL ") {
			got = append(got, l)
		}
	}
	if !slices.Equal(got, want) {
		report("Dockerfile: target %s is %q, want %q", genericTarget, got, want)
	}
}

// targetNamed returns the image called name among targets.
func targetNamed(targets []target, name string) (target, bool) {
	i := slices.IndexFunc(targets, func(tg target) bool { return tg.name == name })
	if i < 0 {
		return target{}, false
	}
	return targets[i], true
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

// TestDockerfileNeedsNoFrontendImage: a `# syntax=` directive makes every
// build pull that frontend image first, which fails without a registry; the
// engine's built-in frontend (Engine 20.10 and later) reads this Dockerfile.
func TestDockerfileNeedsNoFrontendImage(t *testing.T) {
	raw, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	directive := regexp.MustCompile(`(?i)^#\s*syntax\s*=`)
	for line := range strings.Lines(string(raw)) {
		if !strings.HasPrefix(line, "#") {
			break // parser directives come before anything else
		}
		if directive.MatchString(line) {
			t.Errorf("Dockerfile: %q pulls a frontend image at every build; drop it", strings.TrimSpace(line))
		}
	}
}

// TestDockerfileBuildsOnceInOneStage: one build stage, with the module and
// build caches, compiles every program in one `go build`.
func TestDockerfileBuildsOnceInOneStage(t *testing.T) {
	lines := dockerfileLines(t)
	want := []*regexp.Regexp{
		regexp.MustCompile(`^ARG GO_VERSION=1\.26(\.\d+)?$`),
		regexp.MustCompile(`^FROM (--platform=\S+ )?golang:(\$\{GO_VERSION\}|1\.26[.\d]*\S*) AS ` + buildStage + `$`),
		regexp.MustCompile(`^RUN --mount=type=cache,target=/go/pkg/mod .*go mod download`),
		regexp.MustCompile(`^RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build .*go build`),
	}
	for _, re := range want {
		if !slices.ContainsFunc(lines, re.MatchString) {
			t.Errorf("Dockerfile: no instruction matches %s", re)
		}
	}
	builds := 0
	for _, s := range dockerfileStages(t) {
		for _, l := range s.lines {
			if strings.Contains(l, " go build ") {
				builds++
				if s.name != buildStage {
					t.Errorf("Dockerfile: stage %q runs go build; only the %s stage may", s.name, buildStage)
				}
			}
		}
		if s.name == buildStage && !want[1].MatchString(s.from) {
			t.Errorf("Dockerfile: the %s stage is %q", buildStage, s.from)
		}
	}
	if builds != 1 {
		t.Errorf("Dockerfile: %d go build commands, want one for all the programs", builds)
	}
}

// TestDockerfileTargets: each image is a distroless static stage, run as
// nonroot, holding its binaries only, with its own entrypoint and ports; the
// last stage is payment-service. A program with no target of its own ships
// through the generic one (--target program --build-arg PROGRAM=…).
func TestDockerfileTargets(t *testing.T) {
	targets, problems := dockerfileTargets(t)
	for _, p := range problems {
		t.Error(p)
	}
	if len(targets) == 0 {
		t.Fatal("Dockerfile: no image stage after the build stage")
	}
	var names []string
	shipped := map[string]string{}
	for _, tg := range targets {
		names = append(names, tg.name)
		if tg.user != "nonroot:nonroot" {
			t.Errorf("Dockerfile: target %s: USER %q, want nonroot:nonroot", tg.name, tg.user)
		}
		if tg.entrypoint != tg.name || !slices.Contains(tg.programs, tg.entrypoint) {
			t.Errorf("Dockerfile: target %s: entrypoint %s%s, want %s%s, one of its programs %q",
				tg.name, binDir, tg.entrypoint, binDir, tg.name, tg.programs)
		}
		for _, p := range tg.programs {
			if !slices.Contains(programs(t), p) {
				t.Errorf("Dockerfile: target %s copies %s, which is not one of cmd/%q", tg.name, p, programs(t))
			}
			if other, dup := shipped[p]; dup {
				t.Errorf("Dockerfile: %s ships in both %s and %s", p, other, tg.name)
			}
			shipped[p] = tg.name
		}
	}
	var wantNames []string
	for _, w := range wantTargets {
		wantNames = append(wantNames, w.name)
		tg, ok := targetNamed(targets, w.name)
		if !ok {
			continue
		}
		if !slices.Equal(tg.programs, w.programs) {
			t.Errorf("Dockerfile: target %s holds %q, want %q", w.name, tg.programs, w.programs)
		}
		if !slices.Equal(tg.expose, w.expose) {
			t.Errorf("Dockerfile: target %s exposes %q, want %q", w.name, tg.expose, w.expose)
		}
	}
	if got, want := slices.Sorted(slices.Values(names)), wantNames; !slices.Equal(got, want) {
		t.Errorf("Dockerfile: targets %q, want %q", got, want)
	}
	if last := names[len(names)-1]; last != "payment-service" {
		t.Errorf("Dockerfile: the last stage is %q; `docker build .` must give payment-service", last)
	}
	if !slices.ContainsFunc(dockerfileStages(t), func(s stage) bool { return s.name == genericTarget }) {
		for _, p := range programs(t) {
			if _, ok := shipped[p]; !ok {
				t.Errorf("Dockerfile: no image ships cmd/%s, and there is no generic target %q", p, genericTarget)
			}
		}
	}
}

// buildStageContext copies what the build stage COPYs from the build context
// into a temporary directory laid out as the stage's WORKDIR, and returns it.
// Each source must also be let in by .dockerignore ("!source").
func buildStageContext(t *testing.T) string {
	t.Helper()
	ignore, err := os.ReadFile(repoRoot + "/.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, s := range dockerfileStages(t) {
		if s.name != buildStage {
			continue
		}
		for _, l := range s.lines {
			words := strings.Fields(l)
			if words[0] != "COPY" || strings.HasPrefix(words[1], "--") {
				continue
			}
			srcs, dst := words[1:len(words)-1], words[len(words)-1]
			for _, src := range srcs {
				if !letIn(string(ignore), src) {
					t.Errorf(".dockerignore: the build stage copies %s, which .dockerignore does not let in (want a line !%s)", src, src)
				}
				to := filepath.Join(dir, dst)
				if strings.HasSuffix(dst, "/") && !strings.HasSuffix(src, "/") {
					to = filepath.Join(to, filepath.Base(src))
				}
				if err := copyPath(filepath.Join(repoRoot, src), to); err != nil {
					t.Fatalf("Dockerfile: %s: %v", l, err)
				}
			}
		}
	}
	return dir
}

// letIn reports whether .dockerignore lets src in: a line !src, or a line
// !dir/ of a directory above it (!kit/ lets in kit/go.mod).
func letIn(ignore, src string) bool {
	for _, l := range strings.Split(ignore, "\n") {
		dir, ok := strings.CutPrefix(l, "!")
		if ok && (dir == src || strings.HasSuffix(dir, "/") && strings.HasPrefix(src, dir)) {
			return true
		}
	}
	return false
}

// copyPath copies a file or a directory tree.
func copyPath(src, dst string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if fi.IsDir() { // over what an earlier COPY put there, as Docker's COPY does
		return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, err := filepath.Rel(src, p)
			if err != nil {
				return err
			}
			return copyPath(p, filepath.Join(dst, rel))
		})
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

// TestDockerfileBuildCommandBuildsHere runs the Dockerfile's `go build`, as
// written there, on this machine: the one part of the image build that needs no
// Docker engine. The binaries must be static, as distroless/static has no libc,
// and each image (its binaries plus distroless/static) under maxImageSize.
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
		if !slices.Contains(args, p) && !slices.Contains(args, "./cmd/...") {
			t.Errorf("Dockerfile: go build does not build %s", p)
		}
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goBin, args[1:]...)
	// In a copy of what the build stage copies, so that a package the
	// Dockerfile leaves out fails here as it would in the image build.
	cmd.Dir = buildStageContext(t)
	cmd.Env = append(os.Environ(), append(env, "GOWORK=off")...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(append(env, args...), " "), err, b)
	}
	sizes := map[string]int64{}
	for _, p := range programs(t) {
		path := filepath.Join(out, p)
		fi, err := os.Stat(path)
		if err != nil {
			t.Errorf("%s was not built: %v", p, err)
			continue
		}
		sizes[p] = fi.Size()
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
	targets, _ := dockerfileTargets(t)
	for _, tg := range targets {
		size := int64(runtimeBaseSize)
		for _, p := range tg.programs {
			s, ok := sizes[p]
			if !ok {
				t.Errorf("image %s: %s is not built by go build", tg.name, p)
			}
			size += s
		}
		t.Logf("image %-16s %5.1f MB (%s, plus ~%.0f MB of distroless/static)",
			tg.name, float64(size)/1e6, strings.Join(tg.programs, ", "), runtimeBaseSize/1e6)
		if size >= maxImageSize {
			t.Errorf("image %s: %.1f MB (%s plus distroless/static), want under %.0f MB",
				tg.name, float64(size)/1e6, strings.Join(tg.programs, ", "), maxImageSize/1e6)
		}
	}
}
