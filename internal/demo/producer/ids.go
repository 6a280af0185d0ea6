package producer

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// NewRunID returns a short random id that keeps the order ids of one run apart
// from those of every other run.
func NewRunID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // never fails since Go 1.24
	return hex.EncodeToString(b)
}

// newEventID returns a random UUID (version 4). Event ids come from crypto/rand,
// not from the seeded generator, so that replaying a seed never reuses an id a
// consumer has already recorded in its inbox.
func newEventID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
