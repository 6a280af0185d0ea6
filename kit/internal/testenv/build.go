package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Build builds the main packages pkgs names (as go build takes them,
// relative to the test's package: "../../cmd/...", say) and returns a
// directory of this test binary's own that holds the programs; RunMain
// removes it.
//
// The build goes to a directory of the machine's temporary one that
// outlives the test binary: go build compares a binary's build ID with what
// it would build and links again only what changed, so the next test binary
// that builds the same programs (CI runs the end-to-end package seven
// times) finds them up to date, where each run linked all six programs of
// cmd/ anew (about a second of CPU each). That directory is a cache, never
// run from: under a lock, the build's binaries are linked (hard links) into
// the test binary's own directory, so that another build of the same
// packages (a second run from the same checkout, with other code) cannot
// change a program under a test that runs it. A binary the build did not
// make or touch (a program since removed from pkgs) is deleted from the
// cache, not handed on.
//
// The cache is kit-programs-<uid>/<the package's name>-<a hash of the
// test's directory and pkgs>, private to the user (0700); one unused for a
// day is removed. Where that directory is not private (another user's), the
// programs are built into the test binary's own directory alone.
func Build(pkgs string) (string, error) {
	cache, err := cacheDir(pkgs)
	if err != nil {
		return "", err
	}
	// The test binary's own directory: beside the caches, where a test
	// binary that ended without RunMain (a crash, a panic at its -timeout)
	// leaves it to be pruned with them.
	parent := ""
	if cache != "" {
		parent = filepath.Dir(cache)
	}
	own, err := os.MkdirTemp(parent, ".own-")
	if err != nil {
		return "", err
	}
	buildMu.Lock()
	buildDirs = append(buildDirs, own)
	buildMu.Unlock()
	if cache == "" {
		return own, goBuild(own, pkgs)
	}
	lock, err := os.OpenFile(cache+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	// A prune may have removed the cache while this waited for its lock.
	if err := os.Mkdir(cache, 0o700); err != nil && !os.IsExist(err) {
		return "", err
	}
	// go build touches a binary it finds up to date: what it made or kept
	// is no older than the build.
	began := time.Now().Add(-time.Second)
	if err := goBuild(cache, pkgs); err != nil {
		return "", err
	}
	entries, err := os.ReadDir(cache)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		from := filepath.Join(cache, e.Name())
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if fi.ModTime().Before(began) {
			_ = os.Remove(from) // a program no longer built from pkgs
			continue
		}
		if err := linkOrCopy(from, filepath.Join(own, e.Name())); err != nil {
			return "", err
		}
	}
	now := time.Now()
	_ = os.Chtimes(cache, now, now)
	pruneCaches(filepath.Dir(cache), now.Add(-24*time.Hour))
	return own, nil
}

var (
	buildMu   sync.Mutex
	buildDirs []string // the test binary's own program directories, which RunMain removes
)

func goBuild(dir, pkgs string) error {
	cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator), pkgs) // #nosec G204 -- the test's own packages
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkgs, err, out)
	}
	return nil
}

// cacheDir is Build's cache for pkgs, made if it is missing; "" where the
// user's directory for it is not private.
func cacheDir(pkgs string) (string, error) {
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
		return "", nil
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

// linkOrCopy makes to the same file as from: a hard link, or a copy where
// the link is refused.
func linkOrCopy(from, to string) error {
	if os.Link(from, to) == nil {
		return nil
	}
	src, err := os.Open(from) // #nosec G304 -- a binary of the build's cache
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o700) // #nosec G302 -- a program, run by its owner
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// pruneCaches removes the caches of root unused since before (a checkout
// gone, a generated project's test directory), each under its lock, taken
// without waiting: one in use is left. The lock files stay (one removed
// while another process waits on it would let a third lock a new one and
// build beside it). A test binary's own directory (.own-…) as old is left
// from one that ended without RunMain: removed too.
func pruneCaches(root string, before time.Time) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil || !e.IsDir() || !fi.ModTime().Before(before) {
			continue
		}
		dir := filepath.Join(root, e.Name())
		if strings.HasPrefix(e.Name(), ".own-") {
			_ = os.RemoveAll(dir)
			continue
		}
		lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			continue
		}
		if syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			_ = os.RemoveAll(dir)
		}
		lock.Close()
	}
}
