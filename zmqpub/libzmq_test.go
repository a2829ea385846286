package zmqpub

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvshm/kvshm/internal/testenv"
)

// Real libzmq peers (pyzmq: a heartbeating SUB, an XSUB, a heartbeating DEALER, a REQ; testdata/libzmqpeers.py)
// get exactly what they got before the bounds, from 127.0.0.1, while hostile peers from other loopback addresses
// hold their address's share of both sockets, flood PINGs (one never reads, one sends 60 KiB contexts), flood
// subscriptions and hold unfinished replay requests: every bound cuts the hostile peer, never the libzmq ones.
func TestLibzmqPeersBesideHostiles(t *testing.T) {
	py := testenv.VenvPython(t, "../.venv/bin/python", "zmq")
	p := newPub(t, Config{Endpoint: "tcp://*:0", ReplayEndpoint: "tcp://*:0", Topic: "kv", BufferSteps: 100_000,
		StallTimeout: 10 * time.Minute})
	local := func(ep string) string {
		return strings.Replace(strings.TrimPrefix(ep, "tcp://"), "0.0.0.0", "127.0.0.1", 1)
	}
	pub, rep := local(p.Stats().Endpoint), local(p.Stats().ReplayEndpoint)

	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			_ = c.Close()
		}
	})
	hold := func(from, addr, socketType string, first []byte) {
		c, err := handshakeFrom(from, addr, socketType)
		if err != nil {
			return // past the address's share: closed at accept
		}
		held = append(held, c)
		_, _ = c.Write(first) // a peer cut while it writes gets an error: what it asked for

	}
	// 127.0.0.2: idle connections past its share on both sockets.
	for range DefaultConnsPerAddr + 10 {
		hold("127.0.0.2", pub, "SUB", subscription(true, []byte("never")))
		hold("127.0.0.2", rep, "DEALER", appendFrame(nil, flagMore, bytes.Repeat([]byte{1}, 60<<10)))
	}
	// 127.0.0.3: a PING flood that never reads, a PING with a 60 KiB context, a subscription flood.
	hold("127.0.0.3", pub, "SUB", bytes.Repeat(pingFrame(make([]byte, 16)), 10_000))
	hold("127.0.0.3", rep, "DEALER", pingFrame(make([]byte, 60<<10)))
	var subs []byte
	for i := range maxSubscriptions + 1 {
		subs = append(subs, subscription(true, fmt.Appendf(nil, "flood-%d", i))...)
	}
	hold("127.0.0.3", pub, "SUB", subs)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the publisher: [kv, seq, "batch-<seq>"] about every millisecond until the peers are done
		defer wg.Done()
		for seq := uint64(1); ; seq++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			p.Publish(seq, fmt.Appendf(nil, "batch-%d", seq))
		}
	}()
	out, err := exec.Command(py, "testdata/libzmqpeers.py", "tcp://"+pub, "tcp://"+rep, "kv").Output()
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("libzmq peers: %v: %s", err, out)
	}
	var res struct {
		Errors        []string
		Sub, Replayed int
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("libzmq peers' output %q: %v", out, err)
	}
	if len(res.Errors) > 0 {
		t.Fatalf("libzmq peers beside hostile ones: %s", strings.Join(res.Errors, "; "))
	}
	for _, want := range []struct {
		reason string
		n      uint64
	}{{"addr_conns", 20}, {"ping", 1}, {"subscriptions", 1}} {
		if got := cutBy(p, want.reason); got != want.n {
			t.Errorf("%d peers cut under %s, want %d", got, want.reason, want.n)
		}
	}
	t.Logf("libzmq SUB got %d batches in order, DEALER replayed %d; cut: %v", res.Sub, res.Replayed,
		p.Stats().PeersCut)
}
