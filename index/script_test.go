package index

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// The data-driven scripts in testdata/*.txt (github.com/cockroachdb/datadriven, as pebble's): blocks of
//
//	# comments
//	command key=value ...
//	[input lines]
//	----
//	expected output
//
// separated by blank lines. `go test ./index -run TestScripts -rewrite` rewrites the expected output.
//
// Commands:
//
//	new worker=W bs=B max=M [onloss=error] [shape=blocks]   a fresh index (default best-effort, chains)
//	stored id=I [dp=D] [parent=P] blocks=H,H:T,...   block hash H, tokens hash T (default H+1000000)
//	stored-range from=A to=B              one Stored root block per id (block hash = id)
//	removed id=I [dp=D] hashes=H,...
//	cleared id=I [dp=D]
//	lost first=A last=B                   MarkLost; the input, if any, is the reason
//	unknown                               MarkUnknownHistory; the input, if any, is the reason
//	recover [start=S] [end=E] [rank=R]    prints the decoded response (RecoverRank with rank); an incomplete
//	                                      answer ends with "incomplete lost=A-B,unknown-N,..."
//	json [start=S] [end=E] [rank=R]       prints the raw response JSON
//	match hashes=H,...                    FindMatches (tokens hashes, early exit off)
//	tree                                  a fresh BFS dump, bypassing the cache and the counters
//	stats                                 log, taint and dump-cache counters
//	concurrent-dumps n=N                  N dumps at once while the first build is held; all must agree
//	dump-during-build                     a dump whose build runs the input (a command line) after its snapshot

func TestScripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			var ix *Indexer
			datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
				return execScript(t, &ix, d.Cmd, scriptArgs(d.CmdArgs), d.Input)
			})
		})
	}
}

// scriptArgs maps a command's arguments to their values (a list stays one comma-separated value).
func scriptArgs(args []datadriven.CmdArg) map[string]string {
	m := map[string]string{}
	for _, a := range args {
		m[a.Key] = strings.Join(a.Vals, ",")
	}
	return m
}

func argU64(t *testing.T, m map[string]string, k string) (uint64, bool) {
	v, ok := m[k]
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("argument %s=%q: %v", k, v, err)
	}
	return n, true
}

func argList(t *testing.T, m map[string]string, k string) []uint64 {
	var out []uint64
	if m[k] == "" {
		return nil
	}
	for _, s := range strings.Split(m[k], ",") {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("argument %s: %v", k, err)
		}
		out = append(out, n)
	}
	return out
}

func applyOut(res ApplyResult, err error) string {
	s := res.Status.String()
	if res.Gap {
		s += " gap"
	}
	if res.IDReset {
		s += " id-reset"
	}
	if err != nil && res.Status == StatusOK {
		s = "error: " + err.Error()
	}
	return s
}

func execScript(t *testing.T, ixp **Indexer, cmd string, m map[string]string, input string) string {
	t.Helper()
	if cmd == "dump-during-build" {
		return dumpDuringBuild(t, ixp, input)
	}
	m["reason"] = input
	ix := *ixp
	ctx := context.Background()
	id, _ := argU64(t, m, "id")
	dp64, _ := argU64(t, m, "dp")
	dp := uint32(dp64)
	switch cmd {
	case "new":
		w, _ := argU64(t, m, "worker")
		bs, _ := argU64(t, m, "bs")
		mx, _ := argU64(t, m, "max")
		cfg := Config{WorkerID: w, BlockSize: uint32(bs), MaxBufferSize: int(mx)}
		switch m["onloss"] {
		case "", "best-effort":
		case "error":
			cfg.OnLoss = LossError
		default:
			t.Fatalf("onloss=%s", m["onloss"])
		}
		switch m["shape"] {
		case "", "chains":
		case "blocks":
			cfg.DumpShape = DumpBlocks
		default:
			t.Fatalf("shape=%s", m["shape"])
		}
		nix, err := New(cfg)
		if err != nil {
			return "error: " + err.Error()
		}
		*ixp = nix
		return "ok"
	case "stored":
		parent, hasParent := argU64(t, m, "parent")
		var blocks []Block
		if m["blocks"] != "" {
			for _, f := range strings.Split(m["blocks"], ",") {
				bh, th, ok := strings.Cut(f, ":")
				b := Block{BlockHash: mustU64(t, bh)}
				b.TokensHash = b.BlockHash + 1000000
				if ok {
					b.TokensHash = mustU64(t, th)
				}
				blocks = append(blocks, b)
			}
		}
		return applyOut(ix.Apply(&Event{ID: id, DpRank: dp, Kind: KindStored, HasParent: hasParent, Parent: parent, Blocks: blocks}))
	case "stored-range":
		from, _ := argU64(t, m, "from")
		to, _ := argU64(t, m, "to")
		var outs []string
		for i := from; i <= to; i++ {
			outs = append(outs, applyOut(ix.Apply(&Event{ID: i, Kind: KindStored, Blocks: []Block{{i, i + 1000000}}})))
		}
		return strings.Join(dedupe(outs), ",")
	case "removed":
		return applyOut(ix.Apply(&Event{ID: id, DpRank: dp, Kind: KindRemoved, Hashes: argList(t, m, "hashes")}))
	case "cleared":
		return applyOut(ix.Apply(&Event{ID: id, DpRank: dp, Kind: KindCleared}))
	case "lost":
		a, _ := argU64(t, m, "first")
		b, _ := argU64(t, m, "last")
		ix.MarkLost(a, b, orDefault(m["reason"], "ring full"))
		return "ok"
	case "unknown":
		ix.MarkUnknownHistory(orDefault(m["reason"], "daemon restarted"))
		return "ok"
	case "recover", "json":
		var start, end *uint64
		if v, ok := argU64(t, m, "start"); ok {
			start = &v
		}
		if v, ok := argU64(t, m, "end"); ok {
			end = &v
		}
		var r Response
		var err error
		if rank, ok := argU64(t, m, "rank"); ok {
			r, err = ix.RecoverRank(ctx, start, end, uint32(rank))
		} else {
			r, err = ix.Recover(ctx, start, end)
		}
		if err != nil {
			return "error: " + err.Error()
		}
		if cmd == "json" {
			return string(r.JSON)
		}
		return describeResponse(t, r)
	case "tree":
		snap, msg := ix.buildDump(rankFilter{})
		if msg != "" {
			return "Error: " + msg
		}
		ix.dumpBuilds.Add(^uint64(0)) // not a recovery build
		return describeResponse(t, snap.response(false))
	case "match":
		var out []string
		for _, s := range ix.FindMatches(argList(t, m, "hashes"), false) {
			out = append(out, fmt.Sprintf("dp%d=%d", s.DpRank, s.Blocks))
		}
		return "scores: " + strings.Join(out, " ")
	case "stats":
		st := ix.Stats()
		if st.Incomplete != st.Tainted {
			t.Fatalf("Stats.Incomplete %v, Tainted %v", st.Incomplete, st.Tainted)
		}
		return fmt.Sprintf("buffered=%d first=%d last=%d resident=%d nodes=%d tainted=%v gaps=%d resets=%d lost_ids=%d builds=%d hits=%d extends=%d dump_errors=%d",
			st.Buffered, st.FirstEventID, st.LastEventID, st.ResidentBlocks, st.Nodes, st.Tainted, st.Gaps, st.IDResets,
			st.LostIDs, st.DumpBuilds, st.DumpCacheHits, st.DumpCacheExtends, st.DumpErrors)
	case "concurrent-dumps":
		n, _ := argU64(t, m, "n")
		return concurrentDumps(t, ix, int(n))
	}
	t.Fatalf("unknown command %q", cmd)
	return ""
}

func mustU64(t *testing.T, s string) uint64 {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("number %q: %v", s, err)
	}
	return n
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func dedupe(s []string) []string {
	var out []string
	for _, x := range s {
		if len(out) == 0 || out[len(out)-1] != x {
			out = append(out, x)
		}
	}
	return out
}

// describeResponse decodes r.JSON with encoding/json (so every script also checks the JSON) and prints it.
func describeResponse(t *testing.T, r Response) string {
	t.Helper()
	out := describeJSON(t, r)
	if r.Incomplete != (len(r.Lost) > 0) {
		t.Fatalf("Incomplete %v with lost ranges %v", r.Incomplete, r.Lost)
	}
	if r.Incomplete {
		var ls []string
		for _, l := range r.Lost {
			switch {
			case l.Unknown:
				ls = append(ls, fmt.Sprintf("unknown-%d", l.First))
			case l.First == l.Last:
				ls = append(ls, fmt.Sprint(l.First))
			default:
				ls = append(ls, fmt.Sprintf("%d-%d", l.First, l.Last))
			}
		}
		out += " incomplete lost=" + strings.Join(ls, ",")
	}
	return out
}

func describeJSON(t *testing.T, r Response) string {
	t.Helper()
	kind, v, err := decodeResponse(r.JSON)
	if err != nil {
		t.Fatalf("decode %s: %v", r.JSON, err)
	}
	if kind != r.Kind {
		t.Fatalf("JSON variant %v, Response.Kind %v", kind, r.Kind)
	}
	switch kind {
	case RespEvents, RespTreeDump:
		l := v.(jsEventList)
		if l.LastEventID != r.LastEventID || len(l.Events) != r.NumEvents {
			t.Fatalf("JSON last %d n %d, Response last %d n %d", l.LastEventID, len(l.Events), r.LastEventID, r.NumEvents)
		}
		var parts []string
		for _, e := range l.Events {
			_, ev, err := decodeRouterEvent(mustMarshal(t, e))
			if err != nil {
				t.Fatal(err)
			}
			parts = append(parts, describeEvent(ev))
		}
		hit := ""
		if r.CacheHit {
			hit = " (cached)"
		}
		out := fmt.Sprintf("%s last=%d n=%d%s", kind, l.LastEventID, len(l.Events), hit)
		if len(parts) > 0 {
			out += ": " + strings.Join(parts, " ")
		}
		return out
	case RespTooNew:
		x := v.(jsTooNew)
		return fmt.Sprintf("TooNew start=%d end=%d newest=%d", *x.RequestedStart, *x.RequestedEnd, x.NewestAvail)
	case RespInvalidRange:
		x := v.(jsInvalidRange)
		return fmt.Sprintf("InvalidRange start=%d end=%d", x.StartID, x.EndID)
	}
	return fmt.Sprintf("Error: %s", v.(string))
}

func describeEvent(ev Event) string {
	switch ev.Kind {
	case KindStored:
		var hs []string
		for _, b := range ev.Blocks {
			hs = append(hs, strconv.FormatUint(b.BlockHash, 10))
		}
		p := "-"
		if ev.HasParent {
			p = strconv.FormatUint(ev.Parent, 10)
		}
		dp := ""
		if ev.DpRank != 0 {
			dp = fmt.Sprintf("@%d", ev.DpRank)
		}
		return fmt.Sprintf("%d:S%s(%s>%s)", ev.ID, dp, p, strings.Join(hs, ","))
	case KindRemoved:
		var hs []string
		for _, h := range ev.Hashes {
			hs = append(hs, strconv.FormatUint(h, 10))
		}
		return fmt.Sprintf("%d:R(%s)", ev.ID, strings.Join(hs, ","))
	}
	return fmt.Sprintf("%d:C", ev.ID)
}

func mustMarshal(t *testing.T, e jsRouterEvent) []byte {
	t.Helper()
	b, err := jsonMarshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// concurrentDumps runs n dumps at once: the first build is held until the other n-1 callers wait for it.
func concurrentDumps(t *testing.T, ix *Indexer, n int) string {
	t.Helper()
	release := make(chan struct{})
	held := make(chan struct{})
	ix.testBuildHook = func() {
		close(held)
		<-release
	}
	results := make([]Response, n)
	var wg sync.WaitGroup
	first := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(first)
		results[0], _ = ix.Recover(context.Background(), nil, nil)
	}()
	select {
	case <-held:
	case <-first:
		ix.testBuildHook = nil
		return "no build (answered from the cache): " + describeResponse(t, results[0])
	}
	ix.testBuildHook = nil
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], _ = ix.Recover(context.Background(), nil, nil)
		}()
	}
	for ix.waiters.Load() != int64(n-1) {
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	for i := 1; i < n; i++ {
		if string(results[i].JSON) != string(results[0].JSON) {
			t.Fatalf("concurrent dump %d differs from dump 0", i)
		}
	}
	return fmt.Sprintf("%d dumps agree: %s", n, describeResponse(t, results[0]))
}

// dumpDuringBuild runs a dump whose build executes the command line rest after its tree snapshot.
func dumpDuringBuild(t *testing.T, ixp **Indexer, rest string) string {
	ix := *ixp
	cmd, args, err := datadriven.ParseLine(rest)
	if err != nil {
		t.Fatalf("dump-during-build: %v", err)
	}
	var inner string
	ix.testBuildHook = func() {
		ix.testBuildHook = nil // a rebuild runs without the hook
		inner = execScript(t, ixp, cmd, scriptArgs(args), "")
	}
	r, err := ix.Recover(context.Background(), nil, nil)
	ix.testBuildHook = nil
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("during build: %s\n%s", inner, describeResponse(t, r))
}
