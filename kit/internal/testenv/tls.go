package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Certs are a test's certificate authority and a server certificate it
// signed, for DNS names only (no IP address: a client that dials an address
// the certificate does not name must refuse it), as PEM files in Dir.
type Certs struct {
	Dir               string
	CAFile            string // the CA that signed the server certificate
	OtherCAFile       string // a CA that signed nothing here
	CertFile, KeyFile string // the server's
	// ClientCert and ClientKey are a client certificate of the CA, for the
	// user postgres (PostgreSQL's clientcert=verify-full matches its name).
	ClientCert, ClientKey string
}

// NewCerts makes a CA, a server certificate for names, a client certificate
// and an unrelated CA, in a directory removed when the test ends.
func NewCerts(t testing.TB, names ...string) Certs {
	t.Helper()
	dir := t.TempDir()
	c := Certs{Dir: dir, CAFile: filepath.Join(dir, "ca.pem"), OtherCAFile: filepath.Join(dir, "other-ca.pem"),
		CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client-key.pem")}
	ca, caKey := newCert(t, "test CA", nil, nil, nil, true)
	writePEM(t, c.CAFile, "CERTIFICATE", ca.Raw)
	other, _ := newCert(t, "another CA", nil, nil, nil, true)
	writePEM(t, c.OtherCAFile, "CERTIFICATE", other.Raw)
	srv, srvKey := newCert(t, names[0], names, ca, caKey, false)
	writePEM(t, c.CertFile, "CERTIFICATE", srv.Raw)
	writeKey(t, c.KeyFile, srvKey)
	cli, cliKey := newCert(t, "postgres", nil, ca, caKey, false)
	writePEM(t, c.ClientCert, "CERTIFICATE", cli.Raw)
	writeKey(t, c.ClientKey, cliKey)
	return c
}

func newCert(t testing.TB, cn string, dns []string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, isCA bool) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if isCA {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
		tmpl.ExtKeyUsage = nil
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
}

func writeKey(t testing.TB, path string, key *ecdsa.PrivateKey) {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// copyServerFiles copies the CA and the server's certificate and key into
// dir, private, under their own names: a server reads a key only from a file
// of its own user's.
func (c Certs) copyServerFiles(t testing.TB, dir string) {
	t.Helper()
	for _, f := range []string{c.CAFile, c.CertFile, c.KeyFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// StartTLSPostgres runs a PostgreSQL of the test's own (initdb in a
// temporary directory, the machine's server binaries, a free port on
// 127.0.0.1) with ssl=on and c's server certificate, TLS connections only
// (hostssl) with trust authentication,
// and stops it when the test ends. As root it runs as the postgres user. It
// returns the port. The machine's PostgreSQL is not touched.
func StartTLSPostgres(t testing.TB, c Certs) int {
	t.Helper()
	bin := postgresBin(t)
	dir, err := os.MkdirTemp("", "tls-postgres-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	run := func(args ...string) {
		t.Helper()
		cmd := asPostgres(t, dir, args...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// The server reads its key only if it is its owner's and private.
	c.copyServerFiles(t, dir)
	chownToPostgres(t, dir)
	data := filepath.Join(dir, "data")
	run(filepath.Join(bin, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
	// TCP with TLS only, and a client certificate of the CA for the user:
	// a plaintext client, or one without a certificate, is refused.
	hba := "local all all trust\nhostssl all all 127.0.0.1/32 trust clientcert=verify-full\nhostssl all all ::1/128 trust clientcert=verify-full\n"
	if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	chownToPostgres(t, data)
	port := freePort(t)
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -c unix_socket_directories=%s -c ssl=on -c ssl_cert_file=%s -c ssl_key_file=%s -c ssl_ca_file=%s -c fsync=off",
		port, dir, filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"), filepath.Join(dir, "ca.pem"))
	run(filepath.Join(bin, "pg_ctl"), "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "-t", "60", "start")
	t.Cleanup(func() {
		_ = asPostgres(t, dir, filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop").Run()
	})
	return port
}

func postgresBin(t testing.TB) string {
	t.Helper()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(dirs) == 0 {
		t.Fatal("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin: install Debian's postgresql")
	}
	return filepath.Dir(dirs[len(dirs)-1])
}

// asPostgres runs a server command as the postgres user when the test runs
// as root (initdb and the server refuse root).
func asPostgres(t testing.TB, dir string, args ...string) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		return exec.Command(args[0], args[1:]...) // #nosec G204 -- the machine's server binaries
	}
	cmd := exec.Command("runuser", append([]string{"-u", "postgres", "--"}, args...)...) // #nosec G204 -- as above
	cmd.Dir = dir
	return cmd
}

func chownToPostgres(t testing.TB, dir string) { chownTo(t, dir, "postgres") }

// chownTo gives dir and what it holds to the system user name, when the
// test runs as root (the servers run as their own users).
func chownTo(t testing.TB, dir, name string) {
	t.Helper()
	if os.Geteuid() != 0 {
		return
	}
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatalf("running as root, the server must run as %s: %v", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	err = filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(p, uid, gid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// rabbitmqctl is the machine's CLI (Debian's wrapper runs it as the
// rabbitmq user, with the nodes' cookie), or TEST_RABBITMQCTL's.
func rabbitmqctl() string {
	if c := os.Getenv(CtlEnv); c != "" {
		return strings.Fields(c)[0]
	}
	return "rabbitmqctl"
}

// TLSBroker is a RabbitMQ node of the test's own with a TLS listener.
type TLSBroker struct {
	Node    string // its Erlang node name, for rabbitmqctl -n
	TLSPort int    // amqps, on 127.0.0.1, c's server certificate
}

// StartTLSRabbitMQ runs a RabbitMQ node of the test's own (the machine's
// server, its own node name, ports, data and configuration, no plugins)
// with a TLS listener on 127.0.0.1 that presents c's server certificate and
// requires a client certificate of c's CA, a
// user and a password of the test's, and stops it when the test ends. It
// needs root, as scripts/cluster.sh does, and fails without it. The
// machine's broker is not touched.
func StartTLSRabbitMQ(t testing.TB, c Certs, user, password string) TLSBroker {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("a RabbitMQ node of the test's own needs root (rabbitmq-server and rabbitmqctl), as scripts/cluster.sh")
	}
	dir, err := os.MkdirTemp("", "tls-rabbitmq-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b := TLSBroker{Node: Name("tls") + "@localhost", TLSPort: freePort(t)}
	tcp := freePort(t)
	for tcp+20000 > 65535 || portTaken(tcp+20000) {
		tcp = freePort(t)
	}
	// The node runs as the rabbitmq user, with its home (and its Erlang
	// cookie, which rabbitmqctl uses too), on copies of the certificates it
	// can read.
	c.copyServerFiles(t, dir)
	conf := fmt.Sprintf(`listeners.tcp.local = 127.0.0.1:%d
listeners.ssl.1 = 127.0.0.1:%d
ssl_options.cacertfile = %s
ssl_options.certfile = %s
ssl_options.keyfile = %s
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = true
loopback_users = none
`, tcp, b.TLSPort, filepath.Join(dir, filepath.Base(c.CAFile)), filepath.Join(dir, filepath.Base(c.CertFile)), filepath.Join(dir, filepath.Base(c.KeyFile)))
	for name, content := range map[string]string{"rabbitmq.conf": conf, "rabbitmq-env.conf": "", "enabled_plugins": "[].\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	chownTo(t, dir, "rabbitmq")
	pid := filepath.Join(dir, "pid")
	start := exec.Command("runuser", "-u", "rabbitmq", "--", "env", "-i", "PATH="+os.Getenv("PATH"), "HOME=/var/lib/rabbitmq", // #nosec G204 -- the machine's server
		"RABBITMQ_NODENAME="+b.Node, "RABBITMQ_NODE_PORT="+strconv.Itoa(tcp), "RABBITMQ_DIST_PORT="+strconv.Itoa(tcp+20000),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(dir, "rabbitmq-env.conf"), "RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"), "RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"), "RABBITMQ_PID_FILE="+pid, "ERL_EPMD_ADDRESS=127.0.0.1",
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		"/usr/lib/rabbitmq/bin/rabbitmq-server", "-detached")
	start.Dir = dir // where a crash dump would land
	if out, err := start.CombinedOutput(); err != nil {
		t.Fatalf("rabbitmq-server: %v\n%s", err, out)
	}
	ctl := func(args ...string) {
		t.Helper()
		cmd := exec.Command(rabbitmqctl(), append([]string{"-q", "-n", b.Node}, args...)...) // #nosec G204 -- as above
		if out, err := cmd.CombinedOutput(); err != nil {
			logs, _ := exec.Command("sh", "-c", "tail -n 30 "+filepath.Join(dir, "log")+"/*.log").CombinedOutput() // #nosec G204 -- the test's own directory
			t.Fatalf("rabbitmqctl %s: %v\n%s\nthe node's log:\n%s", strings.Join(args, " "), err, out, logs)
		}
	}
	t.Cleanup(func() {
		// With the pid file, stop returns once the node's process has exited:
		// only then is its directory removed.
		_ = exec.Command(rabbitmqctl(), "-q", "-n", b.Node, "stop", pid).Run() // #nosec G204 -- as above
	})
	ctl("wait", "--timeout", "120", pid)
	ctl("await_startup", "--timeout", "120")
	ctl("add_user", user, password)
	ctl("set_permissions", "-p", "/", user, ".*", ".*", ".*")
	return b
}

func freePort(t testing.TB) int {
	t.Helper()
	_, p, err := net.SplitHostPort(FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

func portTaken(p int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		return true
	}
	l.Close()
	return false
}
