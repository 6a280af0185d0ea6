package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/kit/database"
	"github.com/inbox-template/payment-service/kit/internal/inbox"
	"github.com/inbox-template/payment-service/kit/internal/testenv"
	"github.com/inbox-template/payment-service/kit/migrations"
)

// From an outside review: the look-up runs unprepared (database.CustomPlan)
// and gets its results as text, which pgx reads only as hex bytea. A
// database whose default is bytea_output=escape (or a DateStyle other than
// ISO) made every look-up fail; the kit's pools pin the formats.
func TestLookUpWorksWhateverTheDatabasesOutputFormats(t *testing.T) {
	_, url := testenv.MigratedDB(t, migrations.Inbox)
	ctx := context.Background()
	admin, err := database.Open(ctx, database.Options{URL: url, MaxConns: 1}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	var name string
	if err := admin.Raw(`SELECT current_database()`).Scan(&name).Error; err != nil {
		t.Fatal(err)
	}
	if err := admin.Exec(`ALTER DATABASE "` + name + `" SET bytea_output = 'escape'`).Error; err != nil {
		t.Fatal(err)
	}
	if err := admin.Exec(`ALTER DATABASE "` + name + `" SET datestyle = 'SQL, DMY'`).Error; err != nil {
		t.Fatal(err)
	}
	database.Close(admin)
	db, err := database.Open(ctx, database.Options{URL: url, MaxConns: 2}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { database.Close(db) })
	ib := inbox.New(db, "c")
	body := []byte(`{"n":1}`)
	if _, err := ib.Commit(ctx, []inbox.Item{{MessageID: "m-1", Body: body}}); err != nil {
		t.Fatal(err)
	}
	seen, err := ib.SeenMany(ctx, []inbox.Key{{MessageID: "m-1", Body: body}, {MessageID: "m-2", Body: body}})
	if err != nil {
		t.Fatalf("look-up under bytea_output=escape: %v", err)
	}
	if !seen[0].Applied || seen[0].Err != nil || seen[1].Applied {
		t.Fatalf("look-up: %+v, want m-1 applied and m-2 not", seen)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	var at time.Time
	if err := sqlDB.QueryRowContext(ctx, `SELECT received_at FROM inbox WHERE message_id = $1`, database.CustomPlan, "m-1").Scan(&at); err != nil {
		t.Fatalf("a timestamp read unprepared under DateStyle SQL, DMY: %v", err)
	}
	if time.Since(at) > time.Hour || time.Since(at) < -time.Hour {
		t.Fatalf("received_at read as %s", at)
	}
}
