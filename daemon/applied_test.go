package daemon

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/proto/sock"
)

// hasSample reports whether the scrape has the exact sample line.
func hasSample(t *testing.T, scrape, line string) bool {
	t.Helper()
	for l := range strings.SplitSeq(scrape, "\n") {
		if l == line {
			return true
		}
	}
	return false
}

// TestBlocksAppliedMetric: kvshm_blocks_applied_total counts each applied event's blocks under its type and tree
// status; an event whose token count does not match its blocks is applied as Dynamo does (its blocks count under
// its status, as many as it carries hashes).
func TestBlocksAppliedMetric(t *testing.T) {
	ts := startServer(t, nil)
	p := newProducer(t, ts.SocketPath(), 1, 4, 1<<16)
	p.mustPublish(stored(0, 0, nil, []uint64{10, 11}, tokens(0, 2, 4)))                                                  // ok, 2 blocks
	p.mustPublish(stored(1, 0, u64p(99), []uint64{20, 21, 22}, tokens(0, 3, 4)))                                         // parent_not_found, 3 blocks
	p.mustPublish(removed(2, 0, 10, 55))                                                                                 // block_not_found, 2 blocks
	p.mustPublish(removed(3, 0, 11))                                                                                     // ok, 1 block
	p.mustPublish(fbs.EventSpec{Seq: 4, Kind: fbs.KindStored, BlockHashes: []uint64{30, 31}, TokenIDs: tokens(0, 1, 4)}) // ok (token mismatch), 2 blocks
	p.mustPublish(cleared(5))                                                                                            // ok, 0 blocks
	checkStats(t, ts.SocketPath(), 1, func(s sock.StreamStats) bool { return s.EventsReceived == 6 })
	m := scrape(t, ts.Server)
	want := map[[2]string]int{
		{"stored", "ok"}: 4, {"stored", "parent_not_found"}: 3, {"removed", "block_not_found"}: 2, {"removed", "ok"}: 1,
	}
	for _, typ := range kindLabels {
		for _, status := range []string{"ok", "parent_not_found", "block_not_found", "invalid_block_sequence"} {
			line := fmt.Sprintf(`kvshm_blocks_applied_total{dp_rank="",status=%q,type=%q,worker_id="1"} %d`, status, typ, want[[2]string{typ, status}])
			if !hasSample(t, m, line) {
				t.Errorf("metrics lack %s", line)
			}
		}
	}
	if !hasSample(t, m, `kvshm_blocks_received_total{dp_rank="",type="stored",worker_id="1"} 7`) {
		t.Errorf("blocks_received for stored is not 7 (2 + 3 + 2):\n%s", m)
	}
}
