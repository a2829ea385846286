package index

import "encoding/binary"

// Decimal u64 formatting for the JSON appenders. Formatting the numbers (two 20-digit hashes per block) is most
// of what a dump or an Events answer costs, and strconv.AppendUint produces two digits per 64-bit division; this
// splits a value into 8-digit groups (at most two divisions by 1e8 and one by 1e16) and converts each group with
// a few multiplications inside one 64-bit word (SWAR). Output is byte-identical to strconv.AppendUint(dst, v,
// 10) (TestAppendU64, FuzzAppendU64).

// digits8 returns the 8 decimal digits of x < 1e8, zero-padded, as ASCII in a little-endian word (the most
// significant digit in the lowest byte).
func digits8(x uint32) uint64 {
	// Two 4-digit halves in the two 32-bit lanes, then each lane split into 2-digit and 1-digit parts by
	// multiply-and-shift divisions (exact for the ranges involved: x/100 for x < 10^4 as x*10486>>20, x/10 for
	// x < 100 as x*103>>10).
	merged := uint64(x/10000) | uint64(x%10000)<<32
	top := ((merged * 10486) >> 20) & (0x7F<<32 | 0x7F)
	hundreds := ((merged - 100*top) << 16) + top
	tens := ((hundreds * 103) >> 10) & (0xF<<48 | 0xF<<32 | 0xF<<16 | 0xF)
	tens += (hundreds - 10*tens) << 8
	return tens + 0x3030303030303030
}

// appendSmall appends x < 1e8 without leading zeros.
func appendSmall(dst []byte, x uint32) []byte {
	if x < 10 {
		return append(dst, byte('0'+x))
	}
	n := 8
	switch {
	case x < 100:
		n = 2
	case x < 1000:
		n = 3
	case x < 10000:
		n = 4
	case x < 100000:
		n = 5
	case x < 1000000:
		n = 6
	case x < 10000000:
		n = 7
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], digits8(x))
	return append(dst, b[8-n:]...)
}

// appendU64 appends v in decimal, as strconv.AppendUint(dst, v, 10).
func appendU64(dst []byte, v uint64) []byte {
	if v < 1e8 {
		return appendSmall(dst, uint32(v))
	}
	if v < 1e16 {
		dst = appendSmall(dst, uint32(v/1e8))
		return binary.LittleEndian.AppendUint64(dst, digits8(uint32(v%1e8)))
	}
	top, rest := v/1e16, v%1e16
	dst = appendSmall(dst, uint32(top))
	dst = binary.LittleEndian.AppendUint64(dst, digits8(uint32(rest/1e8)))
	return binary.LittleEndian.AppendUint64(dst, digits8(uint32(rest%1e8)))
}
