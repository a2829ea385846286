package index

import (
	"strconv"
	"unicode/utf8"
)

// Hand-rolled JSON appenders for Dynamo's RouterEvent and WorkerKvQueryResponse (upstream protocols.rs and indexer/types.rs). They write the
// bytes serde_json writes for those types: no whitespace, fields in declaration order, u64 numbers in decimal
// (never through float64), "cleared" as a bare string, null for start_position and mm_extra_info.

const (
	jsEventHead   = `{"worker_id":`
	jsEventTier   = `,"storage_tier":"device","residency_domain":"worker","event":{"event_id":`
	jsEventTierV0 = `,"storage_tier":"device","event":{"event_id":`
	jsStoredHead  = `,"data":{"stored":{"parent_hash":`
	jsStoredStart = `,"start_position":null,"blocks":[`
	jsBlockHead   = `{"block_hash":`
	jsBlockTokens = `,"tokens_hash":`
	jsBlockTail   = `,"mm_extra_info":null}`
	jsStoredTail  = `]}},"dp_rank":`
	jsRemovedHead = `,"data":{"removed":{"block_hashes":[`
	jsRemovedTail = `]}},"dp_rank":`
	jsCleared     = `,"data":"cleared","dp_rank":`
	jsEventTail   = `}}`
)

// legacy reports whether the shape writes the older wire (no residency_domain, no reset_scope).
func (s DumpShape) legacy() bool { return s == DumpBlocks }

func appendEventHead(dst []byte, shape DumpShape, worker, id uint64) []byte {
	dst = append(dst, jsEventHead...)
	dst = appendU64(dst, worker)
	if shape.legacy() {
		dst = append(dst, jsEventTierV0...)
	} else {
		dst = append(dst, jsEventTier...)
	}
	return appendU64(dst, id)
}

func appendEventTail(dst []byte, dp uint32) []byte {
	dst = appendU64(dst, uint64(dp))
	return append(dst, jsEventTail...)
}

// appendStoredHead writes a Stored RouterEvent up to the opening bracket of its blocks.
func appendStoredHead(dst []byte, shape DumpShape, worker, id uint64, hasParent bool, parent uint64) []byte {
	dst = appendEventHead(dst, shape, worker, id)
	dst = append(dst, jsStoredHead...)
	if hasParent {
		dst = appendU64(dst, parent)
	} else {
		dst = append(dst, "null"...)
	}
	return append(dst, jsStoredStart...)
}

func appendBlock(dst []byte, bh, th uint64) []byte {
	dst = append(dst, jsBlockHead...)
	dst = appendU64(dst, bh)
	dst = append(dst, jsBlockTokens...)
	dst = appendU64(dst, th)
	return append(dst, jsBlockTail...)
}

// AppendStoredJSON appends the RouterEvent JSON of a Stored event in the wire of shape (DumpBlocks: the older
// wire without residency_domain).
func AppendStoredJSON(dst []byte, shape DumpShape, worker, id uint64, dp uint32, hasParent bool, parent uint64, blocks []Block) []byte {
	dst = appendStoredHead(dst, shape, worker, id, hasParent, parent)
	for i, b := range blocks {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendBlock(dst, b.BlockHash, b.TokensHash)
	}
	dst = append(dst, jsStoredTail...)
	return appendEventTail(dst, dp)
}

// appendStoredWords is AppendStoredJSON for blocks stored as (block hash, tokens hash) word pairs.
func appendStoredWords(dst []byte, shape DumpShape, worker, id uint64, dp uint32, hasParent bool, parent uint64, words []uint64) []byte {
	dst = appendStoredHead(dst, shape, worker, id, hasParent, parent)
	for i := 0; i+1 < len(words); i += 2 {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendBlock(dst, words[i], words[i+1])
	}
	dst = append(dst, jsStoredTail...)
	return appendEventTail(dst, dp)
}

// AppendRemovedJSON appends the RouterEvent JSON of a Removed event.
func AppendRemovedJSON(dst []byte, shape DumpShape, worker, id uint64, dp uint32, hashes []uint64) []byte {
	dst = appendEventHead(dst, shape, worker, id)
	dst = append(dst, jsRemovedHead...)
	for i, h := range hashes {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendU64(dst, h)
	}
	dst = append(dst, jsRemovedTail...)
	return appendEventTail(dst, dp)
}

// AppendClearedJSON appends the RouterEvent JSON of a Cleared event.
func AppendClearedJSON(dst []byte, shape DumpShape, worker, id uint64, dp uint32) []byte {
	dst = appendEventHead(dst, shape, worker, id)
	dst = append(dst, jsCleared...)
	return appendEventTail(dst, dp)
}

// Response framing: {"Events":{"events":[ ... ],"last_event_id":N}} and the other variants.
const (
	jsEventsHead   = `{"Events":{"events":[`
	jsTreeDumpHead = `{"TreeDump":{"events":[`
	jsListTail     = `],"last_event_id":`
	jsRespTail     = `}}`
	jsResetAll     = `,"reset_scope":"all"`
)

// appendListTail closes an Events list: `],"last_event_id":N}}`.
func appendListTail(dst []byte, last uint64) []byte {
	dst = append(dst, jsListTail...)
	dst = appendU64(dst, last)
	return append(dst, jsRespTail...)
}

// appendDumpTail closes a TreeDump list: `],"last_event_id":N,"reset_scope":"all"}}` (no reset_scope in the
// older wire).
func appendDumpTail(dst []byte, shape DumpShape, last uint64) []byte {
	dst = append(dst, jsListTail...)
	dst = appendU64(dst, last)
	if !shape.legacy() {
		dst = append(dst, jsResetAll...)
	}
	return append(dst, jsRespTail...)
}

// dumpTailLen is the length of what appendDumpTail writes.
func dumpTailLen(shape DumpShape, last uint64) int {
	n := len(jsListTail) + len(strconv.AppendUint(nil, last, 10)) + len(jsRespTail)
	if !shape.legacy() {
		n += len(jsResetAll)
	}
	return n
}

// AppendTooNewJSON appends {"TooNew":{"requested_start":S,"requested_end":E,"newest_available":N}}.
func AppendTooNewJSON(dst []byte, start, end, newest uint64) []byte {
	dst = append(dst, `{"TooNew":{"requested_start":`...)
	dst = appendU64(dst, start)
	dst = append(dst, `,"requested_end":`...)
	dst = appendU64(dst, end)
	dst = append(dst, `,"newest_available":`...)
	dst = appendU64(dst, newest)
	return append(dst, jsRespTail...)
}

// AppendInvalidRangeJSON appends {"InvalidRange":{"start_id":S,"end_id":E}}.
func AppendInvalidRangeJSON(dst []byte, start, end uint64) []byte {
	dst = append(dst, `{"InvalidRange":{"start_id":`...)
	dst = appendU64(dst, start)
	dst = append(dst, `,"end_id":`...)
	dst = appendU64(dst, end)
	return append(dst, jsRespTail...)
}

// AppendErrorJSON appends {"Error":"msg"} with msg escaped as serde_json escapes strings.
func AppendErrorJSON(dst []byte, msg string) []byte {
	dst = append(dst, `{"Error":`...)
	dst = AppendJSONString(dst, msg)
	return append(dst, '}')
}

const hexDigits = "0123456789abcdef"

// AppendJSONString appends s as a JSON string the way serde_json writes it: '"' and '\\' escaped, control
// characters as \b \f \n \r \t or \u00xx (lowercase hex), everything else verbatim. Invalid UTF-8 (impossible in
// a Rust String) becomes U+FFFD, as encoding/json does.
func AppendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, s[start:i]...)
				dst = append(dst, "\ufffd"...)
				i++
				start = i
				continue
			}
			i += size
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"':
			dst = append(dst, '\\', '"')
		case '\\':
			dst = append(dst, '\\', '\\')
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
