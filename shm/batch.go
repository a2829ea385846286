package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Wire format: never change without bumping the version. A BATCH record's payload (FORMAT.md, "BATCH record"):
//
//	| ts f64 | count u32 | flags u32 | count × sub-record, each 8-aligned: | length u32 | type u32 | payload | pad |
const (
	// BatchHeaderSize is the size of a BATCH payload's fixed part: ts f64, count u32, flags u32.
	BatchHeaderSize = 16
	// SubEvent is the sub-record type of a kvevent.Event FlatBuffer (the EVENT record's payload, byte for byte).
	SubEvent uint32 = TypeEvent
	// SubMeta is the sub-record type of a kvevent.Meta FlatBuffer; it applies to the EVENT sub-record right after it.
	SubMeta uint32 = 4
	// subHeaderSize is the [u32 length][u32 type] header of a sub-record (as a ring record's).
	subHeaderSize = RecordHeaderSize
)

// ErrMalformedBatch is wrapped by every error Record.Batch returns, and by Writer.WriteBatch's for sub-records
// that break the layout rules: the record is not a valid BATCH. The daemon counts it and skips the record, as any
// undecodable record; the rest of the ring is fine.
var ErrMalformedBatch = errors.New("kvshm/shm: malformed batch record")

// Batch is a parsed BATCH record: the engine's timestamp (0 = unknown) and the sub-records in order.
type Batch struct {
	TS   float64
	Subs []Sub
}

// Sub is one sub-record of a batch. Payload aliases the ring memory like Record.Payload (valid until the next
// Release).
type Sub struct {
	Type    uint32
	Payload []byte
}

// Batch parses a TypeBatch record's payload. It validates the layout: the fixed part, count >= 1, every
// sub-record header inside the payload with 8 <= length and its 8-aligned size inside the payload (the last one
// unpadded: the payload ends exactly where it ends), sub-types EVENT or META only, every META immediately followed by an
// EVENT, and no bytes after the last sub-record. Any violation is an error wrapping ErrMalformedBatch that names
// the payload offset. It does not look inside the FlatBuffers (seq and dp_rank equality across the batch's EVENTs is
// the consumer's check, after decoding them). flags is reserved: writers store 0, Batch ignores it.
func (r Record) Batch() (Batch, error) {
	var b Batch
	err := r.ParseBatch(&b)
	return b, err
}

// ParseBatch is Batch into b, reusing b.Subs' capacity: with enough capacity it allocates nothing on success. On
// error b.Subs is empty.
func (r Record) ParseBatch(b *Batch) error {
	b.TS, b.Subs = 0, b.Subs[:0]
	if r.Type != TypeBatch {
		return fmt.Errorf("%w: record type %d is not BATCH", ErrMalformedBatch, r.Type)
	}
	subs, err := parseBatch(r.Payload, b.Subs)
	if err != nil {
		b.Subs = b.Subs[:0]
		return err
	}
	b.TS = math.Float64frombits(binary.LittleEndian.Uint64(r.Payload))
	b.Subs = subs
	return nil
}

func parseBatch(p []byte, subs []Sub) ([]Sub, error) {
	le := binary.LittleEndian
	n := uint64(len(p))
	if n < BatchHeaderSize {
		return subs, malformedBatch(0, "payload of %d bytes is shorter than the batch header", n)
	}
	count := uint64(le.Uint32(p[8:]))
	if count == 0 {
		return subs, malformedBatch(8, "count 0")
	}
	if count > (n-BatchHeaderSize)/subHeaderSize {
		return subs, malformedBatch(8, "count %d cannot fit in %d bytes", count, n)
	}
	if uint64(cap(subs)) < count {
		subs = make([]Sub, 0, count)
	}
	off := uint64(BatchHeaderSize)
	for i := uint64(0); i < count; i++ {
		if off+subHeaderSize > n {
			return subs, malformedBatch(off, "sub-record %d of %d starts past the payload", i, count)
		}
		length := uint64(le.Uint32(p[off:]))
		typ := le.Uint32(p[off+4:])
		if length < subHeaderSize || length > n-off {
			return subs, malformedBatch(off, "sub-record %d: length %d outside [8, %d]", i, length, n-off)
		}
		switch typ {
		case SubEvent:
		case SubMeta:
			if i+1 == count {
				return subs, malformedBatch(off, "sub-record %d: META is the last sub-record", i)
			}
		default:
			return subs, malformedBatch(off, "sub-record %d: unknown type %#x", i, typ)
		}
		if i > 0 && typ == SubMeta && subs[i-1].Type == SubMeta {
			return subs, malformedBatch(off, "sub-record %d: META follows a META", i)
		}
		subs = append(subs, Sub{Type: typ, Payload: p[off+subHeaderSize : off+length : off+length]})
		if i+1 == count {
			off += length
		} else {
			off += align8(length)
		}
	}
	if off != n {
		return subs, malformedBatch(off, "%d bytes after the last sub-record", int64(n)-int64(off))
	}
	return subs, nil
}

//go:noinline
func malformedBatch(off uint64, format string, args ...any) error {
	return fmt.Errorf("%w at payload offset %d: %s", ErrMalformedBatch, off, fmt.Sprintf(format, args...))
}

// BatchSize returns the payload size of a BATCH record holding subs (without the 8-byte record header).
func BatchSize(subs []Sub) uint64 {
	n := uint64(BatchHeaderSize)
	for i, s := range subs {
		l := uint64(subHeaderSize + len(s.Payload))
		if i+1 < len(subs) {
			l = align8(l)
		}
		n += l
	}
	return n
}

// AppendBatch appends the BATCH payload of (ts, subs) to dst: the layout Record.Batch parses, padding bytes zero.
// It checks the layout rules first and returns an error wrapping ErrMalformedBatch (dst unchanged) for an empty
// subs, an unknown sub-type or a META not followed by an EVENT.
func AppendBatch(dst []byte, ts float64, subs []Sub) ([]byte, error) {
	if err := checkSubs(subs); err != nil {
		return dst, err
	}
	le := binary.LittleEndian
	dst = le.AppendUint64(dst, math.Float64bits(ts))
	dst = le.AppendUint32(dst, uint32(len(subs)))
	dst = le.AppendUint32(dst, 0)
	for i, s := range subs {
		l := subHeaderSize + len(s.Payload)
		dst = le.AppendUint32(dst, uint32(l))
		dst = le.AppendUint32(dst, s.Type)
		dst = append(dst, s.Payload...)
		if i+1 < len(subs) {
			for ; l%RecordAlign != 0; l++ {
				dst = append(dst, 0)
			}
		}
	}
	return dst, nil
}

func checkSubs(subs []Sub) error {
	if len(subs) == 0 {
		return malformedBatch(8, "count 0")
	}
	for i, s := range subs {
		switch {
		case s.Type != SubEvent && s.Type != SubMeta:
			return fmt.Errorf("%w: sub-record %d: unknown type %#x", ErrMalformedBatch, i, s.Type)
		case s.Type == SubMeta && (i+1 == len(subs) || subs[i+1].Type != SubEvent):
			return fmt.Errorf("%w: sub-record %d: META not followed by an EVENT", ErrMalformedBatch, i)
		case uint64(len(s.Payload)) > math.MaxUint32-subHeaderSize:
			return fmt.Errorf("%w: sub-record %d: payload of %d bytes", ErrMalformedBatch, i, len(s.Payload))
		}
	}
	return nil
}
