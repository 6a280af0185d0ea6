package e2e_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"golang.org/x/mod/modfile"

	"github.com/inbox-template/payment-service/kit"
	"github.com/inbox-template/payment-service/kit/kittest"
)

// The README's first command for your own copy: scripts/new-project.sh under a
// new module path, with a new service. In the copy the module vets (every
// package type-checked, its dependencies compiled) and passes its unit
// tests, the generated service passes its end-to-end test against the real
// broker and database as generated, no file names the template's module
// path, and the scripts keep their exec bits.
func TestNewProjectScript(t *testing.T) {
	t.Parallel() // beside the fault trials of make test-scenarios
	dir := filepath.Join(t.TempDir(), "shipping-service")
	const module = "example.com/acme/shipping-service"
	mustRun(t, "../..", "bash", "scripts/new-project.sh", module, dir,
		"--service", "refund-service", "--event", "refund-requested", "--exchange", "payments", "--routing-key", "refund.requested",
		"--publishes", "refunds")
	// --publishes: the handler keeps k.Outbox and emits from its writes; the
	// generated test (run below) counts one event per record.
	if b, err := os.ReadFile(filepath.Join(dir, "internal/refund/refund.go")); err != nil ||
		!strings.Contains(string(b), `Publishes: []string{"refunds"},`) || !strings.Contains(string(b), "h.outbox.Enqueue(ctx, tx,") {
		t.Errorf("the service generated --publishes does not emit through the outbox (%v)", err)
	}
	// The kit is a module of its own (kit/, replaced with ./kit): ./... stops
	// at it, so its packages are named by their module path. go vet compiles
	// every dependency and type-checks every package; the binaries are not
	// linked here (go run and go test below link theirs): a link of each of
	// the copy's programs cost more than the rest of the test.
	mustRun(t, dir, "go", "vet", "./...", module+"/kit/...")
	if out, err := exec.Command("gofmt", "-l", dir).Output(); err != nil || len(out) > 0 {
		t.Errorf("gofmt -l in the copy: %v\n%s", err, out)
	}
	mustRun(t, dir, "go", "test", "-count=1", "./internal/refund", "./internal/payment/orders", module+"/kit/internal/service", module+"/kit/faults", "./internal/payment/gateway", "./internal/demo/config")
	if out, err := exec.Command("grep", "-rIl", "--exclude-dir=.git", "github.com/inbox-template/payment-service", dir).Output(); err == nil {
		t.Errorf("files still name the template's module path:\n%s", out)
	}
	for f, want := range map[string]string{"go.mod": module, "kit/go.mod": module + "/kit"} {
		goMod, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || !strings.HasPrefix(string(goMod), "module "+want+"\n") {
			t.Errorf("%s starts %q (%v), want module %s", f, firstLine(string(goMod)), err, want)
		}
	}
	for _, f := range []string{"internal/refund/refund.go", "internal/refund/migrations/00001_refund_records.sql", "cmd/refund-service/main.go"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("the generated service lacks %s: %v", f, err)
		}
	}
	for _, f := range []string{"scripts/chaos.sh", "scripts/faults/crash-after-commit.sh", ".ci/run"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode()&0o111 == 0 {
			t.Errorf("%s: mode %v (%v), want executable", f, st.Mode(), err)
		}
	}
	compose, err := os.ReadFile(filepath.Join(dir, "docker-compose.yml"))
	if err != nil || !strings.Contains(string(compose), "\nname: shipping-service\n") || strings.Contains(string(compose), "inbox-template/") {
		t.Errorf("docker-compose.yml keeps the template's project or image names (%v)", err)
	}
	// A handler that gains an outside call must still have the key-expiry
	// guard: it is on unless the generator was asked for --no-outside-calls.
	if out, err := commandOutput(t, dir, []string{"IDEMPOTENCY_KEY_TTL=1m"}, "go", "run", "./cmd/refund-service", "migrate"); err == nil ||
		!strings.Contains(out, "a retry after the key expired would repeat its side effect") {
		t.Errorf("the generated service with IDEMPOTENCY_KEY_TTL=1m: %v, want the key-expiry guard's refusal:\n%s", err, out)
	}
	if out, err := commandOutput(t, dir, nil, "go", "run", "./cmd/refund-service", "env"); err != nil || !strings.Contains(out, "\nIDEMPOTENCY_KEY_TTL=24h\n") {
		t.Errorf("refund-service env: %v, want IDEMPOTENCY_KEY_TTL=24h:\n%s", err, out)
	}
}

// commandOutput runs name in dir with extra added to the environment, and
// returns its output, stdout and stderr together.
func commandOutput(t *testing.T, dir string, extra []string, name string, args ...string) (string, error) {
	ctx, cancel := commandContext(t)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(copyEnv(), extra...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func mustRun(t *testing.T, dir, name string, args ...string) {
	t.Helper()
	ctx, cancel := commandContext(t)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = copyEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s in %s: %v\n%s", name, strings.Join(args, " "), dir, err, out)
	}
}

// commandContext bounds a command of the generator's tests by the test's
// own deadline (a minute before go test's -timeout), not by a fixed limit:
// the copy's builds share the machine with the fault trials, and a cold
// build of a copy took 330 s in a CI run.
func commandContext(t *testing.T) (context.Context, context.CancelFunc) {
	if end, ok := kittest.TestDeadline(t); ok {
		return context.WithDeadline(context.Background(), end)
	}
	return context.WithCancel(context.Background())
}

// copyEnv is the environment of the go commands run in a copy: -trimpath
// added to GOFLAGS. A copy lives in a new temporary directory each run,
// and without -trimpath the directory is part of what go build caches a
// package under: every package of the copy was compiled anew each run (the
// two generator tests took 250 to 400 s beside the fault trials).
func copyEnv() []string {
	return append(os.Environ(), "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -trimpath"))
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// Every choice of the generator's options makes a service that vets, its
// test included, and that names none of the template's marks, names or
// module path: the template (scripts/template) is itself ordered,
// publishing and calling out, and the other two tests run one more choice
// each; here each of the eight is rendered and vetted, and a ninth service
// whose names hold the template's own.
//
// Each choice is a copy, made by the generator as a user's would be, the
// nine at once. Their services are then vetted together, in one go vet,
// each under a directory of its own in a module of the template's own path
// and requirements whose kit is this checkout's kit/ (the copy's module
// path in the rendered imports mapped back to it). Vetted in its copy, a
// service needs the copy's kit and every dependency compiled under the
// copy's paths: about 80 s of CPU on 2 cores with no build cache for them,
// which CI has none of when this test starts (the copies' builds take
// -trimpath, copyEnv, and nothing before them does). Here they are the
// packages make vet compiled before: the same directories, with no
// -trimpath. That a whole copy, renamed, vets is TestNewProjectScript's
// proof.
func TestNewProjectScriptEveryChoiceVets(t *testing.T) {
	t.Parallel()
	const module = "example.com/acme/shipping-service"
	type choice struct {
		dir      string   // the service's directory in the vetting module
		pkg, svc string   // internal/<pkg>, cmd/<svc>
		args     []string // new-project.sh's options
		left     []string // what no line of the service may hold
	}
	template, kitModule := modulePath(t, "../../go.mod"), kitModulePath(t)
	var choices []choice
	for _, ordered := range []bool{false, true} {
		for _, publishes := range []bool{false, true} {
			for _, noCalls := range []bool{false, true} {
				c := choice{pkg: "refund", svc: "refund-service", left: []string{"gen:", "gen>", "widget", template},
					args: []string{"--service", "refund-service", "--event", "refund-requested", "--exchange", "payments", "--routing-key", "refund.requested"}}
				var name []string
				if ordered {
					c.args, name = append(c.args, "--ordered"), append(name, "ordered")
				}
				if publishes {
					c.args, name = append(c.args, "--publishes", "refunds"), append(name, "publishes")
				}
				if noCalls {
					c.args, name = append(c.args, "--no-outside-calls"), append(name, "no-outside-calls")
				}
				c.dir = strings.Join(append([]string{"refund"}, name...), "_")
				choices = append(choices, c)
			}
		}
	}
	// Names that hold the template's own (widget-service, widget): the
	// renaming is one pass, so they are not renamed again.
	choices = append(choices, choice{dir: "blue-widget", pkg: "bluewidget", svc: "blue-widget-service", left: []string{"gen:", "gen>", template},
		args: []string{"--service", "blue-widget-service", "--event", "widget-made", "--exchange", "widgets", "--routing-key", "widget.made"}})

	services := t.TempDir() // the module they are vetted in
	rendered := make([]bool, len(choices))
	var wg sync.WaitGroup
	for i, c := range choices {
		wg.Go(func() {
			dir := filepath.Join(t.TempDir(), "shipping-service")
			if out, err := commandOutput(t, "../..", nil, "bash", append([]string{"scripts/new-project.sh", module, dir}, c.args...)...); err != nil {
				t.Errorf("new-project.sh %s: %v\n%s", strings.Join(c.args, " "), err, out)
				return
			}
			// The copy's imports of its kit become the kit's, of its
			// service the service's directory here.
			imports := strings.NewReplacer(module+"/kit", kitModule, module+"/", template+"/"+c.dir+"/")
			rendered[i] = true
			for _, d := range []string{"internal/" + c.pkg, "cmd/" + c.svc} {
				err := filepath.WalkDir(filepath.Join(dir, d), func(path string, e fs.DirEntry, err error) error {
					if err != nil || e.IsDir() {
						return err
					}
					rel, _ := filepath.Rel(dir, path)
					b, err := os.ReadFile(path)
					if err != nil {
						return err
					}
					for i, line := range strings.Split(string(b), "\n") {
						for _, s := range c.left {
							if strings.Contains(line, s) {
								t.Errorf("new-project.sh %s: %s:%d holds %q, of the template's:\n%s", strings.Join(c.args, " "), rel, i+1, s, line)
							}
						}
					}
					to := filepath.Join(services, c.dir, rel)
					if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
						return err
					}
					return os.WriteFile(to, []byte(imports.Replace(string(b))), 0o644)
				})
				if err != nil {
					t.Errorf("new-project.sh %s: %s: %v", strings.Join(c.args, " "), d, err)
					rendered[i] = false
				}
			}
			if c.pkg == "bluewidget" {
				if b, err := os.ReadFile(filepath.Join(dir, "internal/bluewidget/bluewidget_test.go")); err != nil || !strings.Contains(string(b), `"../../cmd/blue-widget-service"`) {
					t.Errorf("blue-widget-service's test does not run cmd/blue-widget-service (%v)", err)
				}
			}
		})
	}
	wg.Wait()

	// A service not rendered is reported above: named here, its missing
	// directories would fail go vet before it vetted the others.
	writeTemplateModule(t, services)
	pkgs := []string{"vet"}
	for i, c := range choices {
		if rendered[i] {
			pkgs = append(pkgs, "./"+c.dir+"/internal/"+c.pkg, "./"+c.dir+"/cmd/"+c.svc)
		}
	}
	if len(pkgs) == 1 {
		return
	}
	ctx, cancel := commandContext(t)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", pkgs...)
	cmd.Dir = services // in the environment of make vet, not copyEnv: see above
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("go vet of the rendered services (the directory of each names its choice: refund_OPTION_…, blue-widget): %v\n%s", err, out)
	}
}

// writeTemplateModule writes into dir the go.mod of a module of the
// template's own path and requirements, its replacements by a relative
// directory (the kit's, ./kit) made absolute, and the template's go.sum:
// packages put there build on this checkout's kit and the versions the
// template builds with.
func writeTemplateModule(t *testing.T, dir string) {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse("go.mod", b, nil)
	if err != nil {
		t.Fatal(err)
	}
	var local []*modfile.Replace
	for _, r := range f.Replace {
		if modfile.IsDirectoryPath(r.New.Path) && !filepath.IsAbs(r.New.Path) {
			local = append(local, r)
		}
	}
	for _, r := range local {
		if err := f.AddReplace(r.Old.Path, r.Old.Version, filepath.Join(root, r.New.Path), ""); err != nil {
			t.Fatal(err)
		}
	}
	if b, err = f.Format(); err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
}

// The generator refuses what would not make a service, naming the flag.
func TestNewProjectScriptRefusesBadServiceFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--service", "refund-service"}, "go together"},
		{[]string{"--service", "Refund_Service", "--event", "e", "--exchange", "x", "--routing-key", "k"}, "--service Refund_Service"},
		{[]string{"--service", "r-service", "--event", "e", "--exchange", "x", "--routing-key", "k.#"}, "--routing-key k.#"},
		{[]string{"--service", "payment-service", "--event", "e", "--exchange", "x", "--routing-key", "k"}, "internal/payment"},
		{[]string{"--bogus"}, "unknown option --bogus"},
		{[]string{"--bare"}, "--bare needs --service"},
		{[]string{"--service", "type-service", "--event", "e", "--exchange", "x", "--routing-key", "k"}, "Go does not allow"},
		{[]string{"--service", "outbox-service", "--event", "e", "--exchange", "x", "--routing-key", "k"}, "kit's schemas"},
		{[]string{"--service", "r-service", "--event", "record", "--exchange", "x", "--routing-key", "k"}, "collide"},
		{[]string{"--service", "r-service", "--event", "reason-missing-field", "--exchange", "x", "--routing-key", "k"}, "collide"},
		{[]string{"--no-outside-calls"}, "--no-outside-calls needs --service"},
		{[]string{"--ordered"}, "--ordered needs --service"},
		{[]string{"--publishes", "x"}, "--publishes needs --service"},
		{[]string{"--service", "r-service", "--event", "e", "--exchange", "x", "--routing-key", "k", "--publishes", "--bare"}, "--publishes needs a value"},
		{[]string{"--service", "r-service", "--event", "e", "--exchange", "x", "--routing-key", "k", "--publishes", "a b"}, "--publishes a b"},
		{[]string{"--service", "r-service", "--event", "e", "--exchange", "x", "--routing-key", "k", "--kit-version", "v0.1.0"}, "need --bare"},
		{[]string{"--service", "r-service", "--event", "e", "--exchange", "x", "--routing-key", "k", "--bare", "--kit-version", "0.1"}, "--kit-version 0.1"},
		{[]string{"--service", "r-service", "--event", "e", "--exchange", "x", "--routing-key", "k", "--bare", "--kit-version", "v9.9.9", "--kit-proxy", "p"}, "not --kit-version v9.9.9"},
	} {
		dir := filepath.Join(t.TempDir(), "copy")
		cmd := exec.Command("bash", append([]string{"scripts/new-project.sh", "example.com/acme/x", dir}, tc.args...)...)
		cmd.Dir = "../.."
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("new-project.sh %v: %v, want a refusal naming %q:\n%s", tc.args, err, tc.want, out)
		}
	}
}

// --bare: the project is the generated service on the kit as a library: no
// copy of the kit's source, go.mod requiring the kit's module at the version
// this checkout's kit declares, served by --kit-proxy from a file-based
// module proxy made in the test. It vets, is gofmt-clean and the generated
// service passes its end-to-end test; nothing of the payment service, the
// demo or the examples is there, and its .env.example is the service's own
// env command. With --no-outside-calls the service declares NoOutsideCalls:
// IDEMPOTENCY_KEY_TTL is refused and left out of .env.example. With
// --ordered it requires the buffered inbox, and its own test expects the
// poison parked. Then the kit's next release (this kit with its Version
// bumped, as a release does) is served beside it, and one command, go get,
// moves the project to it: its binary then holds the new kit, and the
// project vendors and builds from vendor/.
func TestNewProjectScriptBare(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "refunds")
	proxy := t.TempDir()
	const module = "example.com/acme/refunds"
	kitModule := kitModulePath(t)
	env := bareEnv(t)
	mustRunEnv(t, "../..", env, "bash", "scripts/new-project.sh", module, dir,
		"--service", "refund-service", "--event", "refund-requested", "--exchange", "payments", "--routing-key", "refund.requested", "--bare",
		"--no-outside-calls", "--ordered", "--kit-proxy", proxy)
	// The generator served the kit into the proxy; what the project runs
	// next finds it there (or in the module cache it filled).
	env = append(env, "GOPROXY=file://"+proxy+","+goEnv(t, env, "GOPROXY"), "GONOSUMDB="+kitModule)
	// --ordered: the service requires the buffered inbox, and its test (run
	// below) expects the poison parked, not dead-lettered.
	if b, err := os.ReadFile(filepath.Join(dir, "internal/refund/refund.go")); err != nil ||
		!strings.Contains(string(b), "Requires: kit.Requirements{Mode: kit.ModeBuffered, SingleActiveConsumer: true},") {
		t.Errorf("the service generated --ordered does not require the buffered inbox and a single active consumer (%v)", err)
	}
	checkRequiresKit(t, dir, kitModule, kit.Version)
	mustRunEnv(t, dir, env, "go", "vet", "./...")
	if out, err := exec.Command("gofmt", "-l", dir).Output(); err != nil || len(out) > 0 {
		t.Errorf("gofmt -l in the copy: %v\n%s", err, out)
	}
	mustRunEnv(t, dir, env, "go", "test", "-count=1", "./...")
	cmds, _ := filepath.Glob(filepath.Join(dir, "cmd", "*"))
	if len(cmds) != 1 || filepath.Base(cmds[0]) != "refund-service" {
		t.Errorf("cmd/ holds %v, want refund-service only", cmds)
	}
	for _, gone := range []string{"kit", "internal/payment", "internal/demo", "internal/e2e", "examples", "bench", "scripts", ".ci/stack", "docs"} {
		if _, err := os.Stat(filepath.Join(dir, gone)); err == nil {
			t.Errorf("%s is in the bare project", gone)
		}
	}
	// No package of the kit's, under any directory: the project holds only
	// its own (refund, main).
	if out, err := exec.Command("grep", "-rlE", "--include=*.go", "^package (consumer|service|outbox|inbox|buffered|ops|testenv|wire|kit)$", dir).Output(); err == nil {
		t.Errorf("the bare project holds the kit's source:\n%s", out)
	}
	if out, err := exec.Command("grep", "-rIlE",
		"OrderPlaced|order-placed|fake-gateway|fake-carrier|order-publisher|inboxctl|internal/payment|internal/demo|examples/shipping", dir).Output(); err == nil {
		t.Errorf("the bare project still names the payment stack:\n%s", out)
	}
	envFile, err := os.ReadFile(filepath.Join(dir, ".env.example"))
	if err != nil || !strings.Contains(string(envFile), "\nQUEUE=refund-service.refund-requested\n") || strings.Contains(string(envFile), "GATEWAY_URL") ||
		strings.Contains(string(envFile), "IDEMPOTENCY_KEY_TTL") || !strings.Contains(string(envFile), "\nINBOX_MODE=buffered\n") ||
		!strings.Contains(string(envFile), "\nSINGLE_ACTIVE_CONSUMER=true\n") {
		t.Errorf(".env.example is not refund-service's, ordered, with no outside calls (%v):\n%s", err, envFile)
	}
	if out, err := commandOutput(t, dir, append(env, "IDEMPOTENCY_KEY_TTL=24h"), "go", "run", "./cmd/refund-service", "migrate"); err == nil ||
		!strings.Contains(out, "declares no outside calls") {
		t.Errorf("the service generated --no-outside-calls with IDEMPOTENCY_KEY_TTL set: %v, want a refusal:\n%s", err, out)
	}
	for f, want := range map[string]string{
		"docker-compose.yml": "\n  refund-service:\n", "Dockerfile": "./cmd/refund-service", "README.md": "go get " + kitModule + "@v",
		".ci/run": "make test", "Makefile": "$(GO) test", "deploy/postgres/init-databases.sql": "CREATE DATABASE refund_service;",
	} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %q (%v)", f, want, err)
		}
	}
	if out, err := commandOutput(t, dir, env, "go", "run", "./cmd/refund-service", "version"); err != nil ||
		!strings.Contains(out, fmt.Sprintf("kit %s (module %s %s)", kit.Version, kitModule, kit.Version)) {
		t.Errorf("refund-service version: %v, want kit %s at module version %[2]s:\n%s", err, kit.Version, out)
	}

	// The kit's next release: this kit with its Version bumped.
	next := nextMinor(t, kit.Version)
	release := filepath.Join(t.TempDir(), "kit")
	mustRun(t, "../..", "cp", "-r", "kit", release)
	kitGo := filepath.Join(release, "internal", "release", "release.go")
	src, err := os.ReadFile(kitGo)
	if err != nil {
		t.Fatal(err)
	}
	bumped := strings.Replace(string(src), fmt.Sprintf("const Version = %q", kit.Version), fmt.Sprintf("const Version = %q", next), 1)
	if bumped == string(src) {
		t.Fatalf("kit/internal/release/release.go does not declare const Version = %q", kit.Version)
	}
	if err := os.WriteFile(kitGo, []byte(bumped), 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "../..", "go", "run", "./scripts/kitproxy", "-kit", release, "-out", proxy)
	// The upgrade: one command.
	mustRunEnv(t, dir, env, "go", "get", kitModule+"@"+next)
	checkRequiresKit(t, dir, kitModule, next)
	if out, err := commandOutput(t, dir, env, "go", "run", "./cmd/refund-service", "version"); err != nil ||
		!strings.Contains(out, fmt.Sprintf("kit %s (module %s %s)", next, kitModule, next)) {
		t.Errorf("refund-service version after go get: %v, want kit %s at module version %[2]s:\n%s", err, next, out)
	}
	// A team that must vendor: go mod vendor, and every package the build
	// and the tests need resolves from vendor/ with no proxy. (Compiling
	// them again from there would compile the kit a third time: the same
	// source, under other paths.)
	mustRunEnv(t, dir, env, "go", "mod", "vendor")
	mustRunEnv(t, dir, append(env, "GOPROXY=off", "GOFLAGS=-mod=vendor -trimpath"), "go", "list", "-deps", "-test", "./...")
	if b, err := os.ReadFile(filepath.Join(dir, "vendor", filepath.FromSlash(kitModule), "internal", "release", "release.go")); err != nil || !strings.Contains(string(b), next) {
		t.Errorf("vendor/ does not hold the kit %s (%v)", next, err)
	}
}

// bareEnv is the environment of a --bare project's go commands: a module
// cache of the test's own (the kit's versions served here must not meet a
// kit of the same version cached by an earlier run), filled from the
// machine's module cache first (the kit's dependencies, with no network),
// writable so that the test can remove it.
func bareEnv(t *testing.T) []string {
	shared := goEnv(t, nil, "GOMODCACHE")
	return []string{
		"GOMODCACHE=" + t.TempDir(),
		"GOPROXY=file://" + filepath.Join(shared, "cache", "download") + "," + goEnv(t, nil, "GOPROXY"),
		"GOFLAGS=" + strings.TrimSpace(os.Getenv("GOFLAGS")+" -trimpath -modcacherw"),
	}
}

// goEnv is go env NAME in the environment with extra added.
func goEnv(t *testing.T, extra []string, name string) string {
	out, err := commandOutput(t, ".", extra, "go", "env", name)
	if err != nil {
		t.Fatalf("go env %s: %v\n%s", name, err, out)
	}
	return strings.TrimSpace(out)
}

// checkRequiresKit checks that dir's go.mod requires the kit at version,
// with no replace: the kit comes as a module.
func checkRequiresKit(t *testing.T, dir, kitModule, version string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil || !regexp.MustCompile(`(?m)^\s*(require\s+)?`+regexp.QuoteMeta(kitModule)+` `+regexp.QuoteMeta(version)+`$`).Match(b) ||
		strings.Contains(string(b), "replace") {
		t.Errorf("go.mod does not require %s %s without a replace (%v):\n%s", kitModule, version, err, b)
	}
}

// nextMinor is the release after version: v0.1.0 gives v0.2.0.
func nextMinor(t *testing.T, version string) string {
	var major, minor, patch int
	if _, err := fmt.Sscanf(version, "v%d.%d.%d", &major, &minor, &patch); err != nil {
		t.Fatalf("kit.Version %q: %v", version, err)
	}
	return fmt.Sprintf("v%d.%d.0", major, minor+1)
}

func mustRunEnv(t *testing.T, dir string, extra []string, name string, args ...string) {
	t.Helper()
	if out, err := commandOutput(t, dir, extra, name, args...); err != nil {
		t.Fatalf("%s %s in %s: %v\n%s", name, strings.Join(args, " "), dir, err, out)
	}
}

// kitModulePath is the kit's module path, as kit/go.mod declares it.
func kitModulePath(t *testing.T) string {
	t.Helper()
	return modulePath(t, "../../kit/go.mod")
}

// modulePath is the module path the go.mod file declares.
func modulePath(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	path := modfile.ModulePath(b)
	if path == "" {
		t.Fatalf("%s declares no module", file)
	}
	return path
}
