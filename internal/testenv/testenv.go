// Package testenv decides what a test does when something it needs from outside Go is missing (kvshm's dev
// Python environment, promtool): with CI or KVSHM_REQUIRE_TOOLS set (.ci/run sets CI, `make test` sets
// KVSHM_REQUIRE_TOOLS) it fails, so a missing install step never passes unseen; otherwise it skips and says how to
// get it, so that `go test ./...` on a fresh clone passes with only Go installed.
package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Require does nothing when err is nil. Otherwise it fails the test (CI, KVSHM_REQUIRE_TOOLS) or skips it, with
// what is missing, err, and how to get it.
func Require(t testing.TB, err error, what, how string) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv("CI") != "" || os.Getenv("KVSHM_REQUIRE_TOOLS") != "" {
		t.Fatalf("this test needs %s: %v (%s)", what, err, how)
	}
	t.Skipf("needs %s: %v (%s; required when CI or KVSHM_REQUIRE_TOOLS is set)", what, err, how)
}

// VenvPython returns the dev venv's Python (.venv at the repository root, rel from the test's package directory,
// e.g. "../.venv/bin/python") once it imports every module of imports (e.g. "zmq, msgspec"), or skips/fails as
// Require says.
func VenvPython(t testing.TB, rel, imports string) string {
	t.Helper()
	py, err := filepath.Abs(rel)
	if err == nil {
		if _, err = os.Stat(py); err == nil {
			err = exec.Command(py, "-c", "import "+imports).Run()
		}
	}
	Require(t, err, "the dev venv with "+imports, "make venv")
	return py
}
