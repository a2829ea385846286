package daemon

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvshm/kvshm/proto/sock"
)

func TestParseRecoverQuery(t *testing.T) {
	tests := []struct {
		raw                      string
		worker, start, end, rank string // "" = absent
		ok                       bool
	}{
		{"", "", "", "", "", true},
		{"start=&end=", "", "", "", "", true},
		{"start=5&end=9", "", "5", "9", "", true},
		{"end=9&start=5&worker_id=18446744073709551615", "18446744073709551615", "5", "9", "", true},
		{"start=0", "", "0", "", "", true},
		{"start=0&dp_rank=4294967295", "", "0", "", "4294967295", true},
		{"dp_rank=&worker_id=3", "3", "", "", "", true},
		{"dp_rank=4294967296", "", "", "", "", false},
		{"dp_rank=-1", "", "", "", "", false},
		{"dp_rank=1&dp_rank=2", "", "", "", "", false},
		{"start=18446744073709551616", "", "", "", "", false},
		{"start=-1", "", "", "", "", false},
		{"start=+1", "", "", "", "", false},
		{"start=1.0", "", "", "", "", false},
		{"start=%201", "", "", "", "", false},
		{"start=0x10", "", "", "", "", false},
		{"start=1&start=1", "", "", "", "", false},
		{"begin=1", "", "", "", "", false},
		{"start=%zz", "", "", "", "", false},
		{"start=1;end=2", "", "", "", "", false},
	}
	for _, tt := range tests {
		q, err := ParseRecoverQuery(tt.raw)
		if (err == nil) != tt.ok {
			t.Errorf("ParseRecoverQuery(%q) error = %v, want ok=%v", tt.raw, err, tt.ok)
			continue
		}
		if !tt.ok {
			continue
		}
		for _, c := range []struct {
			name string
			got  *uint64
			want string
		}{{"worker_id", q.WorkerID, tt.worker}, {"start", q.Start, tt.start}, {"end", q.End, tt.end}} {
			got := ""
			if c.got != nil {
				got = strconv.FormatUint(*c.got, 10)
			}
			if got != c.want {
				t.Errorf("ParseRecoverQuery(%q).%s = %q, want %q", tt.raw, c.name, got, c.want)
			}
		}
		rank := ""
		if q.DpRank != nil {
			rank = strconv.FormatUint(uint64(*q.DpRank), 10)
		}
		if rank != tt.rank {
			t.Errorf("ParseRecoverQuery(%q).dp_rank = %q, want %q", tt.raw, rank, tt.rank)
		}
	}
}

// FuzzParseRecoverQuery: no panic; an accepted query re-encodes to an equivalent one.
func FuzzParseRecoverQuery(f *testing.F) {
	for _, s := range []string{"", "start=&end=", "start=5&end=9&worker_id=1", "start=-1", "x=1", "start=1&start=2", "%zz", "dp_rank=4294967295&start=0", "dp_rank=4294967296"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if len(raw) > 4096 {
			return
		}
		q, err := ParseRecoverQuery(raw)
		if err != nil {
			return
		}
		v := url.Values{}
		for name, p := range map[string]*uint64{"start": q.Start, "end": q.End, "worker_id": q.WorkerID} {
			if p != nil {
				v.Set(name, strconv.FormatUint(*p, 10))
			}
		}
		if q.DpRank != nil {
			v.Set("dp_rank", strconv.FormatUint(uint64(*q.DpRank), 10))
		}
		q2, err := ParseRecoverQuery(v.Encode())
		if err != nil {
			t.Fatalf("re-encoded query %q rejected: %v", v.Encode(), err)
		}
		eq := func(a, b *uint64) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }
		if !eq(q.Start, q2.Start) || !eq(q.End, q2.End) || !eq(q.WorkerID, q2.WorkerID) ||
			(q.DpRank == nil) != (q2.DpRank == nil) || q.DpRank != nil && *q.DpRank != *q2.DpRank {
			t.Fatalf("round trip of %q changed the query", raw)
		}
	})
}

// TestHTTPRecoverStatus: /kv_recover answers 404 for an unknown worker and 409 when worker_id is omitted while
// several streams are attached, each with the JSON error body; with worker_id it serves 200.
func TestHTTPRecoverStatus(t *testing.T) {
	ts := startServer(t, nil)
	get := func(q string) (int, string) {
		t.Helper()
		rec := httptest.NewRecorder()
		ts.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/kv_recover?"+q, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get("start=&end="); code != http.StatusNotFound || !strings.Contains(body, `"code":"not_found"`) {
		t.Fatalf("no stream: %d %s, want 404 not_found", code, body)
	}
	p1 := newProducer(t, ts.SocketPath(), 1, 4, 1<<16)
	p1.mustPublish(stored(0, 0, nil, []uint64{10}, tokens(0, 1, 4)))
	if code, body := get("start=0"); code != http.StatusOK || !strings.HasPrefix(body, `{"Events":`) {
		t.Fatalf("one stream, no worker_id: %d %s, want 200 Events", code, body)
	}
	newProducer(t, ts.SocketPath(), 2, 4, 1<<16)
	tests := []struct {
		query string
		code  int
		body  string
	}{
		{"start=&end=", http.StatusConflict, `"code":"conflict"`},
		{"start=0", http.StatusConflict, `"code":"conflict"`},
		{"worker_id=3", http.StatusNotFound, `"code":"not_found"`},
		{"worker_id=18446744073709551615&start=0", http.StatusNotFound, `"code":"not_found"`},
		{"worker_id=1&start=0", http.StatusOK, `{"Events":`},
		{"worker_id=2", http.StatusOK, `{"TreeDump":`},
	}
	for _, tt := range tests {
		code, body := get(tt.query)
		if code != tt.code || !strings.Contains(body, tt.body) {
			t.Errorf("/kv_recover?%s = %d %s, want %d with %s", tt.query, code, body, tt.code, tt.body)
		}
		if code != http.StatusOK {
			var eb sock.ErrorBody
			if err := json.Unmarshal([]byte(body), &eb); err != nil || eb.Error == "" {
				t.Errorf("/kv_recover?%s: error body %q is not {\"error\",\"code\"}", tt.query, body)
			}
		}
	}
}

// TestHTTPConnectionLimit: beyond HTTPMaxConns a connection gets 503 busy and is closed at once; a client that
// never finishes its headers is closed after HTTPHeaderTimeout, which frees its slot; the server's timeouts are set.
func TestHTTPConnectionLimit(t *testing.T) {
	ts := startServer(t, func(c *Config) {
		c.HTTPAddr = "127.0.0.1:0"
		c.HTTPMaxConns = 2
		c.HTTPHeaderTimeout = 2 * time.Second
	})
	if ts.httpS.ReadHeaderTimeout != 2*time.Second || ts.httpS.IdleTimeout != 2*time.Minute {
		t.Fatalf("http.Server timeouts: header %v idle %v", ts.httpS.ReadHeaderTimeout, ts.httpS.IdleTimeout)
	}
	addr := ts.HTTPAddr()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// readAll reads until the server closes (or 10 s pass: then closed=false).
	readAll := func(c net.Conn) (string, bool) {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(c)
		return string(b), err == nil || !isTimeout(err)
	}
	// Two slow clients: each sends half a request line and stops.
	slow := []net.Conn{dial(), dial()}
	for _, c := range slow {
		if _, err := c.Write([]byte("GET /healthz HT")); err != nil {
			t.Fatal(err)
		}
	}
	// Wait until both hold a slot: a third connection is refused with 503 (retry until both were accepted).
	var busy string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		c := dial()
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		out, closed := readAll(c)
		if !closed {
			t.Fatal("third connection neither answered nor closed")
		}
		if strings.HasPrefix(out, "HTTP/1.1 503") {
			busy = out
			break
		}
	}
	if !strings.Contains(busy, `"code":"busy"`) {
		t.Fatalf("no 503 busy beyond the connection limit (last answer %q)", busy)
	}
	// The slow clients are cut off by the header timeout, which frees their slots.
	for i, c := range slow {
		if _, closed := readAll(c); !closed {
			t.Fatalf("slow client %d not closed by the header timeout", i)
		}
	}
	var resp *http.Response
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err = http.Get("http://" + addr + "/healthz")
		if err == nil && resp.StatusCode == http.StatusOK {
			break
		}
		if err == nil {
			resp.Body.Close()
		}
	}
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("after the slow clients were closed: %v %v", resp, err)
	}
	resp.Body.Close()
	if m := scrape(t, ts.Server); !strings.Contains(m, `kvshm_connections_rejected_total{reason="http_busy"}`) {
		t.Fatal("http_busy rejections not counted")
	}
}
