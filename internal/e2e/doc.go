// Package e2e runs the built programs as real processes against the real broker
// and databases: the stack a newcomer starts from the README, checked end to end.
package e2e
