package e2e_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Every script the repository tracks with a #! line is executable in git, so
// that a clone runs it as the docs write it (scripts/up.sh, not bash
// scripts/up.sh); a file without one is sourced and needs no exec bit.
func TestScriptsWithAShebangAreExecutable(t *testing.T) {
	out, err := exec.Command("git", "-C", "../..", "ls-files", "-s").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// <mode> <object> <stage>\t<path>
		meta, path, ok := strings.Cut(sc.Text(), "\t")
		if !ok || !strings.HasPrefix(meta, "100644 ") {
			continue
		}
		head := make([]byte, 2)
		f, err := os.Open("../../" + path)
		if err != nil {
			continue // deleted in the work tree
		}
		n, _ := f.Read(head)
		f.Close()
		if n == 2 && string(head) == "#!" {
			t.Errorf("%s starts with #! but git has it as 100644: git update-index --chmod=+x %s", path, path)
		}
	}
}
