package payment

import (
	"embed"

	"github.com/inbox-template/payment-service/kit"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations is the payment service's own schema: the payments table. The
// inbox table is the kit's (migrations.Inbox), applied first.
var Migrations = kit.Migrations("payments", migrationFiles, "migrations")
