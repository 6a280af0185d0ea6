package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The second build of a program finds the first one's binary up to date
// and keeps it: no link again.
func TestBuildTwiceLinksOnce(t *testing.T) {
	dir, err := Build("./testdata/hello")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "hello")
	first, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Build("./testdata/hello")
	if err != nil {
		t.Fatal(err)
	}
	if again != dir {
		t.Fatalf("built into %s, then into %s", dir, again)
	}
	second, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	// A link ends in a rename of its output over the binary: a new file.
	// (An up-to-date binary is only touched.)
	if !os.SameFile(first, second) {
		t.Errorf("the second build replaced the binary: it linked again")
	}
	out, err := exec.Command(bin).Output()
	if err != nil || string(out) != "hello\n" {
		t.Errorf("the binary printed %q (%v), want hello", out, err)
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
