package daemon

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// Dead streams are reclaimed (the reaper): a stream whose producer is gone is kept, queryable and published, so
// that a router can still recover through it (its replay socket answers the end-of-incarnation Cleared, /kv_recover
// answers its state, a restarted engine on the same worker continues its wire seqs and its subscribers), but not
// forever: a producer that cycles worker ids would otherwise grow the daemon by two bound ports, an index and a set
// of metric series per id. The rules:
//
//	dead         no attachment, and no pid watch following a producer whose connection broke while it lived
//	asked        a recovery or MATCH query selected the stream (socket or HTTP), or its replay socket served a
//	             request; a connected subscriber is not asking (Dynamo's and llm-d's routers stay subscribed to
//	             every worker they ever saw)
//	retention    a stream dead and not asked for during Config.DeadRetention (--dead-stream-retention,
//	             default 10 min) is forgotten, as FORGET forgets it: its ports closed, its index, counters, metric
//	             series and checkpoints dropped; a later ATTACH of the worker starts a new stream (stream_epoch 1)
//	count        beyond Config.MaxDeadStreams dead streams (--max-dead-streams, default 256) the ones longest not
//	             asked for are forgotten at once, whatever their age: fds, memory and series stay bounded however
//	             fast worker ids cycle (two fds per published dead stream: at most 512 by default)
//
// A stream forgotten while its incarnation was never seen to end (its producer's pid cannot be watched from here,
// or its ring faulted) ends it first: the Cleared is published and applied, as at any end. Until it is forgotten a
// dead stream's last checkpoint stays in the state directory.
//
// Why 10 minutes: what a router needs from a dead stream is its end-of-incarnation Cleared, either live, or by
// replay when it comes back (Dynamo 1.6.1's listener asks the replay socket on the seq gap it sees after a
// reconnect; llm-d's consumer redials 5 s after losing the connection and replays from its last seq + 1): the
// cluster's late router restart and its partitions past the replay window reconnect within seconds to a minute.
// The longer need is the engine's own restart on the same worker (a crashed vLLM pod back from Kubernetes'
// CrashLoopBackOff, at most 5 min, plus a model load of minutes): within the retention it continues the stream
// (seqs continue, which llm-d with --zmq-seq-base zero relies on; the ports and subscribers stay); after it the
// engine starts a new stream (with zero, seqs from 1 again: llm-d takes it for a publisher restart and replays from
// 0). A router that never came back holds nothing of the stream worth keeping: a restarted router holds nothing,
// and both routers drop a worker that leaves their discovery.

// Reaper defaults (Config.DeadRetention, Config.MaxDeadStreams).
const (
	DefaultDeadRetention  = 10 * time.Minute
	DefaultMaxDeadStreams = 256
)

// mono is the daemon's monotonic clock in ns (for the reaper's times, which must not follow wall clock jumps);
// tests move it forward with monoSkew.
func (s *Server) mono() int64 { return int64(time.Since(s.born)) + s.monoSkew.Load() }

// touch records that a consumer asked for the stream now.
func (st *entry) touch(now int64) { st.asked.Store(now) }

// wakeReaper asks the reaper to look at the dead streams now (an attachment ended): the count bound holds at
// once, not one tick later.
func (s *Server) wakeReaper() {
	select {
	case s.reapWake <- struct{}{}:
	default:
	}
}

// reapTick is how often the reaper looks for streams past the retention.
func reapTick(retention time.Duration) time.Duration {
	return min(max(retention/4, time.Millisecond), time.Second)
}

// reapLoop runs the reaper until ctx ends.
func (s *Server) reapLoop(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(reapTick(s.cfg.DeadRetention))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.reapWake:
		}
		s.reap()
	}
}

// reap forgets the dead streams past the retention, then the ones longest not asked for beyond MaxDeadStreams.
func (s *Server) reap() {
	s.reapMu.Lock() // one sweep at a time (a test may sweep beside the loop)
	defer s.reapMu.Unlock()
	now := s.mono()
	retention := int64(s.cfg.DeadRetention)
	type idle struct {
		st           *entry
		since, asked int64 // dead or asked for, whichever is later; asked as seen
	}
	var kept []idle
	for _, st := range s.streamSet() {
		dead, since := st.Dead()
		if !dead {
			continue
		}
		if p := st.Publisher(); p != nil {
			if n := p.Stats().ReplayRequests; n != st.replaysSeen { // a replay request since the last sweep
				st.replaysSeen = n
				st.touch(now)
			}
		}
		asked := st.asked.Load()
		since = max(since, asked)
		if now-since >= retention {
			s.reclaim(st, asked, fmt.Sprintf("dead and not asked for in %v (--dead-stream-retention)", s.cfg.DeadRetention))
			continue
		}
		kept = append(kept, idle{st, since, asked})
	}
	if over := len(kept) - s.cfg.MaxDeadStreams; over > 0 {
		sort.Slice(kept, func(i, j int) bool { return kept[i].since < kept[j].since })
		for _, k := range kept[:over] {
			s.reclaim(k.st, k.asked, fmt.Sprintf("more than %d dead streams (--max-dead-streams)", s.cfg.MaxDeadStreams))
		}
	}
}

// streamSet returns the streams in no particular order.
func (s *Server) streamSet() []*entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*entry, 0, len(s.streams))
	for _, st := range s.streams {
		out = append(out, st)
	}
	return out
}

// reclaim forgets st if it is still a dead stream of this daemon that no consumer asked for since the sweep saw
// asked (an ATTACH installs, and a query selects, only under s.mu: neither can come between the check and the drop;
// a query after it finds no stream).
func (s *Server) reclaim(st *entry, asked int64, why string) {
	s.mu.Lock()
	if s.closed || s.streams[st.key] != st || st.asked.Load() != asked {
		s.mu.Unlock()
		return
	}
	if !st.Reclaim("stream reclaimed: " + why) { // an attachment or a pid watch came: not dead
		s.mu.Unlock()
		return
	}
	s.dropLocked(st, "dead stream reclaimed: ports closed, index, metrics and checkpoints dropped", "why", why)
}

// dropLocked forgets st, which has no attachment (FORGET's path and the reaper's): it leaves the daemon's streams,
// its checkpoints are deleted, a pid watcher of it stops, its publisher (ports) is closed and its metric series are
// deleted. Called with s.mu held; returns with it released.
func (s *Server) dropLocked(st *entry, msg string, args ...any) {
	delete(s.streams, st.key)
	s.ckpt.remove(st.key)
	s.mu.Unlock()
	st.Forget() // a pid watcher of the stream stops, its publisher closes
	s.m.forgetStream(st.labels())
	s.log.Info(msg, append(st.key.LogAttrs(), args...)...)
}
