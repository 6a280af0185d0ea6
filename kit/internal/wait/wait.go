// Package wait holds the kit's one interruptible sleep.
package wait

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx ends: it reports whether it waited all of d
// (for d of zero or less, whether ctx is still live).
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
