package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inbox-template/payment-service/kit/testenv"
)

// The README's first command for your own copy: scripts/new-project.sh under a
// new module path, with a new service. In the copy the module builds, vets
// and passes its unit tests, the generated service passes its end-to-end test
// against the real broker and database as generated, no file names the
// template's module path, and the scripts keep their exec bits.
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
	// at it, so its packages are named by their module path.
	mustRun(t, dir, "go", "build", "./...", module+"/kit/...")
	mustRun(t, dir, "go", "vet", "./...", module+"/kit/...")
	if out, err := exec.Command("gofmt", "-l", dir).Output(); err != nil || len(out) > 0 {
		t.Errorf("gofmt -l in the copy: %v\n%s", err, out)
	}
	mustRun(t, dir, "go", "test", "-count=1", "./internal/refund", "./internal/payment/orders", module+"/kit/service", module+"/kit/faults", "./internal/payment/gateway", "./internal/demo/config")
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
	if end, ok := testenv.TestDeadline(t); ok {
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
		{[]string{"--no-outside-calls"}, "--no-outside-calls needs --service"},
		{[]string{"--ordered"}, "--ordered needs --service"},
		{[]string{"--publishes", "x"}, "--publishes needs --service"},
		{[]string{"--service", "r-service", "--event", "e", "--exchange", "x", "--routing-key", "k", "--publishes", "--bare"}, "--publishes needs a value"},
		{[]string{"--service", "r-service", "--event", "e", "--exchange", "x", "--routing-key", "k", "--publishes", "a b"}, "--publishes a b"},
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

// --bare: the copy keeps the kit and the generated service only. It builds,
// vets, is gofmt-clean and the generated service passes its end-to-end test;
// nothing of the payment service, the demo or the examples is left, and its
// .env.example is the service's own env command. With --no-outside-calls
// the service declares NoOutsideCalls: IDEMPOTENCY_KEY_TTL is refused and
// left out of .env.example. With --ordered it requires the buffered inbox,
// and its own test expects the poison parked.
func TestNewProjectScriptBare(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "refunds")
	const module = "example.com/acme/refunds"
	mustRun(t, "../..", "bash", "scripts/new-project.sh", module, dir,
		"--service", "refund-service", "--event", "refund-requested", "--exchange", "payments", "--routing-key", "refund.requested", "--bare",
		"--no-outside-calls", "--ordered")
	// --ordered: the service requires the buffered inbox, and its test (run
	// below) expects the poison parked, not dead-lettered.
	if b, err := os.ReadFile(filepath.Join(dir, "internal/refund/refund.go")); err != nil ||
		!strings.Contains(string(b), "Requires: service.Requirements{Mode: service.ModeBuffered, SingleActiveConsumer: true},") {
		t.Errorf("the service generated --ordered does not require the buffered inbox and a single active consumer (%v)", err)
	}
	mustRun(t, dir, "go", "vet", "./...", module+"/kit/...")
	if out, err := exec.Command("gofmt", "-l", dir).Output(); err != nil || len(out) > 0 {
		t.Errorf("gofmt -l in the copy: %v\n%s", err, out)
	}
	mustRun(t, dir, "go", "test", "-count=1", "./internal/refund", module+"/kit/ops", module+"/kit/migrations")
	cmds, _ := filepath.Glob(filepath.Join(dir, "cmd", "*"))
	if len(cmds) != 1 || filepath.Base(cmds[0]) != "refund-service" {
		t.Errorf("cmd/ holds %v, want refund-service only", cmds)
	}
	for _, gone := range []string{"internal/payment", "internal/demo", "internal/e2e", "examples", "bench", "scripts/faults", "scripts/lib.sh", ".ci/stack", "docs"} {
		if _, err := os.Stat(filepath.Join(dir, gone)); err == nil {
			t.Errorf("%s is still in the bare copy", gone)
		}
	}
	// The kit's comments may name the template's services as examples, and
	// the generator knows what --bare removes; the copy's own files must not.
	if out, err := exec.Command("grep", "-rIlE", "--exclude-dir=kit", "--exclude=new-project.sh",
		"OrderPlaced|order-placed|fake-gateway|fake-carrier|order-publisher|inboxctl|internal/payment|internal/demo|examples/shipping", dir).Output(); err == nil {
		t.Errorf("the bare copy still names the payment stack:\n%s", out)
	}
	env, err := os.ReadFile(filepath.Join(dir, ".env.example"))
	if err != nil || !strings.Contains(string(env), "\nQUEUE=refund-service.refund-requested\n") || strings.Contains(string(env), "GATEWAY_URL") ||
		strings.Contains(string(env), "IDEMPOTENCY_KEY_TTL") || !strings.Contains(string(env), "\nINBOX_MODE=buffered\n") ||
		!strings.Contains(string(env), "\nSINGLE_ACTIVE_CONSUMER=true\n") {
		t.Errorf(".env.example is not refund-service's, ordered, with no outside calls (%v):\n%s", err, env)
	}
	if out, err := commandOutput(t, dir, []string{"IDEMPOTENCY_KEY_TTL=24h"}, "go", "run", "./cmd/refund-service", "migrate"); err == nil ||
		!strings.Contains(out, "declares no outside calls") {
		t.Errorf("the service generated --no-outside-calls with IDEMPOTENCY_KEY_TTL set: %v, want a refusal:\n%s", err, out)
	}
	for f, want := range map[string]string{
		"docker-compose.yml": "\n  refund-service:\n", "Dockerfile": "./cmd/refund-service", "README.md": "# refund-service\n",
		".ci/run": "make test", "Makefile": "$(GO) test", "deploy/postgres/init-databases.sql": "CREATE DATABASE refund_service;",
	} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %q (%v)", f, want, err)
		}
	}
}
