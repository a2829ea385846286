"""The private kvshmd is detached from the engine: not the engine's child nor descendant, so vLLM's
shutdown (which SIGKILLs every descendant of the engine: ``force killing sub process kvshmd``) cannot kill it
before its final drain; it follows the engine's pid instead and, once the engine is gone, drains, publishes and
removes its private directory (``--cleanup-dir``)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import zmq
from vllm_shapes import AllBlocksCleared, BlockStored, decode, recv_batch, vllm_payload

from kvshm._launcher import TOKEN_NAME, PrivateDaemon
from kvshm._proc import proc_stat

from conftest import IndexerFactory
from helpers import pid_gone, wait_for


def ancestors(pid: int) -> list[int]:
    """The ppid chain of ``pid`` up to init, read from /proc (not through the code under test)."""
    chain = []
    while pid > 1:
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
        chain.append(pid)
    return chain


def test_private_daemon_is_not_a_descendant_of_the_engine(make_indexer: IndexerFactory) -> None:
    """Fails before: the daemon was this process's child (subprocess.Popen)."""
    ix = make_indexer()
    pid = ix.stats()["daemon_pid"]
    assert pid is not None and proc_stat(pid) is not None
    assert os.getpid() not in ancestors(pid), ancestors(pid)
    assert os.getsid(pid) != os.getsid(0)  # its own session: a signal to the engine's group does not reach it
    ix.apply_stored(0, list(range(4)), [1])
    assert '"Events"' in ix.get_events_json(0)
    ix.shutdown()
    assert pid_gone(pid)


def test_failed_start_reports_status_and_output(short_dir: Path) -> None:
    """The exit status of a daemon that is not our child still reaches the error (through its waiter)."""
    bad = short_dir / "bad"
    bad.write_text("#!/bin/sh\necho 'kvshmd: boom' >&2\nexit 7\n")
    bad.chmod(0o755)
    d = PrivateDaemon(str(bad))
    with pytest.raises(Exception, match=r"(?s)status 7.*boom"):
        d.start()
    assert d.returncode() == 7 and d.pid is None
    d.stop()


def test_daemon_killed_by_a_signal_is_reported() -> None:
    d = PrivateDaemon()
    try:
        d.start()
        pid = d.pid
        assert pid is not None and d.alive() and d.returncode() is None
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not d.alive(), "the SIGKILLed daemon to be seen dead")
        assert d.returncode() == -signal.SIGKILL and d.pid is None
    finally:
        d.stop()
    assert not os.path.exists(d.dir)


def test_private_dir_carries_the_cleanup_token() -> None:
    """The launcher writes the random token it passes as ``--cleanup-token`` into the private directory (a 0600
    file), and the daemon, SIGTERMed, removes the directory itself. Fails before: there was no token (and kvshmd
    deleted whatever 0700 directory ``--cleanup-dir`` named)."""
    d = PrivateDaemon()
    try:
        d.start()
        argv = d.argv()
        token = argv[argv.index("--cleanup-token") + 1]
        path = os.path.join(d.dir, TOKEN_NAME)
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        with open(path) as f:
            assert f.read() == token + "\n" and len(token) >= 32
        pid = d.pid
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not d.alive(), "the SIGTERMed daemon to exit")
        assert d.returncode() == 0
        assert not os.path.exists(d.dir)  # removed by the daemon (stop() has not run)
    finally:
        d.stop()


ENGINE = textwrap.dedent(
    """
    import json, os, signal, sys
    from kvshm import LocalIndexer, ZmqPublish
    from kvshm import events as ke
    ix = LocalIndexer(5, 4, ring_dir=sys.argv[1], ring_bytes=1 << 20,
                      publish=ZmqPublish(endpoint="ipc://" + sys.argv[2]))
    st = ix.stats()
    print(json.dumps({"pid": st["daemon_pid"], "socket": st["socket_path"]}), flush=True)
    seq = 0
    for line in sys.stdin:
        if line.startswith("warm"):
            ix.apply_batch(seq, [ke.AllBlocksCleared()], ts=0.5)
            seq += 1
        else:
            for i in range(200):
                ix.apply_batch(seq, [ke.BlockStored([1000 + i], None, [i] * 4, 4, None, "GPU", None)], ts=1.0)
                seq += 1
            os.kill(os.getpid(), signal.SIGKILL)  # no hook runs: the daemon alone drains what is in the ring
    """
)


def test_engine_sigkill_daemon_drains_then_leaves_nothing(ring_dir: Path, short_dir: Path) -> None:
    """The engine publishes 200 batches and SIGKILLs itself at once: the daemon (not its child) drains the ring
    and publishes every batch to a subscriber, exits, and removes its private directory."""
    ep = str(short_dir / "pub.sock")
    eng = subprocess.Popen([sys.executable, "-c", ENGINE, str(ring_dir), ep], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    assert eng.stdin is not None and eng.stdout is not None
    zc: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = zc.socket(zmq.SUB)
    try:
        info = json.loads(eng.stdout.readline())
        assert eng.pid not in [info["pid"], *ancestors(info["pid"])]
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVTIMEO, 100)
        sub.connect("ipc://" + ep)
        for _ in range(300):  # PUB drops until the subscription arrives: warm up
            eng.stdin.write("warm\n")
            eng.stdin.flush()
            try:
                sub.recv_multipart()
                break
            except zmq.Again:
                continue
        else:
            pytest.fail("the subscriber never heard the engine's stream")
        eng.stdin.write("go\n")
        eng.stdin.flush()
        assert eng.wait(60) == -signal.SIGKILL
        sub.setsockopt(zmq.RCVTIMEO, 10_000)
        want = [vllm_payload(1.0, [BlockStored([1000 + i], None, [i] * 4, 4, None, "GPU", None)], 0)
                for i in range(200)]
        got: list[bytes] = []
        seqs: list[int] = []
        while len(got) < len(want):  # judged by payload order and increasing seqs (the wire seqs are kvshmd's)
            try:
                _, seq, payload = sub.recv_multipart()
            except zmq.Again:
                break
            if payload in want:
                got.append(payload)
                seqs.append(int.from_bytes(seq, "big"))
        assert got == want, f"{len(got)} of {len(want)} batches published after the engine's SIGKILL"
        assert seqs == sorted(set(seqs))
        # Then the end of the incarnation (docs/lifecycle.md): one [AllBlocksCleared] batch with the next wire seq,
        # flushed before the daemon exits.
        _, _, payload = recv_batch(sub, seqs[-1])
        assert payload == vllm_payload(decode(payload)[0], [AllBlocksCleared()], 0), decode(payload)
        wait_for(lambda: pid_gone(info["pid"]), "the daemon to exit after the engine's death")
        assert not os.path.exists(os.path.dirname(info["socket"])), "the private directory is left behind"
    finally:
        sub.close(0)
        zc.term()
        if eng.poll() is None:
            eng.kill()
            eng.wait()
