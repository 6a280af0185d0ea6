package main

import (
	"os"
	"testing"

	"github.com/inbox-template/payment-service/kit/kittest"
)

// The tests' vhosts come in batches, and go when the tests end.
func TestMain(m *testing.M) { os.Exit(kittest.RunMain(m)) }
