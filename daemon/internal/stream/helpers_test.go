package stream

import (
	"encoding/binary"
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

// le64 and le32 are the little-endian bytes index.ApplyStoredTokens takes.
func le64(v []uint64) []byte {
	b := make([]byte, 0, 8*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, x)
	}
	return b
}

func le32(v []uint32) []byte {
	b := make([]byte, 0, 4*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, x)
	}
	return b
}
