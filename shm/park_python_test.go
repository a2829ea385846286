package shm

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvshm/kvshm/internal/testenv"
)

// parkPythonScript is a Python producer (pybind/src/kvshm/_ring.py) that creates a ring, prints its path, and
// publishes one event for each line read from stdin.
const parkPythonScript = `
import sys
sys.path.insert(0, sys.argv[1])
from kvshm._ring import RingWriter
w = RingWriter.create(sys.argv[2], 1, 4, 100, 65536)
print(w.path, flush=True)
seq = 0
for _ in sys.stdin:
    assert w.publish_cleared(seq, 0)
    seq += 1
w.close()
`

// TestParkWokenByPythonPublish: the Go Reader parked on a ring written by the Python RingWriter in another process
// is woken by the writer's doorbell (FUTEX_WAKE on the shared mapping, through kvshm._ringsync or ctypes), not by the Park timeout.
func TestParkWokenByPythonPublish(t *testing.T) {
	py := os.Getenv("KVSHM_PYTHON")
	if py == "" {
		py, _ = filepath.Abs("../.venv/bin/python")
	}
	_, err := os.Stat(py)
	testenv.Require(t, err, "kvshm's dev interpreter", "run `make venv` or set KVSHM_PYTHON")
	src, err := filepath.Abs("../pybind/src")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-c", parkPythonScript, src, t.TempDir())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		io.Copy(io.Discard, stdout)
		if err := cmd.Wait(); err != nil {
			t.Errorf("Python producer: %v\n%s", err, stderr.String())
		}
	}()
	path, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("Python producer printed no ring path: %v\n%s", err, stderr.String())
	}
	r, err := Open(strings.TrimSpace(path))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for round := range 3 { // the first wake, then wakes of a reader that parked again
		if _, err := r.Next(); err != ErrEmpty {
			t.Fatalf("round %d: Next before the publish = %v, want ErrEmpty", round, err)
		}
		res := parkAsync(r, parkTimeout)
		waitParked(t, r.m, r.futex)
		if _, err := io.WriteString(stdin, "publish\n"); err != nil {
			t.Fatal(err)
		}
		if got := <-res; !got.woken || got.timedOut {
			t.Fatalf("round %d: park while Python publishes = %+v, want woken by the doorbell (not the timeout)", round, got)
		}
		if rec, err := r.Next(); err != nil || rec.Type != TypeEvent {
			t.Fatalf("round %d: Next after the wake = %+v, %v, want the event", round, rec, err)
		}
		r.Release()
	}
}
