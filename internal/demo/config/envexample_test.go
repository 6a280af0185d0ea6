package config

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/inbox-template/payment-service/examples/shipping"
	"github.com/inbox-template/payment-service/internal/payment"
	"github.com/inbox-template/payment-service/kit/kittest"
)

// envExamplePath is the documented environment of all programs; Docker Compose
// reads it once it is copied to .env.
const envExamplePath = "../../../.env.example"

var update = flag.Bool("update", false, "rewrite .env.example from the programs' configuration")

// programConfigs is every configuration struct of this package and the
// program reading it. A new one must be added here:
// TestEveryProgramConfigIsListed fails until it is.
var programConfigs = []struct {
	program string
	spec    any // a pointer to the struct
}{
	{"fake-gateway", &FakeGateway{}},
	{"fake-carrier", &FakeCarrier{}},
	{"order-publisher", &Publisher{}},
	{"inboxctl", &Verify{}}, // verify, migrate gateway
}

// program is one program and every variable it reads, with its defaults.
type program struct {
	name string
	vars []kittest.Variable
}

// programs lists what each program reads. The payment service's variables
// are the kit's and its handler's settings; inboxctl loads the same
// configuration to find the service's queues, database and retention.
func programs() []program {
	pay := payment.Service().Describe()
	// The shipping example's own settings; the kit's variables it reads too
	// are the payment service's, set per service in docker-compose.yml.
	out := []program{{"payment-service", pay}, {"shipping-service", kittest.Describe(&shipping.Settings{})}}
	for _, p := range programConfigs {
		out = append(out, program{p.program, kittest.Describe(p.spec)})
	}
	for i := range out {
		if out[i].name == "inboxctl" {
			out[i].vars = append(slices.Clone(pay), out[i].vars...)
		}
	}
	return out
}

const envExampleHeader = `# Every environment variable the programs read, once each, set to the default the
# program uses when the variable is unset (the local-process defaults of the
# README's quick start). The comment above a variable names the programs that
# read it and says what it is for.
#
# Generated from the programs' configuration (the desc and default tags of the
# service.Config in kit/internal/service, whose runtime settings default to the kit's
# consumer.Defaults, of each handler's Settings and of internal/demo/config):
# do not edit by hand; after changing a setting run
#   go test ./internal/demo/config -run EnvExample -update
#
# Docker Compose: ` + "`cp .env.example .env`" + `, edit, ` + "`docker compose up`" + `. Compose reads
# .env from the project directory (a variable set in your shell wins) and
# substitutes it into docker-compose.yml, whose ${NAME:-default} entries pass each
# variable to the services that read it. The connection variables (AMQP_URL,
# DATABASE_URL, GATEWAY_DATABASE_URL, GATEWAY_URL, CARRIER_URL, HTTP_ADDR,
# OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME) are set per service in
# docker-compose.yml, because inside Compose they name the other containers or
# the service itself, and FAULTS_ENABLED is true there for the fault demo.
`

// composeHostPorts are docker-compose.yml's own settings, read by no program:
// the host port of each published service, defaulting to the container's.
// .ci/compose-check holds them to the Compose file.
var composeHostPorts = []struct{ name, def, desc string }{
	{"RABBITMQ_HOST_PORT", "5672", "host port of RabbitMQ's AMQP listener (container port 5672)"},
	{"RABBITMQ_UI_HOST_PORT", "15672", "host port of the RabbitMQ management UI (container port 15672)"},
	{"POSTGRES_HOST_PORT", "5432", "host port of PostgreSQL (container port 5432)"},
	{"GATEWAY_HOST_PORT", "8081", "host port of the fake gateway (container port 8081)"},
	{"CARRIER_HOST_PORT", "8082", "host port of the fake carrier (container port 8082)"},
	{"PROMETHEUS_HOST_PORT", "9090", "host port of Prometheus (container port 9090)"},
}

const composeSection = `
# Docker Compose only, marked [compose]: the host ports docker-compose.yml
# publishes, on 127.0.0.1. Change them to run the stack beside a local
# PostgreSQL or RabbitMQ; 0 lets Docker pick a free port (` + "`docker compose port`" + `
# shows it). The payment-service replicas always get free ports.

`

// entry is one variable across the programs that read it.
type entry struct {
	desc     string
	readers  []string
	defaults map[string]string // program → default
	first    string
}

// collect lists every variable once, in the order the programs read them.
func collect(progs []program) (order []string, entries map[string]*entry) {
	entries = map[string]*entry{}
	for _, p := range progs {
		for _, v := range p.vars {
			e, ok := entries[v.Name]
			if !ok {
				e = &entry{desc: v.Desc, defaults: map[string]string{}, first: p.name}
				entries[v.Name] = e
				order = append(order, v.Name)
			}
			if !slices.Contains(e.readers, p.name) {
				e.readers = append(e.readers, p.name)
				e.defaults[p.name] = v.Default
			}
		}
	}
	return order, entries
}

// generateEnvExample writes every variable once, in the order the programs
// read them: a comment with its readers and purpose (and the other programs'
// defaults where they differ), then NAME=default.
func generateEnvExample(t *testing.T, progs []program) string {
	t.Helper()
	order, entries := collect(progs)
	var b strings.Builder
	b.WriteString(envExampleHeader)
	group := ""
	for _, name := range order {
		e := entries[name]
		if e.first != group {
			b.WriteString("\n")
			group = e.first
		}
		value := e.defaults[e.first]
		if strings.ContainsAny(value, " \t\"'$#`\\") {
			t.Errorf("%s: default %q needs quoting; keep defaults plain so that Compose and a shell read the same value", name, value)
		}
		if e.desc == "" {
			t.Errorf("%s: no desc tag on its field", name)
		}
		comment := e.desc
		for _, r := range e.readers {
			if d := e.defaults[r]; d != value {
				comment += fmt.Sprintf("; %s's default is %s", r, d)
			}
		}
		fmt.Fprintf(&b, "# [%s] %s\n%s=%s\n", strings.Join(e.readers, ", "), comment, name, value)
	}
	b.WriteString(composeSection)
	for _, v := range composeHostPorts {
		if e, ok := entries[v.name]; ok {
			t.Errorf("%s is a Compose host port, but %s reads it", v.name, strings.Join(e.readers, ", "))
		}
		fmt.Fprintf(&b, "# [compose] %s\n%s=%s\n", v.desc, v.name, v.def)
	}
	return b.String()
}

func TestEnvExampleMatchesPrograms(t *testing.T) {
	want := generateEnvExample(t, programs())
	if *update {
		if err := os.WriteFile(envExamplePath, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	raw, err := os.ReadFile(envExamplePath)
	if err != nil {
		t.Fatal(err)
	}
	got := string(raw)
	if got == want {
		return
	}
	gotLines, wantLines := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(gotLines), len(wantLines)) {
		g, w := line(gotLines, i), line(wantLines, i)
		if g != w {
			t.Fatalf(".env.example is out of date with the programs' configuration; run\n"+
				"  go test ./internal/demo/config -run EnvExample -update\nfirst difference, line %d:\n  file:      %q\n  generated: %q", i+1, g, w)
		}
	}
}

func line(lines []string, i int) string {
	if i < len(lines) {
		return lines[i]
	}
	return "<end of file>"
}

// TestEveryProgramConfigIsListed fails when the package declares a struct with
// envconfig tags (directly or through a struct it holds) that is neither in
// programConfigs nor part of a struct that is, so that a new program's
// variables cannot miss .env.example.
func TestEveryProgramConfigIsListed(t *testing.T) {
	structs := packageStructs(t)
	covered := map[string]bool{}
	for _, p := range programConfigs {
		markStructs(reflect.TypeOf(p.spec).Elem(), covered)
	}
	for _, name := range slices.Sorted(maps.Keys(structs)) {
		if ast.IsExported(name) && !covered[name] && readsEnv(name, structs, map[string]bool{}) {
			t.Errorf("config.%s has envconfig tags but is not in programConfigs (nor part of a struct there): add it with the program that reads it", name)
		}
	}
}

// packageStructs parses the package's non-test files and returns its struct types.
func packageStructs(t *testing.T) map[string]*ast.StructType {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	structs := map[string]*ast.StructType{}
	fset := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok {
				if st, ok := ts.Type.(*ast.StructType); ok {
					structs[ts.Name.Name] = st
				}
			}
			return true
		})
	}
	if len(structs) == 0 {
		t.Fatal("no struct types found in the package")
	}
	return structs
}

// readsEnv reports whether the struct called name has an envconfig tag, or a
// field whose type is such a struct of this package.
func readsEnv(name string, structs map[string]*ast.StructType, seen map[string]bool) bool {
	st, ok := structs[name]
	if !ok || seen[name] {
		return false
	}
	seen[name] = true
	for _, f := range st.Fields.List {
		if f.Tag != nil {
			tag, err := strconv.Unquote(f.Tag.Value)
			if _, has := reflect.StructTag(tag).Lookup("envconfig"); err == nil && has {
				return true
			}
		}
		typ := f.Type
		if star, ok := typ.(*ast.StarExpr); ok {
			typ = star.X
		}
		if id, ok := typ.(*ast.Ident); ok && readsEnv(id.Name, structs, seen) {
			return true
		}
	}
	return false
}

// markStructs records t and every struct type of this package held in it.
func markStructs(t reflect.Type, covered map[string]bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t.PkgPath() != reflect.TypeFor[FakeGateway]().PkgPath() || covered[t.Name()] {
		return
	}
	covered[t.Name()] = true
	for i := range t.NumField() {
		markStructs(t.Field(i).Type, covered)
	}
}
