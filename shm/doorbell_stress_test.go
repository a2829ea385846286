package shm_test

// The port check for a CPU with a weaker memory model than x86 (aarch64: NVIDIA Grace): several real Python
// producers (the wheel's RingWriter, through kvshm._ringsync) publish bursts into their own small rings while one
// Go Reader per ring drains it and sleeps on the doorbell between bursts. Every event is checked byte for byte
// against what its seq derives (stressCheck: a record whose tail became visible before its bytes shows up as a
// wrong byte, a torn 8-byte value as unequal halves), and every Park that runs into its timeout while records are
// waiting is a missed doorbell (the Dekker pair of FORMAT.md, "Doorbell"): both must never happen.
//
//	go test ./shm -run DoorbellStress -v                     # 2 producers x 50k events (-short: 1 x 10k)
//	make grace-stress                                        # 4 producers x 1M events (README, "Grace nodes")
//
// KVSHM_STRESS_PRODUCERS: producer processes (one ring each); KVSHM_STRESS_PRODUCER_EVENTS: events per producer;
// KVSHM_STRESS_PARK_MS: the consumers' park timeout (default 2000; a missed doorbell costs one). The producers use
// the C extension when it is built (make pyext; the wheel always has it); with the x86-64 pure-Python fallback,
// which has no fence, missed doorbells are reported but allowed (FORMAT.md: the park timeout bounds them).
// Emulation (qemu-user) runs it with x86 ordering: it passes there whatever the barriers, so only real ARM hardware
// makes it a check of the ordering (README, "Grace nodes").

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvshm/kvshm/shm"
)

func stressEnv(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

// doorbellCounts is what one consumer saw.
type doorbellCounts struct {
	events, records, losses, parks, wakes, missed uint64
	wraps                                         uint64
}

// drainParked reads the ring until the producer has exited and the ring is empty, parking on the doorbell whenever
// it is empty. A Park that returns after its whole timeout with records waiting, while the producer still runs, is
// a missed doorbell (the producer pauses at most a millisecond between bursts).
func drainParked(r *shm.Reader, c *stressCheck, p *producer, park time.Duration) (doorbellCounts, error) {
	var n doorbellCounts
	final := false
	for i := 0; ; {
		rec, err := r.Next()
		if errors.Is(err, shm.ErrEmpty) {
			r.Release()
			if final {
				break
			}
			if p.exited() {
				final = true // one more pass: the last tail store may follow our last load
				continue
			}
			n.parks++
			start := time.Now()
			if r.Park(park) {
				n.wakes++
			} else if time.Since(start) >= park && r.Pending() && !p.exited() {
				n.missed++
			}
			continue
		}
		if err != nil {
			return n, fmt.Errorf("Next after %d records: %w", c.records, err)
		}
		if err := c.record(rec); err != nil {
			return n, err
		}
		if i++; i%64 == 0 {
			r.Release()
		}
	}
	st := r.Stats()
	n.events, n.records, n.losses, n.wraps = c.next-1, uint64(c.records), c.losses, st.Tail/st.Capacity
	if st.DroppedEvents != c.losses || st.ReadPos != st.Tail {
		return n, fmt.Errorf("final stats %+v: want dropped_events == %d (sum of LOSS counts), everything read", st, c.losses)
	}
	return n, nil
}

func TestPythonProducersDoorbellStress(t *testing.T) {
	producers := stressEnv(t, "KVSHM_STRESS_PRODUCERS", 2)
	events := 50_000
	if testing.Short() {
		producers, events = 1, 10_000
	}
	events = stressEnv(t, "KVSHM_STRESS_PRODUCER_EVENTS", events)
	park := time.Duration(stressEnv(t, "KVSHM_STRESS_PARK_MS", 2000)) * time.Millisecond
	procs := make([]*producer, producers)
	readers := make([]*shm.Reader, producers)
	for i := range procs {
		procs[i] = startProducer(t, "--events", strconv.Itoa(events), "--capacity", strconv.Itoa(64<<10),
			"--worker-id", strconv.Itoa(100+i), "--burst", "64", "--pause-us", "1000")
		r, err := shm.Open(procs[i].path)
		if err != nil {
			t.Fatalf("open the ring of producer %d: %v", i, err)
		}
		defer r.Close()
		readers[i] = r
	}
	start := time.Now()
	counts := make([]doorbellCounts, producers)
	errs := make([]error, producers)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			counts[i], errs[i] = drainParked(readers[i], &stressCheck{next: 1}, procs[i], park)
			if errs[i] != nil {
				procs[i].cmd.Process.Kill()
			}
		}()
	}
	wg.Wait()
	var sum doorbellCounts
	native := true
	for i, p := range procs {
		native = native && p.native
		if errs[i] != nil {
			t.Errorf("producer %d: %v", i, errs[i])
			continue
		}
		if p.err != nil {
			t.Errorf("producer %d failed: %v\nstderr:\n%s", i, p.err, p.stderr.String())
		}
		c := counts[i]
		if c.events != uint64(events) {
			t.Errorf("producer %d: read %d events, it published %d", i, c.events, events)
		}
		sum.events += c.events
		sum.records += c.records
		sum.losses += c.losses
		sum.parks += c.parks
		sum.wakes += c.wakes
		sum.missed += c.missed
		sum.wraps += c.wraps
	}
	publication := "kvshm._ringsync"
	if !native {
		publication = "the pure-Python fallback (no fence: missed doorbells allowed)"
	}
	t.Logf("%s; %d producers x %d events: %d records checked, %d wraps, %d full-ring retries, %d parks, %d doorbell "+
		"wakes, %d missed doorbells, in %v", publication, producers, events, sum.records, sum.wraps, sum.losses, sum.parks,
		sum.wakes, sum.missed, time.Since(start).Round(time.Millisecond))
	if sum.missed != 0 && native {
		t.Errorf("%d parks ran into their %v timeout with records waiting: the doorbell missed a parked consumer",
			sum.missed, park)
	}
	if sum.wakes == 0 {
		t.Errorf("no Park was ended by the doorbell: the test did not exercise it")
	}
}
