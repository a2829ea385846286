package fbs

import (
	"encoding/binary"
	"errors"
	"fmt"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/kvshm/kvshm/proto/fbs/kvevent"
)

// ErrMalformedMeta is wrapped by every error DecodeMeta returns: the payload is not a valid kvevent.Meta.
var ErrMalformedMeta = errors.New("kvshm/fbs: malformed event metadata")

// MetaSpec is the metadata of one event to encode with BuildMeta (vLLM's fields the index does not need). A
// Has* flag false (or a nil ExtraKeys) is vLLM's None. Slices are only read.
type MetaSpec struct {
	HasMedium        bool
	Medium           string
	HasLoraID        bool
	LoraID           int64
	HasBlockSize     bool
	BlockSize        uint32
	ExtraKeys        []byte // msgspec's msgpack of extra_keys; nil = None
	HasGroupIdx      bool
	GroupIdx         uint32
	HasKind          bool
	Kind             string // kv_cache_spec_kind
	HasSlidingWindow bool
	SlidingWindow    uint32 // kv_cache_spec_sliding_window
	// HashBytes: the event's bytes block hashes, concatenated (nil: ints); ParentBytes: its parent's (nil: an
	// int or None). See the schema; DecodeMeta does not relate them to the event (the daemon does).
	HashBytes   []byte
	ParentBytes []byte
	// SGLang's BlockStored fields (absent: None).
	HasCacheSalt bool
	CacheSalt    string
	HasSessionID bool
	SessionID    string
}

// MetaView is a decoded Meta whose byte slices alias the payload given to DecodeMeta (valid as long as it is).
// A Has* flag false is vLLM's None; ExtraKeys is nil when absent.
type MetaView struct {
	HasMedium        bool
	Medium           []byte
	HasLoraID        bool
	LoraID           int64
	HasBlockSize     bool
	BlockSize        uint32
	ExtraKeys        []byte
	HasGroupIdx      bool
	GroupIdx         uint32
	HasKind          bool
	Kind             []byte
	HasSlidingWindow bool
	SlidingWindow    uint32
	HashBytes        []byte // nil when absent
	ParentBytes      []byte // nil when absent
	HasCacheSalt     bool
	CacheSalt        []byte
	HasSessionID     bool
	SessionID        []byte
}

// BuildMeta encodes m with b in the canonical call order (the Python builder, kvshm._encode, follows it too) and
// returns the finished bytes (a root buffer without file identifier). It resets b first; the result aliases b's
// buffer and is valid until b is used again.
//
//	[session = CreateString], [salt = CreateString], [parent = CreateByteVector], [hashes = CreateByteVector],
//	[kind = CreateString], [extra = CreateByteVector], [medium = CreateString]
//	MetaStart, [AddMedium], [AddLoraId], [AddBlockSize], [AddExtraKeys], [AddGroupIdx], [AddKvCacheSpecKind],
//	[AddKvCacheSpecSlidingWindow], [AddBlockHashBytes], [AddParentHashBytes], [AddCacheSalt], [AddSessionId],
//	MetaEnd, Finish
func BuildMeta(b *flatbuffers.Builder, m *MetaSpec) []byte {
	b.Reset()
	var session, salt, parent, hashes, kind, extra, medium flatbuffers.UOffsetT
	if m.HasSessionID {
		session = b.CreateString(m.SessionID)
	}
	if m.HasCacheSalt {
		salt = b.CreateString(m.CacheSalt)
	}
	if m.ParentBytes != nil {
		parent = b.CreateByteVector(m.ParentBytes)
	}
	if m.HashBytes != nil {
		hashes = b.CreateByteVector(m.HashBytes)
	}
	if m.HasKind {
		kind = b.CreateString(m.Kind)
	}
	if m.ExtraKeys != nil {
		extra = b.CreateByteVector(m.ExtraKeys)
	}
	if m.HasMedium {
		medium = b.CreateString(m.Medium)
	}
	kvevent.MetaStart(b)
	if m.HasMedium {
		kvevent.MetaAddMedium(b, medium)
	}
	if m.HasLoraID {
		kvevent.MetaAddLoraId(b, m.LoraID)
	}
	if m.HasBlockSize {
		kvevent.MetaAddBlockSize(b, m.BlockSize)
	}
	if m.ExtraKeys != nil {
		kvevent.MetaAddExtraKeys(b, extra)
	}
	if m.HasGroupIdx {
		kvevent.MetaAddGroupIdx(b, m.GroupIdx)
	}
	if m.HasKind {
		kvevent.MetaAddKvCacheSpecKind(b, kind)
	}
	if m.HasSlidingWindow {
		kvevent.MetaAddKvCacheSpecSlidingWindow(b, m.SlidingWindow)
	}
	if m.HashBytes != nil {
		kvevent.MetaAddBlockHashBytes(b, hashes)
	}
	if m.ParentBytes != nil {
		kvevent.MetaAddParentHashBytes(b, parent)
	}
	if m.HasCacheSalt {
		kvevent.MetaAddCacheSalt(b, salt)
	}
	if m.HasSessionID {
		kvevent.MetaAddSessionId(b, session)
	}
	kvevent.FinishMetaBuffer(b, kvevent.MetaEnd(b))
	return b.FinishedBytes()
}

// Wire format: never change without changing the schema. Vtable slots of kvevent.Meta.
const (
	slotMetaMedium        = 0
	slotMetaLoraID        = 1
	slotMetaBlockSize     = 2
	slotMetaExtraKeys     = 3
	slotMetaGroupIdx      = 4
	slotMetaKind          = 5
	slotMetaSlidingWindow = 6
	slotMetaHashBytes     = 7
	slotMetaParentBytes   = 8
	slotMetaCacheSalt     = 9
	slotMetaSessionID     = 10
	metaFields            = 11

	metaHeaderSize = 4 // root uoffset, no file identifier
	// minMetaSize: the root offset, a table's soffset and a minimal vtable.
	minMetaSize = metaHeaderSize + 4 + 4
)

// DecodeMeta validates a kvevent.Meta payload with the rules Decode applies to an event (tables, vtables, fields,
// strings, vectors, leftover bytes; see the package documentation) and fills m with views into it. It never
// panics and allocates nothing on success. On error m is zeroed and the error wraps ErrMalformedMeta (it names
// the offset and the reason).
func DecodeMeta(payload []byte, m *MetaView) error {
	*m = MetaView{}
	if err := decodeMeta(payload, m); err != nil {
		*m = MetaView{}
		var me *MalformedError
		if errors.As(err, &me) {
			return fmt.Errorf("%w at offset %d: %s", ErrMalformedMeta, me.Offset, me.Reason)
		}
		return fmt.Errorf("%w: %v", ErrMalformedMeta, err)
	}
	return nil
}

func decodeMeta(payload []byte, m *MetaView) error {
	d := decoder{p: payload, n: uint64(len(payload)), end: metaHeaderSize}
	if d.n < minMetaSize {
		return malformed(0, reasonShort)
	}
	root := d.u32(0)
	if root < metaHeaderSize || root >= d.n {
		return malformed(0, reasonRootOffset)
	}
	t, err := d.table(root, metaFields)
	if err != nil {
		return err
	}
	if m.Medium, m.HasMedium, err = d.optString(t, slotMetaMedium); err != nil {
		return err
	}
	if pos, err := d.field(t, slotMetaLoraID, 8); err != nil {
		return err
	} else if pos != 0 {
		m.HasLoraID, m.LoraID = true, int64(binary.LittleEndian.Uint64(payload[pos:]))
	}
	if m.BlockSize, m.HasBlockSize, err = d.optU32(t, slotMetaBlockSize); err != nil {
		return err
	}
	if m.ExtraKeys, err = d.optBytes(t, slotMetaExtraKeys); err != nil {
		return err
	}
	if m.GroupIdx, m.HasGroupIdx, err = d.optU32(t, slotMetaGroupIdx); err != nil {
		return err
	}
	if m.Kind, m.HasKind, err = d.optString(t, slotMetaKind); err != nil {
		return err
	}
	if m.SlidingWindow, m.HasSlidingWindow, err = d.optU32(t, slotMetaSlidingWindow); err != nil {
		return err
	}
	if m.HashBytes, err = d.optBytes(t, slotMetaHashBytes); err != nil {
		return err
	}
	if m.ParentBytes, err = d.optBytes(t, slotMetaParentBytes); err != nil {
		return err
	}
	if m.CacheSalt, m.HasCacheSalt, err = d.optString(t, slotMetaCacheSalt); err != nil {
		return err
	}
	if m.SessionID, m.HasSessionID, err = d.optString(t, slotMetaSessionID); err != nil {
		return err
	}
	if !d.unknown && d.n-d.end > maxTrailing {
		return malformed(d.end, reasonTrailing)
	}
	return nil
}

func (d *decoder) optU32(t table, slot int) (uint32, bool, error) {
	pos, err := d.field(t, slot, 4)
	if err != nil || pos == 0 {
		return 0, false, err
	}
	return binary.LittleEndian.Uint32(d.p[pos:]), true, nil
}

// optBytes reads a [ubyte] field: nil when absent, non-nil (maybe empty) when present.
func (d *decoder) optBytes(t table, slot int) ([]byte, error) {
	pos, err := d.field(t, slot, 4)
	if err != nil || pos == 0 {
		return nil, err
	}
	return d.vector(pos, 1) // an empty vector is a non-nil empty slice: present, not None
}

func (d *decoder) optString(t table, slot int) ([]byte, bool, error) {
	pos, err := d.field(t, slot, 4)
	if err != nil || pos == 0 {
		return nil, false, err
	}
	s, err := d.string(pos)
	if err != nil {
		return nil, false, err
	}
	return s, true, nil
}
