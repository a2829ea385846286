package bench

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvshm/kvshm/shm"
)

// wakeFloorProducer is the producer of BenchmarkWakeFloor: kvshm's own Python RingWriter, as the engine uses it,
// publishing one Cleared (a 40-byte record) per period until its stdin closes. It prints the ring's path, then
// waits for a line before it starts.
const wakeFloorProducer = `
import sys, time
from kvshm._ring import RingWriter
w = RingWriter.create(sys.argv[1], worker_id=1, kv_block_size=16, max_buffer_size=1000, capacity=1 << 20)
print(w.path, flush=True)
sys.stdin.readline()
per, seq, nxt = 1.0 / float(sys.argv[2]), 0, time.monotonic()
import select
while not select.select([sys.stdin], [], [], 0)[0]:
    nxt += per
    d = nxt - time.monotonic()
    if d > 0:
        time.sleep(d)
    w.publish_cleared(seq, 0)
    seq += 1
w.close()
`

// BenchmarkWakeFloor measures the floor under kvshmd's CPU per batch at a low rate: what any consumer in a process
// of its own pays to be woken once per batch on this machine, doing nothing else. A Python RingWriter publishes
// one small record per period; a goroutine of this otherwise idle process drains the ring the cheapest way the
// ring allows (Park on the doorbell, Next, Release): no index, no encoding, no send. consumer_us/wake is this
// process's CPU (getrusage) per record. At a rate slower than a wakeup every record costs one (the Go runtime's and
// the virtual CPU's idle exit and entry), which node_report.py sets beside kvshmd's CPU per batch at the same rate.
// One op is a 1 s window. The producer is $KVSHM_BENCH_PYTHON (default python3) with ../pybind/src on its path.
func BenchmarkWakeFloor(b *testing.B) {
	for _, rate := range []int{100, 1000} {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) {
			py := os.Getenv("KVSHM_BENCH_PYTHON")
			if py == "" {
				py = "python3"
			}
			src, err := filepath.Abs("../pybind/src")
			if err != nil {
				b.Fatal(err)
			}
			cmd := exec.Command(py, "-c", wakeFloorProducer, b.TempDir(), fmt.Sprint(rate))
			cmd.Env = append(os.Environ(), "PYTHONPATH="+src)
			cmd.Stderr = os.Stderr
			stdin, err := cmd.StdinPipe()
			if err != nil {
				b.Fatal(err)
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				b.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
			path, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil {
				b.Fatalf("producer: %v", err)
			}
			r, err := shm.Open(strings.TrimSpace(path))
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()

			stop := make(chan struct{})
			done := make(chan int)
			go func() { // the consumer: the least any out-of-process drain does per record
				n := 0
				for {
					select {
					case <-stop:
						done <- n
						return
					default:
					}
					for {
						_, err := r.Next()
						if errors.Is(err, shm.ErrEmpty) {
							break
						}
						if err != nil {
							panic(err)
						}
						n++
					}
					r.Release()
					r.Park(time.Second) // a doorbell, not the timeout, wakes it
				}
			}()
			if _, err := fmt.Fprintln(stdin, "go"); err != nil {
				b.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond) // warm: the consumer parks, the producer's pacing settles
			b.ResetTimer()
			cpu0, t0 := cpuTime(), time.Now()
			for b.Loop() {
				time.Sleep(time.Second)
			}
			cpu, wall := cpuTime()-cpu0, time.Since(t0)
			b.StopTimer()
			close(stop)
			n := <-done
			_ = stdin.Close()
			records := float64(rate) * wall.Seconds() // paced: the records published in the window
			b.ReportMetric(float64(cpu.Microseconds())/records, "consumer_us/wake")
			b.ReportMetric(100*float64(cpu)/float64(wall), "pct_core")
			if n == 0 {
				b.Fatal("the consumer read no record")
			}
		})
	}
}
