package daemon

import (
	"fmt"
	"testing"

	"github.com/kvshm/kvshm/drain"
	"github.com/kvshm/kvshm/proto/sock"
)

// TestDrainSchedulerModes runs one daemon scenario on both drain modes: futex_waitv workers shared by many rings
// (2 rings per worker here, so streams share workers) and the fallback of one worker per ring on Reader.Park (as
// on a kernel without futex_waitv). Every query sees what was published before it (read-your-writes barriers wake
// the sleeping worker), a producer's DETACH final-drains its ring and ends only its stream, and the others go on.
// (The whole suite runs on the fallback with go test ./daemon/ -args -drain-fallback.)
func TestDrainSchedulerModes(t *testing.T) {
	for _, mode := range []struct {
		name string
		cfg  drain.Config
	}{{"waitv", drain.Config{RingsPerWorker: 2}}, {"fallback", drain.Config{NoWaitv: true}}} {
		t.Run(mode.name, func(t *testing.T) {
			ts := startServer(t, func(c *Config) { c.Drain = mode.cfg })
			socket := ts.SocketPath()
			q := dialT(t, socket)
			var ps []*producer
			for w := range uint64(5) {
				ps = append(ps, newProducer(t, socket, 100+w, 4, 1<<16))
			}
			for seq := uint64(0); seq < 20; seq++ {
				for i, p := range ps {
					if i == 0 && seq >= 10 {
						continue // detached below
					}
					p.mustPublish(stored(seq, 0, parentOf(seq), []uint64{seq + 1}, tokens(uint32(seq), 1, 4)))
					eventsEqual(t, q, p, u64p(0), fmt.Sprintf("worker %d after seq %d", p.worker, seq))
				}
				if seq == 9 {
					if err := ps[0].conn.Detach(ctxT(t), ps[0].worker); err != nil {
						t.Fatal(err)
					}
					checkStats(t, socket, ps[0].worker, func(s sock.StreamStats) bool { return !s.Attached })
					ps[0].applyOracle(cleared(10)) // the incarnation's end (docs/lifecycle.md)
					eventsEqual(t, q, ps[0], u64p(0), "the detached worker's index")
				}
			}
		})
	}
}
