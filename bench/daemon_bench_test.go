package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/kvshm/kvshm/daemon"
	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
)

// Daemon benchmarks: ingest rate unloaded vs under 64 query clients (with dumps), idle CPU, and reach latency
// (publish → applied). They print numbers and never fail on thresholds. Run with
//
//	go test -run '^$' -bench 'DaemonIngest' -benchtime 200000x ./bench/
//	go test -run '^$' -bench 'DaemonIdleCPU' -benchtime 10x ./bench/        (10 windows of 200 ms)
//	go test -run '^$' -bench 'DaemonReach' -benchtime 5000x ./bench/
//	go test -run '^$' -bench 'DaemonColdReach' -benchtime 10x ./bench/     (one event per second: parked stream)
//	go test -run '^$' -bench 'DaemonStreamsCPU' -benchtime 4x ./bench/     (64 streams at 10 events/s, 4 windows of 1 s)
//	go test -run '^$' -bench 'DaemonQueryUnderLoad' -benchtime 2000x ./bench/
//	go test -run '^$' -bench 'DaemonProcCPU' -benchtime 4x ./bench/        (kvshmd as a process: its CPU alone)
//
// Goals: ingest under load ≥ 50% of unloaded (ratio_vs_unloaded), idle CPU ≤ 1% of a core
// (pct_core), busy reach ~100 µs (p50_us/p99_us at gap=0 and gap=200us); the node: 64 idle streams ≤ 0.2% of a
// core, 64 streams at 10 events/s ≤ 2% (daemon_pct_core: the run's CPU less the same publishers' without a daemon),
// a recovery query under 64 streams at 400 events/s p50 ≤ 1 ms, p99 ≤ 5 ms.

const benchBlockSize = 16

// benchDaemon is an in-process kvshmd with one attached producer.
type benchDaemon struct {
	srv    *daemon.Server
	socket string // a kvshmd process's socket (startProcDaemon), when srv is nil
	cancel context.CancelFunc
	done   chan error
	w      *shm.Writer
	conn   *sock.Client
	b      *flatbuffers.Builder
	seq    uint64
	next   uint64 // next block hash
	live   [][]uint64
	toks   []uint32
}

func startBenchDaemon(tb testing.TB, capacity uint64) *benchDaemon {
	tb.Helper()
	return startBenchDaemonCfg(tb, nil)
}

// startBenchDaemonCfg is startBenchDaemon with mod applied to the daemon's config.
func startBenchDaemonCfg(tb testing.TB, mod func(*daemon.Config)) *benchDaemon {
	tb.Helper()
	dir := tb.TempDir()
	cfg := daemon.Config{SocketPath: filepath.Join(dir, "run", "kvshmd.sock"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	// KVSHM_BENCH_RINGS_PER_WORKER and KVSHM_BENCH_DRAIN_FALLBACK=1 compare drain scheduler settings.
	cfg.Drain.RingsPerWorker, _ = strconv.Atoi(os.Getenv("KVSHM_BENCH_RINGS_PER_WORKER"))
	cfg.Drain.NoWaitv = os.Getenv("KVSHM_BENCH_DRAIN_FALLBACK") == "1"
	if mod != nil {
		mod(&cfg)
	}
	srv, err := daemon.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &benchDaemon{srv: srv, cancel: cancel, done: make(chan error, 1), b: flatbuffers.NewBuilder(4096), next: 1}
	go func() { d.done <- srv.Serve(ctx) }()
	tb.Cleanup(d.stop)
	return d
}

func (d *benchDaemon) stop() {
	if d.cancel != nil {
		d.cancel()
		<-d.done
		d.cancel = nil
	}
	if d.conn != nil {
		d.conn.Close()
	}
	if d.w != nil {
		d.w.Close()
	}
}

func (d *benchDaemon) attach(tb testing.TB, worker uint64, capacity uint64) (*shm.Writer, *sock.Client) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), fmt.Sprintf("w%d.ring", worker))
	w, err := shm.Create(path, shm.Options{Capacity: capacity, WorkerID: worker, KVBlockSize: benchBlockSize, MaxBufferSize: 4096})
	if err != nil {
		tb.Fatal(err)
	}
	socket := d.socket
	if d.srv != nil {
		socket = d.srv.SocketPath()
	}
	c, err := sock.Dial(context.Background(), socket)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := c.Attach(context.Background(), sock.AttachRequest{RingPath: path, WorkerID: worker, KVBlockSize: benchBlockSize, MaxBufferSize: 4096}); err != nil {
		tb.Fatal(err)
	}
	return w, c
}

// event returns the next event of a steady workload: a 4-block store (64 tokens) or the removal of the oldest
// stored chain once more than keep chains are resident, so the tree size stays constant.
func (d *benchDaemon) event(keep int) []byte {
	ev := fbs.EventSpec{Seq: d.seq}
	d.seq++
	if len(d.live) > keep {
		ev.Kind, ev.BlockHashes = fbs.KindRemoved, d.live[0]
		d.live = d.live[1:]
	} else {
		hashes := []uint64{d.next, d.next + 1, d.next + 2, d.next + 3}
		d.next += 4
		if d.toks == nil {
			d.toks = make([]uint32, 4*benchBlockSize)
		}
		for i := range d.toks {
			d.toks[i] = uint32(d.next) + uint32(i)
		}
		ev.Kind, ev.BlockHashes, ev.TokenIDs = fbs.KindStored, hashes, d.toks
		d.live = append(d.live, hashes)
	}
	return fbs.Build(d.b, &ev)
}

// publish appends one event, waiting for room (no loss), and publishes it.
func (d *benchDaemon) publish(payload []byte) {
	for !d.w.Append(shm.TypeEvent, payload) {
		time.Sleep(20 * time.Microsecond)
	}
	d.w.Publish()
}

// waitDrained spins until the daemon released everything published.
func (d *benchDaemon) waitDrained() {
	for {
		st := d.w.Stats()
		if st.Head == st.Tail {
			return
		}
		time.Sleep(20 * time.Microsecond)
	}
}

var unloadedRate atomic.Uint64 // events/s measured by load=none in this run (float bits)

// BenchmarkDaemonIngest publishes b.N events (stores and removes over a ~4000-block tree) and measures the rate at
// which the daemon applies them, unloaded and while 64 query clients (a quarter of them dumping) hammer it.
func BenchmarkDaemonIngest(b *testing.B) {
	for _, load := range []int{0, 64} {
		name := "load=none"
		if load > 0 {
			name = fmt.Sprintf("load=%dclients", load)
		}
		b.Run(name, func(b *testing.B) {
			// Eager: the drain path's capacity, not a lazy stream's last records waiting for their deadline.
			d := startBenchDaemonCfg(b, func(c *daemon.Config) { c.EagerDrain = true })
			d.w, d.conn = d.attach(b, 1, 16<<20)
			for range 1000 { // resident tree: 1000 chains of 4 blocks
				d.publish(d.event(1000))
			}
			d.waitDrained()
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var queries, dumps atomic.Int64
			for i := range load {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c, err := sock.Dial(context.Background(), d.srv.SocketPath())
					if err != nil {
						b.Error(err)
						return
					}
					defer c.Close()
					w := uint64(1)
					for n := 0; ; n++ {
						select {
						case <-stop:
							return
						default:
						}
						ctx := context.Background()
						switch {
						case i%4 == 0:
							_, err = c.Dump(ctx, &w)
							dumps.Add(1)
						case n%3 == 0:
							_, err = c.Stats(ctx, &w)
						case n%3 == 1:
							_, err = c.Match(ctx, sock.MatchRequest{WorkerID: &w, Tokens: make([]uint32, 64)})
						default:
							_, err = c.Events(ctx, &w, &d.seq, nil)
						}
						if err != nil {
							b.Error(err)
							return
						}
						queries.Add(1)
					}
				}()
			}
			if load > 0 {
				time.Sleep(100 * time.Millisecond) // clients connected and running
			}
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for b.Loop() { // encoding is part of the loop, as in a real producer
				d.publish(d.event(1000))
			}
			d.waitDrained()
			elapsed := time.Since(start)
			b.StopTimer()
			close(stop)
			wg.Wait()
			rate := float64(b.N) / elapsed.Seconds()
			b.ReportMetric(rate, "events/s")
			if load == 0 {
				unloadedRate.Store(uint64(rate))
			} else {
				b.ReportMetric(float64(queries.Load())/elapsed.Seconds(), "queries/s")
				b.ReportMetric(float64(dumps.Load())/elapsed.Seconds(), "dumps/s")
				if base := unloadedRate.Load(); base > 0 {
					b.ReportMetric(rate/float64(base), "ratio_vs_unloaded")
				}
			}
		})
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDaemonIdleCPU measures the CPU a daemon with attached but silent producers uses (streams=0 is the
// baseline: a daemon with no stream): one op is a 200 ms sleep
// window; pct_core is process CPU time (getrusage) / wall time × 100. The benchmark goroutine only sleeps, so
// the drain loops' backoff is what is measured.
func BenchmarkDaemonIdleCPU(b *testing.B) {
	for _, streams := range []int{0, 1, 8, 64} {
		b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) {
			d := startBenchDaemon(b, 1<<16)
			for i := range streams {
				w, c := d.attach(b, uint64(i+1), 1<<16)
				b.Cleanup(func() { c.Close(); w.Close() })
			}
			time.Sleep(200 * time.Millisecond) // past the spin and yield phases
			b.ReportAllocs()
			b.ResetTimer()
			cpu0, t0 := cpuTime(), time.Now()
			for b.Loop() {
				time.Sleep(200 * time.Millisecond)
			}
			pct := 100 * float64(cpuTime()-cpu0) / float64(time.Since(t0))
			b.ReportMetric(pct, "pct_core")
		})
	}
}

// BenchmarkDaemonReachLatency measures publish → applied (head released past the event) for one event at a time,
// with a gap between events: gap=0 keeps the drain loop busy (spin phase), 200µs and 2ms find it in its warm nap
// backoff, 50ms and 300ms parked on the ring's doorbell (woken by the publish; daemon/internal/stream/idle.go has the phases).
func BenchmarkDaemonReachLatency(b *testing.B) {
	benchReach(b, []time.Duration{0, 200 * time.Microsecond, 2 * time.Millisecond, 50 * time.Millisecond, 300 * time.Millisecond})
}

// BenchmarkDaemonColdReach is BenchmarkDaemonReachLatency for a stream that has been idle a long time (1 s between
// events, well past coldAfter and one park timeout): the drain loop sleeps in Reader.Park and the publish's
// doorbell (FUTEX_WAKE) wakes it, so the first event after idle is reached in about one wakeup.
func BenchmarkDaemonColdReach(b *testing.B) {
	benchReach(b, []time.Duration{time.Second})
}

func benchReach(b *testing.B, gaps []time.Duration) {
	for _, gap := range gaps {
		b.Run(fmt.Sprintf("gap=%v", gap), func(b *testing.B) {
			// Eager: the doorbell path every publishing stream takes (a stream nobody subscribes to is drained
			// lazily, and a query's barrier, not the doorbell, reaches its records: daemon/internal/stream/idle.go).
			d := startBenchDaemonCfg(b, func(c *daemon.Config) { c.EagerDrain = true })
			d.w, d.conn = d.attach(b, 1, 1<<20)
			lat := make([]time.Duration, 0, 1024)
			b.ReportAllocs()
			for b.Loop() {
				payload := d.event(64)
				if gap > 0 {
					// Busy-wait short gaps: Go's timers cannot sleep below ~1 ms here, and the gap must be exact.
					t := time.Now()
					if gap > 10*time.Millisecond {
						time.Sleep(gap)
					}
					for time.Since(t) < gap {
					}
				}
				t0 := time.Now()
				d.w.Append(shm.TypeEvent, payload)
				d.w.Publish()
				tail := d.w.Stats().Tail
				for d.w.Stats().Head < tail {
				}
				lat = append(lat, time.Since(t0))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50_us")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99_us")
		})
	}
}

// pacedStream is one producer of the many-streams benchmarks: a ring (attached or not) and its event generator.
type pacedStream struct {
	w      *shm.Writer
	worker uint64
	b      *flatbuffers.Builder
	seq    atomic.Uint64 // next seq to publish
	toks   []uint32
}

// publishOne publishes the stream's next event: a one-block store, then its removal, so the tree stays small.
func (p *pacedStream) publishOne() {
	seq := p.seq.Load()
	h := []uint64{p.worker<<32 | seq/2 + 1}
	ev := fbs.EventSpec{Seq: seq, Kind: fbs.KindStored, BlockHashes: h, TokenIDs: p.toks}
	if seq%2 == 1 {
		ev = fbs.EventSpec{Seq: seq, Kind: fbs.KindRemoved, BlockHashes: h}
	}
	if p.w.Append(shm.TypeEvent, fbs.Build(p.b, &ev)) {
		p.w.Publish()
	}
	p.seq.Store(seq + 1)
}

// startStreams creates n rings (attached to d when d is not nil) and publishes on each every period, at a random
// phase, from its own goroutine, until the returned stop is called.
func startStreams(b *testing.B, d *benchDaemon, n int, period time.Duration) ([]*pacedStream, func()) {
	var ps []*pacedStream
	for i := range n {
		worker := uint64(i + 1)
		p := &pacedStream{worker: worker, b: flatbuffers.NewBuilder(256), toks: make([]uint32, benchBlockSize)}
		if d != nil {
			w, c := d.attach(b, worker, 1<<20)
			b.Cleanup(func() { c.Close(); w.Close() })
			p.w = w
		} else {
			w, err := shm.Create(filepath.Join(b.TempDir(), "r.ring"), shm.Options{Capacity: 1 << 20, WorkerID: worker,
				KVBlockSize: benchBlockSize, MaxBufferSize: 4096})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { w.Close() })
			p.w = w
		}
		ps = append(ps, p)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := time.Now().Add(period * time.Duration(i) / time.Duration(n)) // spread phases
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Until(next)):
				}
				p.publishOne()
				next = next.Add(period)
			}
		}()
	}
	return ps, func() { close(stop); wg.Wait() }
}

var publishersOnly atomic.Uint64 // pct_core of daemon=none in this run (float bits)

// BenchmarkDaemonStreamsCPU measures the CPU of 64 streams publishing 10 events/s each: daemon=none is the same
// publishers writing rings nobody reads (the baseline: timers, encoding, the publish), daemon=kvshmd the same with
// every ring attached to an in-process kvshmd. One op is a 1 s window; daemon_pct_core is the difference (the
// producers' FUTEX_WAKE on a sleeping daemon counts as the daemon's).
func BenchmarkDaemonStreamsCPU(b *testing.B) {
	for _, mode := range []string{"none", "kvshmd"} {
		b.Run("streams=64/rate=10/daemon="+mode, func(b *testing.B) {
			var d *benchDaemon
			if mode == "kvshmd" {
				d = startBenchDaemon(b, 1<<20)
			}
			_, stop := startStreams(b, d, 64, 100*time.Millisecond)
			defer stop()
			time.Sleep(500 * time.Millisecond) // every stream has published and gone idle once
			b.ReportAllocs()
			b.ResetTimer()
			cpu0, t0 := cpuTime(), time.Now()
			for b.Loop() {
				time.Sleep(time.Second)
			}
			pct := 100 * float64(cpuTime()-cpu0) / float64(time.Since(t0))
			b.ReportMetric(pct, "pct_core")
			if mode == "none" {
				publishersOnly.Store(math.Float64bits(pct))
			} else if base := publishersOnly.Load(); base != 0 {
				b.ReportMetric(pct-math.Float64frombits(base), "daemon_pct_core")
			}
		})
	}
}

var idleQueryP50 atomic.Uint64 // p50 in µs of busy=0 in this run (float bits)

// BenchmarkDaemonQueryUnderLoad measures a recovery query (EVENTS of one worker from its newest 10 ids, through
// sock.Client) while 64 streams publish 400 events/s each (busy=64), against the same query with those streams
// attached and silent (busy=0). p50_vs_idle is the ratio of the medians.
func BenchmarkDaemonQueryUnderLoad(b *testing.B) {
	for _, busy := range []bool{false, true} {
		name := "busy=0"
		if busy {
			name = "busy=64"
		}
		b.Run(name, func(b *testing.B) {
			d := startBenchDaemon(b, 1<<20)
			period := time.Hour
			if busy {
				period = 2500 * time.Microsecond
			}
			ps, stop := startStreams(b, d, 64, period)
			defer stop()
			for _, p := range ps { // every stream has events to answer with
				p.publishOne()
			}
			time.Sleep(300 * time.Millisecond)
			c, err := sock.Dial(context.Background(), d.srv.SocketPath())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			lat := make([]time.Duration, 0, 4096)
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				p := ps[i%len(ps)]
				i++
				w := p.worker
				start := uint64(0)
				if s := p.seq.Load(); s > 10 {
					start = s - 10
				}
				t0 := time.Now()
				if _, err := c.Events(context.Background(), &w, &start, nil); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			slices.Sort(lat)
			p50 := float64(lat[len(lat)/2].Nanoseconds()) / 1e3
			b.ReportMetric(p50, "p50_us")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99_us")
			if !busy {
				idleQueryP50.Store(math.Float64bits(p50))
			} else if base := idleQueryP50.Load(); base != 0 {
				b.ReportMetric(p50/math.Float64frombits(base), "p50_vs_idle")
			}
		})
	}
}

var (
	kvshmdOnce sync.Once
	kvshmdBin  string
	kvshmdErr  error
)

// startProcDaemon runs `kvshmd serve` as a process of its own (built once per run) and returns it with its pid, so
// a benchmark can read the daemon's CPU alone (procCPU) without the in-process publishers' scheduler activity.
func startProcDaemon(b *testing.B) (*benchDaemon, int) {
	kvshmdOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvshmd-bench-")
		if err != nil {
			kvshmdErr = err
			return
		}
		kvshmdBin = filepath.Join(dir, "kvshmd")
		if out, err := exec.Command("go", "build", "-o", kvshmdBin, "../cmd/kvshmd").CombinedOutput(); err != nil {
			kvshmdErr = fmt.Errorf("build kvshmd: %v\n%s", err, out)
		}
	})
	if kvshmdErr != nil {
		b.Fatal(kvshmdErr)
	}
	socket := filepath.Join(b.TempDir(), "run", "kvshmd.sock")
	cmd := exec.Command(kvshmdBin, "serve", "--socket", socket)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	for i := 0; ; i++ {
		c, err := sock.Dial(context.Background(), socket)
		if err == nil {
			_, err = c.Health(context.Background())
			c.Close()
			if err == nil {
				break
			}
		}
		if i == 1000 {
			b.Fatalf("kvshmd did not answer: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return &benchDaemon{socket: socket, b: flatbuffers.NewBuilder(4096), next: 1}, cmd.Process.Pid
}

// procCPU is the CPU time of every live thread of process pid (/proc/pid/task/*/schedstat, ns on CPU).
func procCPU(b *testing.B, pid int) time.Duration {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		b.Skip("no /proc/PID/task/*/schedstat")
	}
	var sum time.Duration
	for _, f := range tasks {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var ns int64
		if _, err := fmt.Sscan(string(data), &ns); err == nil {
			sum += time.Duration(ns)
		}
	}
	return sum
}

// BenchmarkDaemonProcCPU measures the CPU of a kvshmd process alone (its threads' schedstat), with 64 streams
// attached by this process: idle, and publishing 10 events/s each (streams=0: the same daemon with none). One op is a 1 s window; kvshmd_pct_core is
// its CPU / wall time × 100. It is what RESULTS.md's Node "kvshmd CPU" rows mean; BenchmarkDaemonIdleCPU and
// BenchmarkDaemonStreamsCPU measure the same in-process, where the publishers' own scheduling interferes.
func BenchmarkDaemonProcCPU(b *testing.B) {
	for _, c := range []struct {
		name    string
		streams int
		period  time.Duration
	}{{"streams=0/idle", 0, time.Hour}, {"streams=64/idle", 64, time.Hour}, {"streams=64/rate=10", 64, 100 * time.Millisecond}} {
		b.Run(c.name, func(b *testing.B) {
			d, pid := startProcDaemon(b)
			_, stop := startStreams(b, d, c.streams, c.period)
			defer stop()
			time.Sleep(500 * time.Millisecond)
			b.ReportAllocs()
			b.ResetTimer()
			cpu0, t0 := procCPU(b, pid), time.Now()
			for b.Loop() {
				time.Sleep(time.Second)
			}
			b.ReportMetric(100*float64(procCPU(b, pid)-cpu0)/float64(time.Since(t0)), "kvshmd_pct_core")
		})
	}
}
