package testenv

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeCtl puts a rabbitmqctl and an erl_call first on PATH that answer as
// the cluster's nodes do. The liveness check (erl_call: the node's boot
// state) of node 1 passes the first time, and after that fails if node1Dies
// (another test's fault round killed it between the check and the call) and
// passes if not (the command's own failure); node 1's rabbitmqctl fails
// every command with rc. Node 2 is up and answers. Each rabbitmqctl call is
// appended to the returned file.
func fakeCtl(t *testing.T, rc string, node1Dies bool) (calls string) {
	dir := t.TempDir()
	calls = filepath.Join(dir, "calls")
	later := "echo ready"
	if node1Dies {
		later = "exit 1"
	}
	ctl := `#!/bin/bash
node=$3; shift 3
echo "$node $*" >>` + calls + `
case "$node" in
  cluster1@localhost) echo "refused by $node" >&2; exit ` + rc + ` ;;
  cluster2@localhost) echo "answered by $node: $*"; exit 0 ;;
esac
exit 1
`
	erlCall := `#!/bin/bash
while (($#)); do [[ $1 == -n ]] && node=$2; shift; done
case "$node" in
  cluster1@localhost)
    if [[ -e ` + dir + `/checked ]]; then ` + later + `; exit 0; fi
    touch ` + dir + `/checked; echo ready ;;
  cluster2@localhost) echo ready ;;
  *) echo "erl_call: failed to connect to node $node" >&2; exit 1 ;;
esac
`
	for name, body := range map[string]string{"rabbitmqctl": ctl, "erl_call": erlCall} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
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

// The leader of a queue comes from the first live node (erl_call, faked
// here: node 1 is down, node 2 answers): its node's number, 0 where no
// running node leads it or the queue does not exist; an error fails.
func TestClusterLeaderIsTheNumberOfTheNodeThatLeads(t *testing.T) {
	dir := t.TempDir()
	erlCall := `#!/bin/bash
while (($#)); do case $1 in -n) node=$2 ;; -a) call=$2 ;; -e) expr=$(cat) ;; esac; shift; done
[[ $node == cluster2@localhost ]] || { echo "erl_call: failed to connect to node $node" >&2; exit 1; }
[[ -n ${call:-} ]] && { echo ready; exit 0; }
case "$expr" in
  *'<<"v">>, queue, <<"led">>'*) echo '{ok, {leader, cluster3@localhost}}' ;;
  *'<<"v">>, queue, <<"unled">>'*) echo "{ok, {leader, ''}}" ;;
  *'<<"v">>, queue, <<"gone">>'*) echo '{ok, not_found}' ;;
  *) echo '{error, "*** eval: undef"}' ;;
esac
`
	if err := os.WriteFile(filepath.Join(dir, "erl_call"), []byte(erlCall), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	c := &Cluster{t: t, script: clusterScript(t), vhost: "v"}
	if n := c.Leader("led"); n != 3 {
		t.Errorf("Leader(led) = %d, want 3", n)
	}
	for _, q := range []string{"unled", "gone"} { // its leader's node down; no such queue
		if n := c.Leader(q); n != 0 {
			t.Errorf("Leader(%s) = %d, want 0", q, n)
		}
	}
	if out, err := exec.Command("bash", clusterScript(t), "leader", "v", "broken").CombinedOutput(); err == nil || !strings.Contains(string(out), "node 2 answered {error") {
		t.Errorf("leader answered with an error: %v, %s; want it to fail with the answer", err, out)
	}
	if out, err := exec.Command("bash", clusterScript(t), "leader", "v", `a"b`).CombinedOutput(); err == nil || !strings.Contains(string(out), "must be names of") {
		t.Errorf("leader of a queue named with a quote: %v, %s; want it refused", err, out)
	}
}
