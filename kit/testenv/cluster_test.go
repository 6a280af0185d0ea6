package testenv

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeCtl puts a rabbitmqctl first on PATH that answers as the cluster's
// nodes do: node 1 passes its first liveness check (await_startup), then
// fails every command with rc; after that, its liveness checks fail if
// node1Dies (another test's fault round killed it between the check and
// the call) and pass if not (the command's own failure). Node 2 answers.
// Each call is appended to the returned file.
func fakeCtl(t *testing.T, rc string, node1Dies bool) (calls string) {
	dir := t.TempDir()
	calls = filepath.Join(dir, "calls")
	later := "0"
	if node1Dies {
		later = "69"
	}
	stub := `#!/bin/bash
node=$3; shift 3
echo "$node $*" >>` + calls + `
case "$node:$1" in
  cluster1@localhost:await_startup)
    [[ -e ` + dir + `/checked ]] && exit ` + later + `
    touch ` + dir + `/checked; exit 0 ;;
  cluster1@localhost:*) echo "refused by $node" >&2; exit ` + rc + ` ;;
  cluster2@localhost:*) echo "answered by $node: $*"; exit 0 ;;
esac
exit 1
`
	if err := os.WriteFile(filepath.Join(dir, "rabbitmqctl"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("CLUSTER_NICE", "0")
	t.Setenv("TMPDIR", t.TempDir()) // where ctl's stderr file is made, and must be gone from
	return calls
}

func TestClusterCtlGoesOnToTheNextNodeWhenItsNodeDiedAfterTheCheck(t *testing.T) {
	fakeCtl(t, "69", true) // 69: the node is unavailable
	c := &Cluster{t: t, script: clusterScript(t)}
	out := c.Ctl("add_vhost", "v")
	if !strings.Contains(out, "answered by cluster2@localhost: add_vhost v") || !strings.Contains(out, "node 1 went down during the call") {
		t.Fatalf("ctl printed %q, want node 2's answer and why node 1's was not taken", out)
	}
	assertNoFilesLeft(t)
}

func TestClusterCtlEndsOnTheCommandsOwnFailure(t *testing.T) {
	for _, rc := range []string{"65", "69"} { // 65: a vhost that does not exist; 69: also the CLI's generic error
		t.Run(rc, func(t *testing.T) {
			calls := fakeCtl(t, rc, false)
			out, err := exec.Command("bash", clusterScript(t), "ctl", "delete_vhost", "v").CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != map[string]int{"65": 65, "69": 69}[rc] {
				t.Fatalf("ctl: %v, want exit status %s\n%s", err, rc, out)
			}
			if got := strings.TrimSpace(string(out)); got != "refused by cluster1@localhost" {
				t.Fatalf("ctl printed %q, want node 1's refusal alone", got)
			}
			if b, _ := os.ReadFile(calls); strings.Contains(string(b), "cluster2") {
				t.Fatalf("ctl went on to node 2 while node 1 was up:\n%s", b)
			}
			assertNoFilesLeft(t)
		})
	}
}

func assertNoFilesLeft(t *testing.T) {
	t.Helper()
	if left, _ := os.ReadDir(os.Getenv("TMPDIR")); len(left) > 0 {
		t.Fatalf("ctl left %d files in TMPDIR", len(left))
	}
}
