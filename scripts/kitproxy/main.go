// Command kitproxy serves the kit (kit/, a Go module of its own) at a version
// from a directory laid out as a Go module proxy, for a project that requires
// the kit at a version while it is not published where the go command looks:
//
//	go run ./scripts/kitproxy -out /srv/goproxy            # kit/ at kit.Version
//	go run ./scripts/kitproxy -kit ../kit-next -version v0.2.0 -out /srv/goproxy
//	GOPROXY=file:///srv/goproxy,$(go env GOPROXY) GONOSUMDB=github.com/inbox-template/payment-service/kit \
//	  go get github.com/inbox-template/payment-service/kit@v0.2.0
//
// It writes <module>/@v/<version>.info, .mod and .zip (the module's files as
// the go command zips them: no .git, no nested module, no symbolic link) and
// adds the version to @v/list. A version once served never changes (go.sum
// pins its hash): serving it again with other content is refused, with the
// same content it does nothing. docs/upgrading.md tells the whole story.
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
	"path"
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
	dir := fset.String("kit", "kit", "the kit's module directory (its go.mod names the module)")
	version := fset.String("version", "", "the version to serve it as (default: the Version its internal/release declares)")
	out := fset.String("out", "", "the proxy's directory (GOPROXY=file://<it>); made if missing")
	if err := fset.Parse(args); err != nil {
		return err
	}
	if *out == "" || fset.NArg() > 0 {
		return errors.New("usage: kitproxy [-kit DIR] [-version vX.Y.Z] -out DIR")
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
	if *version == "" {
		if *version, err = declaredVersion(kitDir); err != nil {
			return err
		}
	}
	if !semver.IsValid(*version) || semver.Canonical(*version) != *version || semver.Build(*version) != "" {
		return fmt.Errorf("-version %q: want a canonical semantic version like v0.2.0", *version)
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
	served, err := serve(proxyDir, kitDir, mod, *version)
	if err != nil {
		return err
	}
	fmt.Printf("%s@%s %s in %s\n", mod, *version, served, *out)
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
		return "", fmt.Errorf("no -version, and %w", err)
	}
	m := regexp.MustCompile(`(?m)^const Version = "([^"]+)"`).FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("no -version, and %s/internal/release/release.go declares no Version", kitDir.Name())
	}
	return string(m[1]), nil
}

// serve writes the version into the proxy directory, or finds it there with
// the same content; it says which.
func serve(proxyDir, kitDir *os.Root, mod, version string) (string, error) {
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
	archive, err := zipModule(kitDir, mod+"@"+version)
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

// zipModule zips the kit as the module zip of prefix (module@version): every
// regular file under it, in a stable order with a fixed time (the same tree
// zips to the same bytes), leaving out what the go command leaves out of a
// module: version-control directories, nested modules, vendor directories,
// symbolic links and other special files.
func zipModule(kitDir *os.Root, prefix string) ([]byte, error) {
	var files []string
	err := fs.WalkDir(kitDir.FS(), ".", func(rel string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if rel == "." {
				return nil
			}
			switch d.Name() {
			case ".git", ".hg", ".svn", ".bzr", "vendor":
				return fs.SkipDir
			}
			if _, err := kitDir.Stat(path.Join(rel, "go.mod")); err == nil {
				return fs.SkipDir // a module of its own
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if err := module.CheckFilePath(rel); err != nil {
			return fmt.Errorf("%s cannot be in a module: %w", rel, err)
		}
		files = append(files, rel)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(files)
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
