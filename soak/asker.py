"""A soak child that asks a shared kvshmd for one configuration (huge buffer_steps, hwm, ring) as a producer would
(``kvshm.LocalIndexer(publish=kvshm.ZmqPublish(...))``) and says what happened on stdout (one JSON line:
``{"ok": true, "stats": ...}`` or ``{"ok": false, "error": "..."}``); then waits for a line on stdin and shuts down.
The ring file is sparse (``posix_fallocate`` replaced by ``ftruncate``): a 4 GiB ask costs this machine nothing
until written, the daemon maps it all the same."""

from __future__ import annotations

import argparse
import json
import os
import sys

import kvshm  # the installed wheel


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--worker", type=int, required=True)
    ap.add_argument("--zmq-dir", required=True)
    ap.add_argument("--ring-bytes", type=int, default=1 << 20)
    ap.add_argument("--buffer-steps", type=int, default=10_000)
    ap.add_argument("--hwm", type=int, default=100_000)
    a = ap.parse_args()
    os.posix_fallocate = lambda fd, off, n: os.ftruncate(fd, off + n)  # sparse ring file
    ix = None
    try:
        pub = kvshm.ZmqPublish(endpoint=f"ipc://{a.zmq_dir}/ask-{a.worker}.sock", buffer_steps=a.buffer_steps,
                               hwm=a.hwm)
        ix = kvshm.LocalIndexer(a.worker, 4, 10000, socket_path=a.socket, ring_dir=a.zmq_dir,
                                ring_bytes=a.ring_bytes, publish=pub)
        ix.apply_batch(0, [kvshm.events.AllBlocksCleared()], ts=1.0)
        st = ix.stats()
        print(json.dumps({"ok": bool(st["attached"]), "error": st.get("last_error") or "",
                          "attached": st["attached"]}), flush=True)
    except Exception as e:  # the answer to report
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}), flush=True)
    sys.stdin.readline()
    if ix is not None:
        ix.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
