package daemon

import (
	"net/url"
	"strconv"
	"testing"
)

func TestParseRecoverQuery(t *testing.T) {
	tests := []struct {
		raw                string
		worker, start, end string // "" = absent
		ok                 bool
	}{
		{"", "", "", "", true},
		{"start=&end=", "", "", "", true},
		{"start=5&end=9", "", "5", "9", true},
		{"end=9&start=5&worker_id=18446744073709551615", "18446744073709551615", "5", "9", true},
		{"start=0", "", "0", "", true},
		{"start=18446744073709551616", "", "", "", false},
		{"start=-1", "", "", "", false},
		{"start=+1", "", "", "", false},
		{"start=1.0", "", "", "", false},
		{"start=%201", "", "", "", false},
		{"start=0x10", "", "", "", false},
		{"start=1&start=1", "", "", "", false},
		{"begin=1", "", "", "", false},
		{"start=%zz", "", "", "", false},
		{"start=1;end=2", "", "", "", false},
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
	}
}

// FuzzParseRecoverQuery: no panic; an accepted query re-encodes to an equivalent one.
func FuzzParseRecoverQuery(f *testing.F) {
	for _, s := range []string{"", "start=&end=", "start=5&end=9&worker_id=1", "start=-1", "x=1", "start=1&start=2", "%zz"} {
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
		q2, err := ParseRecoverQuery(v.Encode())
		if err != nil {
			t.Fatalf("re-encoded query %q rejected: %v", v.Encode(), err)
		}
		eq := func(a, b *uint64) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }
		if !eq(q.Start, q2.Start) || !eq(q.End, q2.End) || !eq(q.WorkerID, q2.WorkerID) {
			t.Fatalf("round trip of %q changed the query", raw)
		}
	})
}
