package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/kvshm/kvshm/shm"
)

func inspect(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvshmd inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: kvshmd inspect [--json] RINGFILE")
		return exitUsage
	}
	h, st, err := shm.Inspect(fs.Arg(0))
	if err != nil && h.Capacity == 0 {
		fmt.Fprintf(stderr, "kvshmd inspect: %v\n", err)
		return exitFailure
	}
	if *asJSON {
		b, _ := json.MarshalIndent(struct {
			Header shm.Header    `json:"header"`
			Stats  shm.RingStats `json:"stats"`
			Error  string        `json:"error,omitempty"`
		}{h, st, errString(err)}, "", "  ")
		fmt.Fprintln(stdout, string(b))
	} else {
		alive := "no"
		if h.ProducerPID != 0 && syscall.Kill(int(h.ProducerPID), 0) == nil {
			alive = "yes (pid exists)"
		}
		fill := 0.0
		if st.Capacity > 0 {
			fill = 100 * float64(st.Used) / float64(st.Capacity)
		}
		fmt.Fprintf(stdout, "ring           %s\nversion        %d\nstate          %s\nworker_id      %d\nkv_block_size  %d\nmax_buffer     %d\n",
			fs.Arg(0), h.Version, h.State, h.WorkerID, h.KVBlockSize, h.MaxBufferSize)
		fmt.Fprintf(stdout, "epoch          %d (%s)\nproducer_pid   %d alive=%s\ncapacity       %d bytes, max_record %d\n",
			h.Epoch, time.Unix(0, int64(h.Epoch)).UTC().Format(time.RFC3339Nano), h.ProducerPID, alive, h.Capacity, h.MaxRecord)
		fmt.Fprintf(stdout, "head           %d\ntail           %d\nused           %d bytes (%.1f%%)\ndropped        %d events, %d bytes\n",
			st.Head, st.Tail, st.Used, fill, st.DroppedEvents, st.DroppedBytes)
		if st.LossPending {
			fmt.Fprintf(stdout, "loss pending   seqs %d..%d\n", st.LossFirstSeq, st.LossLastSeq)
		}
		if st.ConsumerHeartbeat != 0 {
			fmt.Fprintf(stdout, "consumer seen  %s\n", time.Unix(0, int64(st.ConsumerHeartbeat)).UTC().Format(time.RFC3339Nano))
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvshmd inspect: the ring is invalid: %v\n", err)
		return exitFailure
	}
	return exitOK
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
