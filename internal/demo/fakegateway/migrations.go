package fakegateway

import (
	"embed"

	"github.com/inbox-template/payment-service/kit/migrations"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations is the fake gateway's schema: charges and their keys, in the
// gateway's own database (STORE=postgres). The set keeps its name, and with it
// its version table gateway_schema_version.
var Migrations = migrations.NewSet("gateway", migrations.Must(migrationFiles, "migrations"))
