"""``python -m kvshm_conf [run|record]``: the conformance run (``make conformance``) or trace recording."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import kvshm
import kvshm_conformance as ref

from .batches import BATCH_PROFILES, batched, run_batched_stream
from .differential import feed, run_inputs, run_stream
from .gen import PROFILES, Profile, generate
from .ops import Header, Query, Trace, dump_trace
from .report import Report
from .topologies import TOPOLOGIES, run_topology, topology
from .zmqjudge import ZMQ_PROFILES, run_zmq


def kvshmd_path() -> str:
    packaged = Path(kvshm.__file__).parent / "_bin" / "kvshmd"
    if packaged.is_file():
        return str(packaged)
    found = shutil.which("kvshmd")
    if found is None:
        raise SystemExit("kvshm_conf: no kvshmd (install the kvshm wheel)")
    return found


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    log(f"kvshm_conf: seed {seed} (replay with --seed {seed})")
    report = Report()
    t0 = time.monotonic()
    if args.part in ("all", "differential"):
        for prof in PROFILES:
            row = report.row(f"differential/{prof.name}")
            for k in range(args.seeds):
                run_stream(generate(prof, seed + k), row, log)
        run_inputs(report.row("differential/input"))
    if args.part in ("all", "batches"):
        for prof in BATCH_PROFILES:
            row = report.row(f"differential/{prof.name}")
            for k in range(args.seeds):
                try:
                    run_batched_stream(batched(prof, seed + k), row, log)
                except AttributeError as e:  # a kvshm without apply_batch
                    row.add("FAIL", f"seed={seed + k}: {type(e).__name__}: {e}")
    if args.part in ("all", "topologies"):
        kvshmd = kvshmd_path()
        for name in TOPOLOGIES:
            row = report.row(f"topology/{name}")
            for k in range(args.seeds):
                try:
                    with topology(name, kvshmd, seed + k) as t:
                        run_topology(t, seed + k, row)
                except (OSError, RuntimeError, TypeError, ValueError) as e:
                    row.add("FAIL", f"seed={seed + k}: the topology could not run: {type(e).__name__}: {e}")
            log(f"  topology {name}: done")
    if args.part in ("all", "zmq"):
        for zp in ZMQ_PROFILES:
            ref_row, kvshm_row = report.row(f"zmq/reference/{zp.name}"), report.row(f"zmq/kvshm/{zp.name}")
            for k in range(args.seeds):
                run_zmq(zp, seed + k, ref_row, kvshm_row, log)
        log("  zmq: done")
    print()
    print(report.table())
    print(f"\nseed {seed}, {args.seeds} seed(s) per scenario, {time.monotonic() - t0:.1f} s")
    if report.failed:
        print()
        print(report.failure_details())
        return 1
    return 0


#: The recorded traces: small, one feature each, fixed seeds (conformance/traces/<name>.jsonl).
TRACES: tuple[tuple[Profile, int], ...] = (
    (Profile("basic", events=70, query_rate=0.15), 1),
    (Profile("tiny-buffer", max_buffer_size=4, block_size=2, events=60, query_rate=0.2), 2),
    (Profile("lora-eagle", lora=True, eagle=True, events=60, query_rate=0.15), 3),
    (Profile("mismatch", mismatch=True, eagle=True, events=60, query_rate=0.15), 4),
    (Profile("skipped-ids", skips=True, first_seq=100, events=60, query_rate=0.2), 5),
    (Profile("multi-rank", ranks=(0, 1, 2), lora=True, events=60, query_rate=0.15), 6),
    (Profile("multi-rank-cleared", ranks=(0, 1), cleared_single_rank_only=False, events=60, query_rate=0.2), 7),
    (Profile("dup-parent", dup_parent=True, cleared=False, events=50, query_rate=0.15), 8),
    (Profile("twins", twins=True, events=60, query_rate=0.2), 9),
)


def record(args: argparse.Namespace) -> int:
    """Feed each trace's stream to the reference and write its answers; the header names the deviation marks."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for prof, seed in TRACES:
        stream = generate(prof, seed)
        ix = ref.LocalIndexer(prof.worker_id, prof.block_size, prof.max_buffer_size)
        trace = Trace(Header(prof.name, prof.worker_id, prof.block_size, prof.max_buffer_size))
        for i, op in enumerate(stream.ops):
            for dev, at in stream.marks.items():
                if at <= i and dev not in trace.header.deviations:
                    trace.header.deviations[dev] = len(trace.ops)
            if isinstance(op, Query):
                trace.ops.append(Query(op.start, op.end, ix.get_events_json(op.start, op.end)))
            elif feed(ix, op) is None:
                trace.ops.append(op)
        ix.shutdown()
        text = dump_trace(trace)
        path = out / f"{prof.name}.jsonl"
        path.write_text(text)
        total += len(text)
        log(f"  {path}: {len(trace.ops)} ops, {len(text)} bytes")
    log(f"kvshm_conf: {total} bytes of traces")
    return 0


def verify(args: argparse.Namespace) -> int:
    """The committed traces are what ``record`` writes today (the generator did not drift), and the crate's
    ``replay`` binary gives the recorded answer to every query (the crate did not drift)."""
    import json
    import subprocess
    import tempfile

    bad = 0
    committed = Path(args.traces)
    with tempfile.TemporaryDirectory() as tmp:
        record(argparse.Namespace(out=tmp))
        for prof, _ in TRACES:
            name = f"{prof.name}.jsonl"
            fresh = (Path(tmp) / name).read_bytes()
            old = (committed / name).read_bytes() if (committed / name).exists() else b""
            if fresh != old:
                log(f"kvshm_conf: {committed / name} is not what `make conformance-traces` records now")
                bad += 1
    if args.replay:
        for path in sorted(committed.glob("*.jsonl")):
            text = path.read_text()
            out = subprocess.run([args.replay], input=text, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                log(f"kvshm_conf: replay {path}: exit {out.returncode}: {out.stderr.strip()}")
                bad += 1
                continue
            want = [json.loads(ln).get("answer") for ln in text.splitlines()[1:] if '"op":"query"' in ln]
            got = [json.loads(ln).get("answer") for ln in out.stdout.splitlines()[1:] if '"query"' in ln]
            if want != got:
                log(f"kvshm_conf: replay {path}: the crate answers differently from the recorded answers")
                bad += 1
    log(f"kvshm_conf: traces {'verified' if not bad else f'{bad} problem(s)'}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvshm_conf", description=__doc__)
    sub = ap.add_subparsers(dest="cmd")
    r = sub.add_parser("run", help="the conformance run (default)")
    r.add_argument("--seed", type=int, default=None, help="base seed (default: from the clock, printed)")
    r.add_argument("--seeds", type=int, default=int(os.environ.get("KVSHM_CONF_SEEDS", "2")))
    r.add_argument("--part", choices=("all", "differential", "batches", "topologies", "zmq"), default="all")
    rec = sub.add_parser("record", help="record the traces of conformance/traces with the real crate")
    rec.add_argument("--out", default="conformance/traces")
    ver = sub.add_parser("verify", help="check conformance/traces against the generator and the replay binary")
    ver.add_argument("--traces", default="conformance/traces")
    ver.add_argument("--replay", default=None, help="the crate's replay binary")
    args = ap.parse_args(argv)
    if args.cmd == "record":
        return record(args)
    if args.cmd == "verify":
        return verify(args)
    if args.cmd is None:
        args = r.parse_args([])
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
