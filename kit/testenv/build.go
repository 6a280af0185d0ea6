package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// Build builds the main packages pkgs names (as go build takes them,
// relative to the test's package: "../../cmd/...", say) into a directory
// of the machine's temporary one that outlives the test binary, and returns
// that directory. The binaries stay there between runs on purpose: go build
// compares a binary's build ID with what it would build and links again only
// what changed, so the next test binary that builds the same programs (the
// suite runs the end-to-end package under five build tags and settings)
// finds them up to date. A link is about a second of CPU a program; a run of
// CI built the same programs over 40 times.
//
// The directory is kit-programs-<uid>/<a hash of the test's directory and
// pkgs>, private to the user (0700); one that another user owns is not
// used: the programs go to a new temporary directory then.
func Build(pkgs string) (string, error) {
	dir, err := buildDir(pkgs)
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator), pkgs) // #nosec G204 -- the test's own packages
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkgs, err, out)
	}
	return dir, nil
}

// buildDir is Build's directory for pkgs, made if it is missing.
func buildDir(pkgs string) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(wd + "\x00" + pkgs))
	root := filepath.Join(os.TempDir(), fmt.Sprintf("kit-programs-%d", os.Getuid()))
	if err := os.Mkdir(root, 0o700); err != nil && !os.IsExist(err) {
		return "", err
	}
	if !private(root) {
		return os.MkdirTemp("", "programs-")
	}
	dir := filepath.Join(root, strings.TrimRight(filepath.Base(filepath.Clean(strings.TrimSuffix(pkgs, "/..."))), ".")+"-"+hex.EncodeToString(sum[:8]))
	if err := os.Mkdir(dir, 0o700); err != nil && !os.IsExist(err) {
		return "", err
	}
	return dir, nil
}

// private reports whether dir is a directory (not a link) that this user
// owns and no one else may write to.
func private(dir string) bool {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o022 != 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Getuid()
}
