package sock

import (
	"strings"
	"testing"
)

// TestDecodeStrict pins the request-body rules (a defect the soak found: encoding/json alone matched keys without
// case, took null as {} and kept the last of duplicate keys).
func TestDecodeStrictKeys(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	cases := []struct {
		body    string
		want    EventsRequest
		wantErr string // "" = accepted
	}{
		{``, EventsRequest{}, ""},
		{`  `, EventsRequest{}, ""},
		{`{}`, EventsRequest{}, ""},
		{`{"start":1,"end":5}`, EventsRequest{Start: u(1), End: u(5)}, ""},
		{`{"worker_id":7,"start":null}`, EventsRequest{WorkerID: u(7)}, ""},
		{`{"START":1}`, EventsRequest{}, `unknown field "START"`},
		{`{"Start":1}`, EventsRequest{}, `unknown field "Start"`},
		{`{"start":1,"start":2}`, EventsRequest{}, `duplicate field "start"`},
		{`null`, EventsRequest{}, "want a JSON object"},
		{`[]`, EventsRequest{}, "want a JSON object"},
		{`1`, EventsRequest{}, "want a JSON object"},
		{`{"start":1}{}`, EventsRequest{}, "trailing data"},
		{`{"start":"1"}`, EventsRequest{}, "cannot unmarshal"},
		{`{"start":-1}`, EventsRequest{}, "cannot unmarshal"},
		{`{"bogus":{"start":1}}`, EventsRequest{}, `unknown field "bogus"`},
		{`{"start":1`, EventsRequest{}, "invalid JSON body"},
	}
	for _, c := range cases {
		t.Run(c.body, func(t *testing.T) {
			var got EventsRequest
			err := DecodeStrict([]byte(c.body), &got)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("DecodeStrict(%s) = %v, want an error containing %q", c.body, err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeStrict(%s) = %v, want nil", c.body, err)
			}
			if !eqU(got.WorkerID, c.want.WorkerID) || !eqU(got.Start, c.want.Start) || !eqU(got.End, c.want.End) {
				t.Fatalf("DecodeStrict(%s) = %+v, want %+v", c.body, got, c.want)
			}
		})
	}
}

// TestDecodeStrictNested: the rules hold inside ATTACH's publish object too.
func TestDecodeStrictNested(t *testing.T) {
	for _, c := range []struct{ body, wantErr string }{
		{`{"publish":{"endpoint":"tcp://*:1","replay_endpoint":null,"topic":"","hwm":1,"buffer_steps":2}}`, ""},
		{`{"publish":null}`, ""},
		{`{"publish":{"Endpoint":"x"}}`, `publish: unknown field "Endpoint"`},
		{`{"publish":{"endpoint":"x","endpoint":"y"}}`, `publish: duplicate field "endpoint"`},
		{`{"publish":{"endpoint":"x","bogus":1}}`, `publish: unknown field "bogus"`},
		{`{"publish":{"hwm":"1"}}`, "cannot unmarshal"},
		{`{"publish":[]}`, "want a JSON object"},
	} {
		var got AttachRequest
		err := DecodeStrict([]byte(c.body), &got)
		if c.wantErr == "" {
			if err != nil {
				t.Errorf("DecodeStrict(%s) = %v, want nil", c.body, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("DecodeStrict(%s) = %v, want an error containing %q", c.body, err, c.wantErr)
		}
	}
}

func eqU(a, b *uint64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// FuzzDecodeStrict: no panic on any body, and an accepted body re-decodes the same way.
func FuzzDecodeStrictKeys(f *testing.F) {
	for _, s := range []string{`{}`, `{"start":1,"end":2}`, `{"START":1}`, `null`, `{"start":1,"start":1}`, `[`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) > 1<<12 {
			return
		}
		var a, b EventsRequest
		if DecodeStrict(body, &a) != nil {
			return
		}
		if err := DecodeStrict(body, &b); err != nil || !eqU(a.Start, b.Start) || !eqU(a.End, b.End) {
			t.Fatalf("accepted body %q decodes differently the second time: %v", body, err)
		}
	})
}
