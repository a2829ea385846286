// Command kvshmd is the kvshm daemon: it drains the shared-memory rings of KV-cache event producers into per-worker
// indexes and answers recovery queries over a Unix socket (and optionally HTTP). The same binary carries the
// operator subcommands that speak the socket protocol. Run `kvshmd help` for usage.
//
// One file per command: serve.go (the daemon's wiring; its flags, each with its environment variable, default and
// help, in serveflags.go, their checks and conversion into daemon.Config in serveconfig.go), query.go (health,
// stats, events, dump, match, forget over the socket), inspect.go (a ring file's header, no daemon needed),
// watch.go (a ZMQ KV-event stream, decoded).
package main

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
)

// version is set at link time (-ldflags "-X main.version=v1.2.3"); otherwise the module version or "dev".
var version = ""

// Exit codes.
const (
	exitOK          = 0
	exitFailure     = 1 // the daemon answered with an error, or serve failed
	exitUsage       = 2 // bad command line
	exitUnreachable = 3 // cannot connect to the daemon
)

const usageTop = `kvshmd: the kvshm daemon and its operator commands.

Usage:
  kvshmd serve   [flags]                 run the daemon (see kvshmd serve --help)
  kvshmd health  [--socket P]            check that the daemon answers
  kvshmd stats   [--socket P] [--worker W] [--dp-rank R]
  kvshmd events  [--socket P] [--worker W] [--dp-rank R] [--start N] [--end N]
  kvshmd dump    [--socket P] [--worker W] [--dp-rank R]
  kvshmd match   [--socket P] [--worker W] [--dp-rank R] --tokens 1,2,3 [--lora NAME] [--eagle]
  kvshmd forget  [--socket P] --worker W [--dp-rank R]  drop a stream whose producer is gone (index, metrics)
  kvshmd inspect [--json] RINGFILE       read a ring file's header (no daemon needed)
  kvshmd watch   [--topic T] [--count N] [--timeout D] [--replay EP --from SEQ] ENDPOINT
                                         follow a ZMQ KV-event stream (vLLM's wire: kvshmd's publish=, vLLM's
                                         own), one JSON line per batch
  kvshmd version

The socket defaults to $KVSHMD_SOCKET, then $KVSHM_SOCKET, then $XDG_RUNTIME_DIR/kvshm/kvshmd.sock, then
/tmp/kvshm-<uid>/kvshmd.sock. events/dump print the WorkerKvQueryResponse JSON exactly as the daemon sent it.
--dp-rank selects the per-rank stream of that rank (a producer attached with dp_rank), else the rank's view of the
worker's ALL stream (events/dump); forget --dp-rank drops exactly that per-rank stream.

Exit codes: 0 ok; 1 the daemon answered with an error (or serve failed); 2 usage error; 3 daemon unreachable.
`

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageTop)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return serve(rest, stderr)
	case "health", "stats", "events", "dump", "match", "forget":
		return query(cmd, rest, stdout, stderr)
	case "inspect":
		return inspect(rest, stdout, stderr)
	case "watch":
		return watch(rest, stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, buildVersion())
		return exitOK
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usageTop)
		return exitOK
	}
	fmt.Fprintf(stderr, "kvshmd: unknown command %q\n\n%s", cmd, usageTop)
	return exitUsage
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// envOr returns the first non-empty environment variable, else def.
func envOr(def string, names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return def
}
