package config

import (
	"strings"
	"testing"
)

func TestLoadNamesTheVariableAtFault(t *testing.T) {
	tests := []struct {
		env      map[string]string
		variable string // "" means valid
	}{
		{map[string]string{}, ""},
		{map[string]string{"PREFETCH": "many"}, "PREFETCH"},
		{map[string]string{"PREFETCH": "0"}, "PREFETCH"},
		{map[string]string{"WORKERS": "193"}, "WORKERS"},
		{map[string]string{"WORKERS": "300", "PREFETCH": "300"}, ""},
		{map[string]string{"DB_COMMITTERS": "10"}, "DB_MAX_CONNS"},
		{map[string]string{"DB_COMMITTERS": "0"}, "DB_COMMITTERS"},
		{map[string]string{"GROUP_COMMIT_MAX": "0"}, "GROUP_COMMIT_MAX"},
		{map[string]string{"GROUP_COMMIT_MAX": "1", "GROUP_COMMIT_WAIT": "0s"}, ""},
		{map[string]string{"GROUP_COMMIT_WAIT": "2s"}, "GROUP_COMMIT_WAIT"},
		{map[string]string{"PPROF_ENABLED": "yes please"}, "PPROF_ENABLED"},
		{map[string]string{"AMQP_URL": "localhost:5672"}, "AMQP_URL"},
		{map[string]string{"DATABASE_URL": "mysql://x"}, "DATABASE_URL"},
		{map[string]string{"GATEWAY_URL": "ftp://gw"}, "GATEWAY_URL"},
		{map[string]string{"RETRY_DELAYS": "1s,0s"}, "RETRY_DELAYS"},
		{map[string]string{"RETRY_DELAYS": "soon"}, "RETRY_DELAYS"},
		{map[string]string{"MAX_ATTEMPTS": "0"}, "MAX_ATTEMPTS"},
		{map[string]string{"HANDLER_TIMEOUT": "2s", "GATEWAY_TIMEOUT": "3s"}, "HANDLER_TIMEOUT"},
		{map[string]string{"HANDLER_TIMEOUT": "31m"}, "HANDLER_TIMEOUT"},
		{map[string]string{"FAULTS_ENABLED": "maybe"}, "FAULTS_ENABLED"},
		{map[string]string{"LOG_LEVEL": "trace"}, "LOG_LEVEL"},
		{map[string]string{"DB_STATEMENT_TIMEOUT": "1ms"}, "DB_STATEMENT_TIMEOUT"},
		{map[string]string{"INBOX_RETENTION": "23h"}, "INBOX_RETENTION"},
		// 2 × (24h + 24h) of retry trips is above the 72h window.
		{map[string]string{"RETRY_DELAYS": "24h", "MAX_ATTEMPTS": "3", "INBOX_RETENTION": "72h"}, "INBOX_RETENTION"},
		{map[string]string{"RETRY_DELAYS": "24h", "MAX_ATTEMPTS": "3", "INBOX_RETENTION": "96h"}, ""},
		{map[string]string{"INBOX_PRUNE_INTERVAL": "0"}, ""},
		{map[string]string{"INBOX_PRUNE_INTERVAL": "10ms"}, "INBOX_PRUNE_INTERVAL"},
		{map[string]string{"INBOX_PRUNE_BATCH": "0"}, "INBOX_PRUNE_BATCH"},
	}
	for _, tt := range tests {
		t.Run(tt.variable, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var cfg PaymentService
			err := Load(&cfg)
			switch {
			case tt.variable == "" && err != nil:
				t.Fatalf("defaults rejected: %v", err)
			case tt.variable != "" && (err == nil || !strings.Contains(err.Error(), tt.variable)):
				t.Fatalf("err = %v, want one naming %s", err, tt.variable)
			}
		})
	}
}

func TestLogValueMasksSecrets(t *testing.T) {
	t.Setenv("AMQP_URL", "amqp://user:s3cret@broker:5672/")
	t.Setenv("DATABASE_URL", "postgres://app:hunter2@db:5432/payments")
	var cfg PaymentService
	if err := Load(&cfg); err != nil {
		t.Fatal(err)
	}
	v := LogValue(&cfg)
	for _, secret := range []string{"s3cret", "hunter2"} {
		for k, val := range v {
			if strings.Contains(val, secret) {
				t.Errorf("%s=%s shows a password", k, val)
			}
		}
	}
	if v["PREFETCH"] != "192" || !strings.Contains(v["AMQP_URL"], "user:") {
		t.Errorf("log value lost non-secret fields: %v", v)
	}
}

func TestOpsConfigsNameTheVariableAtFault(t *testing.T) {
	tests := []struct {
		name     string
		cfg      validator
		env      map[string]string
		variable string // "" means valid
	}{
		{"dlq defaults", &DeadLetterOps{}, nil, ""},
		{"dlq broker URL", &DeadLetterOps{}, map[string]string{"AMQP_URL": "localhost"}, "AMQP_URL"},
		{"dlq queue", &DeadLetterOps{}, map[string]string{"DEAD_LETTER_QUEUE": ""}, "DEAD_LETTER_QUEUE"},
		{"prune defaults", &InboxPrune{}, nil, ""},
		{"prune window", &InboxPrune{}, map[string]string{"INBOX_RETENTION": "1h"}, "INBOX_RETENTION"},
		{"prune batch", &InboxPrune{}, map[string]string{"INBOX_PRUNE_BATCH": "100001"}, "INBOX_PRUNE_BATCH"},
		{"prune attempts", &InboxPrune{}, map[string]string{"MAX_ATTEMPTS": "0"}, "MAX_ATTEMPTS"},
		{"gateway defaults", &FakeGateway{}, nil, ""},
		{"gateway memory store", &FakeGateway{}, map[string]string{"STORE": "memory"}, ""},
		{"gateway store", &FakeGateway{}, map[string]string{"STORE": "redis"}, "STORE"},
		{"gateway database", &FakeGateway{}, map[string]string{"DATABASE_URL": "mysql://x"}, "DATABASE_URL"},
		{"memory store reads no database", &FakeGateway{}, map[string]string{"STORE": "memory", "DATABASE_URL": "mysql://x"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			err := Load(tt.cfg)
			switch {
			case tt.variable == "" && err != nil:
				t.Fatalf("rejected: %v", err)
			case tt.variable != "" && (err == nil || !strings.Contains(err.Error(), tt.variable)):
				t.Fatalf("err = %v, want one naming %s", err, tt.variable)
			}
		})
	}
}
