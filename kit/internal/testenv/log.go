package testenv

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// Logger writes JSON log lines to the test's log, shown when the test fails or
// with -v. Lines written after the test ended are dropped instead of panicking.
func Logger(t testing.TB) *slog.Logger {
	log, _ := CaptureLogger(t)
	return log
}

// CaptureLogger is Logger that also keeps every line, for tests that assert
// on what was (not) logged.
// A benchmark gets warnings and errors only: its log is always printed.
func CaptureLogger(t testing.TB) (*slog.Logger, *Buffer) {
	level := slog.LevelDebug
	if _, ok := t.(*testing.B); ok {
		level = slog.LevelWarn
	}
	buf := &Buffer{}
	w := &testWriter{t: t, keep: buf}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})), buf
}

// Buffer is a goroutine-safe log store: an io.Writer for the output of a
// program that is still running.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

type testWriter struct {
	t    testing.TB
	keep *Buffer
	mu   sync.Mutex
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	_, _ = w.keep.Write(p)
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}
