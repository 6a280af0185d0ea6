package deadletter

import (
	"os"
	"testing"

	"github.com/inbox-template/payment-service/kit/internal/testenv"
)

// The tests' vhosts come in batches, and go when the tests end.
func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m)) }
