package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// TestUsage: every command-line mistake exits 2 with a message naming the problem; help exits 0.
func TestUsage(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.sock")
	tests := []struct {
		args []string
		code int
		want string
	}{
		{nil, exitUsage, "Usage:"},
		{[]string{"help"}, exitOK, "kvshmd serve"},
		{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"serve", "--help"}, exitOK, "KVSHMD_SOCKET"},
		{[]string{"serve", "--socket-mode", "999"}, exitUsage, "--socket-mode"},
		{[]string{"serve", "--log-level", "loud"}, exitUsage, "--log-level"},
		{[]string{"serve", "--log-format", "xml"}, exitUsage, "--log-format"},
		{[]string{"serve", "--max-request-bytes", "1"}, exitUsage, "--max-request-bytes"},
		{[]string{"serve", "extra"}, exitUsage, "unexpected argument"},
		{[]string{"events", "--start", "-1"}, exitUsage, "unsigned"},
		{[]string{"match", "--socket", missing}, exitUsage, "--tokens is required"},
		{[]string{"match", "--socket", missing, "--tokens", "1,x"}, exitUsage, "not a u32"},
		{[]string{"health", "--socket", missing}, exitUnreachable, "is `kvshmd serve` running?"},
		{[]string{"inspect"}, exitUsage, "usage: kvshmd inspect"},
		{[]string{"inspect", missing}, exitFailure, "inspect ring"},
		{[]string{"version"}, exitOK, ""},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		code := run(tt.args, &out, &errb)
		if code != tt.code || !strings.Contains(out.String()+errb.String(), tt.want) {
			t.Errorf("kvshmd %v: exit %d, output %q; want exit %d mentioning %q", tt.args, code, out.String()+errb.String(), tt.code, tt.want)
		}
	}
}

func TestServeEnvErrors(t *testing.T) {
	t.Setenv("KVSHMD_IDLE_TIMEOUT", "forever")
	var out, errb bytes.Buffer
	if code := run([]string{"serve"}, &out, &errb); code != exitUsage || !strings.Contains(errb.String(), "KVSHMD_IDLE_TIMEOUT") {
		t.Fatalf("bad env: exit %d %q", code, errb.String())
	}
}
