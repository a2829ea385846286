// Package sock is kvshmd's Unix-socket protocol: the frame codec (frame.go), the request and reply bodies and
// their strict decoder (messages.go), the error codes and RemoteError (errors.go), the socket directory and peer
// credential checks both ends make (socket.go), and the Go client (client.go). The byte format is specified in
// PROTOCOL.md; the frame vectors in testdata/protocol pin it for this package and the Python client. The server
// side is package daemon.
//
// # Usage contract
//
//	c, err := sock.Dial(ctx, sock.DefaultSocketPath())
//	defer c.Close()
//	st, err := c.Stats(ctx, nil)
//
// A Client is safe for concurrent use; calls are serialized on its one connection. A producer keeps the Client it
// attached with open for its whole life (closing it tells the daemon the producer is gone).
//
// # Failure outcomes
//
//	input                                       outcome
//	socket directory not ours, or group/other   Dial fails with ErrUntrustedServer wrapping ErrUnsafeDir; nothing
//	writable                                    is sent
//	socket served by another uid                Dial fails with ErrUntrustedServer; nothing is sent
//	length < 4                                  ReadFrame: ErrFrameTooShort (no header field read beyond length)
//	version ≠ Version                           ReadFrame: ErrUnsupportedVersion, the header fields returned
//	length above the cap                        ReadFrame: ErrFrameTooLarge, the header fields returned
//	stream ends inside a frame / before one     io.ErrUnexpectedEOF / io.EOF
//	body above MaxResponseBody                  WriteFrame: ErrFrameTooLarge, nothing written
//	error reply                                 *RemoteError (errors.Is ErrRemote; IsCode matches its code); an
//	                                            unparseable one has code internal
//	reply of another kind than the request      an error; the connection should be closed
//	the context ends                            the exchange is cut (deadline on the connection); the error wraps
//	                                            the context's
//
// After ErrFrameTooShort, ErrUnsupportedVersion or ErrFrameTooLarge the body has not been consumed: the stream is
// out of sync and the connection must be closed.
package sock
