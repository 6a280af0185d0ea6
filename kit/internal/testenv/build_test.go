package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// The second build of a program finds the first one's binary up to date
// and keeps it: no link again. Each build hands its test binary a
// directory of its own (links to the cache's binaries).
func TestBuildTwiceLinksOnce(t *testing.T) {
	first, err := Build("./testdata/hello")
	if err != nil {
		t.Fatal(err)
	}
	// An hour old: the second build hands it on only if go build touches
	// what it finds up to date (what it did not touch is stale to Build).
	cache, err := cacheDir("./testdata/hello")
	if err != nil {
		t.Fatal(err)
	}
	hour := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(cache, "hello"), hour, hour); err != nil {
		t.Fatal(err)
	}
	second, err := Build("./testdata/hello")
	if err != nil {
		t.Fatal(err)
	}
	if first == second {
		t.Fatalf("both builds handed out %s: a build of other code would change the first one's program", first)
	}
	a, err := os.Stat(filepath.Join(first, "hello"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.Stat(filepath.Join(second, "hello"))
	if err != nil {
		t.Fatal(err)
	}
	// A link ends in a rename of its output over the cache's binary: a new
	// file. (An up-to-date binary is only touched.)
	if !os.SameFile(a, b) {
		t.Errorf("the second build's program is another file: it linked again")
	}
	out, err := exec.Command(filepath.Join(second, "hello")).Output()
	if err != nil || string(out) != "hello\n" {
		t.Errorf("the program printed %q (%v), want hello", out, err)
	}
}

// A binary in the cache that the build did not make (a program removed from
// the packages since) is not handed on, and leaves the cache.
func TestBuildHandsOnOnlyWhatItBuilt(t *testing.T) {
	cache, err := cacheDir("./testdata/hello")
	if err != nil || cache == "" {
		t.Fatalf("cache %q: %v", cache, err)
	}
	stale := filepath.Join(cache, "removed-program")
	if err := os.WriteFile(stale, []byte("#!/bin/sh\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	dir, err := Build("./testdata/hello")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "removed-program")); !os.IsNotExist(err) {
		t.Errorf("a program the build did not make was handed on (%v)", err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("a program the build did not make stayed in the cache (%v)", err)
	}
}

// A directory that others may write to is not used for the programs.
func TestBuildRefusesADirectoryOthersMayWrite(t *testing.T) {
	dir := t.TempDir()
	if !private(dir) {
		t.Fatalf("%s (0700, ours) is not private", dir)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if private(dir) {
		t.Errorf("%s is writable by all, and private says it is private", dir)
	}
}

// A cache unused for longer than the limit is removed, one in use kept.
func TestPruneCachesRemovesOnlyTheUnused(t *testing.T) {
	root := t.TempDir()
	old, oldOwn, fresh := filepath.Join(root, "old-1"), filepath.Join(root, ".own-2"), filepath.Join(root, "fresh-3")
	for _, d := range []string{old, oldOwn, fresh} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	day := time.Now().Add(-25 * time.Hour)
	for _, d := range []string{old, oldOwn} {
		if err := os.Chtimes(d, day, day); err != nil {
			t.Fatal(err)
		}
	}
	pruneCaches(root, time.Now().Add(-24*time.Hour))
	for _, d := range []string{old, oldOwn} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s, unused for a day, is still there (%v)", d, err)
		}
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("the cache in use was removed: %v", err)
	}
}
