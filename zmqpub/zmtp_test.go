package zmqpub

import (
	"bufio"
	"bytes"
	"testing"
)

// FuzzZMTPDecoders: whatever a peer sends, the frame reader, the command parser and the READY parser return an
// error or a value within the bounds; they never panic.
func FuzzZMTPDecoders(f *testing.F) {
	f.Add(libzmqPing)
	f.Add(ready("DEALER"))
	f.Add([]byte{0x01, 0x00, 0x00, 0x08, 0, 0, 0, 0, 0, 0, 0, 7})
	f.Add([]byte{0x06, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x04, 0x03, 0x09, 'R', 'E'})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bufio.NewReader(bytes.NewReader(b))
		for {
			flags, body, err := readFrame(r, maxCommand)
			if err != nil {
				return
			}
			if len(body) > maxCommand || flags&flagLong != 0 {
				t.Fatalf("frame of %d bytes, flags %#x", len(body), flags)
			}
			if name, data, err := parseCommand(body); err == nil && name == "READY" {
				_, _ = readyProps(data)
			}
		}
	})
}

func TestReadyRoundTrip(t *testing.T) {
	r := bufio.NewReader(bytes.NewReader(ready("ROUTER")))
	flags, body, err := readFrame(r, maxCommand)
	if err != nil || flags != flagCommand {
		t.Fatalf("READY frame: %#x %v", flags, err)
	}
	name, data, err := parseCommand(body)
	if err != nil || name != "READY" {
		t.Fatalf("command %q %v", name, err)
	}
	props, err := readyProps(data)
	if err != nil || props["Socket-Type"] != "ROUTER" || len(props) != 1 {
		t.Fatalf("props %v %v", props, err)
	}
}
