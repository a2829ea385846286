package sock

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"
)

// Client speaks the query protocol to one daemon over one connection. It is safe for concurrent use: calls are
// serialized on the connection (open several Clients for parallel queries).
type Client struct {
	mu   sync.Mutex // serializes calls; protects conn, br, buf
	conn *net.UnixConn
	br   *bufio.Reader
	buf  []byte
}

// Dial connects to the daemon socket at path. It refuses (ErrUntrustedServer, nothing sent) a socket in a
// directory that is not this user's and private, and a socket served by another user (SO_PEERCRED).
func Dial(ctx context.Context, path string) (*Client, error) {
	if err := CheckSocketDir(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("dial kvshmd socket %s: %w: %w", path, ErrUntrustedServer, err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("dial kvshmd socket %s: %w", path, err)
	}
	uc := c.(*net.UnixConn)
	if err := checkServerCred(uc); err != nil {
		_ = uc.Close()
		return nil, fmt.Errorf("dial kvshmd socket %s: %w", path, err)
	}
	return &Client{conn: uc, br: bufio.NewReaderSize(uc, 64<<10)}, nil
}

// Close closes the connection. For a producer's attaching connection this tells the daemon the producer is gone.
func (c *Client) Close() error { return c.conn.Close() }

// Conn returns the underlying connection (tests use it to misbehave).
func (c *Client) Conn() *net.UnixConn { return c.conn }

// Do sends one request with a raw JSON body and returns the reply body (valid until the next call). An error
// reply is returned as a *RemoteError; the context's deadline bounds the whole exchange.
func (c *Client) Do(ctx context.Context, kind Kind, body []byte) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Time{}
	}
	if err := c.conn.SetDeadline(dl); err != nil {
		return nil, fmt.Errorf("set deadline: %w", err)
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { _ = c.conn.SetDeadline(time.Unix(1, 0)) })
		defer stop()
	}
	if err := WriteFrame(c.conn, kind, StatusOK, body); err != nil {
		// The daemon may have refused the connection (forbidden, busy) with an error frame and closed it before
		// the request went out: that frame is still readable and says why.
		_ = c.conn.SetReadDeadline(time.Now().Add(time.Second))
		if f, _, rerr := ReadFrame(c.br, 1<<16, nil); rerr == nil && f.Status != StatusOK {
			return nil, remoteError(kind, f.Body)
		}
		return nil, fmt.Errorf("send %s request: %w", kind, err)
	}
	f, buf, err := ReadFrame(c.br, MaxResponse, c.buf)
	c.buf = buf
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read %s reply: %w", kind, ctx.Err())
		}
		return nil, fmt.Errorf("read %s reply: %w", kind, err)
	}
	if f.Kind != kind && f.Status == StatusOK {
		return nil, fmt.Errorf("read %s reply: reply kind %s does not echo the request", kind, f.Kind)
	}
	if f.Status != StatusOK {
		return nil, remoteError(kind, f.Body)
	}
	return f.Body, nil
}

func remoteError(kind Kind, body []byte) *RemoteError {
	var eb ErrorBody
	if err := json.Unmarshal(body, &eb); err != nil || eb.Code == "" {
		return &RemoteError{Kind: kind, Code: CodeInternal, Message: fmt.Sprintf("unparseable error reply %q", body)}
	}
	return &RemoteError{Kind: kind, Code: eb.Code, Message: eb.Error}
}

// Call marshals req as the body, sends it, and unmarshals the reply into resp (when resp is non-nil).
func (c *Client) Call(ctx context.Context, kind Kind, req, resp any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode %s request: %w", kind, err)
	}
	out, err := c.Do(ctx, kind, body)
	if err != nil {
		return err
	}
	if resp == nil {
		return nil
	}
	if err := json.Unmarshal(out, resp); err != nil {
		return fmt.Errorf("decode %s reply: %w", kind, err)
	}
	return nil
}

// Attach registers the producer of a ring. Keep the Client open for as long as the producer lives: closing it
// (or the process exiting) tells the daemon the producer is gone.
func (c *Client) Attach(ctx context.Context, req AttachRequest) (AttachReply, error) {
	var r AttachReply
	err := c.Call(ctx, KindAttach, req, &r)
	return r, err
}

// Detach drains the worker's ring one last time and stops following it; the index stays queryable.
func (c *Client) Detach(ctx context.Context, workerID uint64) error {
	return c.DetachStream(ctx, WorkerRequest{WorkerID: &workerID})
}

// DetachStream is Detach of the stream req selects (worker_id and, for a per-rank stream, dp_rank).
func (c *Client) DetachStream(ctx context.Context, req WorkerRequest) error {
	return c.Call(ctx, KindDetach, req, nil)
}

// Forget drops a worker's stream (index, counters, metric series). The daemon refuses it (conflict) while a
// producer is attached.
func (c *Client) Forget(ctx context.Context, workerID uint64) error {
	return c.ForgetStream(ctx, WorkerRequest{WorkerID: &workerID})
}

// ForgetStream is Forget of the stream req selects (worker_id and, for a per-rank stream, dp_rank).
func (c *Client) ForgetStream(ctx context.Context, req WorkerRequest) error {
	return c.Call(ctx, KindForget, req, nil)
}

// Events returns the WorkerKvQueryResponse JSON for [start, end] (nil = open). The bytes are a fresh copy.
func (c *Client) Events(ctx context.Context, workerID, start, end *uint64) ([]byte, error) {
	return c.EventsOf(ctx, EventsRequest{WorkerID: workerID, Start: start, End: end})
}

// EventsOf is Events with every request field (dp_rank selects a per-rank stream or an ALL stream's rank view).
func (c *Client) EventsOf(ctx context.Context, req EventsRequest) ([]byte, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	out, err := c.Do(ctx, KindEvents, body)
	return clone(out), err
}

// Dump returns the WorkerKvQueryResponse JSON of a full dump. The bytes are a fresh copy.
func (c *Client) Dump(ctx context.Context, workerID *uint64) ([]byte, error) {
	return c.DumpOf(ctx, WorkerRequest{WorkerID: workerID})
}

// DumpOf is Dump with every request field (dp_rank as in EventsOf).
func (c *Client) DumpOf(ctx context.Context, req WorkerRequest) ([]byte, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	out, err := c.Do(ctx, KindDump, body)
	return clone(out), err
}

// Stats returns per-stream statistics (all streams when workerID is nil).
func (c *Client) Stats(ctx context.Context, workerID *uint64) (StatsReply, error) {
	return c.StatsOf(ctx, WorkerRequest{WorkerID: workerID})
}

// StatsOf is Stats with every request field (dp_rank: for each worker its stream of that rank, else its ALL
// stream).
func (c *Client) StatsOf(ctx context.Context, req WorkerRequest) (StatsReply, error) {
	var r StatsReply
	err := c.Call(ctx, KindStats, req, &r)
	return r, err
}

// Match returns overlap scores of the token sequence against the worker's tree.
func (c *Client) Match(ctx context.Context, req MatchRequest) (MatchReply, error) {
	var r MatchReply
	err := c.Call(ctx, KindMatch, req, &r)
	return r, err
}

// Health returns the daemon's health.
func (c *Client) Health(ctx context.Context) (HealthReply, error) {
	var r HealthReply
	err := c.Call(ctx, KindHealth, struct{}{}, &r)
	return r, err
}

// IsCode reports whether err is an error reply with the given code.
func IsCode(err error, code string) bool {
	var re *RemoteError
	return errors.As(err, &re) && re.Code == code
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}
