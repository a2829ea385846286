package stream

import (
	"flag"
	"log/slog"
	"testing"
)

var verbose = flag.Bool("stream.log", false, "show the engine's logs in tests")

// testLogger discards the engine's lines unless -stream.log.
func testLogger(t testing.TB) *slog.Logger {
	if *verbose {
		return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// tokens are nblocks×bs token ids from base.
func tokens(base uint32, nblocks int, bs uint32) []uint32 {
	out := make([]uint32, nblocks*int(bs))
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}
