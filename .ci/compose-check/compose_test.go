// Package composecheck validates the repository's docker-compose.yml with
// compose-go, the loader Docker Compose itself uses (schema, interpolation,
// merge keys, consistency), then checks what the stack promises: health checks
// and start order, two payment-service replicas, named volumes, the images
// and the Dockerfile targets they build, and every .env.example variable
// reaching the programs that read it. dockerfile_test.go checks the
// Dockerfile: its targets, and each image's size. up_test.go runs
// scripts/up.sh (make up) against a stub docker: each refusal says why.
//
// It is a module of its own so that the main module does not depend on
// compose-go. No Docker engine is needed: run.sh runs it.
package composecheck

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/dotenv"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/sirupsen/logrus"
	"go.yaml.in/yaml/v4"
)

const (
	repoRoot    = "../.."
	composeFile = repoRoot + "/docker-compose.yml"
	envExample  = repoRoot + "/.env.example"
	// binDir is where the Dockerfile's images hold the programs.
	binDir = "/usr/local/bin/"
)

// wantBuildTargets is the Dockerfile target each service of ours builds and
// runs: inboxctl ships in the payment-service image.
var wantBuildTargets = map[string]string{
	"fake-carrier":     "fake-carrier",
	"shipping-service": "shipping-service",
	"fake-gateway":     "fake-gateway",
	"payment-service":  "payment-service",
	"order-publisher":  "order-publisher",
	"inboxctl":         "payment-service",
}

// connectionSettings are the variables docker-compose.yml sets per service
// instead of taking them from .env: inside Compose they name the other
// containers. Each check gets the service's program and returns what is wrong
// with the value, or "".
var connectionSettings = map[string]func(program, value string) string{
	// Every node of the profile "cluster", in the order of the nodes (a
	// service without the profile finds rabbitmq first and passes over the
	// two it cannot resolve).
	"AMQP_URL": func(_, v string) string {
		nodes := strings.Split(v, ",")
		want := []string{"rabbitmq:5672", "rabbitmq-2:5672", "rabbitmq-3:5672"}
		if len(nodes) != len(want) {
			return "want the three nodes " + strings.Join(want, ", ")
		}
		for i, n := range nodes {
			if msg := wantHost(n, "amqp", want[i]); msg != "" {
				return fmt.Sprintf("node %d: %s", i+1, msg)
			}
		}
		return ""
	},
	"DATABASE_URL": func(prog, v string) string {
		db := map[string]string{"payment-service": "/payments", "fake-gateway": "/gateway", "inboxctl": "/payments",
			"shipping-service": "/shipping", "fake-carrier": "/carrier"}[prog]
		if msg := wantHost(v, "postgres", "postgres:5432"); msg != "" {
			return msg
		}
		if u, _ := url.Parse(v); u.Path != db {
			return "want database " + db
		}
		return ""
	},
	"GATEWAY_DATABASE_URL": func(_, v string) string {
		if msg := wantHost(v, "postgres", "postgres:5432"); msg != "" {
			return msg
		}
		if u, _ := url.Parse(v); u.Path != "/gateway" {
			return "want database /gateway"
		}
		return ""
	},
	"SHIPPING_DATABASE_URL": func(_, v string) string { return wantDatabase(v, "/shipping") },
	"CARRIER_DATABASE_URL":  func(_, v string) string { return wantDatabase(v, "/carrier") },
	"GATEWAY_URL":           func(_, v string) string { return wantHost(v, "http", "fake-gateway:8081") },
	"CARRIER_URL":           func(_, v string) string { return wantHost(v, "http", "fake-carrier:8082") },
	"HTTP_ADDR": func(prog, v string) string {
		// inboxctl loads the service's configuration: the service's value.
		want := map[string]string{"payment-service": ":8080", "fake-gateway": ":8081", "inboxctl": ":8080",
			"shipping-service": ":8080", "fake-carrier": ":8082"}[prog]
		if v != want {
			return "want " + want
		}
		return ""
	},
	// Each program's spans under its own name (inboxctl traces nothing).
	"OTEL_SERVICE_NAME": func(prog, v string) string {
		want := map[string]string{"payment-service": "payment-service", "inboxctl": "payment-service",
			"shipping-service": "shipping-service", "order-publisher": "order-publisher"}[prog]
		if v != want {
			return "want " + want
		}
		return ""
	},
	// The profile "tracing"'s collector.
	"OTEL_EXPORTER_OTLP_ENDPOINT": func(_, v string) string { return wantHost(v, "http", "otel-collector:4318") },
	// The publisher's run summaries, in the demo-state volume both mount.
	"SUMMARY_DIR": func(_, v string) string {
		if v != "/var/lib/order-publisher/runs" {
			return "want /var/lib/order-publisher/runs, in the demo-state volume"
		}
		return ""
	},
	// The demo injects faults at run time.
	"FAULTS_ENABLED": func(_, v string) string {
		if v != "true" {
			return "want true for the fault demo"
		}
		return ""
	},
}

// wantDatabase checks a PostgreSQL URL of the Compose network for database db.
func wantDatabase(v, db string) string {
	if msg := wantHost(v, "postgres", "postgres:5432"); msg != "" {
		return msg
	}
	if u, _ := url.Parse(v); u.Path != db {
		return "want database " + db
	}
	return ""
}

// warnings collects what compose-go logs while loading (an unset variable, an
// obsolete `version` key): Docker Compose prints these, so they fail here.
var warnings struct {
	sync.Mutex
	lines []string
}

type warningHook struct{}

func (warningHook) Levels() []logrus.Level { return logrus.AllLevels[:logrus.WarnLevel+1] }
func (warningHook) Fire(e *logrus.Entry) error {
	warnings.Lock()
	defer warnings.Unlock()
	warnings.lines = append(warnings.lines, e.Message)
	return nil
}

func TestMain(m *testing.M) {
	logrus.AddHook(warningHook{})
	os.Exit(m.Run())
}

// load loads docker-compose.yml the way `docker compose --profile '*'` does,
// with env as the whole environment (no .env file, no process environment).
func load(t *testing.T, env map[string]string) *types.Project {
	t.Helper()
	return loadProfiles(t, env, "*")
}

// loadProfiles loads docker-compose.yml as load does, with only the profiles
// named active (none: the services `docker compose up` starts).
func loadProfiles(t *testing.T, env map[string]string, profiles ...string) *types.Project {
	t.Helper()
	var list []string
	for k, v := range env {
		list = append(list, k+"="+v)
	}
	opts, err := cli.NewProjectOptions([]string{composeFile},
		cli.WithWorkingDirectory(repoRoot),
		cli.WithEnv(list),
		cli.WithProfiles(profiles),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		t.Fatal(err)
	}
	warnings.Lock()
	warnings.lines = nil
	warnings.Unlock()
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yml does not load: %v", err)
	}
	warnings.Lock()
	defer warnings.Unlock()
	slices.Sort(warnings.lines)
	for _, w := range slices.Compact(warnings.lines) {
		t.Errorf("compose warns: %s", w)
	}
	return p
}

// envExampleValues reads .env.example with Compose's own dotenv parser, and
// checks that a plain NAME=value reading (a shell's, the config package
// test's) agrees with it.
func envExampleValues(t *testing.T) map[string]string {
	t.Helper()
	env, err := dotenv.ReadFile(envExample, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf(".env.example: %v", err)
	}
	if len(env) == 0 {
		t.Fatal(".env.example has no variables")
	}
	plain := map[string]string{}
	for name, v := range envExampleEntries(t) {
		plain[name] = v.value
	}
	if !maps.Equal(env, plain) {
		t.Errorf(".env.example: Compose reads %v, a plain NAME=value reading gives %v", env, plain)
	}
	return env
}

type envEntry struct {
	value    string
	programs []string // from the comment above: "# [payment-service, inboxctl] ..."
}

// composeOnly reports whether docker-compose.yml itself reads the variable
// (marked "[compose]"), rather than a program.
func (e envEntry) composeOnly() bool { return slices.Equal(e.programs, []string{"compose"}) }

// envExampleEntries reads .env.example as NAME=value lines, each with the
// programs named at the start of the comment above it (internal/demo/config's test
// holds that list to the programs' configuration structs).
func envExampleEntries(t *testing.T) map[string]envEntry {
	t.Helper()
	raw, err := os.ReadFile(envExample)
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string]envEntry{}
	comment := ""
	for line := range strings.Lines(string(raw)) {
		line = strings.TrimSpace(line)
		if c, ok := strings.CutPrefix(line, "#"); ok {
			comment = strings.TrimSpace(c)
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			comment = ""
			continue
		}
		e := envEntry{value: value}
		if list, ok := strings.CutPrefix(comment, "["); ok {
			list, _, _ = strings.Cut(list, "]")
			e.programs = strings.Split(list, ", ")
		}
		if len(e.programs) == 0 {
			t.Errorf(".env.example: the comment above %s does not start with [programs]", name)
		}
		entries[name] = e
		comment = ""
	}
	return entries
}

// program is the program a service of our image runs, or "".
func program(s types.ServiceConfig) string {
	if s.Build == nil || len(s.Entrypoint) == 0 {
		return ""
	}
	return strings.TrimPrefix(s.Entrypoint[0], binDir)
}

func TestLoadsWithAndWithoutEnvFile(t *testing.T) {
	withEnv := load(t, envExampleValues(t))
	without := load(t, nil)
	a, err := yaml.Marshal(withEnv)
	if err != nil {
		t.Fatal(err)
	}
	b, err := yaml.Marshal(without)
	if err != nil {
		t.Fatal(err)
	}
	// .env.example holds the programs' defaults, and so must every
	// ${NAME:-default} in docker-compose.yml.
	if string(a) != string(b) {
		t.Errorf("docker-compose.yml's ${NAME:-default} defaults differ from .env.example:\n%s", diffLines(string(b), string(a)))
	}
}

func TestEnvExampleReachesTheServices(t *testing.T) {
	env := envExampleValues(t)
	entries := envExampleEntries(t)
	marked := map[string]string{}
	for name := range env {
		marked[name] = "marker-" + strings.ToLower(name)
		if entries[name].composeOnly() {
			marked[name] = env[name] // a port; TestHostPortsComeFromEnv follows them
		}
	}
	p := load(t, marked)
	for name := range env {
		if entries[name].composeOnly() {
			continue
		}
		_, fixed := connectionSettings[name]
		readers := 0
		for _, s := range p.Services {
			v, ok := s.Environment[name]
			if !ok || v == nil {
				continue
			}
			switch {
			case fixed && *v == marked[name]:
				t.Errorf("%s: %s comes from .env, but must name the Compose services", s.Name, name)
			case !fixed && *v != marked[name]:
				t.Errorf("%s: %s=%s is fixed in docker-compose.yml; write ${%s:-%s} so that .env changes it", s.Name, name, *v, name, env[name])
			default:
				readers++
			}
		}
		if !fixed && readers == 0 {
			t.Errorf("%s is in .env.example but no service receives it", name)
		}
	}
}

func TestConnectionSettingsNameTheServices(t *testing.T) {
	p := load(t, envExampleValues(t))
	for _, s := range p.Services {
		for variable, check := range connectionSettings {
			v, ok := s.Environment[variable]
			if !ok || v == nil {
				continue
			}
			if msg := check(program(s), *v); msg != "" {
				t.Errorf("%s: %s=%s: %s", s.Name, variable, *v, msg)
			}
		}
	}
}

// TestEveryProgramGetsWhatItReads fails when a service lacks a variable its
// program reads: the program would fall back to its local default silently
// (localhost, or a value .env cannot change).
func TestEveryProgramGetsWhatItReads(t *testing.T) {
	entries := envExampleEntries(t)
	p := load(t, envExampleValues(t))
	seen := map[string]bool{}
	for _, s := range p.Services {
		prog := program(s)
		if prog == "" {
			continue
		}
		seen[prog] = true
		for name, e := range entries {
			if v := s.Environment[name]; slices.Contains(e.programs, prog) && v == nil {
				t.Errorf("%s: %s reads %s, which the service does not set", s.Name, prog, name)
			}
		}
	}
	// The stack runs every program that has an image of its own; another
	// program (a consumer of yours) joins it when you add its service.
	targets, _ := dockerfileTargets(t)
	for _, tg := range targets {
		for _, prog := range tg.programs {
			if !seen[prog] && prog != "inboxctl" {
				t.Errorf("no service runs cmd/%s, which image %s ships", prog, tg.name)
			}
		}
	}
}

// noHealthCheck are the long-running services without one, and why.
var noHealthCheck = map[string]string{
	// The profile "tracing"'s sink: its image holds the collector's binary
	// alone, which has no probe command, and nothing waits for it (a span
	// sent before it is up is dropped, never a message).
	"otel-collector": "no probe in its image; nothing depends on it",
}

func TestLongRunningServicesHaveHealthChecks(t *testing.T) {
	p := load(t, envExampleValues(t))
	for _, s := range p.Services {
		if s.Restart == types.RestartPolicyNo {
			continue
		}
		if _, ok := noHealthCheck[s.Name]; ok && s.HealthCheck == nil {
			continue
		}
		if s.Restart != types.RestartPolicyUnlessStopped {
			t.Errorf("%s: restart %q, want unless-stopped", s.Name, s.Restart)
		}
		hc := s.HealthCheck
		if hc == nil || hc.Disable || len(hc.Test) < 2 || hc.Test[0] != "CMD" {
			t.Errorf("%s: needs an exec-form health check ([\"CMD\", ...]), got %+v", s.Name, hc)
			continue
		}
		if hc.StartInterval != nil {
			// Engine 20.10 refuses it at `up` ("can't set
			// healthcheck.start_interval"); short intervals do instead.
			t.Errorf("%s: healthcheck.start_interval needs Engine 25; the stack runs on 20.10", s.Name)
		}
		if len(s.Profiles) > 0 && !slices.Equal(s.Profiles, []string{"cluster"}) {
			// `docker compose down` only stops the services of the active
			// profiles: this one would survive `down -v` and keep the network.
			// The profile "cluster" is the exception the issue asks for: its
			// extra broker nodes; `make down` and the fault kit's Compose
			// mode name it (TestDownNamesTheClusterProfile).
			t.Errorf("%s: long-running, but in profiles %q; keep it in the default set", s.Name, s.Profiles)
		}
		if s.Build != nil {
			// Our image has no shell: the program probes itself.
			want := []string{"CMD", s.Entrypoint[0], "healthcheck"}
			if !slices.Equal(hc.Test, want) {
				t.Errorf("%s: health check %q, want %q", s.Name, hc.Test, want)
			}
		}
	}
	wantTest := map[string]string{
		"rabbitmq": "CMD rabbitmq-diagnostics -q ping",
		"postgres": "CMD pg_isready",
	}
	for name, prefix := range wantTest {
		if got := strings.Join(service(t, p, name).HealthCheck.Test, " "); !strings.HasPrefix(got, prefix) {
			t.Errorf("%s: health check %q, want %q…", name, got, prefix)
		}
	}
}

func TestPaymentServiceRunsTwoReplicas(t *testing.T) {
	p := load(t, envExampleValues(t))
	s := service(t, p, "payment-service")
	if s.Deploy == nil || s.Deploy.Replicas == nil || *s.Deploy.Replicas != 2 {
		t.Errorf("payment-service: want deploy.replicas 2, got %d replicas", s.GetScale())
	}
	if s.Restart != types.RestartPolicyUnlessStopped {
		t.Errorf("payment-service: restart %q, want unless-stopped", s.Restart)
	}
	for _, port := range s.Ports {
		if port.Published != "" && !strings.Contains(port.Published, "-") {
			t.Errorf("payment-service: host port %s cannot be shared by two replicas", port.Published)
		}
	}
	// Docker kills a container stop_grace_period after SIGTERM; the service's
	// whole stop takes at most SHUTDOWN_TIMEOUT (every phase of the consumer
	// together) plus 2 s to close its broker connections and 2 s for the
	// HTTP server: 5 s of margin covers both.
	shutdown, err := time.ParseDuration(*s.Environment["SHUTDOWN_TIMEOUT"])
	if err != nil {
		t.Fatal(err)
	}
	if s.StopGracePeriod == nil || time.Duration(*s.StopGracePeriod) < shutdown+5*time.Second {
		t.Errorf("payment-service: stop_grace_period %v must be at least SHUTDOWN_TIMEOUT %s plus 5s", s.StopGracePeriod, shutdown)
	}
	if !slices.Contains(s.Entrypoint, binDir+"payment-service") {
		t.Errorf("payment-service: entrypoint %q", s.Entrypoint)
	}
}

// TestStartOrderWaitsForHealth: a service starts once what it needs is
// healthy (or, for a one-shot, finished).
func TestStartOrderWaitsForHealth(t *testing.T) {
	p := load(t, envExampleValues(t))
	want := map[string][]string{
		"fake-gateway":     {"postgres"},
		"payment-service":  {"fake-gateway", "postgres", "rabbitmq"},
		"order-publisher":  {"payment-service", "rabbitmq", "shipping-service"},
		"inboxctl":         {"postgres", "rabbitmq"},
		"fake-carrier":     {"postgres"},
		"shipping-service": {"fake-carrier", "postgres", "rabbitmq"},
		"prometheus":       {"order-publisher"},
	}
	for _, s := range p.Services {
		var deps []string
		for dep, d := range s.DependsOn {
			if dep == "rabbitmq-2" || dep == "rabbitmq-3" {
				// The profile "cluster"'s nodes: waited for when the profile
				// is on, never required (x-broker).
				if d.Required {
					t.Errorf("%s: depends on %s, which only the profile cluster runs, with required: true", s.Name, dep)
				}
				continue
			}
			deps = append(deps, dep)
			if service(t, p, dep).Restart == types.RestartPolicyNo && d.Condition == types.ServiceConditionCompletedSuccessfully {
				continue // waiting for a one-shot to finish (TestOneShotsAreAdopted)
			}
			if d.Condition != types.ServiceConditionHealthy {
				t.Errorf("%s: depends_on %s with condition %q, want service_healthy", s.Name, dep, d.Condition)
			}
			if hc := service(t, p, dep).HealthCheck; hc == nil || hc.Disable {
				t.Errorf("%s: depends on %s being healthy, which has no health check", s.Name, dep)
			}
		}
		slices.Sort(deps)
		if w, ok := want[s.Name]; ok && !slices.Equal(deps, w) {
			t.Errorf("%s: depends on %q, want %q", s.Name, deps, w)
		}
	}
}

// TestOneShotsAreAdopted: a service that exits by design either sits behind a
// profile (run with `docker compose run --rm`), or is in the default set and
// a long-running service depends on its successful completion: otherwise
// `up --wait` counts its normal exit as a failure.
func TestOneShotsAreAdopted(t *testing.T) {
	p := load(t, envExampleValues(t))
	for _, s := range p.Services {
		if s.Restart != types.RestartPolicyNo || len(s.Profiles) > 0 {
			continue
		}
		adopted := false
		for _, other := range p.Services {
			if d, ok := other.DependsOn[s.Name]; ok && other.Restart != types.RestartPolicyNo &&
				d.Condition == types.ServiceConditionCompletedSuccessfully {
				adopted = true
			}
		}
		if !adopted {
			t.Errorf("%s: a one-shot in the default set that no long-running service waits for (service_completed_successfully)", s.Name)
		}
	}
}

func TestOrderPublisherIsAOneShotDemo(t *testing.T) {
	p := load(t, envExampleValues(t))
	s := service(t, p, "order-publisher")
	if s.Restart != types.RestartPolicyNo {
		t.Errorf("order-publisher: restart %q, want \"no\"", s.Restart)
	}
	if len(s.Profiles) != 0 {
		t.Errorf("order-publisher: profiles %q, want the default set: the demo load comes with `up`", s.Profiles)
	}
	if i := slices.Index(s.Command, "-once"); i < 0 || i+1 == len(s.Command) {
		t.Errorf("order-publisher: command %q lacks -once FILE: `up` would publish the demo load every time", s.Command)
	} else if once := s.Command[i+1]; !slices.ContainsFunc(s.Volumes, func(v types.ServiceVolumeConfig) bool {
		return v.Type == types.VolumeTypeVolume && strings.HasPrefix(once, v.Target+"/")
	}) {
		t.Errorf("order-publisher: -once %s is not on a named volume: the record would not survive the container", once)
	}
	if !slices.Equal(s.Entrypoint, types.ShellCommand{binDir + "order-publisher"}) {
		t.Errorf("order-publisher: entrypoint %q", s.Entrypoint)
	}
	for _, flag := range []string{"-count", "-duplicate-rate", "-republish-rate", "-poison"} {
		if !slices.Contains(s.Command, flag) {
			t.Errorf("order-publisher: command %q lacks %s", s.Command, flag)
		}
	}
}

func TestImages(t *testing.T) {
	p := load(t, envExampleValues(t))
	want := map[string]*regexp.Regexp{
		"postgres": regexp.MustCompile(`^postgres:17([.-]|$)`),
		"rabbitmq": regexp.MustCompile(`^rabbitmq:4(\.\d+){0,2}-management(-alpine)?$`),
	}
	for name, re := range want {
		if img := service(t, p, name).Image; !re.MatchString(img) {
			t.Errorf("%s: image %q, want %s", name, img, re)
		}
	}
	for _, s := range p.Services {
		if s.Build == nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(s.Build.Context, s.Build.Dockerfile)); err != nil {
			t.Errorf("%s: %v", s.Name, err)
		}
		if len(s.Entrypoint) != 1 || !strings.HasPrefix(s.Entrypoint[0], binDir) {
			t.Errorf("%s: entrypoint %q, want one of the programs in %s", s.Name, s.Entrypoint, binDir)
		}
	}
}

// .ci/stack-images/build.sh gets the images of the services `docker compose
// up` starts, and of a profile only when asked for it: the collector, whose
// stand-in takes the longest to build, must stay the profile tracing's alone,
// or make up would need it with tracing off.
func TestCollectorRunsOnlyInTheProfileTracing(t *testing.T) {
	env := envExampleValues(t)
	collector := func(p *types.Project) []string {
		var names []string
		for _, s := range p.Services {
			if strings.HasPrefix(s.Image, "otel/opentelemetry-collector") {
				names = append(names, s.Name)
			}
		}
		return names
	}
	if got := collector(loadProfiles(t, env)); len(got) > 0 {
		t.Errorf("services started without a profile run the collector's image: %v", got)
	}
	if got := collector(loadProfiles(t, env, "tracing")); len(got) != 1 {
		t.Errorf("the profile tracing runs the collector's image in %v, want one service", got)
	}
}

// TestServicesBuildTheirTargets: each service of ours builds the Dockerfile
// target holding its program, under that target's own image name, and the
// ports it publishes are the ones the image exposes.
func TestServicesBuildTheirTargets(t *testing.T) {
	p := load(t, envExampleValues(t))
	targets, _ := dockerfileTargets(t)
	imageOf := map[string]string{}  // target -> image
	targetOf := map[string]string{} // image -> target
	seen := map[string]bool{}
	for _, s := range p.Services {
		if s.Build == nil {
			if _, ours := wantBuildTargets[s.Name]; ours {
				t.Errorf("%s: no build section; want target %s", s.Name, wantBuildTargets[s.Name])
			}
			continue
		}
		seen[s.Name] = true
		name := s.Build.Target
		if want, ok := wantBuildTargets[s.Name]; !ok {
			t.Errorf("%s: builds target %q; add the service to wantBuildTargets", s.Name, name)
		} else if name != want {
			t.Errorf("%s: builds target %q, want %q", s.Name, name, want)
		}
		tg, ok := targetNamed(targets, name)
		if !ok {
			t.Errorf("%s: build target %q is not an image stage of the Dockerfile", s.Name, name)
			continue
		}
		if prog := program(s); !slices.Contains(tg.programs, prog) {
			t.Errorf("%s: runs %s%s, which image %s does not hold (it holds %q)", s.Name, binDir, prog, name, tg.programs)
		}
		if hc := s.HealthCheck; hc != nil && len(hc.Test) > 1 && strings.HasPrefix(hc.Test[1], binDir) &&
			!slices.Contains(tg.programs, strings.TrimPrefix(hc.Test[1], binDir)) {
			t.Errorf("%s: health check runs %s, which image %s does not hold", s.Name, hc.Test[1], name)
		}
		for _, port := range s.Ports {
			if !slices.Contains(tg.expose, strconv.FormatUint(uint64(port.Target), 10)) {
				t.Errorf("%s: publishes port %d, which image %s does not expose (%q)", s.Name, port.Target, name, tg.expose)
			}
		}
		// One image name per target: services of one target share the
		// image, and no two targets write the same tag.
		if s.Image == "" {
			t.Errorf("%s: builds target %s without an image name", s.Name, name)
			continue
		}
		if repo, _, _ := strings.Cut(s.Image, ":"); repo != name && !strings.HasSuffix(repo, "/"+name) {
			t.Errorf("%s: image %q for target %s; name the image after its target", s.Name, s.Image, name)
		}
		if img, ok := imageOf[name]; ok && img != s.Image {
			t.Errorf("%s: target %s is built as both %q and %q", s.Name, name, img, s.Image)
		}
		if other, ok := targetOf[s.Image]; ok && other != name {
			t.Errorf("%s: image %q is built from both targets %s and %s", s.Name, s.Image, other, name)
		}
		imageOf[name], targetOf[s.Image] = s.Image, name
	}
	for name := range wantBuildTargets {
		if !seen[name] {
			t.Errorf("no service %s builds its image", name)
		}
	}
}

func TestDataLivesInNamedVolumes(t *testing.T) {
	p := load(t, envExampleValues(t))
	want := map[string]struct{ volume, target string }{
		"rabbitmq": {"rabbitmq-data", "/var/lib/rabbitmq"},
		"postgres": {"postgres-data", "/var/lib/postgresql/data"},
	}
	for name, w := range want {
		if _, ok := p.Volumes[w.volume]; !ok {
			t.Errorf("volume %s is not declared", w.volume)
		}
		found := false
		for _, v := range service(t, p, name).Volumes {
			found = found || (v.Type == types.VolumeTypeVolume && v.Source == w.volume && v.Target == w.target)
		}
		if !found {
			t.Errorf("%s: want volume %s on %s", name, w.volume, w.target)
		}
	}
	for _, s := range p.Services {
		for _, v := range s.Volumes {
			if v.Type != types.VolumeTypeBind {
				continue
			}
			if _, err := os.Stat(v.Source); err != nil {
				t.Errorf("%s: bind mount source: %v", s.Name, err)
			}
		}
	}
	initdb := false
	for _, v := range service(t, p, "postgres").Volumes {
		initdb = initdb || strings.HasPrefix(v.Target, "/docker-entrypoint-initdb.d")
	}
	if !initdb {
		t.Error("postgres: nothing mounted into /docker-entrypoint-initdb.d creates the databases")
	}
}

func TestPorts(t *testing.T) {
	p := load(t, envExampleValues(t))
	want := map[string][]uint32{
		"rabbitmq":        {5672, 15672},
		"postgres":        {5432},
		"fake-gateway":    {8081},
		"payment-service": {8080},
		"prometheus":      {9090},
	}
	hostPorts := map[string]string{}
	for _, s := range p.Services {
		var targets []uint32
		for _, port := range s.Ports {
			targets = append(targets, port.Target)
			if port.HostIP != "127.0.0.1" {
				t.Errorf("%s: port %d published on %q; want 127.0.0.1 only (demo credentials)", s.Name, port.Target, port.HostIP)
			}
			if port.Published == "" {
				continue
			}
			key := net.JoinHostPort(port.HostIP, port.Published)
			if other, dup := hostPorts[key]; dup {
				t.Errorf("%s and %s both publish %s", other, s.Name, key)
			}
			hostPorts[key] = s.Name
		}
		for _, w := range want[s.Name] {
			if !slices.Contains(targets, w) {
				t.Errorf("%s: port %d is not published", s.Name, w)
			}
		}
	}
}

// wantHostPorts is the service and container port each [compose] variable of
// .env.example publishes on the host.
var wantHostPorts = map[string]struct {
	service string
	target  uint32
}{
	"RABBITMQ_HOST_PORT":    {"rabbitmq", 5672},
	"RABBITMQ_UI_HOST_PORT": {"rabbitmq", 15672},
	"POSTGRES_HOST_PORT":    {"postgres", 5432},
	"GATEWAY_HOST_PORT":     {"fake-gateway", 8081},
	"CARRIER_HOST_PORT":     {"fake-carrier", 8082},
	"PROMETHEUS_HOST_PORT":  {"prometheus", 9090},
}

// docs/compose.md's table of ports names every host port variable, and the
// README's line that moves them all sets every one.
func TestDocsNameEveryHostPort(t *testing.T) {
	compose, err := os.ReadFile(repoRoot + "/docs/compose.md")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(repoRoot + "/README.md")
	if err != nil {
		t.Fatal(err)
	}
	for name := range wantHostPorts {
		if !strings.Contains(string(compose), "\n| `"+name+"` |") {
			t.Errorf("docs/compose.md: the table of ports lacks %s", name)
		}
		if !strings.Contains(string(readme), " "+name+"=0") {
			t.Errorf("README.md: the export of free ports lacks %s=0", name)
		}
	}
}

// TestHostPortsComeFromEnv: every fixed host port is a [compose] variable of
// .env.example, defaulting to the container's port, so that the stack runs
// beside local servers without editing the file.
func TestHostPortsComeFromEnv(t *testing.T) {
	entries := envExampleEntries(t)
	env := envExampleValues(t)
	var vars []string
	for name, e := range entries {
		if e.composeOnly() {
			vars = append(vars, name)
		}
	}
	slices.Sort(vars)
	if got, want := vars, slices.Sorted(maps.Keys(wantHostPorts)); !slices.Equal(got, want) {
		t.Fatalf(".env.example: [compose] variables %q, want %q", got, want)
	}
	// Each variable set to a port of its own: that port, and only it, moves.
	moved := maps.Clone(env)
	byPort := map[string]string{}
	for i, name := range vars {
		if w := wantHostPorts[name]; env[name] != strconv.FormatUint(uint64(w.target), 10) {
			t.Errorf(".env.example: %s=%s; want the container port %d (today's default)", name, env[name], w.target)
		}
		port := strconv.Itoa(41000 + i)
		moved[name] = port
		byPort[port] = name
	}
	p := load(t, moved)
	seen := map[string]bool{}
	for _, s := range p.Services {
		for _, port := range s.Ports {
			if port.Published == "" {
				continue // a free port, chosen by Docker
			}
			name, ok := byPort[port.Published]
			if !ok {
				t.Errorf("%s: host port %s for %d is fixed in docker-compose.yml; take it from a [compose] variable", s.Name, port.Published, port.Target)
				continue
			}
			if w := wantHostPorts[name]; w.service != s.Name || w.target != port.Target {
				t.Errorf("%s publishes %s:%d; want %s:%d", name, s.Name, port.Target, w.service, w.target)
			}
			seen[name] = true
		}
	}
	for _, name := range vars {
		if !seen[name] {
			t.Errorf("%s is in .env.example but docker-compose.yml publishes no port with it", name)
		}
	}
}

func TestPrometheusScrapesEveryReplica(t *testing.T) {
	p := load(t, envExampleValues(t))
	s := service(t, p, "prometheus")
	if len(s.Profiles) != 0 {
		t.Errorf("prometheus: profiles %q; keep it in the default set, so that `down -v` stops it", s.Profiles)
	}
	var cfgPath string
	for _, v := range s.Volumes {
		if v.Target == "/etc/prometheus/prometheus.yml" {
			cfgPath = v.Source
		}
	}
	if cfgPath == "" {
		t.Fatal("prometheus: no /etc/prometheus/prometheus.yml mounted")
	}
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []struct {
			JobName      string `yaml:"job_name"`
			DNSSDConfigs []struct {
				Names []string `yaml:"names"`
				Type  string   `yaml:"type"`
				Port  int      `yaml:"port"`
			} `yaml:"dns_sd_configs"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		t.Fatalf("%s: %v", cfgPath, err)
	}
	var replicas, gateway bool
	for _, sc := range cfg.ScrapeConfigs {
		for _, d := range sc.DNSSDConfigs {
			replicas = replicas || (slices.Equal(d.Names, []string{"payment-service"}) && d.Type == "A" && d.Port == 8080)
		}
		for _, st := range sc.StaticConfigs {
			gateway = gateway || slices.Contains(st.Targets, "fake-gateway:8081")
		}
	}
	if !replicas {
		t.Error("prometheus.yml: want dns_sd_configs names [payment-service], type A, port 8080")
	}
	if !gateway {
		t.Error("prometheus.yml: want the target fake-gateway:8081")
	}
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, err := p.GetService(name)
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return s
}

func wantHost(raw, scheme, host string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != scheme || u.Host != host {
		return "want a " + scheme + " URL on " + host
	}
	return ""
}

// diffLines shows the lines of b that a lacks, enough to find the culprit.
func diffLines(a, b string) string {
	have := map[string]bool{}
	for _, l := range strings.Split(a, "\n") {
		have[l] = true
	}
	var out []string
	for _, l := range strings.Split(b, "\n") {
		if !have[l] {
			out = append(out, "  "+strings.TrimSpace(l))
		}
	}
	return strings.Join(out, "\n")
}

// The profile "cluster"'s nodes survive a `down` that does not name the
// profile: every `down` of the repository names it.
func TestDownNamesTheClusterProfile(t *testing.T) {
	for _, f := range []string{repoRoot + "/Makefile", repoRoot + "/scripts/lib.sh"} {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.Contains(line, " down ") && strings.Contains(line, "compose") && !strings.Contains(line, "--profile cluster") {
				t.Errorf("%s: %q removes the stack without the profile \"cluster\": its broker nodes would survive", f, strings.TrimSpace(line))
			}
		}
	}
}
