package sock

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
)

// The frame layout is drawn in PROTOCOL.md. Wire format: never change without bumping Version.
const (
	// Version is the protocol version carried in every frame.
	Version = 1
	// HeaderSize is the number of bytes before the body.
	HeaderSize = 8
	// lengthCounted is how many header bytes the length field counts (version, kind, status).
	lengthCounted = HeaderSize - 4
	// DefaultMaxRequest caps request frames (length field) unless configured otherwise.
	DefaultMaxRequest = 4 << 20
	// MaxResponse caps response frames (length field); a dump larger than this is an internal error.
	MaxResponse = 1 << 30
	// MaxResponseBody is the largest reply body: MaxResponse less the header bytes the length field counts.
	MaxResponseBody = MaxResponse - lengthCounted
)

// Kind is a request kind; a reply echoes it.
type Kind uint8

// Request kinds. Wire format: never renumber.
const (
	KindAttach Kind = 1
	KindDetach Kind = 2
	KindEvents Kind = 3
	KindDump   Kind = 4
	KindStats  Kind = 5
	KindMatch  Kind = 6
	KindHealth Kind = 7
	KindForget Kind = 8
)

var kindNames = [...]string{"", "attach", "detach", "events", "dump", "stats", "match", "health", "forget"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && k != 0 {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Known reports whether k is a request kind of this protocol version.
func (k Kind) Known() bool { return k >= KindAttach && k <= KindForget }

// Status is a reply status. Requests carry StatusOK.
type Status uint16

// Reply statuses. Wire format: never renumber.
const (
	StatusOK    Status = 0
	StatusError Status = 1
)

// Frame is one decoded frame. Body aliases the buffer passed to ReadFrame.
type Frame struct {
	Version uint8
	Kind    Kind
	Status  Status
	Body    []byte
}

// ReadFrame reads one frame from r. The body is read into buf when it fits (buf may be nil) and the returned
// Frame's Body aliases it. maxLen caps the length field (which counts 4 header bytes plus the body).
//
// On ErrUnsupportedVersion, ErrFrameTooLarge and ErrFrameTooShort the header fields that were read are returned
// in the Frame (so a reply can echo the kind) and the body has NOT been consumed: the stream is out of sync and
// the connection must be closed. A stream that ends inside a frame yields io.ErrUnexpectedEOF; one that ends
// before the first byte yields io.EOF.
func ReadFrame(r io.Reader, maxLen uint32, buf []byte) (Frame, []byte, error) {
	var hdr [HeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:4]); err != nil {
		return Frame{}, buf, err
	}
	length := binary.LittleEndian.Uint32(hdr[:4])
	if length < lengthCounted {
		// Too short to hold the rest of the header: do not read further, the stream cannot be trusted.
		return Frame{}, buf, fmt.Errorf("read frame: length %d: %w", length, ErrFrameTooShort)
	}
	if _, err := io.ReadFull(r, hdr[4:]); err != nil {
		return Frame{}, buf, eofIsUnexpected(err)
	}
	f := Frame{Version: hdr[4], Kind: Kind(hdr[5]), Status: Status(binary.LittleEndian.Uint16(hdr[6:8]))}
	if f.Version != Version {
		return f, buf, fmt.Errorf("read frame: version %d (want %d): %w", f.Version, Version, ErrUnsupportedVersion)
	}
	if length > maxLen {
		return f, buf, fmt.Errorf("read frame: length %d exceeds %d: %w", length, maxLen, ErrFrameTooLarge)
	}
	n := int(length - lengthCounted)
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	f.Body = buf[:n]
	if _, err := io.ReadFull(r, f.Body); err != nil {
		return Frame{}, buf, eofIsUnexpected(err)
	}
	return f, buf, nil
}

func eofIsUnexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// AppendHeader appends the 8-byte header of a frame with a body of bodyLen bytes.
func AppendHeader(dst []byte, kind Kind, status Status, bodyLen int) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(bodyLen+lengthCounted))
	dst = append(dst, Version, byte(kind))
	return binary.LittleEndian.AppendUint16(dst, uint16(status))
}

// WriteFrame writes one frame with a single writev (header and body are not copied together). bodyLen+4 must not
// exceed MaxResponse.
func WriteFrame(w io.Writer, kind Kind, status Status, body []byte) error {
	if uint64(len(body))+lengthCounted > MaxResponse {
		return fmt.Errorf("write frame: body of %d bytes: %w", len(body), ErrFrameTooLarge)
	}
	var hdr [HeaderSize]byte
	AppendHeader(hdr[:0], kind, status, len(body))
	if len(body) < 4096 {
		// One small write: cheaper than writev for the common small reply.
		b := make([]byte, 0, HeaderSize+len(body))
		b = append(append(b, hdr[:]...), body...)
		_, err := w.Write(b)
		return err
	}
	bufs := net.Buffers{hdr[:], body}
	_, err := bufs.WriteTo(w)
	return err
}
