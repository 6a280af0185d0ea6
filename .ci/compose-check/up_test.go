package composecheck

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// stubDocker answers as the docker CLI would on a machine described by the
// environment: STUB_INFO_RC is the exit status of `docker info`,
// STUB_COMPOSE_VERSION the line `docker compose version` prints (exit
// STUB_COMPOSE_RC). Every image is present; `compose config` names one; `compose
// up` fails. Any other call fails loudly, so a script that goes further than
// the test meant stops there, saying so.
const stubDocker = `#!/bin/sh
case "$1" in
  info) exit "${STUB_INFO_RC:-0}" ;;
  image) [ "$2" = inspect ] && exit 0 ;;
  compose)
    for a in "$@"; do
      case $a in
        version) echo "$STUB_COMPOSE_VERSION"; exit "${STUB_COMPOSE_RC:-0}" ;;
        config) printf 'services:\n  postgres:\n    image: postgres:17\n'; exit 0 ;;
        up) echo "stub docker: compose up failed: no engine behind this stub" >&2; exit 17 ;;
      esac
    done ;;
esac
echo "stub docker: unexpected call: docker $*" >&2
exit 97
`

// up runs scripts/up.sh with PATH set to path (a stub docker first, the
// system's tools after) and env added; it returns the exit status and stderr.
func up(t *testing.T, path string, env ...string) (int, string) {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bash, repoRoot+"/scripts/up.sh")
	cmd.Env = append([]string{"PATH=" + path, "HOME=" + t.TempDir()}, env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stderr.String()
	}
	t.Fatalf("up.sh: %v", err)
	return 0, ""
}

// Every refusal of `make up` says why, on a line of its own: none ends the
// script silently under set -e. A Compose plugin built from source says its
// version is "dev": it cannot be checked, so up.sh goes on with a warning.
func TestUpSaysWhyItStops(t *testing.T) {
	stub := t.TempDir()
	if err := os.WriteFile(filepath.Join(stub, "docker"), []byte(stubDocker), 0o755); err != nil {
		t.Fatal(err)
	}
	// Only what up.sh needs before it looks for docker: no docker at all.
	bare := t.TempDir()
	dirname, err := exec.LookPath("dirname")
	if err != nil {
		t.Skip("no dirname")
	}
	if err := os.Symlink(dirname, filepath.Join(bare, "dirname")); err != nil {
		t.Fatal(err)
	}
	withStub := stub + ":/usr/bin:/bin"
	for _, tc := range []struct {
		name     string
		path     string
		env      []string
		wantCode int
		want     []string // lines or parts of lines of stderr
	}{
		{"no docker", bare, nil, 2, []string{"make up: no docker command"}},
		{"engine down", withStub, []string{"STUB_INFO_RC=1"}, 2, []string{"make up: the Docker engine does not answer"}},
		{"no plugin", withStub, []string{"STUB_COMPOSE_RC=1"}, 2, []string{"make up: the Compose v2 plugin is missing"}},
		{"old plugin", withStub, []string{"STUB_COMPOSE_VERSION=Docker Compose version v2.12.2"}, 2,
			[]string{"make up: Compose 2.12.2 is too old"}},
		{"plugin built from source", withStub, []string{"STUB_COMPOSE_VERSION=Docker Compose version dev"}, 1,
			[]string{`make up: warning: Compose says its version is "Docker Compose version dev"`, "make up: docker compose up --build --wait failed"}},
		{"no version at all", withStub, []string{"STUB_COMPOSE_VERSION="}, 1,
			[]string{"make up: warning: Compose says no version", "make up: docker compose up --build --wait failed"}},
		{"up fails", withStub, []string{"STUB_COMPOSE_VERSION=Docker Compose version v2.40.3"}, 1,
			[]string{"stub docker: compose up failed", "make up: docker compose up --build --wait failed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stderr := up(t, tc.path, tc.env...)
			if code != tc.wantCode {
				t.Errorf("exit %d, want %d", code, tc.wantCode)
			}
			for _, want := range tc.want {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr lacks %q", want)
				}
			}
			if strings.Contains(stderr, "unexpected call") {
				t.Errorf("up.sh went further than the test meant")
			}
			if t.Failed() {
				t.Logf("stderr:\n%s", stderr)
			}
		})
	}
}
