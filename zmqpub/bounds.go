package zmqpub

import (
	"bytes"
	"encoding/binary"
	"hash/maphash"
	"net"
	"sync/atomic"
)

// What a remote peer can make a socket hold, and what happens past it (doc.go, "Bounds" lists every bound).
// The bounds here are the ones a peer meets by what it sends; the queue bounds are in transport.go.

// DefaultConnsPerAddr is the default Config.ConnsPerAddr: a remote address's share of a socket's maxConns.
const DefaultConnsPerAddr = 64

// maxSubscriptions bounds the distinct subscriptions one subscriber holds; the SUBSCRIBE of one more cuts the peer. vLLM's and Dynamo's subscribers hold one (their topic, or "").
const maxSubscriptions = 1024

// maxPingContext is ZMTP 3.1's bound on a PING's context (the PONG echoes it); a longer one cuts the peer, as
// libzmq does.
const maxPingContext = 16

// maxCommandName is the longest command name a frame can carry (its length is one byte).
const maxCommandName = 255

// CutReasons name why a peer was cut (its connection closed, or refused at accept), in the order of
// Stats.PeersCut (the label values of kvshm_zmq_peers_cut_total).
var CutReasons = [numCutReasons]string{"backlog", "addr_backlog", "stalled", "ping", "subscriptions", "request",
	"protocol", "conns", "addr_conns", "handshakes"}

// cutReason indexes CutReasons.
type cutReason uint8

const (
	cutBacklog       cutReason = iota // its queue past Config.SubscriberBacklog bytes or Config.HWM messages
	cutAddrBacklog                    // its address's queues past Config.AddrBacklog bytes
	cutStalled                        // a write blocked for the stall timeout
	cutPing                           // a PING context over maxPingContext bytes
	cutSubscriptions                  // past maxSubscriptions
	cutRequest                        // a replay request of more than maxRequestFrames frames
	cutProtocol                       // a frame over maxCommand bytes, bad frame flags, a malformed command
	cutConns                          // refused after its handshake: the socket holds maxConns
	cutAddrConns                      // refused at accept: its address holds its share (Config.ConnsPerAddr)
	cutHandshakes                     // refused at accept: maxPendingHandshakes handshakes under way
	numCutReasons
)

// cutError is the cause of a connection closed for a bound: the reason it is counted under.
type cutError struct {
	reason cutReason
	msg    string
}

func (e *cutError) Error() string { return "kvshm/zmqpub: " + e.msg + ": connection closed" }

var (
	// errBacklog: the peer fell more than its bound behind.
	errBacklog = &cutError{cutBacklog, "peer fell behind by more than its bound (bytes or hwm messages)"}
	// errStalled: a write to the peer was blocked for the stall timeout.
	errStalled = &cutError{cutStalled, "peer stopped reading (write blocked for the stall timeout)"}
	// errAddrBacklog: the connections of the peer's address fell more than the address's bound behind.
	errAddrBacklog = &cutError{cutAddrBacklog, "the connections of the peer's address fell behind by more than its bound"}
	errPing        = &cutError{cutPing, "PING context over ZMTP 3.1's 16 bytes"}
	errSubs        = &cutError{cutSubscriptions, "more subscriptions than a subscriber may hold"}
	errRequest     = &cutError{cutRequest, "replay request of too many frames"}
)

// addrShare is one remote address's part of a socket: its connections (at most Config.ConnsPerAddr) and the bytes
// queued to them (at most max: Config.AddrBacklog). Its bytes are counted under each connection's own lock, so the
// count is atomic.
type addrShare struct {
	conns  int // under peerSet.mu
	max    int64
	queued atomic.Int64
}

// over reports whether n more queued bytes take the address past its bound; a nil share has none.
func (a *addrShare) over(n int) bool { return a != nil && a.queued.Load()+int64(n) > a.max }

// add counts n bytes queued (negative: written or dropped).
func (a *addrShare) add(n int) {
	if a != nil {
		a.queued.Add(int64(n))
	}
}

// addrKey is the remote address a connection counts against for Config.ConnsPerAddr: an IPv4 address, or an IPv6
// address's /64 (one host's share, however many addresses it takes from its prefix); "" for a unix socket (its
// file is 0600: only the daemon's own user reaches it).
func addrKey(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return ""
	}
	if v4 := ta.IP.To4(); v4 != nil {
		return v4.String()
	}
	return ta.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// subscriptions are one subscriber's subscriptions, a set as libzmq's PUB keeps them (its mtrie holds a connection
// once per topic: a repeated SUBSCRIBE changes nothing, one CANCEL removes it; libzmq's SUB and XSUB refcount
// their own subscriptions and send the CANCEL when the last is gone). A publisher has one topic, so only a
// subscription that is a prefix of it can ever match: it is kept as its length; any other is kept as a hash of
// what matching read of it (its size and first len(topic)+1 bytes: two that agree there are one subscription,
// which no delivery can tell apart), only for maxSubscriptions. A SUBSCRIBE or CANCEL costs O(its length) and a
// subscriber holds at most maxSubscriptions hashes and len(topic)+1 flags, however many it sends (before, the set
// was a map of every topic, rescanned at each change: 40,000 took 10 s of CPU).
type subscriptions struct {
	topic    []byte
	on       []bool // on[n]: topic[:n] is subscribed
	matching int    // the number of on: > 0 means the topic matches
	others   map[uint64]struct{}
	seed     maphash.Seed
}

func newSubscriptions(topic []byte) *subscriptions {
	return &subscriptions{topic: topic, on: make([]bool, len(topic)+1), seed: maphash.MakeSeed()}
}

// update applies a SUBSCRIBE (add) or CANCEL of a subscription of size bytes whose first bytes are prefix (all of
// it when size <= len(topic)). It returns errSubs for a SUBSCRIBE of a new subscription past maxSubscriptions held.
// A CANCEL of a subscription that is not held changes nothing.
func (s *subscriptions) update(add bool, prefix []byte, size int) error {
	if size <= len(s.topic) && len(prefix) == size && bytes.HasPrefix(s.topic, prefix) {
		switch {
		case add == s.on[size]:
		case add && s.held() >= maxSubscriptions:
			return errSubs
		case add:
			s.on[size], s.matching = true, s.matching+1
		default:
			s.on[size], s.matching = false, s.matching-1
		}
		return nil
	}
	var h maphash.Hash
	h.SetSeed(s.seed)
	_, _ = h.Write(binary.BigEndian.AppendUint64(nil, uint64(size)))
	_, _ = h.Write(prefix)
	k := h.Sum64()
	_, held := s.others[k]
	switch {
	case add == held:
	case add && s.held() >= maxSubscriptions:
		return errSubs
	case add:
		if s.others == nil {
			s.others = map[uint64]struct{}{}
		}
		s.others[k] = struct{}{}
	default:
		delete(s.others, k)
	}
	return nil
}

// held returns the number of subscriptions held.
func (s *subscriptions) held() int { return s.matching + len(s.others) }

// matches reports whether the topic matches a subscription held.
func (s *subscriptions) matches() bool { return s.matching > 0 }
