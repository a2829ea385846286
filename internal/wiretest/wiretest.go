// Package wiretest is what the daemon's tests and the stream engine's tests both need around the wire: the
// little-endian bytes index.ApplyStoredTokens takes, and a one-line description of each event of a published batch
// to compare with what a test expects. Test code only.
package wiretest

import (
	"encoding/binary"
	"fmt"

	"github.com/kvshm/kvshm/vllmwire"
)

// LE64 is v as little-endian bytes (block hashes as index.ApplyStoredTokens takes them).
func LE64(v []uint64) []byte {
	b := make([]byte, 0, 8*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, x)
	}
	return b
}

// LE32 is v as little-endian bytes (token ids as index.ApplyStoredTokens takes them).
func LE32(v []uint32) []byte {
	b := make([]byte, 0, 4*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, x)
	}
	return b
}

// Describe is one string per event of b: its kind's tag and, for a Stored event, its hashes, parent, tokens, block
// size and medium.
func Describe(b vllmwire.Batch) []string {
	var out []string
	for _, e := range b.Events {
		s := e.Kind.Tag()
		if e.Kind == vllmwire.KindStored {
			s += fmt.Sprintf(" %v parent %v/%d tokens %v bs %d medium %q", e.BlockHashes, e.HasParent, e.ParentHash,
				e.TokenIDs, e.BlockSize, e.Medium)
		}
		out = append(out, s)
	}
	return out
}
