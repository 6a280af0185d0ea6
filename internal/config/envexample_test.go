package config

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kelseyhightower/envconfig"
)

// envExamplePath is the documented environment of all programs; Docker Compose
// reads it once it is copied to .env.
const envExamplePath = "../../.env.example"

// programConfigs is every program's configuration struct. A new one must be
// added here: TestEveryProgramConfigIsListed fails until it is.
var programConfigs = []struct {
	program string
	spec    any // a pointer to the struct, as envconfig wants
}{
	{"payment-service", &PaymentService{}},
	{"fake-gateway", &FakeGateway{}},
	{"order-publisher", &Publisher{}},
	{"inboxctl", &Migrate{}},       // migrate
	{"inboxctl", &DeadLetterOps{}}, // dlq
	{"inboxctl", &InboxPrune{}},    // inbox prune
	{"inboxctl", &Verify{}},        // verify
}

// programVariable is one variable as one program reads it.
type programVariable struct {
	program, name, def string
}

// envEntry is one NAME=value line of .env.example with the comment above it.
type envEntry struct {
	line           int
	value, comment string
}

func TestEnvExampleMatchesPrograms(t *testing.T) {
	entries := parseEnvExample(t, envExamplePath)
	readers := map[string][]programVariable{} // variable → every program reading it
	for _, p := range programConfigs {
		for _, v := range readVariables(t, p.program, p.spec) {
			readers[v.name] = append(readers[v.name], v)
		}
	}
	for _, name := range sortedKeys(readers) {
		e, ok := entries[name]
		if !ok {
			t.Errorf("%s is read by %s but missing from .env.example", name, strings.Join(programsOf(readers[name]), ", "))
			continue
		}
		checkEntry(t, name, e, readers[name])
	}
	for _, name := range sortedKeys(entries) {
		// Compose's own settings (host ports) are read by no program;
		// .ci/compose-check holds them to docker-compose.yml.
		if _, ok := readers[name]; !ok && !strings.HasPrefix(entries[name].comment, composeOnly) {
			t.Errorf(".env.example:%d: %s is read by no program (programConfigs), nor marked %q", entries[name].line, name, composeOnly)
		}
	}
}

// composeOnly starts the comment of a variable that only docker-compose.yml
// reads.
const composeOnly = "[compose] "

// checkEntry compares one .env.example entry with the programs that read it.
// Programs sharing a name may default differently (DATABASE_URL, HTTP_ADDR): the
// value is then one of the defaults and the comment names the others.
func checkEntry(t *testing.T, name string, e envEntry, vars []programVariable) {
	t.Helper()
	want := "[" + strings.Join(programsOf(vars), ", ") + "] "
	if !strings.HasPrefix(e.comment, want) {
		t.Errorf(".env.example:%d: the comment above %s must start with %q, got %q", e.line, name, want, e.comment)
	}
	var defaults []string
	for _, v := range vars {
		if !slices.Contains(defaults, v.def) {
			defaults = append(defaults, v.def)
		}
	}
	if !slices.Contains(defaults, e.value) {
		t.Errorf(".env.example:%d: %s=%s, but the default is %s", e.line, name, e.value, describeDefaults(vars))
		return
	}
	for _, d := range defaults {
		if d != e.value && !strings.Contains(e.comment, d) {
			t.Errorf(".env.example:%d: the comment above %s must mention the other default %q (%s)", e.line, name, d, describeDefaults(vars))
		}
	}
}

// readVariables lists what envconfig reads into spec, walked by envconfig
// itself so that embedded structs, prefixes and ignored fields count as they
// do at run time.
func readVariables(t *testing.T, program string, spec any) []programVariable {
	t.Helper()
	const format = `{{range .}}{{.Key}}{{"\t"}}{{.Tags.Get "default"}}{{"\n"}}{{end}}`
	var out strings.Builder
	if err := envconfig.Usagef("", spec, &out, format); err != nil {
		t.Fatalf("%s: %v", program, err)
	}
	var vars []programVariable
	for line := range strings.Lines(out.String()) {
		name, def, _ := strings.Cut(strings.TrimSuffix(line, "\n"), "\t")
		vars = append(vars, programVariable{program: program, name: name, def: def})
	}
	if len(vars) == 0 {
		t.Fatalf("%s: no variables found in %T", program, spec)
	}
	return vars
}

var envLine = regexp.MustCompile(`^([A-Z][A-Z0-9_]*)=(.*)$`)

// parseEnvExample reads the subset of the dotenv format that Docker Compose and
// a shell read alike: comment lines, blank lines and unquoted NAME=value lines,
// each preceded directly by a comment.
func parseEnvExample(t *testing.T, path string) map[string]envEntry {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	entries := map[string]envEntry{}
	comment := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
			comment = ""
		case strings.HasPrefix(line, "#"):
			comment = strings.TrimSpace(strings.TrimPrefix(line, "#"))
		default:
			m := envLine.FindStringSubmatch(line)
			if m == nil {
				t.Errorf("%s:%d: want NAME=value, got %q", path, n, line)
				continue
			}
			name, value := m[1], m[2]
			if strings.ContainsAny(value, " \t\"'$#`\\") {
				t.Errorf("%s:%d: %s: keep values unquoted, without spaces, $, # or backslashes, so that Compose and a shell read the same value", path, n, name)
			}
			if comment == "" {
				t.Errorf("%s:%d: %s needs a one-line # comment directly above it", path, n, name)
			}
			if prev, dup := entries[name]; dup {
				t.Errorf("%s:%d: %s again (first on line %d)", path, n, name, prev.line)
			}
			entries[name] = envEntry{line: n, value: value, comment: comment}
			comment = ""
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return entries
}

// TestEveryProgramConfigIsListed fails when the package declares a struct with
// envconfig tags (directly or through a struct it holds) that is neither in
// programConfigs nor part of a struct that is, so that a new program's
// variables cannot miss the check above.
func TestEveryProgramConfigIsListed(t *testing.T) {
	structs := packageStructs(t)
	covered := map[string]bool{}
	for _, p := range programConfigs {
		markStructs(reflect.TypeOf(p.spec).Elem(), covered)
	}
	for _, name := range sortedKeys(structs) {
		if ast.IsExported(name) && !covered[name] && readsEnv(name, structs, map[string]bool{}) {
			t.Errorf("config.%s has envconfig tags but is not in programConfigs (nor part of a struct there): add it with the program that reads it", name)
		}
	}
	for _, p := range programConfigs {
		if _, ok := structs[reflect.TypeOf(p.spec).Elem().Name()]; !ok {
			t.Errorf("programConfigs lists %T, which the parser did not find", p.spec)
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
	if t.Kind() != reflect.Struct || t.PkgPath() != reflect.TypeFor[PaymentService]().PkgPath() || covered[t.Name()] {
		return
	}
	covered[t.Name()] = true
	for i := range t.NumField() {
		markStructs(t.Field(i).Type, covered)
	}
}

// programsOf names the programs reading a variable, each once, in the order of
// programConfigs.
func programsOf(vars []programVariable) []string {
	var names []string
	for _, v := range vars {
		if !slices.Contains(names, v.program) {
			names = append(names, v.program)
		}
	}
	return names
}

func describeDefaults(vars []programVariable) string {
	var parts []string
	for _, v := range vars {
		parts = append(parts, fmt.Sprintf("%q in %s", v.def, v.program))
	}
	return strings.Join(parts, ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
