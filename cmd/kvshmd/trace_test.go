package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStartTrace(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, path string
		want       bool   // a trace is written
		warn       string // in the log
	}{
		{"off", "", false, ""},
		{"unwritable", filepath.Join(dir, "missing", "t.trace"), false, "cannot create the trace file"},
		{"written", filepath.Join(dir, "t.trace"), true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			stop := startTrace(tc.path, slog.New(slog.NewTextHandler(&logs, nil)))
			if (stop != nil) != tc.want {
				t.Fatalf("startTrace(%q) returned a stop function: %v, want %v", tc.path, stop != nil, tc.want)
			}
			if stop != nil {
				stop()
				if fi, err := os.Stat(tc.path); err != nil || fi.Size() == 0 {
					t.Fatalf("trace file: %v, %v", fi, err)
				}
			}
			if tc.warn != "" && !strings.Contains(logs.String(), tc.warn) {
				t.Fatalf("log %q lacks %q", logs.String(), tc.warn)
			}
		})
	}
}
