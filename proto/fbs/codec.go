// Package fbs is kvshm's event codec: the canonical FlatBuffers encoding of one KV-cache event (schema
// event.fbs, generated accessors in package kvevent) and a complete, allocation-free validator that turns a
// payload read from the ring into a zero-copy EventView.
//
// # Canonical encoding
//
// FlatBuffers does not define one byte sequence per value: the bytes depend on the order of the builder calls.
// kvshm fixes that order, so that the Go builder (Build), the official Python builder and the Python fast encoder
// (pybind/src/kvshm/_encode.py) all produce identical bytes. The shared vectors in testdata/events prove it.
//
//	Stored:  [lora = CreateString(lora_name)]            only if lora_name is non-empty
//	         StartTokenIdsVector(n),    prepend u32 tokens in reverse, EndVector(n)   (also when n == 0)
//	         StartBlockHashesVector(n), prepend u64 hashes in reverse, EndVector(n)   (also when n == 0)
//	         StoredStart, [AddParentHash], AddBlockHashes, AddTokenIds, [AddLoraName], [AddIsEagle(true)], StoredEnd
//	Removed: StartBlockHashesVector(n), reverse prepends, EndVector(n); RemovedStart, AddBlockHashes, RemovedEnd
//	Cleared: ClearedStart, ClearedEnd
//	Event:   EventStart, AddSeq, AddDpRank, AddDataType, AddData, EventEnd, Finish with identifier "KVEV"
//
// Default settings (no forced defaults): seq 0, dp_rank 0 and is_eagle false are not written. parent_hash has a
// null default, so a present parent is always written, even when it is 0.
//
// A finished Stored event of 32 blocks × 32 tokens without LoRA, as the builders lay it out (offsets from the
// start of the payload; every table starts with an i32 offset back to its vtable):
//
//	0x000  u32 root offset → Event table      0x004  "KVEV"
//	       Event vtable (u16 size, u16 table size, 4 × u16 field offsets), Event table (seq, dp_rank, data_type, data)
//	       Stored vtable, Stored table (parent_hash, offsets to block_hashes and token_ids)
//	       block_hashes: u32 count, pad to 8, count × u64
//	       token_ids:    u32 count, count × u32
//
// # Validation
//
// The released Go FlatBuffers runtime has no verifier and its accessors panic on a corrupt buffer, so Decode
// checks everything it touches before it touches it:
//   - the buffer holds the root offset and the identifier "KVEV"; the root table starts after them;
//   - every table is 4-aligned, its vtable lies inside the buffer, is 2-aligned, has an even size >= 4, and the
//     table size it declares fits in the buffer;
//   - every field kvshm reads lies inside its table and the buffer and is aligned to its size;
//   - every vector (and string) is 4-aligned, its length × element size fits in the buffer, u64 elements are
//     8-aligned, and a string ends with its NUL terminator;
//   - the union type is Stored, Removed or Cleared and the required data table is present;
//   - is_eagle is 0 or 1;
//   - leftover bytes: when no table carries fields unknown to this schema, the buffer must end within 7 bytes
//     (alignment padding) of the last byte any table, vtable, vector or string occupies. A longer tail means the
//     record length and the FlatBuffer disagree, which is corruption. Fields added by a newer schema may
//     reference objects kvshm cannot see, so the check is skipped when a vtable is longer than this schema's.
//
// Absent vectors read as empty (FlatBuffers semantics), an absent or empty lora_name as the base model.
// Nothing is checked twice and nothing is allocated on success; a failure returns a *MalformedError (one small
// allocation) that wraps ErrMalformed and names the offset and the reason.
//
// # Metadata
//
// kvevent.Meta carries an event's fields that the index does not need and the ZMQ stream does (vLLM's medium,
// lora_id, block_size, extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window): a separate root
// buffer without file identifier, so the Event encoding above stays byte-identical. It travels as a META
// sub-record of a BATCH ring record (shm/FORMAT.md), just before the EVENT it applies to. BuildMeta fixes its
// canonical call order; DecodeMeta validates it by the same rules as Decode (with a 4-byte header) and returns
// errors wrapping ErrMalformedMeta: the daemon counts the whole BATCH record as malformed and skips it.
//
// # Caveats
//
// EventView's byte slices alias the payload: they are valid exactly as long as the payload is (for a ring record,
// until the Reader's next Release). Copy what you keep. The vectors are little-endian and may be read unaligned
// only through EventView's helpers or encoding/binary.
package fbs

import (
	"encoding/binary"
	"errors"
	"fmt"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/kvshm/kvshm/proto/fbs/kvevent"
)

// Kind is the event variant; its values equal kvevent.EventData's union tags.
type Kind uint8

// The event kinds.
const (
	KindStored  Kind = Kind(kvevent.EventDataStored)
	KindRemoved Kind = Kind(kvevent.EventDataRemoved)
	KindCleared Kind = Kind(kvevent.EventDataCleared)
)

// String returns "stored", "removed", "cleared" or "kind(N)".
func (k Kind) String() string {
	switch k {
	case KindStored:
		return "stored"
	case KindRemoved:
		return "removed"
	case KindCleared:
		return "cleared"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Identifier is the FlatBuffers file identifier of an event payload (bytes 4..8).
const Identifier = kvevent.EventIdentifier

var (
	// ErrMalformed is wrapped by every error Decode returns: the payload is not a valid kvshm event.
	ErrMalformed = errors.New("kvshm/fbs: malformed event")
)

// MalformedError is the error Decode returns: Offset is the payload offset where the problem was found and
// Reason says what was wrong. It unwraps to ErrMalformed.
type MalformedError struct {
	Offset uint64
	Reason string
}

func (e *MalformedError) Error() string {
	return fmt.Sprintf("kvshm/fbs: malformed event at offset %d: %s", e.Offset, e.Reason)
}

// Unwrap returns ErrMalformed.
func (e *MalformedError) Unwrap() error { return ErrMalformed }

func malformed(off uint64, reason string) error { return &MalformedError{Offset: off, Reason: reason} }

// Reasons reported in MalformedError.Reason.
const (
	reasonShort          = "buffer shorter than root offset, identifier and a table"
	reasonIdentifier     = "file identifier is not \"KVEV\""
	reasonRootOffset     = "root table offset outside the buffer or inside the header"
	reasonTableAlign     = "table not 4-byte aligned"
	reasonTableBounds    = "table outside the buffer"
	reasonVtableBounds   = "vtable outside the buffer"
	reasonVtableSize     = "vtable size odd, below 4 or past the buffer"
	reasonTableSize      = "table size below 4 or past the buffer"
	reasonFieldBounds    = "field outside its table"
	reasonFieldAlign     = "field not aligned to its size"
	reasonVectorBounds   = "vector outside the buffer"
	reasonVectorAlign    = "vector not aligned"
	reasonStringBounds   = "string outside the buffer"
	reasonStringNUL      = "string not NUL-terminated"
	reasonDataMissing    = "required event data missing"
	reasonUnknownType    = "unknown event data type"
	reasonBool           = "is_eagle is neither 0 nor 1"
	reasonTrailing       = "trailing bytes after the event"
	reasonTypeWithNoData = "event data type NONE"
)

// EventSpec is an event to encode with Build. Slices are only read.
type EventSpec struct {
	Seq         uint64
	DpRank      uint32
	Kind        Kind
	HasParent   bool
	ParentHash  uint64
	BlockHashes []uint64
	TokenIDs    []uint32
	LoraName    string
	IsEagle     bool
}

// Build encodes ev with b in the canonical call order and returns the finished bytes. It resets b first; the
// result aliases b's buffer and is valid until b is used again. Removed events ignore TokenIDs, parent, LoRA and
// Eagle; Cleared events ignore every vector too. Build panics on an unknown Kind (a programming error).
func Build(b *flatbuffers.Builder, ev *EventSpec) []byte {
	b.Reset()
	var data flatbuffers.UOffsetT
	switch ev.Kind {
	case KindStored:
		var lora flatbuffers.UOffsetT
		hasLora := ev.LoraName != ""
		if hasLora {
			lora = b.CreateString(ev.LoraName)
		}
		kvevent.StoredStartTokenIdsVector(b, len(ev.TokenIDs))
		for i := len(ev.TokenIDs) - 1; i >= 0; i-- {
			b.PrependUint32(ev.TokenIDs[i])
		}
		tokens := b.EndVector(len(ev.TokenIDs))
		kvevent.StoredStartBlockHashesVector(b, len(ev.BlockHashes))
		for i := len(ev.BlockHashes) - 1; i >= 0; i-- {
			b.PrependUint64(ev.BlockHashes[i])
		}
		hashes := b.EndVector(len(ev.BlockHashes))
		kvevent.StoredStart(b)
		if ev.HasParent {
			kvevent.StoredAddParentHash(b, ev.ParentHash)
		}
		kvevent.StoredAddBlockHashes(b, hashes)
		kvevent.StoredAddTokenIds(b, tokens)
		if hasLora {
			kvevent.StoredAddLoraName(b, lora)
		}
		if ev.IsEagle {
			kvevent.StoredAddIsEagle(b, true)
		}
		data = kvevent.StoredEnd(b)
	case KindRemoved:
		kvevent.RemovedStartBlockHashesVector(b, len(ev.BlockHashes))
		for i := len(ev.BlockHashes) - 1; i >= 0; i-- {
			b.PrependUint64(ev.BlockHashes[i])
		}
		hashes := b.EndVector(len(ev.BlockHashes))
		kvevent.RemovedStart(b)
		kvevent.RemovedAddBlockHashes(b, hashes)
		data = kvevent.RemovedEnd(b)
	case KindCleared:
		kvevent.ClearedStart(b)
		data = kvevent.ClearedEnd(b)
	default:
		panic(fmt.Sprintf("kvshm/fbs: Build: unknown event kind %d", uint8(ev.Kind)))
	}
	kvevent.EventStart(b)
	kvevent.EventAddSeq(b, ev.Seq)
	kvevent.EventAddDpRank(b, ev.DpRank)
	kvevent.EventAddDataType(b, kvevent.EventData(ev.Kind))
	kvevent.EventAddData(b, data)
	root := kvevent.EventEnd(b)
	kvevent.FinishEventBuffer(b, root)
	return b.FinishedBytes()
}

// EventView is a decoded event whose byte slices alias the payload given to Decode (see the package Caveats).
type EventView struct {
	Seq        uint64
	DpRank     uint32
	Kind       Kind
	HasParent  bool
	ParentHash uint64
	// BlockHashes holds NumBlocks() little-endian u64 values (8 bytes each).
	BlockHashes []byte
	// TokenIDs holds NumTokens() little-endian u32 values (4 bytes each); empty unless Kind is KindStored.
	TokenIDs []byte
	// LoraName is empty for the base model.
	LoraName []byte
	IsEagle  bool
}

// NumBlocks returns the number of block hashes.
func (v *EventView) NumBlocks() int { return len(v.BlockHashes) / 8 }

// BlockHash returns block hash i (0 <= i < NumBlocks()).
func (v *EventView) BlockHash(i int) uint64 { return binary.LittleEndian.Uint64(v.BlockHashes[8*i:]) }

// NumTokens returns the number of token ids.
func (v *EventView) NumTokens() int { return len(v.TokenIDs) / 4 }

// TokenID returns token id i (0 <= i < NumTokens()).
func (v *EventView) TokenID(i int) uint32 { return binary.LittleEndian.Uint32(v.TokenIDs[4*i:]) }

// Wire format: never change without changing the schema. Vtable slots of the fields Decode reads.
const (
	slotEventSeq      = 0
	slotEventDpRank   = 1
	slotEventDataType = 2
	slotEventData     = 3
	eventFields       = 4

	slotStoredParent  = 0
	slotStoredHashes  = 1
	slotStoredTokens  = 2
	slotStoredLora    = 3
	slotStoredEagle   = 4
	storedFields      = 5
	slotRemovedHashes = 0
	removedFields     = 1
	clearedFields     = 0

	headerSize = 8 // root uoffset + file identifier
	// minSize: header, a table's soffset and a minimal vtable.
	minSize = headerSize + 4 + 4
	// maxTrailing is the largest alignment padding a builder leaves after the last object.
	maxTrailing = 7
)

// decoder carries the payload and the bookkeeping for the leftover check through one Decode call.
type decoder struct {
	p       []byte
	n       uint64
	end     uint64 // highest offset occupied by a known object
	unknown bool   // some vtable declares fields this schema does not know
}

func (d *decoder) u16(off uint64) uint64 { return uint64(binary.LittleEndian.Uint16(d.p[off:])) }
func (d *decoder) u32(off uint64) uint64 { return uint64(binary.LittleEndian.Uint32(d.p[off:])) }
func (d *decoder) occupy(end uint64) {
	if end > d.end {
		d.end = end
	}
}

// table is a validated table: its position, its vtable's position and the sizes the vtable declares.
type table struct {
	pos, vt, vtSize, size uint64
}

// table validates the table at pos (and its vtable) for a schema table of known fields.
func (d *decoder) table(pos uint64, known int) (table, error) {
	if pos%4 != 0 {
		return table{}, malformed(pos, reasonTableAlign)
	}
	if pos+4 > d.n {
		return table{}, malformed(pos, reasonTableBounds)
	}
	vt := int64(pos) - int64(int32(d.u32(pos)))
	if vt < 0 || vt%2 != 0 || uint64(vt)+4 > d.n {
		return table{}, malformed(pos, reasonVtableBounds)
	}
	t := table{pos: pos, vt: uint64(vt)}
	t.vtSize = d.u16(t.vt)
	if t.vtSize < 4 || t.vtSize%2 != 0 || t.vt+t.vtSize > d.n {
		return table{}, malformed(t.vt, reasonVtableSize)
	}
	t.size = d.u16(t.vt + 2)
	if t.size < 4 || pos+t.size > d.n {
		return table{}, malformed(t.vt+2, reasonTableSize)
	}
	if t.vtSize > uint64(4+2*known) {
		d.unknown = true
	}
	d.occupy(t.vt + t.vtSize)
	d.occupy(pos + t.size)
	return t, nil
}

// field returns the position of the field in slot (0 = absent), checked to lie inside the table and to be
// aligned to size.
func (d *decoder) field(t table, slot int, size uint64) (uint64, error) {
	vo := uint64(4 + 2*slot)
	if vo+2 > t.vtSize {
		return 0, nil
	}
	off := d.u16(t.vt + vo)
	if off == 0 {
		return 0, nil
	}
	if off < 4 || off+size > t.size {
		return 0, malformed(t.vt+vo, reasonFieldBounds)
	}
	pos := t.pos + off
	if pos%size != 0 {
		return 0, malformed(pos, reasonFieldAlign)
	}
	return pos, nil
}

// vector follows the uoffset field at pos to a vector of elem-byte elements and returns its element bytes.
func (d *decoder) vector(pos, elem uint64) ([]byte, error) {
	at := pos + d.u32(pos)
	if at%4 != 0 {
		return nil, malformed(at, reasonVectorAlign)
	}
	if at+4 > d.n {
		return nil, malformed(pos, reasonVectorBounds)
	}
	data := at + 4
	if data%elem != 0 {
		return nil, malformed(at, reasonVectorAlign)
	}
	end := data + d.u32(at)*elem
	if end > d.n {
		return nil, malformed(at, reasonVectorBounds)
	}
	d.occupy(end)
	return d.p[data:end:end], nil
}

// string follows the uoffset field at pos to a string and returns its bytes without the terminator.
func (d *decoder) string(pos uint64) ([]byte, error) {
	at := pos + d.u32(pos)
	if at%4 != 0 {
		return nil, malformed(at, reasonVectorAlign)
	}
	if at+4 > d.n {
		return nil, malformed(pos, reasonStringBounds)
	}
	data := at + 4
	end := data + d.u32(at)
	if end >= d.n {
		return nil, malformed(at, reasonStringBounds)
	}
	if d.p[end] != 0 {
		return nil, malformed(end, reasonStringNUL)
	}
	d.occupy(end + 1)
	return d.p[data:end:end], nil
}

// Decode validates payload completely (see the package documentation) and fills v with views into it. It never
// panics and allocates nothing on success. On error v is left zeroed and the error is a *MalformedError wrapping
// ErrMalformed.
func Decode(payload []byte, v *EventView) error {
	*v = EventView{}
	if err := decode(payload, v); err != nil {
		*v = EventView{}
		return err
	}
	return nil
}

func decode(payload []byte, v *EventView) error {
	d := decoder{p: payload, n: uint64(len(payload)), end: headerSize}
	if d.n < minSize {
		return malformed(0, reasonShort)
	}
	if string(payload[4:8]) != Identifier {
		return malformed(4, reasonIdentifier)
	}
	root := d.u32(0)
	if root < headerSize || root >= d.n {
		return malformed(0, reasonRootOffset)
	}
	ev, err := d.table(root, eventFields)
	if err != nil {
		return err
	}
	if pos, err := d.field(ev, slotEventSeq, 8); err != nil {
		return err
	} else if pos != 0 {
		v.Seq = binary.LittleEndian.Uint64(payload[pos:])
	}
	if pos, err := d.field(ev, slotEventDpRank, 4); err != nil {
		return err
	} else if pos != 0 {
		v.DpRank = binary.LittleEndian.Uint32(payload[pos:])
	}
	typePos, err := d.field(ev, slotEventDataType, 1)
	if err != nil {
		return err
	}
	if typePos == 0 {
		return malformed(ev.vt, reasonTypeWithNoData)
	}
	kind := Kind(payload[typePos])
	switch kind {
	case KindStored, KindRemoved, KindCleared:
	case 0:
		return malformed(typePos, reasonTypeWithNoData)
	default:
		return malformed(typePos, reasonUnknownType)
	}
	v.Kind = kind
	dataPos, err := d.field(ev, slotEventData, 4)
	if err != nil {
		return err
	}
	if dataPos == 0 {
		return malformed(ev.vt, reasonDataMissing)
	}
	at := dataPos + d.u32(dataPos)
	switch kind {
	case KindStored:
		err = d.stored(at, v)
	case KindRemoved:
		err = d.removed(at, v)
	case KindCleared:
		_, err = d.table(at, clearedFields)
	}
	if err != nil {
		return err
	}
	if !d.unknown && d.n-d.end > maxTrailing {
		return malformed(d.end, reasonTrailing)
	}
	return nil
}

func (d *decoder) stored(at uint64, v *EventView) error {
	t, err := d.table(at, storedFields)
	if err != nil {
		return err
	}
	pos, err := d.field(t, slotStoredParent, 8)
	if err != nil {
		return err
	}
	if pos != 0 {
		v.HasParent = true
		v.ParentHash = binary.LittleEndian.Uint64(d.p[pos:])
	}
	if pos, err = d.field(t, slotStoredHashes, 4); err != nil {
		return err
	} else if pos != 0 {
		if v.BlockHashes, err = d.vector(pos, 8); err != nil {
			return err
		}
	}
	if pos, err = d.field(t, slotStoredTokens, 4); err != nil {
		return err
	} else if pos != 0 {
		if v.TokenIDs, err = d.vector(pos, 4); err != nil {
			return err
		}
	}
	if pos, err = d.field(t, slotStoredLora, 4); err != nil {
		return err
	} else if pos != 0 {
		if v.LoraName, err = d.string(pos); err != nil {
			return err
		}
	}
	if pos, err = d.field(t, slotStoredEagle, 1); err != nil {
		return err
	} else if pos != 0 {
		switch d.p[pos] {
		case 0:
		case 1:
			v.IsEagle = true
		default:
			return malformed(pos, reasonBool)
		}
	}
	return nil
}

func (d *decoder) removed(at uint64, v *EventView) error {
	t, err := d.table(at, removedFields)
	if err != nil {
		return err
	}
	pos, err := d.field(t, slotRemovedHashes, 4)
	if err != nil {
		return err
	}
	if pos != 0 {
		v.BlockHashes, err = d.vector(pos, 8)
	}
	return err
}
