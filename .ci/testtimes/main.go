// Command testtimes reads what a CI run recorded (the JSON of each go test
// run, which make test writes through gotestsum, and .ci/run's steps) and
// prints where the time went: each CI step, each go test run and its longest
// packages, and the longest tests. With -update FILE it replaces the part of
// FILE between the markers
//
//	<!-- testtimes:begin --> and <!-- testtimes:end -->
//
// with the same tables, so that docs/testing.md shows the latest run's
// numbers, not numbers copied by hand.
//
//	go run ./.ci/testtimes [-update docs/testing.md] [-top 20] REPORT_DIR
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "testtimes:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("testtimes", flag.ContinueOnError)
	update := fs.String("update", "", "replace the marked part of this file with the tables")
	top := fs.Int("top", 20, "how many of the longest tests to list")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: testtimes [-update FILE] [-top N] REPORT_DIR")
	}
	r, err := read(fs.Arg(0))
	if err != nil {
		return err
	}
	out := r.markdown(*top)
	if *update == "" {
		_, err := io.WriteString(stdout, out)
		return err
	}
	return replaceMarked(*update, out)
}

// report is one run's record.
type report struct {
	steps []step // .ci/run's steps, in order
	runs  []testRun
}

type step struct {
	name    string
	seconds float64
}

// testRun is one go test invocation (one JSON file).
type testRun struct {
	name     string
	seconds  float64 // from its first event to its last
	packages map[string]float64
	tests    []testTime
	failed   []string
}

type testTime struct {
	pkg, name string
	seconds   float64
}

// event is a line of go test -json.
type event struct {
	Time    string
	Action  string
	Package string
	Test    string
	Elapsed float64
}

func read(dir string) (*report, error) {
	r := &report{}
	steps, err := os.ReadFile(filepath.Join(dir, "steps.tsv"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(steps)), "\n") {
		name, secs, ok := strings.Cut(line, "\t")
		if !ok {
			continue
		}
		s, err := strconv.ParseFloat(secs, 64)
		if err != nil {
			return nil, fmt.Errorf("steps.tsv: %q: %w", line, err)
		}
		r.steps = append(r.steps, step{name, s})
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	for _, f := range files {
		tr, err := readRun(f)
		if err != nil {
			return nil, err
		}
		r.runs = append(r.runs, tr)
	}
	if len(r.steps) == 0 && len(r.runs) == 0 {
		return nil, fmt.Errorf("%s holds neither steps.tsv nor go test JSON", dir)
	}
	return r, nil
}

func readRun(path string) (testRun, error) {
	tr := testRun{name: strings.TrimSuffix(filepath.Base(path), ".json"), packages: map[string]float64{}}
	f, err := os.Open(path)
	if err != nil {
		return tr, err
	}
	defer f.Close()
	var first, last string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue // a line the test binary printed outside the JSON
		}
		if e.Time != "" {
			if first == "" {
				first = e.Time
			}
			last = e.Time
		}
		if e.Action != "pass" && e.Action != "fail" {
			continue
		}
		switch {
		case e.Test == "":
			tr.packages[e.Package] = e.Elapsed
		case !strings.Contains(e.Test, "/"):
			tr.tests = append(tr.tests, testTime{e.Package, e.Test, e.Elapsed})
		}
		if e.Action == "fail" && e.Test != "" {
			tr.failed = append(tr.failed, e.Package+" "+e.Test)
		}
	}
	if err := sc.Err(); err != nil {
		return tr, fmt.Errorf("%s: %w", path, err)
	}
	tr.seconds = span(first, last)
	return tr, nil
}

func (r *report) markdown(top int) string {
	var b strings.Builder
	if len(r.steps) > 0 {
		total := 0.0
		b.WriteString("| CI step | minutes |\n|---|---:|\n")
		for _, s := range r.steps {
			fmt.Fprintf(&b, "| %s | %.1f |\n", s.name, s.seconds/60)
			if !strings.HasSuffix(s.name, "(beside)") { // run beside the others: in their time
				total += s.seconds
			}
		}
		fmt.Fprintf(&b, "| **all** (the steps marked beside ran during the others) | **%.1f** |\n\n", total/60)
	}
	var all []testTime
	if len(r.runs) > 0 {
		b.WriteString("| go test run | minutes | its longest packages (minutes) |\n|---|---:|---|\n")
		for _, tr := range r.runs {
			fmt.Fprintf(&b, "| %s | %.1f | %s |\n", tr.name, tr.seconds/60, longestPackages(tr.packages, 3))
			for _, t := range tr.tests {
				t.pkg = tr.name + ": " + shortPackage(t.pkg)
				all = append(all, t)
			}
		}
		b.WriteString("\n")
	}
	for _, tr := range r.runs {
		for _, f := range tr.failed {
			fmt.Fprintf(&b, "Failed in %s: %s\n\n", tr.name, shortPackage(f))
		}
	}
	if len(all) > 0 {
		sort.SliceStable(all, func(i, j int) bool { return all[i].seconds > all[j].seconds })
		fmt.Fprintf(&b, "The %d longest tests:\n\n| test | run: package | seconds |\n|---|---|---:|\n", min(top, len(all)))
		for _, t := range all[:min(top, len(all))] {
			fmt.Fprintf(&b, "| `%s` | %s | %.0f |\n", t.name, t.pkg, t.seconds)
		}
	}
	return b.String()
}

func longestPackages(pkgs map[string]float64, n int) string {
	names := make([]string, 0, len(pkgs))
	for p := range pkgs {
		names = append(names, p)
	}
	sort.Slice(names, func(i, j int) bool { return pkgs[names[i]] > pkgs[names[j]] })
	var parts []string
	for _, p := range names[:min(n, len(names))] {
		parts = append(parts, fmt.Sprintf("`%s` %.1f", shortPackage(p), pkgs[p]/60))
	}
	return strings.Join(parts, ", ")
}

// shortPackage drops the module path every package shares: the
// repository's, under which the kit's module lies (…/payment-service/kit).
func shortPackage(p string) string {
	for _, dir := range []string{"/internal/", "/examples/", "/cmd/", "/kit/"} {
		if i := strings.Index(p, dir); i >= 0 {
			return p[i+1:]
		}
	}
	if strings.HasSuffix(p, "/kit") {
		return "kit"
	}
	return p
}

const (
	beginMarker = "<!-- testtimes:begin -->"
	endMarker   = "<!-- testtimes:end -->"
)

func replaceMarked(path, tables string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(old)
	b, e := strings.Index(s, beginMarker), strings.Index(s, endMarker)
	if b < 0 || e < b {
		return fmt.Errorf("%s has no %s … %s part", path, beginMarker, endMarker)
	}
	s = s[:b+len(beginMarker)] + "\n" + tables + s[e:]
	return os.WriteFile(path, []byte(s), 0o644)
}

// span is the seconds from one RFC 3339 time to another.
func span(from, to string) float64 {
	a, err1 := time.Parse(time.RFC3339Nano, from)
	b, err2 := time.Parse(time.RFC3339Nano, to)
	if err1 != nil || err2 != nil {
		return 0
	}
	return b.Sub(a).Seconds()
}
