package vllmwire

import (
	"errors"
	"fmt"
	"math"

	"github.com/tinylib/msgp/msgp"
)

// Batch is a decoded KVEventBatch.
type Batch struct {
	TS        float64
	Events    []Event
	HasDpRank bool
	DpRank    int64
}

// Decode parses a payload in the shape this package encodes (FORMAT.md): a 2- or 3-array [ts, events,
// dp_rank?] whose events are tagged maps with vLLM's field names in any order. It rejects unknown tags, unknown or
// repeated keys, wrong types, out-of-range integers and leftover bytes with an error wrapping ErrMalformed.
// Int block hashes are read as their 64-bit pattern, signed (SGLang) or not; SGLang's fields (cache_salt,
// session_id) are read too, and medium and lora_name may be absent (SGLang omits them when None).
// Bytes block hashes (msgpack bin) fill HashBytes / ParentBytes and their keys (HashKey). Decoded slices are new
// (they do not alias p) except ExtraKeys, which aliases p. The map header's form is not checked, so a payload of
// any Wire decodes. Decode is for tests and tools; the daemon only encodes.
func Decode(p []byte) (Batch, error) {
	var b Batch
	n, rest, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil {
		return b, malformed("batch", err)
	}
	if n != 2 && n != 3 {
		return b, malformed("batch", fmt.Errorf("array of %d elements, want 2 or 3", n))
	}
	if b.TS, rest, err = msgp.ReadFloat64Bytes(rest); err != nil {
		return b, malformed("ts", err)
	}
	ne, rest, err := msgp.ReadArrayHeaderBytes(rest)
	if err != nil {
		return b, malformed("events", err)
	}
	if int(ne) > len(rest) { // every event takes at least one byte: refuse absurd counts before allocating
		return b, malformed("events", fmt.Errorf("%d events in %d bytes", ne, len(rest)))
	}
	b.Events = make([]Event, 0, ne)
	for i := range ne {
		var e Event
		if rest, err = decodeEvent(rest, &e); err != nil {
			return b, fmt.Errorf("event %d: %w", i, err)
		}
		b.Events = append(b.Events, e)
	}
	if n == 3 {
		if msgp.IsNil(rest) {
			rest = rest[1:]
		} else {
			b.HasDpRank = true
			if b.DpRank, rest, err = readInt(rest); err != nil {
				return b, malformed("data_parallel_rank", err)
			}
		}
	}
	if len(rest) != 0 {
		return b, malformed("batch", fmt.Errorf("%d leftover bytes", len(rest)))
	}
	return b, nil
}

// malformed wraps ErrMalformed with the field and the cause.
func malformed(field string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrMalformed, field, err)
}

func readInt(p []byte) (int64, []byte, error) {
	if len(p) > 0 && (p[0] == 0xcf) { // uint64 beyond int64 is refused below
		u, rest, err := msgp.ReadUint64Bytes(p)
		if err != nil {
			return 0, p, err
		}
		if u > math.MaxInt64 {
			return 0, p, errors.New("integer out of range")
		}
		return int64(u), rest, nil
	}
	return msgp.ReadInt64Bytes(p)
}

func readU32(p []byte) (uint32, []byte, error) { return msgp.ReadUint32Bytes(p) }

func readOptString(p []byte) (bool, string, []byte, error) {
	if msgp.IsNil(p) {
		return false, "", p[1:], nil
	}
	s, rest, err := msgp.ReadStringBytes(p)
	return err == nil, s, rest, err
}

// readHashes reads block_hashes: all uints, or all bin strings of one length (vLLM's bytes hashes: their keys
// and their concatenation hb are returned). Mixed forms and bytes of different lengths are refused: the encoder
// cannot write them.
func readHashes(p []byte) (hs []uint64, hb []byte, rest []byte, err error) {
	n, rest, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil {
		return nil, nil, p, err
	}
	if int(n) > len(rest) {
		return nil, nil, p, fmt.Errorf("%d elements in %d bytes", n, len(rest))
	}
	hs = make([]uint64, 0, n)
	asBytes := n > 0 && msgp.NextType(rest) == msgp.BinType
	for i := range n {
		if !asBytes {
			var h uint64
			if h, rest, err = readHash(rest); err != nil {
				return nil, nil, p, err
			}
			hs = append(hs, h)
			continue
		}
		var b []byte
		if b, rest, err = msgp.ReadBytesZC(rest); err != nil {
			return nil, nil, p, err
		}
		if i == 0 {
			hb = make([]byte, 0, len(b)*int(n))
		} else if len(b) != len(hb)/int(i) {
			return nil, nil, p, fmt.Errorf("bytes block hash %d has %d bytes, the first %d", i, len(b), len(hb)/int(i))
		}
		hb = append(hb, b...)
		hs = append(hs, HashKey(b))
	}
	return hs, hb, rest, nil
}

// readTokens reads token_ids: uints, or [a, b] pairs (Eagle; the stream is rebuilt as Dynamo does).
func readTokens(p []byte) (toks []uint32, eagle bool, rest []byte, err error) {
	n, rest, err := msgp.ReadArrayHeaderBytes(p)
	if err != nil {
		return nil, false, p, err
	}
	if int(n) > len(rest) {
		return nil, false, p, fmt.Errorf("%d elements in %d bytes", n, len(rest))
	}
	if n > 0 && msgp.NextType(rest) == msgp.ArrayType {
		eagle = true
	}
	toks = make([]uint32, 0, int(n)+1)
	var last uint32
	for range n {
		if !eagle {
			var t uint32
			if t, rest, err = readU32(rest); err != nil {
				return nil, false, p, err
			}
			toks = append(toks, t)
			continue
		}
		var m uint32
		if m, rest, err = msgp.ReadArrayHeaderBytes(rest); err != nil {
			return nil, false, p, err
		}
		if m != 2 {
			return nil, false, p, fmt.Errorf("eagle token pair of %d elements", m)
		}
		var a uint32
		if a, rest, err = readU32(rest); err != nil {
			return nil, false, p, err
		}
		if last, rest, err = readU32(rest); err != nil {
			return nil, false, p, err
		}
		toks = append(toks, a)
	}
	if eagle {
		toks = append(toks, last)
	}
	return toks, eagle, rest, nil
}

func decodeEvent(p []byte, e *Event) ([]byte, error) {
	nk, rest, err := msgp.ReadMapHeaderBytes(p)
	if err != nil {
		return p, malformed("event", err)
	}
	if int(nk) > len(rest) {
		return p, malformed("event", fmt.Errorf("%d keys in %d bytes", nk, len(rest)))
	}
	var seen uint32
	var tag string
	for range nk {
		var k string
		if k, rest, err = msgp.ReadStringBytes(rest); err != nil {
			return p, malformed("event key", err)
		}
		bit, ok := fieldBits[k]
		if !ok {
			return p, malformed(k, errors.New("unknown field"))
		}
		if seen&bit != 0 {
			return p, malformed(k, errors.New("repeated field"))
		}
		seen |= bit
		switch k {
		case tagKey:
			tag, rest, err = msgp.ReadStringBytes(rest)
		case "block_hashes":
			e.BlockHashes, e.HashBytes, rest, err = readHashes(rest)
		case "parent_block_hash":
			switch {
			case msgp.IsNil(rest):
				rest = rest[1:]
			case msgp.NextType(rest) == msgp.BinType:
				e.HasParent = true
				if e.ParentBytes, rest, err = msgp.ReadBytesBytes(rest, []byte{}); err == nil {
					e.ParentHash = HashKey(e.ParentBytes) // an empty bin stays non-nil: still bytes
				}
			default:
				e.HasParent = true
				e.ParentHash, rest, err = readHash(rest)
			}
		case "token_ids":
			e.TokenIDs, e.IsEagle, rest, err = readTokens(rest)
		case "block_size":
			e.BlockSize, rest, err = readU32(rest)
		case "lora_id":
			if msgp.IsNil(rest) {
				rest = rest[1:]
			} else {
				e.HasLoraID = true
				e.LoraID, rest, err = readInt(rest)
			}
		case "medium":
			e.HasMedium, e.Medium, rest, err = readOptString(rest)
		case "lora_name":
			e.HasLoraName, e.LoraName, rest, err = readOptString(rest)
		case "cache_salt":
			e.HasCacheSalt, e.CacheSalt, rest, err = readOptString(rest)
		case "session_id":
			e.HasSessionID, e.SessionID, rest, err = readOptString(rest)
		case "extra_keys":
			var after []byte
			if after, err = msgp.Skip(rest); err == nil {
				e.ExtraKeys = rest[:len(rest)-len(after)]
				rest = after
			}
		case "group_idx":
			e.HasGroupIdx = true
			e.GroupIdx, rest, err = readU32(rest)
		case "kv_cache_spec_kind":
			e.HasKVCacheSpecKind = true
			e.KVCacheSpecKind, rest, err = msgp.ReadStringBytes(rest)
		case "kv_cache_spec_sliding_window":
			e.HasSlidingWindow = true
			e.KVCacheSpecSlidingWindow, rest, err = readU32(rest)
		}
		if err != nil {
			return p, malformed(k, err)
		}
	}
	var need, allowed uint32
	switch tag {
	case "BlockStored":
		e.Kind = KindStored
		// medium and lora_name: vLLM always writes them, SGLang omits them when None.
		need = bitType | bitHashes | bitParent | bitTokens | bitBlockSize | bitLoraID
		allowed = need | bitMedium | bitLoraName | bitExtra | bitGroup | bitSpecKind | bitWindow | bitSalt | bitSession
	case "BlockRemoved":
		e.Kind = KindRemoved
		need = bitType | bitHashes // medium: SGLang omits it when None
		allowed = need | bitMedium | bitGroup
	case "AllBlocksCleared":
		e.Kind = KindCleared
		need, allowed = bitType, bitType
	default:
		return p, malformed("type", fmt.Errorf("unknown tag %q", tag))
	}
	if seen&need != need || seen&^allowed != 0 {
		return p, malformed(tag, fmt.Errorf("fields %#x, want all of %#x within %#x", seen, need, allowed))
	}
	return rest, nil
}

const (
	bitType uint32 = 1 << iota
	bitHashes
	bitParent
	bitTokens
	bitBlockSize
	bitLoraID
	bitMedium
	bitLoraName
	bitExtra
	bitGroup
	bitSpecKind
	bitWindow
	bitSalt
	bitSession
)

var fieldBits = map[string]uint32{
	tagKey: bitType, "block_hashes": bitHashes, "parent_block_hash": bitParent, "token_ids": bitTokens,
	"block_size": bitBlockSize, "lora_id": bitLoraID, "medium": bitMedium, "lora_name": bitLoraName,
	"extra_keys": bitExtra, "group_idx": bitGroup, "kv_cache_spec_kind": bitSpecKind,
	"kv_cache_spec_sliding_window": bitWindow, "cache_salt": bitSalt, "session_id": bitSession,
}
