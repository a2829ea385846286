package tracecheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kvshm/kvshm/index"
)

const tracesDir = "../traces"

func readTrace(t *testing.T, path string) *Trace {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr, err := Read(f)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return tr
}

func tracePaths(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(tracesDir, "*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatalf("no traces in %s", tracesDir)
	}
	return paths
}

// documentedDeviations reads the ids of conformance/README.md's deviation table (rows "| D<n> | ...").
func documentedDeviations(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range regexp.MustCompile(`(?m)^\| (D[0-9]+) \|`).FindAllSubmatch(b, -1) {
		ids = append(ids, string(m[1]))
	}
	if len(ids) == 0 {
		t.Fatal("conformance/README.md has no deviation table rows")
	}
	return ids
}

// TestTraces replays every recorded trace through kvshm's index: every answer must be identical to Dynamo's,
// rebuild the same state, or fall under a deviation the trace marks and the README documents.
func TestTraces(t *testing.T) {
	documented := documentedDeviations(t)
	for _, path := range tracePaths(t) {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".jsonl"), func(t *testing.T) {
			tr := readTrace(t, path)
			for id := range tr.Header.Deviations {
				if !slices.Contains(documented, id) {
					t.Errorf("%s marks deviation %s, which conformance/README.md does not document", path, id)
				}
			}
			results, err := Check(context.Background(), tr)
			if err != nil {
				t.Fatal(err)
			}
			counts := map[Outcome]int{}
			fails := 0
			for _, r := range results {
				counts[r.Outcome]++
				if r.Outcome == Fail {
					fails++
					if fails <= 8 {
						t.Errorf("%s:%d query(start=%s, end=%s): %s", path, r.Line, opt(r.Start), opt(r.End), r.Detail)
					}
				}
			}
			if fails > 8 {
				t.Errorf("%s: %d more failures", path, fails-8)
			}
			t.Logf("%s: %v", tr.Header.Name, counts)
		})
	}
}

func opt(p *uint64) string {
	if p == nil {
		return "None"
	}
	return fmt.Sprint(*p)
}

// TestCheckCatchesTampering proves the check can fail: a recorded answer changed in a way that changes the
// rebuilt state (one tokens hash of a TreeDump, an Events answer's watermark) must be a Fail.
func TestCheckCatchesTampering(t *testing.T) {
	tr := readTrace(t, filepath.Join(tracesDir, "basic.jsonl"))
	tr.Header.Deviations = nil
	tampered := 0
	for i := range tr.Ops {
		op := &tr.Ops[i]
		if op.Kind != "query" {
			continue
		}
		a := op.Answer
		switch {
		case bytes.HasPrefix(a, []byte(`{"TreeDump"`)) && bytes.Contains(a, []byte(`"tokens_hash":`)):
			op.Answer = tamperTokensHash(a)
		case bytes.HasPrefix(a, []byte(`{"Events"`)):
			op.Answer = bytes.Replace(a, []byte(`"last_event_id":`), []byte(`"last_event_id":9`), 1)
		default:
			continue
		}
		tampered++
	}
	if tampered == 0 {
		t.Fatal("basic.jsonl has no Events or TreeDump answer to tamper with")
	}
	results, err := Check(context.Background(), tr)
	if err != nil {
		t.Fatal(err)
	}
	fails := 0
	for _, r := range results {
		if r.Outcome == Fail {
			fails++
		}
	}
	if fails != tampered {
		t.Errorf("tampered with %d answers, %d failed", tampered, fails)
	}
}

// tamperTokensHash sets the first tokens_hash of an answer to 1 (a block at another place in the tree).
func tamperTokensHash(a []byte) []byte {
	loc := regexp.MustCompile(`"tokens_hash":[0-9]+`).FindIndex(a)
	return slices.Concat(a[:loc[0]], []byte(`"tokens_hash":1`), a[loc[1]:])
}

// TestDeviationKeepsWatermarks: a deviation mark does not excuse an answer that moves the consumer's watermark.
func TestDeviationKeepsWatermarks(t *testing.T) {
	tr := readTrace(t, filepath.Join(tracesDir, "basic.jsonl"))
	tr.Header.Deviations = map[string]int{"D1": 0}
	var events, dumps int
	for i := range tr.Ops {
		op := &tr.Ops[i]
		switch {
		case op.Kind != "query":
		case bytes.HasPrefix(op.Answer, []byte(`{"Events"`)):
			op.Answer = bytes.Replace(op.Answer, []byte(`"last_event_id":`), []byte(`"last_event_id":9`), 1)
			events++
		case bytes.HasPrefix(op.Answer, []byte(`{"TreeDump"`)) && bytes.Contains(op.Answer, []byte(`"tokens_hash":`)):
			op.Answer = tamperTokensHash(op.Answer)
			dumps++
		}
	}
	results, err := Check(context.Background(), tr)
	if err != nil {
		t.Fatal(err)
	}
	got := map[Outcome]int{}
	for _, r := range results {
		got[r.Outcome]++
	}
	if got[Fail] != events || got["D1"] != dumps {
		t.Errorf("%d Events answers with a moved watermark and %d dumps with changed content: got %v", events, dumps, got)
	}
}

func u64(v uint64) *uint64 { return &v }

func stored(dp uint32, parent *uint64, blocks ...uint64) RouterEvent {
	ev := RouterEvent{DpRank: dp, Kind: index.KindStored, Parent: parent}
	for i := 0; i+1 < len(blocks); i += 2 {
		ev.Blocks = append(ev.Blocks, Block{BlockHash: blocks[i], TokensHash: blocks[i+1]})
	}
	return ev
}

// TestModel pins the consumer model's rules on small tables.
func TestModel(t *testing.T) {
	cases := []struct {
		name   string
		live   []RouterEvent
		answer *Answer
		rank   uint32
		want   string
	}{
		{
			name: "chain under a parent",
			live: []RouterEvent{stored(0, nil, 101, 1), stored(0, u64(101), 102, 2, 103, 3)},
			want: "rank 0 watermark 0(false): [1]=101 [1 2]=102 [1 2 3]=103\n",
		},
		{
			name: "missing parent skips the whole store",
			live: []RouterEvent{stored(0, nil, 101, 1), stored(0, u64(999), 102, 2)},
			want: "rank 0 watermark 0(false): [1]=101\n",
		},
		{
			// The stale-block-hash decision: store 101; 102 (parent 101, T); remove 102; 103 (parent 101, T): 103 resolves.
			name: "stale hash: the new hash takes the path",
			live: []RouterEvent{
				stored(0, nil, 101, 1), stored(0, u64(101), 102, 7),
				{Kind: index.KindRemoved, Hashes: []uint64{102}}, stored(0, u64(101), 103, 7),
			},
			want: "rank 0 watermark 0(false): [1]=101 [1 7]=103\n",
		},
		{
			name: "cleared drops only its rank",
			live: []RouterEvent{stored(0, nil, 101, 1), stored(1, nil, 201, 1), {DpRank: 1, Kind: index.KindCleared}},
			want: "rank 0 watermark 0(false): [1]=101\n",
		},
		{
			name:   "a TreeDump resets the rank first",
			live:   []RouterEvent{stored(0, nil, 101, 1)},
			answer: &Answer{Variant: "TreeDump", LastEventID: 9, Events: []RouterEvent{stored(0, nil, 301, 3)}},
			want:   "rank 0 watermark 9(true): [3]=301\n",
		},
		{
			name:   "Events apply on top",
			live:   []RouterEvent{stored(0, nil, 101, 1)},
			answer: &Answer{Variant: "Events", LastEventID: 4, Events: []RouterEvent{stored(0, u64(101), 102, 2)}},
			want:   "rank 0 watermark 4(true): [1]=101 [1 2]=102\n",
		},
		{
			name:   "Error changes nothing",
			live:   []RouterEvent{stored(0, nil, 101, 1)},
			answer: &Answer{Variant: "Error"},
			want:   "rank 0 watermark 0(false): [1]=101\n",
		},
		{
			name:   "split: another rank's events are not this rank's",
			answer: &Answer{Variant: "TreeDump", LastEventID: 2, Events: []RouterEvent{stored(1, nil, 201, 1), stored(0, nil, 101, 1)}},
			want:   "rank 0 watermark 2(true): [1]=101\n",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := NewModel()
			for _, ev := range c.live {
				m.Apply(ev.DpRank, ev)
			}
			if c.answer != nil {
				m.Recover(c.rank, SplitRank(*c.answer, c.rank))
			}
			if got := m.State(); got != c.want {
				t.Errorf("state:\n got  %q\n want %q", got, c.want)
			}
		})
	}
}

func TestParseAnswer(t *testing.T) {
	cases := []struct {
		in      string
		variant string
		n       int
		err     bool
	}{
		{`{"Events":{"events":[{"worker_id":1,"event":{"event_id":3,"data":"cleared","dp_rank":2}}],"last_event_id":3}}`, "Events", 1, false},
		{`{"TreeDump":{"events":[{"worker_id":1,"storage_tier":"device","event":{"event_id":0,"data":{"stored":{"parent_hash":null,"start_position":null,"blocks":[{"block_hash":5,"tokens_hash":6,"mm_extra_info":null}]}},"dp_rank":0}}],"last_event_id":9,"reset_scope":"all"}}`, "TreeDump", 1, false},
		{`{"Events":{"events":[{"event":{"event_id":3,"data":{"removed":{"block_hashes":[1,2]}},"dp_rank":0}}],"last_event_id":3}}`, "Events", 1, false},
		{`{"TooNew":{"requested_start":5,"requested_end":5,"newest_available":4}}`, "TooNew", 0, false},
		{`{"Error":"x"}`, "Error", 0, false},
		{`{"Events":{"events":[]}}`, "", 0, true},
		{`{"Events":{"events":[{"event":{"data":{"bogus":1}}}],"last_event_id":1}}`, "", 0, true},
		{`[]`, "", 0, true},
		{`{"A":1,"B":2}`, "", 0, true},
	}
	for _, c := range cases {
		a, err := ParseAnswer([]byte(c.in))
		if (err != nil) != c.err || (err == nil && (a.Variant != c.variant || len(a.Events) != c.n)) {
			t.Errorf("ParseAnswer(%s) = %+v, %v", c.in, a, err)
		}
		if err != nil && !errors.Is(err, ErrAnswer) {
			t.Errorf("ParseAnswer(%s): error %v does not wrap ErrAnswer", c.in, err)
		}
	}
}

func TestReadRejects(t *testing.T) {
	cases := map[string]string{
		"empty":          "",
		"zero block":     `{"trace":"x","worker_id":1,"block_size":0,"max_buffer_size":1}`,
		"unknown op":     `{"trace":"x","worker_id":1,"block_size":4,"max_buffer_size":1}` + "\n" + `{"op":"bogus"}`,
		"unknown field":  `{"trace":"x","worker_id":1,"block_size":4,"max_buffer_size":1}` + "\n" + `{"op":"cleared","seq":1,"x":2}`,
		"no answer":      `{"trace":"x","worker_id":1,"block_size":4,"max_buffer_size":1}` + "\n" + `{"op":"query","start":null,"end":null}`,
		"trailing bytes": `{"trace":"x","worker_id":1,"block_size":4,"max_buffer_size":1}` + "\n" + `{"op":"cleared","seq":1} 5`,
	}
	for name, in := range cases {
		if _, err := Read(strings.NewReader(in)); !errors.Is(err, ErrTrace) {
			t.Errorf("%s: Read = %v, want ErrTrace", name, err)
		}
	}
}

func FuzzRead(f *testing.F) {
	f.Add([]byte(`{"trace":"x","worker_id":1,"block_size":4,"max_buffer_size":1}` + "\n" + `{"op":"stored","seq":0,"dp_rank":0,"tokens":[1,2,3,4],"hashes":[9],"parent":null,"lora_name":null,"is_eagle":null}` + "\n" + `{"op":"query","start":0,"end":null,"answer":{"Error":"x"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<16 {
			return
		}
		tr, err := Read(bytes.NewReader(b))
		if err != nil || tr.Header.MaxBufferSize > 1<<12 || len(tr.Ops) > 256 {
			return
		}
		_, _ = Check(context.Background(), tr) // must not panic on any trace that parses
	})
}

func FuzzParseAnswer(f *testing.F) {
	f.Add([]byte(`{"Events":{"events":[{"event":{"event_id":3,"data":"cleared","dp_rank":2}}],"last_event_id":3}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseAnswer(b)
		if err == nil {
			m := NewModel()
			m.Recover(0, SplitRank(a, 0))
			_ = m.State()
		}
	})
}
