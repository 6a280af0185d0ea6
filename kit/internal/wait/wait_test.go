package wait

import (
	"context"
	"testing"
	"time"
)

func TestSleepEndsWithItsContext(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) || !Sleep(context.Background(), 0) {
		t.Fatal("a sleep with a live context did not report it waited")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) || Sleep(ctx, 0) {
		t.Fatal("a sleep with its context ended reported it waited")
	}
}
