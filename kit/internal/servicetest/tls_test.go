package servicetest_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/consumer"
	"github.com/inbox-template/payment-service/kit/internal/servicetest"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/rabbit"
)

// TestTLSToBothServers runs a service against a RabbitMQ node and a
// PostgreSQL of the test's own, each with TLS only on the port it is given,
// and a certificate of a test CA for the name localhost alone: with the CA
// (amqps:// with cacertfile, sslmode=verify-full with sslrootcert) and a
// client certificate of it (certfile and keyfile, sslcert and sslkey: both
// servers require one) the service connects, consumes and commits; a client
// given another CA, dialling an address the certificate does not name, or
// without a client certificate, is refused; and no password reaches the
// service's logs.
func TestTLSToBothServers(t *testing.T) {
	certs := testenv.NewCerts(t, "localhost")
	const amqpPassword, pgPassword = "amqp-pa55-Zq9", "pg-pa55-Xw7"
	broker := testenv.StartTLSRabbitMQ(t, certs, "tlsuser", amqpPassword)
	pgPort := testenv.StartTLSPostgres(t, certs)

	// Both servers want a client certificate of the CA as well.
	client := fmt.Sprintf("&certfile=%s&keyfile=%s", url.QueryEscape(certs.ClientCert), url.QueryEscape(certs.ClientKey))
	amqpURL := func(host, ca string) string {
		return fmt.Sprintf("amqps://tlsuser:%s@%s:%d/?cacertfile=%s%s", amqpPassword, host, broker.TLSPort, url.QueryEscape(ca), client)
	}
	pgClient := fmt.Sprintf("&sslcert=%s&sslkey=%s", url.QueryEscape(certs.ClientCert), url.QueryEscape(certs.ClientKey))
	dbURL := func(host, ca string) string {
		return fmt.Sprintf("postgres://postgres:%s@%s:%d/postgres?sslmode=verify-full&sslrootcert=%s%s", pgPassword, host, pgPort, url.QueryEscape(ca), pgClient)
	}

	// Refused: another CA, or an address the certificate does not name.
	for _, c := range []struct{ name, host, ca, want string }{
		{"another CA", "localhost", certs.OtherCAFile, "certificate signed by unknown authority"},
		{"an address the certificate does not name", "127.0.0.1", certs.CAFile, "127.0.0.1"},
	} {
		t.Run("amqp refuses "+c.name, func(t *testing.T) {
			conn, err := rabbit.Dial(amqpURL(c.host, c.ca), 5*time.Second, "tls test")
			if err == nil {
				conn.Close()
				t.Fatal("connected")
			}
			if !strings.Contains(err.Error(), "x509") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v; want a certificate error naming %q", err, c.want)
			}
			if strings.Contains(err.Error(), amqpPassword) {
				t.Errorf("the error shows the password: %v", err)
			}
		})
		t.Run("postgres refuses "+c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			db, err := database.Open(ctx, database.Options{URL: dbURL(c.host, c.ca), MaxConns: 2}, testenv.Logger(t))
			if err == nil {
				database.Close(db)
				t.Fatal("connected")
			}
			if !strings.Contains(err.Error(), "x509") && !strings.Contains(err.Error(), "certificate") {
				t.Errorf("error %v; want a certificate error", err)
			}
			if strings.Contains(err.Error(), pgPassword) {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
	t.Run("amqp refuses a client without a certificate", func(t *testing.T) {
		u := fmt.Sprintf("amqps://tlsuser:%s@localhost:%d/?cacertfile=%s", amqpPassword, broker.TLSPort, url.QueryEscape(certs.CAFile))
		conn, err := rabbit.Dial(u, 5*time.Second, "tls test")
		if err == nil {
			conn.Close()
			t.Fatal("connected without a client certificate")
		}
	})
	t.Run("postgres refuses a client without a certificate", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		u := fmt.Sprintf("postgres://postgres@localhost:%d/postgres?sslmode=verify-full&sslrootcert=%s", pgPort, url.QueryEscape(certs.CAFile))
		db, err := database.Open(ctx, database.Options{URL: u, MaxConns: 2}, testenv.Logger(t))
		if err == nil {
			database.Close(db)
			t.Fatal("connected without a client certificate")
		}
		if !strings.Contains(err.Error(), "certificate") {
			t.Errorf("error %v; want the server's refusal of a missing certificate", err)
		}
	})
	t.Run("plaintext to the TLS port is refused", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		plain := fmt.Sprintf("postgres://postgres@localhost:%d/postgres?sslmode=disable", pgPort)
		if db, err := database.Open(ctx, database.Options{URL: plain, MaxConns: 2}, testenv.Logger(t)); err == nil {
			database.Close(db)
			t.Fatal("a plaintext connection was taken: the server's pg_hba.conf allows TLS only")
		}
	})

	// Accepted: the service runs on both, end to end.
	s := servicetest.Start(t, ledger(), "AMQP_URL="+amqpURL("localhost", certs.CAFile), "DATABASE_URL="+dbURL("localhost", certs.CAFile))
	s.Publish(amqp.Publishing{MessageId: "tls-1", Body: body("e-tls", 5)})
	s.WaitOutcome(consumer.OutcomeProcessed, 1)
	if n := s.Count("SELECT count(*) FROM ledger"); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
	for _, secret := range []string{amqpPassword, pgPassword} {
		if strings.Contains(s.Logs.String(), secret) {
			t.Errorf("the logs show a password (%s…)", secret[:4])
		}
	}
}
