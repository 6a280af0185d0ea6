// Package logging builds the JSON slog logger every program writes to stdout.
package logging

import (
	"io"
	"log/slog"
)

// New returns a JSON logger at level ("debug", "info", "warn" or "error"; the
// config package validates it) that names the program on every line.
func New(w io.Writer, level, program string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})).With("program", program)
}
