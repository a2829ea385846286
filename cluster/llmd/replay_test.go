package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/llm-d/llm-d-router/pkg/kvcache/metrics"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// publisher is one pod's side of the wire the cluster's daemons speak: a PUB sending [topic, seq, batch] and a
// replay ROUTER answering ["", start] with ["", topic, seq, batch] for every retained seq >= start, then the end
// marker ["", "", -1, ""]. A seq recorded as lost is never answered (a gap in the buffer); publish sends any.
type publisher struct {
	t     *testing.T
	topic string
	pub   zmq4.Socket
	rtr   zmq4.Socket

	mu       sync.Mutex
	payloads map[uint64][]byte
	lost     map[uint64]bool
	served   int // replay requests answered
}

func newPublisher(t *testing.T, ctx context.Context, topic string) *publisher {
	p := &publisher{t: t, topic: topic, pub: zmq4.NewPub(ctx), rtr: zmq4.NewRouter(ctx),
		payloads: make(map[uint64][]byte), lost: make(map[uint64]bool)}
	t.Cleanup(func() { _ = p.pub.Close(); _ = p.rtr.Close() })
	if err := p.pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if err := p.rtr.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	go p.serve()
	return p
}

func (p *publisher) endpoints() (pub, replay string) {
	return "tcp://" + p.pub.Addr().String(), "tcp://" + p.rtr.Addr().String()
}

func seqFrame(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// serve answers replay requests until the ROUTER is closed.
func (p *publisher) serve() {
	for {
		msg, err := p.rtr.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
		p.mu.Lock()
		for seq := start; seq < uint64(len(p.payloads)); seq++ {
			if !p.lost[seq] {
				_ = p.rtr.SendMulti(zmq4.NewMsgFrom(id, nil, []byte(p.topic), seqFrame(seq), p.payloads[seq]))
			}
		}
		_ = p.rtr.SendMulti(zmq4.NewMsgFrom(id, nil, nil, seqFrame(^uint64(0)), nil))
		p.served++
		p.mu.Unlock()
	}
}

// record appends the next seq's batch to the buffer (lost: a gap in it), not publishing it.
func (p *publisher) record(lost bool, payload func(seq uint64) []byte) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := uint64(len(p.payloads))
	p.payloads[seq], p.lost[seq] = payload(seq), lost
	return seq
}

// publish sends seq live, again every 100 ms until the pod's subscriber has received one more message (a SUB's
// subscription reaches the PUB asynchronously; llm-d drops a repeated live seq).
func (p *publisher) publish(pod string, seq uint64) {
	p.t.Helper()
	p.mu.Lock()
	payload := p.payloads[seq]
	p.mu.Unlock()
	before := counter(metrics.MessagesReceived, pod)
	waitFor(p.t, "live seq received", func() bool {
		_ = p.pub.Send(zmq4.NewMsgFrom([]byte(p.topic), seqFrame(seq), payload))
		return counter(metrics.MessagesReceived, pod) > before
	})
}

func (p *publisher) requests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.served
}

// counter is one series of one of llm-d's per-pod counters.
func counter(c *prometheus.CounterVec, labels ...string) float64 {
	var m dto.Metric
	if err := c.WithLabelValues(labels...).Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// waitFor polls cond every 100 ms for at most 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// replayRig is the router (llm-d's pool, subscriber manager and index behind the routes) and one pod's publisher.
type replayRig struct {
	t   *testing.T
	ctx context.Context
	rt  *router
	p   *publisher
	pod string
	key podKey
}

// workers numbers the rigs' pods: llm-d's metrics are process-wide, per pod, and dropped asynchronously.
var workers atomic.Int64

func newReplayRig(t *testing.T) *replayRig {
	ctx, cancel := context.WithCancel(context.Background())
	rt, err := newRouter(ctx, 4, "cluster")
	if err != nil {
		t.Fatal(err)
	}
	rt.pool.Start(ctx)
	t.Cleanup(func() {
		rt.subs.Shutdown(ctx)
		rt.pool.Shutdown(ctx)
		cancel()
	})
	key := podKey{300 + workers.Add(1), 0}
	pod := key.String()
	return &replayRig{t: t, ctx: ctx, rt: rt, p: newPublisher(t, ctx, "kv@"+pod+"@cluster"), pod: pod, key: key}
}

// register is the harness's POST /register, with the replay endpoint.
func (r *replayRig) register() {
	r.t.Helper()
	pub, replay := r.p.endpoints()
	body, _ := json.Marshal(map[string]any{"instance_id": r.key.worker, "dp_rank": r.key.rank,
		"endpoint": pub, "replay_endpoint": replay})
	w := httptest.NewRecorder()
	r.rt.mux().ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/register", strings.NewReader(string(body))))
	if w.Code != http.StatusCreated {
		r.t.Fatalf("/register: %d %s", w.Code, w.Body)
	}
}

// block records the next seq as a batch storing one root block (hash 1000+seq), returning the seq and the hash.
func (r *replayRig) block(lost bool) (uint64, uint64) {
	seq := r.p.record(lost, func(seq uint64) []byte { return batch(r.t, 0, stored(nil, 1000+seq)) })
	return seq, 1000 + seq
}

// blocks records n kept blocks (block(false)) and returns their hashes.
func (r *replayRig) blocks(n int) []uint64 {
	var hs []uint64
	for range n {
		_, h := r.block(false)
		hs = append(hs, h)
	}
	return hs
}

// held is what /dump shows for the pod.
func (r *replayRig) held() []uint64 { return r.rt.index.holdings(r.ctx)[r.key] }

func (r *replayRig) waitHeld(want []uint64) {
	r.t.Helper()
	waitFor(r.t, fmt.Sprint("llm-d to hold ", want), func() bool { return reflect.DeepEqual(r.held(), want) })
}

// TestLateSubscriberConvergesByReplay: a router that registers after seqs 0..4 went out (only the buffer has them:
// no subscriber was there) holds their blocks through llm-d's replay from seq 0 on connect, then follows the live
// stream from seq 5.
func TestLateSubscriberConvergesByReplay(t *testing.T) {
	r := newReplayRig(t)
	want := r.blocks(5)
	r.register()
	r.waitHeld(want)
	if n := r.p.requests(); n != 1 {
		t.Fatalf("%d replay requests, want 1 (from seq 0)", n)
	}
	seq, h := r.block(false)
	r.p.publish(r.pod, seq)
	r.waitHeld(append(want, h))
}

// TestReplayStartingLateLeavesNothing pins how strict llm-d's replay is: a reply whose first seq is above the
// requested start is "incomplete", even when every later seq is in it. llm-d then clears the pod (resetForSource),
// blocks replay for 30 s (replayCooldown) and, having no lastSeq, drops every live batch with seq > 0 meanwhile.
func TestReplayStartingLateLeavesNothing(t *testing.T) {
	t.Run("join with seq 0 gone", func(t *testing.T) {
		r := newReplayRig(t)
		r.block(true) // the buffer no longer holds seq 0
		r.blocks(3)
		r.register()
		waitFor(t, "an incomplete replay", func() bool {
			return counter(metrics.ZMQErrors, r.pod, "replay-incomplete") == 1
		})
		r.expectNothingAfterLive(1)
	})
	t.Run("gap with its first seq gone", func(t *testing.T) {
		r := newReplayRig(t)
		want := r.blocks(3)
		r.register()
		r.waitHeld(want) // converged through a replay from seq 0
		r.block(true)    // seq 3: missed live and gone from the buffer
		seq, _ := r.block(false)
		r.p.publish(r.pod, seq) // seq 4: the gap asks for a replay from 3, answered from 4
		waitFor(t, "an incomplete replay", func() bool {
			return counter(metrics.ZMQErrors, r.pod, "replay-incomplete") == 1
		})
		r.expectNothingAfterLive(2)
	})
}

// expectNothingAfterLive publishes two live batches with blocks and a third, then drains the pool: the first two
// were handled before the third was received (one subscriber loop), and the pod holds nothing. The replay requests
// stay the ones made so far (the cooldown).
func (r *replayRig) expectNothingAfterLive(requests int) {
	r.t.Helper()
	for range 3 {
		seq, _ := r.block(false)
		r.p.publish(r.pod, seq)
	}
	r.rt.pool.Shutdown(r.ctx) // drains every queued task, the reset among them
	if got := r.held(); len(got) != 0 {
		r.t.Fatalf("llm-d holds %v for pod %s, want nothing", got, r.pod)
	}
	if n := r.p.requests(); n != requests {
		r.t.Fatalf("%d replay requests, want %d", n, requests)
	}
}

// TestEmptyReplayJoinsMidStream: an answer to a replay from seq 0 that holds nothing (the end marker alone) is a
// complete replay to llm-d, unlike one that starts above seq 0 (TestReplayStartingLateLeavesNothing). Having no
// lastSeq, llm-d asks for seq 0 again on the next live batch, gets nothing again and then takes the batch: it joins
// mid-stream, without the history. The buffer here retains nothing, so every answer is the end marker alone.
func TestEmptyReplayJoinsMidStream(t *testing.T) {
	r := newReplayRig(t)
	for range 3 {
		r.block(true)
	}
	r.register()
	waitFor(t, "the replay on connect", func() bool { return r.p.requests() == 1 })
	seq, h := r.block(true)
	r.p.publish(r.pod, seq)
	r.waitHeld([]uint64{h})
	if n := r.p.requests(); n != 2 {
		t.Fatalf("%d replay requests, want 2 (on connect, then from 0 again on the first live batch)", n)
	}
	if n := counter(metrics.ZMQErrors, r.pod, "replay-incomplete"); n != 0 {
		t.Fatalf("%v incomplete replays, want 0", n)
	}
}
