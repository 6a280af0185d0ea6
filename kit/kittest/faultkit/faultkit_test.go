package faultkit

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m)) }

var dying = testenv.NewProgram("./testdata/dying")

// A replica that dies at a crash point while its points are being cleared
// is the supervisor's to start again, not a replica refusing the call.
func TestArmingAReplicaThatDiesMeanwhileLeavesItToTheSupervisor(t *testing.T) {
	s := Start(t, Config{Program: dying})
	s.ArmAll() // DELETE /faults/crash: the replica goes away as it answers
	if code := s.Process(0).Wait(t, 5*time.Second); code != 137 {
		t.Fatalf("the replica exited with status %d, want 137", code)
	}
}

// A drain that fails says where the work is: each queue holding messages,
// with its ready and unacked counts and its leader, and the stored backlog.
func TestPendingDetailNamesTheQueuesThatHoldMessages(t *testing.T) {
	vhost, db := testenv.VHost(t), testenv.Postgres(t)
	conn, err := pgx.Connect(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), `CREATE TABLE inbox_messages (status text); CREATE TABLE outbox (status text);
		INSERT INTO outbox VALUES ('pending'), ('pending'), ('sent')`); err != nil {
		t.Fatal(err)
	}
	conn.Close(t.Context())
	testenv.WithChannel(t, vhost, func(ch *amqp.Channel) error {
		for _, q := range []string{"work.retry.200ms", "empty", "downstream"} {
			if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
				return err
			}
		}
		for _, q := range []string{"work.retry.200ms", "work.retry.200ms", "downstream"} {
			if err := ch.Publish("", q, false, false, amqp.Publishing{Body: []byte("x")}); err != nil {
				return err
			}
		}
		return nil
	})
	s := newStack(t, Config{AMQPURL: vhost, DBURL: db})
	var got string
	testenv.Eventually(t, 30*time.Second, "the two messages listed", func() (bool, error) {
		got = s.view.pendingDetail()
		return strings.Contains(got, "work.retry.200ms  2  2  0  0  ") && strings.Contains(got, "downstream  1  1  0  0  "), nil
	})
	if strings.Contains(got, "empty") {
		t.Errorf("an empty queue is listed:\n%s", got)
	}
	// A queue no replica consumes is named as a possible sink; a retry
	// queue, which none consumes either, is not.
	if !strings.Contains(got, "downstream  1  1  0  0  ") || !strings.Contains(got, "name it in Config.Sinks") ||
		strings.Count(got, "Config.Sinks") != 1 {
		t.Errorf("the queue without a consumer is not named as a possible sink, or another is:\n%s", got)
	}
	if n := s.view.queued(); n != 3 {
		t.Errorf("queued %d, want the 3 messages of the retry queue and the downstream one", n)
	}
	s.cfg.Sinks = []string{"downstream"}
	if n := s.view.queued(); n != 2 {
		t.Errorf("queued %d with downstream a sink, want the retry queue's 2", n)
	}
	if d := s.view.pendingDetail(); strings.Contains(d, "Config.Sinks") {
		t.Errorf("a sink is named as a possible sink:\n%s", d)
	}
	if !strings.HasSuffix(got, "buffered inbox not processed: 0; outbox pending: 2") {
		t.Errorf("the stored backlog is not counted by table:\n%s", got)
	}
}
