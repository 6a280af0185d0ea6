package config

import (
	"strings"
	"testing"
)

func TestLoadNamesTheVariableAtFault(t *testing.T) {
	tests := []struct {
		name     string
		cfg      Validator
		env      map[string]string
		variable string // "" means valid
	}{
		{"gateway defaults", &FakeGateway{}, nil, ""},
		{"gateway error rate", &FakeGateway{}, map[string]string{"FAULT_ERROR_RATE": "2"}, "FAULT_ERROR_RATE"},
		{"gateway latency", &FakeGateway{}, map[string]string{"FAULT_LATENCY": "soon"}, "FAULT_LATENCY"},
		{"gateway log level", &FakeGateway{}, map[string]string{"LOG_LEVEL": "trace"}, "LOG_LEVEL"},
		{"gateway memory store", &FakeGateway{}, map[string]string{"STORE": "memory"}, ""},
		{"gateway store", &FakeGateway{}, map[string]string{"STORE": "redis"}, "STORE"},
		{"gateway key lifetime", &FakeGateway{}, map[string]string{"KEY_TTL": "24h"}, ""},
		{"gateway negative key lifetime", &FakeGateway{}, map[string]string{"KEY_TTL": "-1s"}, "KEY_TTL"},
		{"gateway database", &FakeGateway{}, map[string]string{"DATABASE_URL": "mysql://x"}, "DATABASE_URL"},
		{"gateway store connections", &FakeGateway{}, map[string]string{"STORE_MAX_CONNS": "0"}, "STORE_MAX_CONNS"},
		{"gateway few store connections", &FakeGateway{}, map[string]string{"STORE_MAX_CONNS": "3"}, ""},
		{"memory store reads no database", &FakeGateway{}, map[string]string{"STORE": "memory", "DATABASE_URL": "mysql://x"}, ""},
		{"publisher defaults", &Publisher{}, nil, ""},
		{"publisher broker URL", &Publisher{}, map[string]string{"AMQP_URL": "localhost"}, "AMQP_URL"},
		{"verify defaults", &Verify{}, nil, ""},
		{"verify gateway database", &Verify{}, map[string]string{"GATEWAY_DATABASE_URL": "mysql://x"}, "GATEWAY_DATABASE_URL"},
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

// Validator is kit.Validator, named here for the table above.
type Validator = interface{ Validate() error }
