package faultkit

import (
	"os"
	"testing"
	"time"

	"github.com/inbox-template/payment-service/internal/kit/testenv"
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
