package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/kvshm/kvshm/proto/sock"
)

// optRank is a flag.Value for an optional u32 dp_rank.
type optRank struct{ v *uint32 }

func (o *optRank) String() string {
	if o.v == nil {
		return ""
	}
	return strconv.FormatUint(uint64(*o.v), 10)
}

func (o *optRank) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return fmt.Errorf("want an unsigned 32-bit integer")
	}
	r := uint32(n)
	o.v = &r
	return nil
}

// optUint is a flag.Value for an optional u64.
type optUint struct{ v *uint64 }

func (o *optUint) String() string {
	if o.v == nil {
		return ""
	}
	return strconv.FormatUint(*o.v, 10)
}

func (o *optUint) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return fmt.Errorf("want an unsigned integer")
	}
	o.v = &n
	return nil
}

func query(cmd string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvshmd "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", envOr(sock.DefaultSocketPath(), "KVSHMD_SOCKET", "KVSHM_SOCKET"), "daemon socket (env KVSHMD_SOCKET, KVSHM_SOCKET)")
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	var worker, start, end optUint
	var rank optRank
	if cmd != "health" {
		help := "worker_id (default: the only stream)"
		rhelp := "dp_rank: the per-rank stream of that rank, else the rank's view of the worker's ALL stream"
		switch cmd {
		case "forget":
			help = "worker_id of the stream to drop (required)"
			rhelp = "dp_rank of the per-rank stream to drop (default: the worker's ALL stream, or its only stream)"
		case "stats":
			rhelp = "dp_rank: for each worker its stream of that rank, else its ALL stream"
		}
		fs.Var(&worker, "worker", help)
		fs.Var(&rank, "dp-rank", rhelp)
	}
	if cmd == "events" {
		fs.Var(&start, "start", "first event id (inclusive; omit for a dump)")
		fs.Var(&end, "end", "last event id (inclusive)")
	}
	var tokens, lora *string
	var eagle *bool
	if cmd == "match" {
		tokens = fs.String("tokens", "", "comma-separated token ids (required)")
		lora = fs.String("lora", "", "LoRA adapter name (default: base model)")
		eagle = fs.Bool("eagle", false, "Eagle windows (block_size+1 tokens)")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "kvshmd %s: unexpected argument %q\n", cmd, fs.Arg(0))
		return exitUsage
	}
	if cmd == "forget" && worker.v == nil {
		fmt.Fprintln(stderr, "kvshmd forget: --worker is required (list the streams with `kvshmd stats`)")
		return exitUsage
	}
	var toks []uint32
	if cmd == "match" {
		if *tokens == "" {
			fmt.Fprintln(stderr, "kvshmd match: --tokens is required (e.g. --tokens 1,2,3)")
			return exitUsage
		}
		for _, f := range strings.Split(*tokens, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32)
			if err != nil {
				fmt.Fprintf(stderr, "kvshmd match: token %q is not a u32\n", f)
				return exitUsage
			}
			toks = append(toks, uint32(n))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	c, err := sock.Dial(ctx, *socket)
	if err != nil {
		fmt.Fprintf(stderr, "kvshmd %s: cannot reach the daemon: %v\n  is `kvshmd serve` running? point --socket (or KVSHMD_SOCKET) at its socket\n", cmd, err)
		return exitUnreachable
	}
	defer c.Close()
	var out []byte
	switch cmd {
	case "health":
		var r sock.HealthReply
		if r, err = c.Health(ctx); err == nil {
			out, err = json.MarshalIndent(r, "", "  ")
		}
	case "stats":
		var r sock.StatsReply
		if r, err = c.StatsOf(ctx, sock.WorkerRequest{WorkerID: worker.v, DpRank: rank.v}); err == nil {
			out, err = json.MarshalIndent(r, "", "  ")
		}
	case "events":
		out, err = c.EventsOf(ctx, sock.EventsRequest{WorkerID: worker.v, Start: start.v, End: end.v, DpRank: rank.v})
	case "dump":
		out, err = c.DumpOf(ctx, sock.WorkerRequest{WorkerID: worker.v, DpRank: rank.v})
	case "forget":
		if err = c.ForgetStream(ctx, sock.WorkerRequest{WorkerID: worker.v, DpRank: rank.v}); err == nil {
			out = []byte("{}")
		}
	case "match":
		req := sock.MatchRequest{WorkerID: worker.v, Tokens: toks, IsEagle: *eagle, DpRank: rank.v}
		if *lora != "" {
			req.LoraName = lora
		}
		var r sock.MatchReply
		if r, err = c.Match(ctx, req); err == nil {
			out, err = json.MarshalIndent(r, "", "  ")
		}
	}
	if err != nil {
		var re *sock.RemoteError
		if errors.As(err, &re) {
			fmt.Fprintf(stderr, "kvshmd %s: the daemon refused: %s (code %s)\n", cmd, re.Message, re.Code)
			if cmd == "forget" && re.Code == sock.CodeConflict {
				fmt.Fprintf(stderr, "  a producer is attached to that worker: stop it (or let it exit) first\n")
			} else if re.Code == sock.CodeConflict || re.Code == sock.CodeNotFound {
				fmt.Fprintf(stderr, "  list the streams with `kvshmd stats` and pick one with --worker (and --dp-rank for a per-rank stream)\n")
			}
			return exitFailure
		}
		fmt.Fprintf(stderr, "kvshmd %s: %v\n", cmd, err)
		return exitUnreachable
	}
	_, _ = stdout.Write(append(out, '\n'))
	return exitOK
}
