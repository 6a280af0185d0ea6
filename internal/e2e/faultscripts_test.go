package e2e_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inbox-template/payment-service/kit/kittest"
)

// The fault scripts sum a metric over its samples whose labels include the
// ones they name: database-restart.sh asks for the payment service's pauses
// of every cause. (It matched the whole series text, so a metric with more
// labels than named, consumer_pauses_total{cause,consumer}, summed to 0.)
func TestFaultScriptsSumAMetricOverItsLabels(t *testing.T) {
	page := `# HELP consumer_pauses_total Pauses.
consumer_pauses_total{cause="database",consumer="payment-service"} 3
consumer_pauses_total{cause="handler_failing",consumer="payment-service"} 2
consumer_pauses_total{cause="database",consumer="shipping-service"} 7
consumer_pauses_totals{consumer="payment-service"} 9
consumer_messages_total{consumer="payment-service",outcome="retried"} 4
consumer_messages_total{consumer="payment-service",outcome="duplicate"} 1e+01
`
	for series, want := range map[string]string{
		`consumer_pauses_total{consumer="payment-service"}`:                     "5",
		`consumer_pauses_total`:                                                 "12",
		`consumer_messages_total{consumer="payment-service",outcome="retried"}`: "4",
		`consumer_messages_total{outcome="duplicate"}`:                          "10",
		`consumer_reconnects_total{consumer="payment-service"}`:                 "0",
	} {
		cmd := exec.Command("bash", "-c", `source ../../scripts/lib.sh && series_sum "$1"`, "bash", series)
		cmd.Stdin = strings.NewReader(page)
		out, err := cmd.CombinedOutput()
		if got := strings.TrimSpace(string(out)); err != nil || got != want {
			t.Errorf("series_sum %s = %q (%v), want %s", series, got, err, want)
		}
	}
}

// faults-cleanup.sh removes the leftovers of a dead local-mode run under
// TEST_NAME_PREFIX only: a vhost and a database of another prefix (another
// team's suite on the same servers) stay. (It matched t_ alone, so a run
// under another prefix left its leftovers behind, and a cleanup under t
// could reach into another suite's names had they begun with t.)
func TestFaultsCleanupRemovesItsOwnPrefixOnly(t *testing.T) {
	// A process id above the kernel's pid_max: no process has it, now or
	// later (that of a process that ended could be given to a new one
	// before the script asks, and its leftovers would count as alive).
	raw, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	pidMax, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	pid := pidMax + 1
	admin := os.Getenv(kittest.PostgresEnv)
	if admin == "" {
		admin = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	mine, other := randomPrefix(t), randomPrefix(t)
	name := func(prefix string) string { return fmt.Sprintf("%s_faults%d_a", prefix, pid) }
	for _, p := range []string{mine, other} {
		kittest.Ctl(t, "add_vhost", name(p))
		execSQL(t, admin, "CREATE DATABASE "+name(p))
	}
	t.Cleanup(func() {
		for _, p := range []string{mine, other} {
			if strings.Contains(kittest.Ctl(t, "-q", "list_vhosts", "name"), name(p)) {
				kittest.Ctl(t, "delete_vhost", name(p))
			}
			execSQL(t, admin, "DROP DATABASE IF EXISTS "+name(p)+" WITH (FORCE)")
		}
	})

	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "../../scripts/faults-cleanup.sh")
	password, _ := u.User.Password()
	cmd.Env = append(os.Environ(), "TEST_NAME_PREFIX="+mine, "PGHOST="+u.Hostname(), "PGPORT="+cmp.Or(u.Port(), "5432"),
		"PGUSER="+u.User.Username(), "PGPASSWORD="+password, "RABBITMQCTL="+cmp.Or(os.Getenv(kittest.CtlEnv), "rabbitmqctl"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("faults-cleanup.sh: %v\n%s", err, out)
	}
	for _, want := range []string{"deleted vhost " + name(mine), "dropped database " + name(mine)} {
		if !strings.Contains(string(out), want) {
			t.Errorf("faults-cleanup.sh under TEST_NAME_PREFIX=%s did not say %q:\n%s", mine, want, out)
		}
	}
	vhosts := kittest.Ctl(t, "-q", "list_vhosts", "name")
	if strings.Contains(vhosts, name(mine)) {
		t.Errorf("vhost %s is still there after the cleanup of its prefix", name(mine))
	}
	if !strings.Contains(vhosts, name(other)) {
		t.Errorf("vhost %s, of another prefix, was removed", name(other))
	}
	if n := scalar(t, admin, "SELECT count(*) FROM pg_database WHERE datname = '"+name(other)+"'"); n != 1 {
		t.Errorf("database %s, of another prefix, was dropped", name(other))
	}
	if n := scalar(t, admin, "SELECT count(*) FROM pg_database WHERE datname = '"+name(mine)+"'"); n != 0 {
		t.Errorf("database %s is still there after the cleanup of its prefix", name(mine))
	}
}

// randomPrefix is a TEST_NAME_PREFIX no other run uses.
func randomPrefix(t *testing.T) string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "x" + hex.EncodeToString(b)
}

// execSQL runs one statement on the database at url, on a session of its own.
func execSQL(t *testing.T, url, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}
