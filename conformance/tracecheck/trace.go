package tracecheck

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Errors.
var (
	// ErrTrace is returned when a trace cannot be read: a bad header, an unknown op, a malformed line.
	ErrTrace = errors.New("kvshm/tracecheck: bad trace")
)

// Header is a trace's first line: the LocalIndexer's constructor arguments and the deviation marks.
type Header struct {
	Name          string         `json:"trace"`
	WorkerID      uint64         `json:"worker_id"`
	BlockSize     uint32         `json:"block_size"`
	MaxBufferSize int            `json:"max_buffer_size"`
	Deviations    map[string]int `json:"deviations,omitempty"`
}

// Op is one op line. Kind is stored, removed, cleared or query; Answer is Dynamo's raw answer of a query.
type Op struct {
	Kind     string          `json:"op"`
	Seq      uint64          `json:"seq"`
	DpRank   uint32          `json:"dp_rank"`
	Tokens   []uint32        `json:"tokens"`
	Hashes   []uint64        `json:"hashes"`
	Parent   *uint64         `json:"parent"`
	LoraName *string         `json:"lora_name"`
	IsEagle  *bool           `json:"is_eagle"`
	Start    *uint64         `json:"start"`
	End      *uint64         `json:"end"`
	Answer   json.RawMessage `json:"answer"`
	Line     int             `json:"-"`
}

// Trace is a parsed trace.
type Trace struct {
	Header Header
	Ops    []Op
}

// maxLine bounds one trace line (a recorded TreeDump answer is the longest).
const maxLine = 16 << 20

// Read parses a trace; errors wrap ErrTrace and name the line.
func Read(r io.Reader) (*Trace, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	var t Trace
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if line == 1 {
			if err := strictUnmarshal(b, &t.Header); err != nil {
				return nil, fmt.Errorf("%w: line 1: header: %v", ErrTrace, err)
			}
			if t.Header.BlockSize == 0 {
				return nil, fmt.Errorf("%w: line 1: block_size 0", ErrTrace)
			}
			continue
		}
		var op Op
		if err := strictUnmarshal(b, &op); err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrTrace, line, err)
		}
		switch op.Kind {
		case "stored", "removed", "cleared":
		case "query":
			if len(op.Answer) == 0 {
				return nil, fmt.Errorf("%w: line %d: query without an answer", ErrTrace, line)
			}
			op.Answer = bytes.Clone(op.Answer)
		default:
			return nil, fmt.Errorf("%w: line %d: unknown op %q", ErrTrace, line, op.Kind)
		}
		op.Line = line
		t.Ops = append(t.Ops, op)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: line %d: %v", ErrTrace, line+1, err)
	}
	if line == 0 {
		return nil, fmt.Errorf("%w: empty", ErrTrace)
	}
	return &t, nil
}

// strictUnmarshal rejects unknown fields and trailing data.
func strictUnmarshal(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("trailing data")
	}
	return nil
}
