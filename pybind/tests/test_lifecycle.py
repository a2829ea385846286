"""Daemon deaths and restarts, interpreter exit, fork, shared daemons, launcher failures.

Real kvshmd processes killed with real signals. Waits are liveness bounds (a test that would hang fails instead),
never performance assertions.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import kvshm
import kvshm._launcher
import kvshm._supervisor
from kvshm import ForkedProcessError, LauncherError, LocalIndexer
from kvshm._client import Client
from kvshm._launcher import PrivateDaemon, find_kvshmd

from conftest import IndexerFactory
from helpers import SharedDaemon, daemon_stream, dump_blocks, event_ids, pid_gone, query, toks, variant, wait_for


def publish_stream(ix: LocalIndexer, first: int, n: int, stop: threading.Event | None = None) -> int:
    """Stores with parents (a chain per 10 events), every 7th a remove; returns the next seq."""
    seq = first
    for _ in range(n):
        if stop is not None and stop.is_set():
            break
        if seq % 7 == 6:
            ix.apply_removed(seq, [seq * 10 - 10])
        else:
            parent = None if seq % 10 == 0 else seq * 10 - 10
            ix.apply_stored(seq, toks(seq, 4), [seq * 10], parent_hash=parent, dp_rank=seq % 2)
        seq += 1
    return seq


def stream_dump_set(first: int, nxt: int) -> set[tuple[int, int | None, int]]:
    """What the tree holds after publish_stream's events first..nxt-1 on a fresh index, as (dp_rank, parent_hash,
    block_hash): a store is applied only when its dp_rank holds the parent (else ParentBlockNotFound), a remove only
    removes what its dp_rank (0) holds."""
    held: dict[tuple[int, int], int | None] = {}
    for seq in range(first, nxt):
        if seq % 7 == 6:
            held.pop((0, seq * 10 - 10), None)
            continue
        parent = None if seq % 10 == 0 else seq * 10 - 10
        if parent is None or (seq % 2, parent) in held:
            held[(seq % 2, seq * 10)] = parent
    return {(dp, parent, bh) for (dp, bh), parent in held.items()}


def dump_set(resp: Any) -> set[tuple[int, int | None, int]]:
    return {(dp, parent, bh) for dp, parent, bh, _ in dump_blocks(resp)}


def test_private_daemon_sigkill_midstream(make_indexer: IndexerFactory) -> None:
    # 4 MiB holds more than every event below (~110 B each): the ring can never fill, nothing is dropped.
    ix = make_indexer(worker_id=2, kv_block_size=4, ring_bytes=4 << 20)
    seq = publish_stream(ix, 0, 50)
    resp = query(ix)
    assert variant(resp) == "TreeDump" and dump_set(resp) == stream_dump_set(0, seq), resp
    # The private daemon checkpoints (--checkpoint-interval 1s) and only then releases the ring head: wait for one.
    wait_for(lambda: ix.stats(daemon=False)["ring"]["head"] > 0, "the first periodic checkpoint")
    old_pid = ix.stats()["daemon_pid"]
    assert old_pid is not None  # a private daemon

    # A publisher thread keeps going while the daemon is killed; queries in the meantime never raise.
    stop = threading.Event()
    result: dict[str, Any] = {}

    def publisher() -> None:
        try:
            result["next"] = publish_stream(ix, seq, 20000, stop)
        except BaseException as e:  # noqa: BLE001 - asserted below
            result["error"] = e

    th = threading.Thread(target=publisher)
    th.start()
    os.kill(old_pid, signal.SIGKILL)
    answers = []
    deadline = time.monotonic() + 30
    # One snapshot: the fields move together.
    while not ((st := ix.stats(daemon=False))["attached"] and st["attaches"] == 2):
        answers.append(json.loads(ix.get_events_json()))  # must not raise, must be JSON
        assert time.monotonic() < deadline, "the private daemon was not restarted"
        time.sleep(0.005)
    stop.set()
    th.join(60)
    assert not th.is_alive(), "the publisher hung"
    assert "error" not in result, result.get("error")
    for a in answers:
        assert variant(a) in ("Error", "TreeDump"), a
        if variant(a) == "Error":
            assert a["Error"].startswith("kvshm:")
    st = ix.stats()
    assert st["daemon_restarts"] == 1 and st["attaches"] == 2 and pid_gone(old_pid), (st, answers[-3:])
    assert st["last_attach"]["resumed"] and st["last_attach"]["head"] > 0, st["last_attach"]
    # The new daemon restored the checkpoint of the killed one and replayed the ring after it: nothing was lost.
    assert st["last_attach"]["restored"] is True, st["last_attach"]
    assert st["dropped_events"] == 0, st

    nxt = result["next"]
    resp = query(ix)
    assert variant(resp) == "TreeDump", (str(resp)[:300], ix.stats())
    assert resp["TreeDump"]["last_event_id"] == nxt - 1
    assert dump_set(resp) == stream_dump_set(0, nxt)
    recent = max(0, nxt - 500)
    assert event_ids(query(ix, recent)) == list(range(recent, nxt))  # the event log survived too
    ix.apply_stored(nxt, toks(95000, 4), [1])
    resp = query(ix)
    assert variant(resp) == "TreeDump" and dump_set(resp) == stream_dump_set(0, nxt) | {(0, None, 1)}, str(resp)[:300]
    # A Cleared still re-bases the state.
    ix.apply_cleared(nxt + 1)
    ix.apply_stored(nxt + 2, toks(90000, 4), [42])
    ix.apply_stored(nxt + 3, toks(90004, 4), [43], parent_hash=42)
    ix.apply_stored(nxt + 4, toks(90000, 4), [44], dp_rank=1)
    resp = query(ix)
    assert variant(resp) == "TreeDump" and resp["TreeDump"]["last_event_id"] == nxt + 4, str(resp)[:300]
    assert dump_set(resp) == {(0, None, 42), (0, 42, 43), (1, None, 42)}  # dp 1 shares dp 0's node (same tokens)
    assert event_ids(query(ix, nxt + 1)) == [nxt + 1, nxt + 2, nxt + 3, nxt + 4]


def test_private_daemon_killed_while_idle_is_restarted(make_indexer: IndexerFactory) -> None:
    ix = make_indexer(worker_id=3)
    ix.apply_stored(0, toks(0, 4), [1])
    assert event_ids(query(ix, 0)) == [0]  # the daemon applied the event
    # ... and, idle, its periodic checkpoint covers it and releases the ring head.
    wait_for(lambda: ix.stats(daemon=False)["ring"]["head"] > 0, "the periodic checkpoint")
    pid = ix.stats()["daemon_pid"]
    assert pid is not None  # a private daemon
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: (st := ix.stats(daemon=False))["attached"] and st["attaches"] == 2, "the restart")
    assert ix.stats()["daemon_pid"] != pid
    # The restarted daemon restored that checkpoint: the history is complete. (A daemon with --state-dir ''
    # reports it unknown instead: test_shared_daemon_killed_and_restarted[none].)
    assert ix.stats()["last_attach"]["restored"] is True
    resp = query(ix)
    assert variant(resp) == "TreeDump" and resp["TreeDump"]["last_event_id"] == 0 and dump_set(resp) == {(0, None, 1)}
    ix.apply_cleared(1)
    assert query(ix) == {"TreeDump": {"events": [], "last_event_id": 1, "reset_scope": "all"}}


def test_shared_daemon_via_env(shared_daemon: SharedDaemon, ring_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSHM_SOCKET", shared_daemon.socket_path)
    a = LocalIndexer(100, 4, ring_dir=ring_dir, ring_bytes=1 << 20)
    b = LocalIndexer(200, 2, ring_dir=ring_dir, ring_bytes=1 << 20)
    try:
        for ix in (a, b):
            st = ix.stats()
            assert st["mode"] == "shared" and st["socket_path"] == shared_daemon.socket_path and st["attached"]
            assert st["daemon_pid"] is None
        a.apply_stored(0, toks(0, 4), [1])
        b.apply_stored(5, toks(0, 2), [2])
        b.apply_cleared(6)
        assert event_ids(query(a, 0)) == [0]
        assert event_ids(query(b, 5)) == [5, 6]
        assert query(a, 0)["Events"]["events"][0]["worker_id"] == 100
        with Client(shared_daemon.socket_path) as c:
            assert c.health()["streams"] == 2
    finally:
        a.shutdown()
    # DETACH: the shared daemon keeps the worker's index queryable after the producer left; the ring file is gone.
    with Client(shared_daemon.socket_path) as c:
        kept = json.loads(c.events(100, 0, None))
    # The end of its incarnation (docs/lifecycle.md): a Cleared under the id after its last, so none of its blocks stay.
    assert event_ids(kept) == [0, 1] and kept["Events"]["events"][1]["event"]["data"] == "cleared", kept
    assert not os.path.exists(a.stats()["ring_path"])
    assert shared_daemon.alive()
    b.apply_stored(7, toks(2, 2), [3])
    assert event_ids(query(b, 7)) == [7]
    b.shutdown()
    assert list(ring_dir.iterdir()) == []


def test_shared_daemon_socket_argument_wins(shared_daemon: SharedDaemon, make_indexer: IndexerFactory,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSHM_SOCKET", "/nonexistent/kvshmd.sock")
    ix = make_indexer(worker_id=1, socket_path=Path(shared_daemon.socket_path))
    assert ix.stats()["attached"] and ix.stats()["socket_path"] == shared_daemon.socket_path


def test_shared_daemon_started_later_loses_nothing(shared_socket: SharedDaemon, make_indexer: IndexerFactory) -> None:
    ix = make_indexer(worker_id=11, socket_path=shared_socket.socket_path)
    assert not ix.stats()["attached"]
    ix.apply_stored(0, toks(0, 4), [1])
    ix.apply_stored(1, toks(4, 4), [2], parent_hash=1)
    resp = query(ix, 0)
    assert variant(resp) == "Error" and "kvshmd is unavailable" in resp["Error"]
    assert ix.stats()["published_while_detached"] == 2
    shared_socket.start()
    wait_for(lambda: ix.stats(daemon=False)["attached"], "the client to attach to the late daemon")
    # The ring kept every event: the daemon's history is complete (head was 0).
    assert event_ids(query(ix, 0)) == [0, 1]
    assert variant(query(ix)) == "TreeDump"


@pytest.mark.parametrize("state", ["default", "none"])
def test_shared_daemon_killed_and_restarted(short_dir: Path, make_indexer: IndexerFactory, state: str) -> None:
    """SIGKILL of a shared kvshmd while a producer publishes, then a new one on the same socket. With its default
    state dir (``<socket>.state``, docs/lifecycle.md "Daemon modes") the ring head is released only up to a written
    checkpoint, so the successor restores it and re-drains the ring from there: its answers are complete. With
    ``--state-dir ''`` the successor resumes at a non-zero head and reports the history before it unknown."""
    args = () if state == "default" else ("--state-dir", "")
    shared_daemon = SharedDaemon(str(short_dir / "kvshmd.sock"), short_dir / "kvshmd.log", args=args)
    shared_daemon.start()
    try:
        ix = make_indexer(worker_id=12, socket_path=shared_daemon.socket_path)
        seq = publish_stream(ix, 0, 30)
        assert variant(query(ix)) == "TreeDump"
        if state == "none":  # the head moves once the daemon applied the events (no checkpoint to wait for)
            wait_for(lambda: ix.stats(daemon=False)["ring"]["head"] > 0, "the daemon to release the ring head")
        shared_daemon.kill()
        wait_for(lambda: not ix.stats(daemon=False)["attached"], "the client to notice the dead daemon")
        # Nobody restarts a shared daemon for us: answers are the JSON Error variant, publishing goes on.
        resp = query(ix, 0)
        assert variant(resp) == "Error" and resp["Error"].startswith("kvshm: kvshmd is unavailable"), resp
        seq = publish_stream(ix, seq, 30)
        assert ix.stats()["dropped_events"] == 0 and ix.stats()["published_while_detached"] >= 30
        shared_daemon.start()
        wait_for(lambda: ix.stats(daemon=False)["attached"], "the client to reattach by itself")
        assert ix.stats()["attaches"] == 2
        resp = query(ix)
        assert variant(resp) == "TreeDump" and resp["TreeDump"]["last_event_id"] == seq - 1, str(resp)[:300]
        st = ix.stats()
        if state == "default":
            # Complete: exactly the stream's blocks, every id since 0, nothing reported missing.
            assert dump_set(resp) == stream_dump_set(0, seq)
            assert event_ids(query(ix, 0)) == list(range(seq))
            assert st["incomplete"] is False, str(st["daemon_stream"])
        else:
            # The history before the resumed head is unknown. It answers with what it applied since (best effort,
            # as Dynamo would) and says the answer is incomplete.
            assert {bh for _, _, bh in dump_set(resp)} <= {s * 10 for s in range(30, seq)}
            assert st["daemon_stream"] is not None, st
            assert st["incomplete"] is True and "unknown" in st["daemon_stream"]["taint_reason"], st["daemon_stream"]
            stream = daemon_stream(shared_daemon.socket_path, 12)
            assert stream["events_received"] == 30  # the events published while it was down were kept in the ring
        ix.apply_cleared(seq)
        assert query(ix) == {"TreeDump": {"events": [], "last_event_id": seq, "reset_scope": "all"}}
        assert ix.stats()["incomplete"] is False
    finally:
        shared_daemon.stop()


EXIT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from kvshm import LocalIndexer
    ix = LocalIndexer(1, 4, ring_dir=sys.argv[1], ring_bytes=1 << 20)
    ix.apply_stored(0, list(range(4)), [1])
    assert '"Events"' in ix.get_events_json(0)
    st = ix.stats()
    print(json.dumps({"pid": st["daemon_pid"], "socket": st["socket_path"], "ring": st["ring_path"]}), flush=True)
    ENDING
    """
)


@pytest.mark.parametrize(
    "ending",
    [
        "pass  # falls off the end",
        "sys.exit(3)",
        "raise RuntimeError('engine crashed')",
        "del ix; import gc; gc.collect(); print('collected', flush=True)",
    ],
)
def test_interpreter_exit_without_shutdown_leaves_nothing(ring_dir: Path, ending: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT.replace("ENDING", ending), str(ring_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    info = json.loads(proc.stdout.splitlines()[0])
    assert pid_gone(info["pid"]), "the private kvshmd outlived the interpreter"
    assert not os.path.exists(info["socket"]) and not os.path.exists(os.path.dirname(info["socket"]))
    assert not os.path.exists(info["ring"]) and list(ring_dir.iterdir()) == []
    assert "Traceback" not in proc.stderr or "engine crashed" in proc.stderr, proc.stderr


def test_parent_killed_daemon_exits(ring_dir: Path) -> None:
    """SIGKILL of the engine skips every Python hook: the private daemon notices (--parent-pid) and exits."""
    script = EXIT_SCRIPT.replace("ENDING", "import time; time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", script, str(ring_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    info = json.loads(proc.stdout.readline())
    proc.kill()
    proc.wait()
    wait_for(lambda: pid_gone(info["pid"]), "the orphaned daemon to exit")
    # Nothing in the killed process could remove its ring file and private directory: the next LocalIndexer on
    # the machine does, and leaves alone what is not stale (a live producer's ring, other files).
    assert [p.name for p in ring_dir.iterdir()] == [os.path.basename(info["ring"])]
    dead_dir = os.path.dirname(info["socket"])
    old = time.time() - 120  # a daemon directory younger than a minute may belong to a daemon being started
    if os.path.exists(dead_dir):  # a kvshmd with --cleanup-dir removed it itself (test_launcher.py)
        os.utime(dead_dir, (old, old))
    other = ring_dir / "kvshm-notes.txt"
    other.write_text("not a ring")
    live = LocalIndexer(2, 4, ring_dir=ring_dir, ring_bytes=1 << 20)
    try:
        again = LocalIndexer(3, 4, ring_dir=ring_dir, ring_bytes=1 << 20)
        again.shutdown()
        assert sorted(p.name for p in ring_dir.iterdir()) == sorted(
            [other.name, os.path.basename(live.stats()["ring_path"])]
        )
        assert not os.path.exists(os.path.dirname(info["socket"])), "the dead engine's daemon directory is left"
        assert os.path.exists(os.path.dirname(live.stats()["socket_path"]))
    finally:
        live.shutdown()
    other.unlink()


def test_forked_child_gets_a_clear_error(make_indexer: IndexerFactory) -> None:
    ix = make_indexer(worker_id=6)
    ix.apply_stored(0, toks(0, 4), [1])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what each call did, then leave without running any exit hook
        os.close(r)
        report = {}
        for name, call in (
            ("apply_stored", lambda: ix.apply_stored(1, toks(0, 4), [2])),
            ("apply_removed", lambda: ix.apply_removed(1, [1])),
            ("apply_cleared", lambda: ix.apply_cleared(1)),
            ("get_events_json", lambda: ix.get_events_json()),
            ("stats", lambda: ix.stats()),
            ("shutdown", lambda: ix.shutdown()),
        ):
            try:
                call()
                report[name] = "no error"
            except ForkedProcessError as e:
                report[name] = str(e)
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                report[name] = f"wrong error {type(e).__name__}: {e}"
        os.write(w, json.dumps(report).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        report = json.loads(f.read())
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    for name, message in report.items():
        assert "forked child" in message and f"pid {pid}" in message, (name, message)
    # The parent is unaffected: same daemon, same ring, nothing published by the child.
    assert ix.stats()["attached"] and ix.stats()["published_events"] == 1
    ix.apply_cleared(1)
    assert event_ids(query(ix, 0)) == [0, 1]


def test_forked_child_normal_exit_does_not_tear_down_the_parent(make_indexer: IndexerFactory) -> None:
    """A child that exits through the interpreter (running exit hooks) must not stop the parent's daemon."""
    ix = make_indexer(worker_id=6)
    pid = os.fork()
    if pid == 0:
        try:
            ix.apply_cleared(0)
        except ForkedProcessError:
            pass
        # What interpreter exit runs in the child: the finalizer, which must see it is not the owner.
        ix._finalizer()  # noqa: SLF001 - the exit hook itself
        os._exit(0)
    os.waitpid(pid, 0)
    st = ix.stats()
    daemon_pid = st["daemon_pid"]
    assert st["attached"] and daemon_pid is not None and not pid_gone(daemon_pid) and os.path.exists(st["ring_path"])
    ix.apply_cleared(0)
    assert event_ids(query(ix, 0)) == [0]


# --------------------------------------------------------------------------------------------------------------
# Launcher


def write_script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_find_kvshmd_order(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = write_script(short_dir / "kvshmd", "exit 0")
    monkeypatch.setenv("KVSHMD_BIN", fake)
    assert find_kvshmd() == fake
    monkeypatch.delenv("KVSHMD_BIN")
    packaged = kvshm._launcher.packaged_kvshmd()
    if packaged.exists():  # the wheel ships it (a source checkout has it only after `make wheel`)
        assert find_kvshmd() == str(packaged)
    monkeypatch.setattr(kvshm._launcher, "packaged_kvshmd", lambda: short_dir / "missing")
    monkeypatch.setenv("PATH", str(short_dir))
    assert find_kvshmd() == fake
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(LauncherError, match="cannot find kvshmd"):
        find_kvshmd()
    monkeypatch.setenv("KVSHMD_BIN", str(short_dir / "nope"))
    with pytest.raises(LauncherError, match="KVSHMD_BIN"):
        find_kvshmd()


def test_daemon_that_fails_reports_its_output(short_dir: Path, ring_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSHMD_BIN", write_script(short_dir / "bad", "echo 'kvshmd: boom: cannot listen' >&2; exit 3"))
    with pytest.raises(LauncherError, match=r"(?s)status 3.*boom: cannot listen"):
        LocalIndexer(0, 4, ring_dir=ring_dir, ring_bytes=1 << 20)
    assert list(ring_dir.iterdir()) == []


def test_daemon_that_never_answers_times_out(short_dir: Path) -> None:
    d = PrivateDaemon(write_script(short_dir / "mute", "echo starting >&2; exec sleep 60"), ready_timeout=0.3)
    with pytest.raises(LauncherError, match=r"(?s)did not answer HEALTH.*starting"):
        d.start()
    assert d.pid is None  # killed and reaped
    d.stop()
    assert not os.path.exists(d.dir)


def test_private_daemon_directory_is_private(make_indexer: IndexerFactory) -> None:
    ix = make_indexer()
    sock = ix.stats()["socket_path"]
    assert os.stat(os.path.dirname(sock)).st_mode & 0o777 == 0o700
    assert os.stat(ix.stats()["ring_path"]).st_mode & 0o777 == 0o600
    with open(f"/proc/{ix.stats()['daemon_pid']}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    assert argv[1:6] == [b"serve", b"--socket", sock.encode(), b"--parent-pid", str(os.getpid()).encode()]


def test_missing_daemon_full_ring_is_counted_then_reported(shared_socket: SharedDaemon,
                                                           make_indexer: IndexerFactory) -> None:
    """No daemon and a full ring: publishing neither blocks nor raises; the drops are counted; once a daemon
    attaches it knows exactly which ids were lost: it answers with what it has, marked incomplete, until a
    Cleared."""
    ix = make_indexer(worker_id=13, kv_block_size=16, socket_path=shared_socket.socket_path, ring_bytes=64 << 10)
    seq = 0
    while (ix.stats(daemon=False)["dropped_events"] or 0) < 3:
        ix.apply_stored(seq, toks(seq, 64), [4 * seq + 1, 4 * seq + 2, 4 * seq + 3, 4 * seq + 4])
        seq += 1
        assert seq < 10000, "the ring never filled up"
    st = ix.stats()
    first_lost = st["ring"]["loss_first_seq"]
    assert st["dropped_events"] == 3 and st["ring"]["loss_last_seq"] == seq - 1 and first_lost == seq - 3
    shared_socket.start()
    wait_for(lambda: ix.stats(daemon=False)["attached"], "the client to attach")
    wait_for(lambda: ix.stats(daemon=False)["ring"]["used"] == 0, "the daemon to drain the ring")
    ix.apply_stored(seq, toks(60000, 16), [99999])  # carries the LOSS record
    resp = query(ix)
    assert variant(resp) == "TreeDump" and resp["TreeDump"]["last_event_id"] == seq, str(resp)[:300]
    held = {bh for _, _, bh in dump_set(resp)}
    assert 99999 in held and not held & {4 * s + i for s in range(first_lost, seq) for i in range(1, 5)}
    st = ix.stats()
    assert st["incomplete"] is True, st
    assert [(r["first"], r["last"]) for r in st["lost_ranges"] or []] == [(first_lost, seq - 1)], st["lost_ranges"]
    # Events across the lost ids: the suffix of what was applied, as across a gap.
    assert event_ids(query(ix, 0)) == [*range(first_lost), seq]
    assert event_ids(query(ix, seq)) == [seq]
    ix.apply_cleared(seq + 1)
    assert query(ix) == {"TreeDump": {"events": [], "last_event_id": seq + 1, "reset_scope": "all"}}
    assert ix.stats()["incomplete"] is False


class FakeDaemon:
    """A socket that stands in for kvshmd: accepts connections on a thread and hands each to ``handle``."""

    def __init__(self, path: str) -> None:
        import socket as _socket

        self.srv = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(8)
        self.srv.settimeout(0.1)
        self.stop = threading.Event()
        self.requests = 0

        def serve() -> None:
            while not self.stop.is_set():
                try:
                    conn, _ = self.srv.accept()
                except TimeoutError:
                    continue
                conn.settimeout(5)
                self.handle(conn)

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def handle(self, conn: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.srv.close()


class RefusingDaemon(FakeDaemon):
    """Answers every request with one error code (what a misconfigured shared daemon does)."""

    def __init__(self, path: str, code: str) -> None:
        self.body = json.dumps({"error": f"refused for the test ({code})", "code": code}).encode()
        super().__init__(path)

    def handle(self, conn: Any) -> None:
        from kvshm._client import encode_frame

        with conn:
            head = conn.recv(8)
            if len(head) < 8:
                return
            conn.recv(int.from_bytes(head[:4], "little") - 4)
            self.requests += 1
            conn.sendall(encode_frame(head[5], self.body, status=1))


def test_shared_daemon_refusing_for_good_is_an_error(short_dir: Path, ring_dir: Path) -> None:
    fake = RefusingDaemon(str(short_dir / "refuse.sock"), "forbidden")
    try:
        with pytest.raises(kvshm.KvshmError, match=r"refused the ring .*forbidden"):
            LocalIndexer(0, 4, socket_path=str(short_dir / "refuse.sock"), ring_dir=ring_dir, ring_bytes=1 << 20)
    finally:
        fake.close()
    assert list(ring_dir.iterdir()) == []


def test_shared_daemon_busy_is_retried(short_dir: Path, make_indexer: IndexerFactory) -> None:
    fake = RefusingDaemon(str(short_dir / "busy.sock"), "busy")
    try:
        ix = make_indexer(socket_path=str(short_dir / "busy.sock"))
        wait_for(lambda: fake.requests >= 3, "the supervisor to retry the ATTACH")
        st = ix.stats()
        assert not st["attached"] and "busy" in (st["last_error"] or "")
        ix.apply_cleared(0)  # publishing is unaffected
        resp = query(ix)
        assert variant(resp) == "Error" and "busy" in resp["Error"]
    finally:
        fake.close()


class HungDaemon(FakeDaemon):
    """Accepts connections and reads requests but never answers (a hung or SIGSTOPped kvshmd), until release()."""

    def __init__(self, path: str) -> None:
        self.conns: list[Any] = []
        super().__init__(path)

    def handle(self, conn: Any) -> None:
        self.conns.append(conn)
        if len(conn.recv(8)) == 8:
            self.requests += 1

    def release(self) -> None:
        """Hang up every connection: a pending ATTACH fails."""
        for conn in self.conns:
            conn.close()

    def close(self) -> None:
        super().close()
        self.release()


def test_constructor_is_bounded_against_a_hung_shared_daemon(short_dir: Path, make_indexer: IndexerFactory,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A hung shared daemon: the constructor's first ATTACH is bounded (_FIRST_ATTACH_TIMEOUT), then the supervisor
    keeps trying; the engine starts and publishes meanwhile. (That it returns at all proves the bound: this daemon
    never answers.)"""
    monkeypatch.setattr(kvshm._supervisor, "_FIRST_ATTACH_TIMEOUT", 0.2)
    fake = HungDaemon(str(short_dir / "hung.sock"))
    try:
        ix = make_indexer(socket_path=str(short_dir / "hung.sock"))
        st = ix.stats()
        assert not st["attached"] and st["last_error"]
        ix.apply_cleared(0)  # publishing is unaffected
        wait_for(lambda: fake.requests >= 2, "the supervisor to try again")
    finally:
        fake.close()


def test_shutdown_during_a_slow_attach_keeps_the_supervisors_descriptors(
        short_dir: Path, make_indexer: IndexerFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hung shared daemon: shutdown() while the supervisor is inside a slow ATTACH (longer than the join timeout)
    must not close descriptors the supervisor still uses: the application's next os.pipe() would reuse them and the
    supervisor would swallow its bytes. The supervisor closes them itself when its ATTACH returns."""
    monkeypatch.setattr(kvshm._supervisor, "_FIRST_ATTACH_TIMEOUT", 0.2)
    monkeypatch.setattr(kvshm._supervisor, "_ATTACH_TIMEOUT", 60.0)
    monkeypatch.setattr(kvshm._supervisor, "_JOIN_TIMEOUT", 0.05)
    fake = HungDaemon(str(short_dir / "hung.sock"))
    try:
        ix = make_indexer(socket_path=str(short_dir / "hung.sock"))
        core = ix._core
        wait_for(lambda: fake.requests >= 2, "the supervisor's ATTACH to be pending")
        wake_fds = (core._wake_r, core._wake_w)
        ix.shutdown()
        assert core.handoff and not core.supervisor_done, "the supervisor should still be inside its ATTACH"
        for fd in wake_fds:
            os.fstat(fd)  # still open: still the supervisor's
        r, w = os.pipe()
        try:
            assert r not in wake_fds and w not in wake_fds
            fake.release()  # the pending ATTACH fails: the supervisor sees closing and exits
            wait_for(lambda: core.supervisor_done, "the supervisor to exit")
            os.write(w, b"application bytes")
            assert os.read(r, 64) == b"application bytes", "someone read the application's pipe"
        finally:
            os.close(r)
            os.close(w)
        assert core.attach_conn is None
    finally:
        fake.close()


def test_sweep_keeps_what_may_be_alive() -> None:
    """Only old directories of pids that do not run here and where nothing listens are removed."""
    import socket
    import tempfile

    from kvshm._launcher import sweep_stale_dirs

    dead_pid = subprocess.Popen(["true"])  # a pid that just exited
    dead_pid.wait()
    tmp = Path(tempfile.gettempdir())
    old = time.time() - 120
    made = {}
    for label in ("stale", "young", "listening", "alive"):
        pid = os.getpid() if label == "alive" else dead_pid.pid
        d = Path(tempfile.mkdtemp(prefix=f"kvshm-{pid}-", dir=tmp))
        made[label] = d
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(made["listening"] / "kvshmd.sock"))
    listener.listen(1)
    try:
        for label, d in made.items():
            if label != "young":
                os.utime(d, (old, old))
        removed = sweep_stale_dirs()
        assert str(made["stale"]) in removed and not made["stale"].exists()
        for label in ("young", "listening", "alive"):
            assert made[label].exists() and str(made[label]) not in removed, label
    finally:
        listener.close()
        for d in made.values():
            shutil.rmtree(d, ignore_errors=True)


def test_truncated_ring_does_not_kill_the_engine(ring_dir: Path) -> None:
    """The truncated ring file: another process truncates the ring file. The supervisor notices within
    _RING_CHECK_INTERVAL and from then on every publish is dropped and counted instead of faulting (SIGBUS would
    kill the engine, exit -7). Runs the engine in a child process so a SIGBUS cannot take pytest with it."""
    script = textwrap.dedent(f"""
        import json, os, time
        import kvshm._supervisor
        from kvshm import LocalIndexer
        kvshm._supervisor._RING_CHECK_INTERVAL = 0.05
        ix = LocalIndexer(3, 4, ring_dir={str(ring_dir)!r}, ring_bytes=1 << 20)
        for seq in range(10):
            ix.apply_stored(seq, list(range(4)), [seq + 1], parent_hash=seq if seq else None)
        os.truncate(ix.stats()["ring_path"], 0)
        deadline = time.monotonic() + 30
        while not ix.stats()["ring_truncated"] and time.monotonic() < deadline:
            time.sleep(0.01)
        for seq in range(10, 20):  # would be a SIGBUS without the guard
            ix.apply_stored(seq, list(range(4)), [seq + 1], parent_hash=seq)
        st = ix.stats()
        print(json.dumps({{"truncated": st["ring_truncated"], "dropped": st["dropped_events"]}}))
        ix.shutdown()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"the engine died (status {out.returncode}):\n{out.stderr}"
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["truncated"] and res["dropped"] == 10, res


def test_only_the_producer_detaches_its_stream(shared_daemon: SharedDaemon, make_indexer: IndexerFactory) -> None:
    """The foreign DETACH: any same-user client could DETACH a live producer, which then published into a ring
    nobody read while reporting itself attached. Now another client's DETACH is refused; shutdown() detaches on the
    producer's own ATTACH connection, after the daemon applied everything."""
    from kvshm._client import RemoteError

    ix = make_indexer(worker_id=21, socket_path=shared_daemon.socket_path)
    ix.apply_stored(0, toks(0, 4), [1])
    with Client(shared_daemon.socket_path) as c:
        with pytest.raises(RemoteError, match="only the producer detaches it") as e:
            c.detach(21)
        assert e.value.code == "forbidden"
    for seq in range(1, 50):
        ix.apply_stored(seq, toks(4 * seq, 4), [seq + 1], parent_hash=seq)
    assert ix.stats()["attached"]
    assert event_ids(query(ix, 0)) == list(range(50)), "events after the refused DETACH were not applied"
    ix.shutdown()
    st = daemon_stream(shared_daemon.socket_path, 21)
    assert not st["attached"] and st["last_event_id"] == 50  # 49, then the end of the incarnation's Cleared


def test_default_ring_is_a_sealed_memfd(short_dir: Path) -> None:
    """The truncated ring file: without a ring_dir the ring is a memfd sealed against shrinking and growing, so no other
    process can truncate it under the engine's mapping (the truncation fails, publishing goes on, nothing is lost),
    and a killed engine leaves no file. The daemon opens it as /proc/<pid>/fd/<n>, and only the producer's own."""
    ix = LocalIndexer(9, 4)
    try:
        path = ix.stats()["ring_path"]
        assert path.startswith(f"/proc/{os.getpid()}/fd/") and ix.stats()["attached"], ix.stats()
        for seq in range(10):
            ix.apply_stored(seq, toks(4 * seq, 4), [seq + 1], parent_hash=seq if seq else None)
        for size in (0, 4096, 1 << 20):
            with pytest.raises(PermissionError):
                os.truncate(path, size)
        for seq in range(10, 20):
            ix.apply_stored(seq, toks(4 * seq, 4), [seq + 1], parent_hash=seq)
        resp = query(ix, 0)
        assert variant(resp) == "Events" and event_ids(resp) == list(range(20))
        assert ix.stats(daemon=False)["dropped_events"] == 0
    finally:
        ix.shutdown()


def test_daemon_refuses_another_process_fd_path(shared_daemon: SharedDaemon) -> None:
    """A /proc/<pid>/fd/<n> ring path is followed only when pid is the attaching producer itself."""
    from kvshm._client import RemoteError

    with open(os.devnull) as f:
        holder = subprocess.Popen(["sleep", "30"], stdin=f)  # another process with a descriptor (its fd 0)
    try:
        with Client(shared_daemon.socket_path) as c:
            with pytest.raises(RemoteError) as e:
                c.attach(f"/proc/{holder.pid}/fd/0", 1, 4, 0)
        assert e.value.code == "forbidden" and "not a regular file" in e.value.message
    finally:
        holder.kill()
        holder.wait()
