package daemon

import (
	"log/slog"
	"testing"
)

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// testLogger logs through t.Log with -daemon.log, else discards.
func testLogger(t testing.TB) *slog.Logger {
	if *verbose {
		return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}
