package retention

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/migrations"
)

// BenchmarkPruneMillion prunes a table of one million inbox rows, half of them
// older than the window, with batches of 1000 and of 10000. It is not part of
// the test suite; run it alone, once per batch size (it seeds for minutes):
//
//	go test -run '^$' -bench PruneMillion -benchtime 1x ./retention   (in kit/)
//
// Besides ns/op it reports rows/s, the longest single batch and the mean one.
func BenchmarkPruneMillion(b *testing.B) {
	const rows = 1_000_000
	gdb, url := testenv.MigratedDB(b, migrations.Inbox)
	db, err := gdb.DB()
	if err != nil {
		b.Fatal(err)
	}
	for _, batch := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			p, err := New(db, Config{Consumer: "bench", Window: 14 * day, BatchSize: batch,
				RetryDelays: []time.Duration{time.Second}, MaxAttempts: 5}, NewMetrics(prometheus.NewRegistry()), testenv.Logger(b))
			if err != nil {
				b.Fatal(err)
			}
			var deleted int64
			var batches int
			var longest, elapsed time.Duration
			for range b.N {
				b.StopTimer()
				seedMillion(b, url, rows)
				b.StartTimer()
				res, err := p.Prune(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				deleted += res.Deleted
				batches += res.Batches
				elapsed += res.Elapsed
				longest = max(longest, res.LongestBatch)
			}
			b.ReportMetric(float64(deleted)/elapsed.Seconds(), "rows/s")
			b.ReportMetric(float64(longest.Microseconds())/1000, "ms/longest-batch")
			b.ReportMetric(float64(elapsed.Microseconds())/1000/float64(batches), "ms/mean-batch")
			b.ReportMetric(float64(deleted)/float64(b.N), "rows-deleted/op")
		})
	}
}

// seedMillion refills the inbox with n rows received over the last 28 days in
// arrival order, as a real inbox fills, so the older half lies in the first
// half of the heap. It runs without the pool's statement timeout.
func seedMillion(b *testing.B, url string, n int) {
	b.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, sql := range []string{
		`TRUNCATE inbox`,
		fmt.Sprintf(`INSERT INTO inbox (message_id, consumer, payload_sha256, received_at)
			SELECT 'evt-' || g, 'bench', sha256(g::text::bytea), now() - interval '28 days' + g * interval '28 days' / %d
			FROM generate_series(1, %d) g`, n, n),
		`VACUUM ANALYZE inbox`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}
}
