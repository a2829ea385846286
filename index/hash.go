package index

import (
	"encoding/binary"
	"fmt"

	"github.com/zeebo/xxh3"
)

// BaseSeed is Dynamo's XXH3_SEED: the XXH3-64 seed of every tokens hash without a LoRA adapter.
const BaseSeed uint64 = 1337

// Seed returns the XXH3-64 seed for tokens hashes of the given LoRA adapter: 1337, or 1337 + XXH3-64(name)
// (unseeded, wrapping) when the name is non-empty. An empty name counts as absent, as in Dynamo.
func Seed(loraName []byte) uint64 {
	if len(loraName) == 0 {
		return BaseSeed
	}
	return BaseSeed + xxh3.Hash(loraName)
}

// AppendBlockHashes appends the tokens hash (Dynamo's LocalBlockHash) of every complete window of tokensLE to
// dst and returns the extended slice. tokensLE holds u32 little-endian tokens (the FlatBuffers vector bytes, read
// in place). A window is blockSize tokens, or blockSize+1 for Eagle (windows still start every blockSize tokens,
// so Eagle windows overlap by one token); an incomplete trailing window is not hashed, so a short sequence yields
// no hashes. Errors: ErrZeroBlockSize, ErrTokenCount when len(tokensLE) is not a multiple of 4.
func AppendBlockHashes(dst []uint64, tokensLE []byte, blockSize uint32, seed uint64, eagle bool) ([]uint64, error) {
	if blockSize == 0 {
		return dst, ErrZeroBlockSize
	}
	if len(tokensLE)%4 != 0 {
		return dst, fmt.Errorf("%w: %d token bytes are not a multiple of 4", ErrTokenCount, len(tokensLE))
	}
	stride := int(blockSize) * 4
	window := stride
	if eagle {
		window += 4
	}
	for off := 0; off+window <= len(tokensLE); off += stride {
		dst = append(dst, xxh3.HashSeed(tokensLE[off:off+window], seed))
	}
	return dst, nil
}

// HashTokens is AppendBlockHashes for a token slice and a LoRA name given as a string (a convenience for tests
// and callers outside the drain path; it allocates).
func HashTokens(tokens []uint32, blockSize uint32, loraName string, eagle bool) ([]uint64, error) {
	return AppendBlockHashes(nil, tokensToLE(nil, tokens), blockSize, Seed([]byte(loraName)), eagle)
}

// tokensToLE appends the u32 little-endian bytes of tokens to dst.
func tokensToLE(dst []byte, tokens []uint32) []byte {
	for _, t := range tokens {
		dst = binary.LittleEndian.AppendUint32(dst, t)
	}
	return dst
}

// TokenCountMismatch reports whether a Stored event with n blocks and ntok tokens differs from the shape the
// block count implies: n*bs tokens, or n*bs+1 for Eagle (the lookahead token); an empty store carries no
// tokens. Such an event is still applied: the complete windows are hashed and zipped with the block hashes.
func TokenCountMismatch(n, ntok int, bs uint32, eagle bool) bool {
	if n == 0 {
		return ntok != 0
	}
	want := n * int(bs)
	if eagle {
		want++
	}
	return ntok != want
}
