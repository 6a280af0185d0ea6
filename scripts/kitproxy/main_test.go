package main

import (
	"archive/zip"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A version is written once: the same tree again changes nothing, another
// tree under the same version is refused, and the list keeps every version
// in semantic order. The zip holds the module's files under module@version/,
// without a nested module's.
func TestServeWritesAVersionOnce(t *testing.T) {
	kit := t.TempDir()
	write(t, kit, "go.mod", "module example.com/kit\n\ngo 1.26\n")
	write(t, kit, "internal/release/release.go", "package release\n\nconst Version = \"v0.9.0\"\n")
	write(t, kit, "nested/go.mod", "module example.com/kit/nested\n")
	write(t, kit, "nested/x.go", "package nested\n")
	out := t.TempDir()

	if err := run([]string{"-kit", kit, "-out", out}); err != nil {
		t.Fatalf("serving v0.9.0: %v", err)
	}
	write(t, kit, "internal/release/release.go", "package release\n\nconst Version = \"v0.10.0\"\n")
	if err := run([]string{"-kit", kit, "-out", out}); err != nil {
		t.Fatalf("serving v0.10.0: %v", err)
	}
	if err := run([]string{"-kit", kit, "-out", out}); err != nil {
		t.Errorf("serving the same tree again: %v, want nothing done", err)
	}
	write(t, kit, "internal/release/release.go", "package release\n\nconst Version = \"v0.10.0\" // changed\n")
	if err := run([]string{"-kit", kit, "-out", out}); err == nil || !strings.Contains(err.Error(), "already served") {
		t.Errorf("serving other content as v0.10.0: %v, want a refusal", err)
	}
	// v2 and later need /v2 in the module path; a version that is not
	// canonical is refused.
	for _, bad := range []string{"v2.0.0", "v0.11", "0.11.0", "v0.11.0+meta"} {
		write(t, kit, "internal/release/release.go", "package release\n\nconst Version = \""+bad+"\"\n")
		if err := run([]string{"-kit", kit, "-out", out}); err == nil {
			t.Errorf("Version %s served", bad)
		}
	}

	vdir := filepath.Join(out, "example.com", "kit", "@v")
	list, err := os.ReadFile(filepath.Join(vdir, "list"))
	if err != nil || string(list) != "v0.9.0\nv0.10.0\n" {
		t.Errorf("list = %q (%v), want v0.9.0 then v0.10.0", list, err)
	}
	if got, want := zipNames(t, filepath.Join(vdir, "v0.10.0.zip")), []string{"example.com/kit@v0.10.0/go.mod", "example.com/kit@v0.10.0/internal/release/release.go"}; !slices.Equal(got, want) {
		t.Errorf("the zip holds %q, want %q", got, want)
	}
	if mod, err := os.ReadFile(filepath.Join(vdir, "v0.10.0.mod")); err != nil || !strings.HasPrefix(string(mod), "module example.com/kit\n") {
		t.Errorf("v0.10.0.mod = %q (%v)", mod, err)
	}
}

// In a git checkout the zip holds what git tracks, as a tag would: an
// ignored or untracked file (an .env, a test binary) stays out.
func TestServeTakesWhatGitTracks(t *testing.T) {
	repo := t.TempDir()
	kit := filepath.Join(repo, "kit")
	write(t, kit, "go.mod", "module example.com/kit\n\ngo 1.26\n")
	write(t, kit, "internal/release/release.go", "package release\n\nconst Version = \"v0.1.0\"\n")
	write(t, repo, ".gitignore", ".env\n")
	if out, err := exec.Command("git", "-C", repo, "init", "-q").CombinedOutput(); err != nil {
		t.Fatalf("git init: %v\n%s", err, out)
	}
	// A kit git does not track yet is refused, not served empty.
	if err := run([]string{"-kit", kit, "-out", t.TempDir()}); err == nil || !strings.Contains(err.Error(), "git must track the kit") {
		t.Errorf("a kit git does not track: %v, want a refusal", err)
	}
	for _, args := range [][]string{{"add", "."}, {"-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "kit"}} {
		if out, err := exec.Command("git", append([]string{"-C", repo}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	write(t, kit, ".env", "SECRET=1\n")
	write(t, kit, "consumer.test", "a binary\n")
	out := t.TempDir()
	if err := run([]string{"-kit", kit, "-out", out}); err != nil {
		t.Fatal(err)
	}
	got := zipNames(t, filepath.Join(out, "example.com", "kit", "@v", "v0.1.0.zip"))
	if want := []string{"example.com/kit@v0.1.0/go.mod", "example.com/kit@v0.1.0/internal/release/release.go"}; !slices.Equal(got, want) {
		t.Errorf("the zip holds %q, want %q", got, want)
	}
	// Without git, a checkout's files are not listed by walking the tree
	// (the ignored .env would go in): refused.
	t.Setenv("PATH", t.TempDir())
	if err := run([]string{"-kit", kit, "-out", t.TempDir()}); err == nil || !strings.Contains(err.Error(), "git ls-files there failed") {
		t.Errorf("a checkout with no git to list it: %v, want a refusal", err)
	}
}

func zipNames(t *testing.T, name string) []string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range zr.File {
		names = append(names, f.Name)
	}
	return names
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
