package main

import (
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"runtime/trace"
)

// startTrace writes Go's execution trace (go tool trace) of the whole serve, with CPU profile samples, to path when KVSHMD_TRACE names one: a
// diagnostic for stalls (which goroutine waited on what, GC phases), off by default. It returns the function that
// ends the trace, or nil when there is none.
func startTrace(path string, log *slog.Logger) func() {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		log.Warn("KVSHMD_TRACE: cannot create the trace file; no trace", "err", err)
		return nil
	}
	if err := trace.Start(f); err != nil {
		log.Warn("KVSHMD_TRACE: cannot start the trace; no trace", "err", err)
		_ = f.Close()
		return nil
	}
	// A CPU profile running beside the trace puts its samples (with stacks) into the trace: what a long-running
	// goroutine was doing. The profile itself is discarded.
	profiling := pprof.StartCPUProfile(io.Discard) == nil
	return func() {
		if profiling {
			pprof.StopCPUProfile()
		}
		trace.Stop()
		if err := f.Close(); err != nil {
			log.Warn("KVSHMD_TRACE: closing the trace file", "err", err)
		}
	}
}
