// Command kitproxy serves the kit (kit/, a Go module of its own) at a version
// from a directory laid out as a Go module proxy, for a project that requires
// the kit at a version while it is not published where the go command looks:
//
//	go run ./scripts/kitproxy -out /srv/goproxy                 # kit/ at its kit.Version
//	go run ./scripts/kitproxy -kit ../next/kit -out /srv/goproxy   # another checkout's
//	GOPROXY=file:///srv/goproxy,$(go env GOPROXY) GONOSUMDB=github.com/inbox-template/payment-service/kit \
//	  go get github.com/inbox-template/payment-service/kit@vX.Y.Z
//
// The version is the one the kit declares (kit.Version, in
// internal/release/release.go), so that a service's version command says
// what it was built from. It writes <module>/@v/<version>.info, .mod and
// .zip and adds the version to @v/list. The zip holds the module's files as
// the go command zips them (no nested module, no vendor directory, no
// symbolic link); in a git checkout, only the files git tracks, as a tag
// would hold them (an ignored .env or a test binary stays out), with a
// warning when they differ from the last commit. A version once served
// never changes (go.sum pins its hash): serving it again with other content
// is refused, with the same content it does nothing. docs/upgrading.md
// tells the whole story.
package main

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kitproxy:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fset := flag.NewFlagSet("kitproxy", flag.ContinueOnError)
	dir := fset.String("kit", "kit", "the kit's module directory (its go.mod names the module; the version is its kit.Version)")
	out := fset.String("out", "", "the proxy's directory (GOPROXY=file://<it>); made if missing")
	if err := fset.Parse(args); err != nil {
		return err
	}
	if *out == "" || fset.NArg() > 0 {
		return errors.New("usage: kitproxy [-kit DIR] -out DIR")
	}
	kitDir, err := os.OpenRoot(*dir)
	if err != nil {
		return err
	}
	defer kitDir.Close()
	mod, err := modulePath(kitDir)
	if err != nil {
		return err
	}
	version, err := declaredVersion(kitDir)
	if err != nil {
		return err
	}
	if !semver.IsValid(version) || semver.Canonical(version) != version || semver.Build(version) != "" {
		return fmt.Errorf("the kit declares Version %q: want a canonical semantic version like v0.2.0", version)
	}
	// v2 and later need the major version in the module path (…/kit/v2):
	// a go command refuses the version for this path.
	if err := module.Check(mod, version); err != nil {
		return fmt.Errorf("the kit declares Version %s: %w", version, err)
	}
	files, err := moduleFiles(*dir)
	if err != nil {
		return err
	}
	// Served files are for every reader of the proxy (a file server, the
	// team's CI), hence the modes 0755 and 0644.
	if err := os.MkdirAll(*out, 0o755); err != nil { // #nosec G301 -- a proxy's directory, read by others
		return err
	}
	proxyDir, err := os.OpenRoot(*out)
	if err != nil {
		return err
	}
	defer proxyDir.Close()
	served, err := serve(proxyDir, kitDir, files, mod, version)
	if err != nil {
		return err
	}
	fmt.Printf("%s@%s %s in %s\n", mod, version, served, *out)
	return nil
}

// modulePath reads the module path from the kit's go.mod.
func modulePath(kitDir *os.Root) (string, error) {
	b, err := kitDir.ReadFile("go.mod")
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^module\s+(\S+)\s*$`).FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("%s/go.mod names no module", kitDir.Name())
	}
	return string(m[1]), nil
}

// declaredVersion reads `const Version = "…"` from the kit's
// internal/release/release.go (kit.Version).
func declaredVersion(kitDir *os.Root) (string, error) {
	b, err := kitDir.ReadFile("internal/release/release.go")
	if err != nil {
		return "", fmt.Errorf("the kit's Version: %w", err)
	}
	m := regexp.MustCompile(`(?m)^const Version = "([^"]+)"`).FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("%s/internal/release/release.go declares no Version", kitDir.Name())
	}
	return string(m[1]), nil
}

// serve writes the version into the proxy directory, or finds it there with
// the same content; it says which.
func serve(proxyDir, kitDir *os.Root, files []string, mod, version string) (string, error) {
	escaped, err := module.EscapePath(mod)
	if err != nil {
		return "", err
	}
	vdir := path.Join(escaped, "@v")
	if err := proxyDir.MkdirAll(vdir, 0o755); err != nil { // #nosec G301 -- read by the proxy's readers
		return "", err
	}
	goMod, err := kitDir.ReadFile("go.mod")
	if err != nil {
		return "", err
	}
	archive, err := zipModule(kitDir, files, mod+"@"+version)
	if err != nil {
		return "", err
	}
	base := path.Join(vdir, version)
	if old, err := proxyDir.ReadFile(base + ".zip"); err == nil {
		if bytes.Equal(old, archive) {
			return "already served, the same", nil
		}
		return "", fmt.Errorf("%s@%s is already served in %s with other content: a version never changes (go.sum pins it); serve a new one", mod, version, proxyDir.Name())
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return "", err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{".mod", goMod}, {".info", info}, {".zip", archive}} { // the zip last: it marks the version served
		if err := proxyDir.WriteFile(base+f.name, f.data, 0o644); err != nil { // #nosec G306 -- read by the proxy's readers
			return "", err
		}
	}
	return "served", addToList(proxyDir, path.Join(vdir, "list"), version)
}

// moduleFiles lists the module's files under dir, slash-separated and
// sorted: in a git checkout the files git tracks (as a tag holds them),
// elsewhere every regular file; then without what the go command leaves out
// of a module: version-control directories, vendor directories, nested
// modules, symbolic links and other special files.
func moduleFiles(dir string) ([]string, error) {
	candidates, tracked, err := gitFiles(dir)
	if err != nil {
		return nil, err
	}
	if !tracked {
		if candidates, err = walkFiles(dir); err != nil {
			return nil, err
		}
	}
	nested := map[string]bool{} // directories of modules of their own
	for _, f := range candidates {
		if path.Base(f) == "go.mod" && path.Dir(f) != "." {
			nested[path.Dir(f)] = true
		}
	}
	if !slices.Contains(candidates, "go.mod") {
		return nil, fmt.Errorf("%s/go.mod is not among the files to serve: in a git checkout, git must track the kit", dir)
	}
	var files []string
	for _, f := range candidates {
		if excluded(f, nested) {
			continue
		}
		st, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(f)))
		if err != nil || !st.Mode().IsRegular() {
			continue // deleted in the working tree, or a link
		}
		if err := module.CheckFilePath(f); err != nil {
			return nil, fmt.Errorf("%s cannot be in a module: %w", f, err)
		}
		files = append(files, f)
	}
	slices.Sort(files)
	return files, nil
}

// excluded says whether f lies in a vendor or version-control directory or
// in a nested module.
func excluded(f string, nested map[string]bool) bool {
	for d := path.Dir(f); d != "."; d = path.Dir(d) {
		switch path.Base(d) {
		case "vendor", ".git", ".hg", ".svn", ".bzr":
			return true
		}
		if nested[d] {
			return true
		}
	}
	return false
}

// gitFiles lists the files git tracks under dir, and warns when the working
// tree differs from the last commit there (a change, a file not added yet);
// tracked is false outside a git checkout. Inside one (a .git in dir or
// above it), git must answer: without it the ignored files (an .env) would
// be served.
func gitFiles(dir string) (files []string, tracked bool, err error) {
	if !inGitCheckout(dir) {
		return nil, false, nil
	}
	out, err := exec.Command("git", "-C", dir, "ls-files", "-z", "--", ".").Output() // #nosec G204 -- git, with the directory given
	if err != nil {
		return nil, false, fmt.Errorf("%s is in a git checkout, and git ls-files there failed (%w): the files to serve are the ones git tracks", dir, gitError(err))
	}
	for f := range strings.SplitSeq(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		if f != "" {
			files = append(files, f)
		}
	}
	if st, err := exec.Command("git", "-C", dir, "status", "--porcelain", "--", ".").Output(); err == nil && len(st) > 0 { // #nosec G204 -- git, with the directory given
		fmt.Fprintf(os.Stderr, "kitproxy: warning: %s differs from its last commit (changes, or files git does not track: those are left out); it is served as it is, under a version a tag may later name otherwise:\n%s", dir, st)
	}
	return files, true, nil
}

// inGitCheckout says whether dir or a directory above it holds .git.
func inGitCheckout(dir string) bool {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for {
		if _, err := os.Lstat(filepath.Join(abs, ".git")); err == nil {
			return true
		}
		parent := filepath.Dir(abs)
		if parent == abs {
			return false
		}
		abs = parent
	}
}

// gitError is err with what git wrote to stderr.
func gitError(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
	}
	return err
}

// walkFiles lists every regular file under dir.
func walkFiles(dir string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		files = append(files, filepath.ToSlash(rel))
		return err
	})
	return files, err
}

// zipModule zips files of the kit as the module zip of prefix
// (module@version), in their order with a fixed time: the same tree zips to
// the same bytes.
func zipModule(kitDir *os.Root, files []string, prefix string) ([]byte, error) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	stamp := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, rel := range files {
		data, err := kitDir.ReadFile(rel)
		if err != nil {
			return nil, err
		}
		w, err := zw.CreateHeader(&zip.FileHeader{Name: path.Join(prefix, rel), Method: zip.Deflate, Modified: stamp})
		if err != nil {
			return nil, err
		}
		if _, err := w.Write(data); err != nil {
			return nil, err
		}
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// addToList adds version to the proxy's version list, once.
func addToList(proxyDir *os.Root, list, version string) error {
	b, err := proxyDir.ReadFile(list)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	versions := strings.Fields(string(b))
	if !slices.Contains(versions, version) {
		versions = append(versions, version)
	}
	semver.Sort(versions)
	return proxyDir.WriteFile(list, []byte(strings.Join(versions, "\n")+"\n"), 0o644) // #nosec G306 -- read by the proxy's readers
}
