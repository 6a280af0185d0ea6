package outbox

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

// BenchmarkRelayDrain times one relay draining a backlog of committed rows
// into a quorum queue, side by side: unordered rows, and ordered rows of a
// key each (the payment service's OrderPaid: one row per order, the key its
// head, so every mark moves a key on). It reports events/s and the test
// process's CPU per event: the relay's and the loop's polling for the count
// of rows sent (PostgreSQL and RabbitMQ are other processes).
//
//	go test -run '^$' -bench RelayDrain -benchtime 3x ./outbox   (in kit/)
func BenchmarkRelayDrain(b *testing.B) {
	const backlog = 2000
	for _, c := range []struct {
		name string
		key  func(i, round int) string
	}{
		{"unordered", func(int, int) string { return "" }},
		{"key-per-row", func(i, round int) string { return fmt.Sprintf("order-%d-%d", round, i) }},
		{"ten-keys", func(i, _ int) string { return fmt.Sprintf("key-%d", i%10) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			e := newEnv(b)
			var elapsed, cpu time.Duration
			total := 0
			for round := 0; round < b.N; round++ {
				b.StopTimer()
				for i := 0; i < backlog; i += 100 {
					msgs := make([]Message, 0, 100)
					for j := i; j < i+100; j++ {
						msgs = append(msgs, event(j, c.key(j, round)))
					}
					if _, err := e.emit(nil, msgs...); err != nil {
						b.Fatal(err)
					}
				}
				total += backlog
				b.StartTimer()
				start, cpu0 := time.Now(), processCPU()
				_, _, stop := e.relay(e.amqp, nil)
				for e.count("status = 'sent'") < total {
					time.Sleep(5 * time.Millisecond)
				}
				elapsed += time.Since(start)
				cpu += processCPU() - cpu0
				b.StopTimer()
				stop()
				testenv.WithChannel(b, e.amqp, func(ch *amqp.Channel) error {
					_, err := ch.QueuePurge(queue, false)
					return err
				})
				b.StartTimer()
			}
			b.ReportMetric(float64(total)/elapsed.Seconds(), "events/s")
			b.ReportMetric(float64(cpu.Microseconds())/float64(total), "cpu-µs/event")
			b.ReportMetric(0, "ns/op")
		})
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
