"""Scenarios: ring corruption and truncation, SIGKILL/SIGSTOP of kvshmd and of producers (also inside checkpoint
writes), checkpoint corruption, many workers, a state dir on a tiny tmpfs."""

from __future__ import annotations

import os
import signal
import stat
import struct
import subprocess
import tempfile
import time

from harness import (
    Ctx,
    Daemon,
    Producer,
    forget,
    healthy,
    judge,
    producer,
    publish_some,
    restart_daemon,
)


def sc_ring_scribble(ctx: Ctx) -> None:
    """Scribble random data words and header words of an attached ring while its producer publishes."""
    rng = ctx.rng
    with producer(ctx, 1) as p:
        w = p.workers[0]
        p.pub(w, 200)
        judge(ctx, w, "publishing (before scribbling)")
        ring = p.rings[w]
        size = os.path.getsize(ring)
        fd = os.open(ring, os.O_RDWR)
        try:
            for _ in range(rng.randint(1, 4)):
                r = rng.random()
                if r < 0.5:
                    off = 4096 + rng.randrange(0, size - 4096 - 8) // 8 * 8
                    what = "ring data word"
                else:
                    off, what = rng.choice([(0x00, "magic"), (0x08, "version"), (0x10, "capacity"),
                                            (0x18, "max_record"), (0x30, "epoch"), (0x38, "worker_id"),
                                            (0x40, "kv_block_size"), (0x48, "state"), (0x80, "tail"), (0x100, "head"),
                                            (0x180, "dropped_events"), (0x190, "loss_first_seq"),
                                            (0x1A0, "loss_pending")])
                val = rng.choice([0, 1, 2, (1 << 64) - 1, rng.randrange(1 << 64), 1 << 40])
                os.pwrite(fd, struct.pack("<Q", val), off)
                ctx.fault("ring scribble: " + what)
                p.pub(w, rng.randint(1, 50))
        finally:
            os.close(fd)
        p.pub(w, 50)
        if not p.check() or not ctx.daemon or not ctx.daemon.check():
            return
        p.clear(w)  # the engine's next Cleared re-bases the stream
        p.pub(w, 100)
        judge(ctx, w, "ring scribbles and a Cleared")
        healthy(ctx, "ring scribbles")


def sc_ring_truncate(ctx: Ctx) -> None:
    """Truncate an attached ring file (to 0, one page, or half) while its producer publishes. Half the runs use
    LocalIndexer's default ring, a sealed memfd: the truncation must be refused (EPERM) and nothing else happen."""
    rng = ctx.rng
    memfd = rng.random() < 0.5
    with producer(ctx, 1, memfd=memfd) as p:
        w = p.workers[0]
        p.pub(w, 100)
        ring = p.rings[w]
        size = os.path.getsize(ring)
        new = rng.choice([0, 4096, size // 2])
        if memfd:
            try:
                os.truncate(ring, new)
            except PermissionError:
                ctx.fault("memfd ring truncation refused")
                p.pub(w, 50)
                judge(ctx, w, "refused truncation of a sealed memfd ring")
                healthy(ctx, "refused ring truncation")
                return
            ctx.fail("wrong answers", f"the memfd ring {ring} of worker {w} could be truncated (not sealed)")
            return
        os.truncate(ring, new)
        delay = rng.uniform(0, 2)
        ctx.fault(f"ring truncated to {new} bytes")
        time.sleep(delay)  # the producer's supervisor checks the file size every second (issue 10 #5 fix)
        ctx.scenario = "ring_truncate:publish"  # only the producer's death here is the known failure
        r = p.pub(w, 50)
        time.sleep(0.5)
        ok_p = p.check()
        ctx.scenario = "ring_truncate"
        if r is not None:
            st = p.call({"op": "stats", "worker": w})
            ps = st["stats"] if st else {}
            ctx.fault("ring truncated, producer alive")
            ctx.fig.details.append(
                f"[ring_truncate] worker {w}: truncated to {new} of {size} bytes, published 50 events {delay:.2f} s "
                f"later; producer: ring_truncated={ps.get('ring_truncated')}, "
                f"dropped_events={ps.get('dropped_events')}")
        ok_d = ctx.daemon is not None and ctx.daemon.check()
        if ok_d:
            healthy(ctx, "ring truncation")
        if ok_d and ok_p:
            ctx.scenario = "ring_truncate:judge"
            judge(ctx, w, "ring truncation", deadline=5)
            ctx.scenario = "ring_truncate"


def sc_daemon_kill(ctx: Ctx, base: Producer) -> None:
    """SIGKILL the daemon at a random instant while producers publish (sometimes just as a checkpoint file
    appears in the state dir), restart it on the same socket and state dir; producers reattach by themselves.
    One to three kills in a row, each judged."""
    for _ in range(ctx.rng.randint(1, 3)):
        _daemon_kill_once(ctx, base)


def _daemon_kill_once(ctx: Ctx, base: Producer) -> None:
    d = ctx.daemon
    assert d is not None
    rng = ctx.rng
    in_ckpt = rng.random() < 0.5
    for w in base.workers:
        base.send({"op": "pub", "worker": w, "n": 400, "pace_us": 500})
    if in_ckpt:
        before = _state_files(d.state_dir)
        t_end = time.monotonic() + 5
        while time.monotonic() < t_end and _state_files(d.state_dir) == before:
            pass
        what = "SIGKILL daemon as a checkpoint file changed"
    else:
        time.sleep(rng.uniform(0, 0.4))
        what = "SIGKILL daemon at a random instant"
    d.check()
    d.signal(signal.SIGKILL)
    ctx.fault(what)
    time.sleep(rng.uniform(0, 0.3))
    restart_daemon(ctx, d)
    base.call({"op": "stats", "worker": base.workers[0]})  # collects the pub replies (the truth advances below)
    for w in base.workers:
        ctx.truths[w].advance(400)
        ctx.acked[w] = ctx.truths[w].last_seq
        base.pub(w, 20)
    for w in base.workers:
        judge(ctx, w, what)


def _state_files(path: str) -> dict[str, int] | None:
    """Name -> mtime of the files in a state dir (None when it changed while being listed)."""
    try:
        return {n: os.stat(os.path.join(path, n)).st_mtime_ns for n in os.listdir(path)}
    except FileNotFoundError:
        return None


def sc_daemon_stop(ctx: Ctx) -> None:
    """SIGSTOP the daemon, publish into a 64 KiB ring until events drop, SIGCONT, publish nothing more: the very
    next answer must report the loss (issue 10 #1); a Cleared then re-bases the stream to a complete answer."""
    d = ctx.daemon
    assert d is not None
    with producer(ctx, 1, ring_bytes=64 << 10) as p:
        w = p.workers[0]
        p.pub(w, 50)
        judge(ctx, w, "publishing (before SIGSTOP)")
        os.kill(d.pid, signal.SIGSTOP)
        ctx.fault("SIGSTOP daemon")
        try:
            dropped = 0
            for _ in range(200):
                r = p.pub(w, 50)
                if r is None or r["dropped"] > 0:
                    dropped = r["dropped"] if r else 0
                    break
            p.pub(w, ctx.rng.randint(0, 60))
        finally:
            os.kill(d.pid, signal.SIGCONT)
        if not dropped:
            ctx.fig.details.append("[daemon_stop] the ring never dropped (no loss to report)")
        judge(ctx, w, f"SIGSTOP/SIGCONT with {dropped}+ drops")
        p.clear(w)
        p.pub(w, 30)
        judge(ctx, w, "a Cleared after the drops")


def sc_producer_kill(ctx: Ctx) -> None:
    """SIGKILL a producer mid-publish: the dead stream stays queryable and, once kvshmd saw the pid gone, ends its
    incarnation with a Cleared under the id after the last event it drained (docs/lifecycle.md: none of its blocks);
    then start its successor for the same worker (a new epoch: the worker's cache starts empty)."""
    rng = ctx.rng
    ws = [ctx.new_worker()]
    p = Producer(ctx, ws)
    w = ws[0]
    try:
        p.pub(w, 100)
        p.send({"op": "pub", "worker": w, "n": 5000, "pace_us": 0})
        time.sleep(rng.uniform(0, 0.5))
        p.kill()
        ctx.fault("SIGKILL producer mid-publish")
        judge(ctx, w, "producer SIGKILL")
        ctx.lives[w] += 1
        p = Producer(ctx, ws)
        ctx.fault("producer restart (new epoch)")
        p.pub(w, 100)
        judge(ctx, w, "producer restart")
    finally:
        p.quit()
        forget(ctx, ws)


def sc_producer_stop(ctx: Ctx) -> None:
    """SIGSTOP a producer mid-publish for a random while, SIGCONT it, publish on: nothing lost, nothing invented."""
    rng = ctx.rng
    with producer(ctx, 1) as p:
        w = p.workers[0]
        p.send({"op": "pub", "worker": w, "n": 1000, "pace_us": 200})
        time.sleep(rng.uniform(0, 0.2))
        os.kill(p.pid, signal.SIGSTOP)
        ctx.fault("SIGSTOP producer")
        time.sleep(rng.uniform(0.1, 1.5))
        # While it is stopped the daemon holds a prefix: that prefix must be right.
        ctx.acked[w] = None
        judge(ctx, w, "producer SIGSTOP (stopped)")
        os.kill(p.pid, signal.SIGCONT)
        p.stopped_since = True  # type: ignore[attr-defined]
        p.call({"op": "stats", "worker": w})
        p.stopped_since = False  # type: ignore[attr-defined]
        ctx.truths[w].advance(1000)
        ctx.acked[w] = ctx.truths[w].last_seq
        p.pub(w, 20)
        judge(ctx, w, "producer SIGCONT")


def sc_many_workers(ctx: Ctx) -> None:
    """64 workers on one daemon (8 processes x 8 LocalIndexers), publishing at once; every one judged."""
    procs: list[Producer] = []
    try:
        for _ in range(8):
            procs.append(Producer(ctx, [ctx.new_worker() for _ in range(8)], ring_bytes=256 << 10))
        n = 30 if ctx.short else 150
        for p in procs:
            for w in p.workers:
                p.send({"op": "pub", "worker": w, "n": n, "pace_us": 0})
        for p in procs:
            p.call({"op": "stats", "worker": p.workers[0]}, timeout=120)
            for w in p.workers:
                ctx.truths[w].advance(n)
                ctx.acked[w] = ctx.truths[w].last_seq
        ctx.fault("64 workers on one daemon")
        for p in procs:
            for w in p.workers:
                judge(ctx, w, "64 workers publishing")
    finally:
        for p in procs:
            p.quit()
            forget(ctx, p.workers)


def sc_tmpfs_state(ctx: Ctx) -> None:
    """A daemon whose --state-dir is a 64 KiB tmpfs: checkpoints fail (disk full) while running, then SIGKILL; the
    successor must not answer a silent wrong state. Needs root to mount; skipped (and said) otherwise."""
    if os.geteuid() != 0:
        ctx.fig.details.append("[tmpfs_state] skipped: not root, cannot mount a tmpfs")
        return
    mnt = tempfile.mkdtemp(prefix="tmpfs-", dir=ctx.work)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", mnt], capture_output=True)
    if r.returncode != 0:
        ctx.fig.details.append(f"[tmpfs_state] skipped: mount failed: {r.stderr.decode().strip()}")
        return
    main = ctx.daemon
    sock = os.path.join(tempfile.mkdtemp(prefix="sock-", dir=ctx.work), "k.sock")
    try:
        ctx.daemon = Daemon(ctx, sock, os.path.join(mnt, "state"), "200ms")
        with producer(ctx, 2) as p:
            for _ in range(6):
                publish_some(ctx, p, 250)
            ctx.fault("state dir on a full 64 KiB tmpfs")
            time.sleep(0.5)
            for w in p.workers:
                judge(ctx, w, "checkpoints on a full tmpfs")
            d = ctx.daemon
            d.signal(signal.SIGKILL)
            ctx.fault("SIGKILL daemon with a full state dir")
            restart_daemon(ctx, d)
            publish_some(ctx, p, 20)
            for w in p.workers:
                judge(ctx, w, "restart after checkpoints on a full tmpfs")
        ctx.daemon.stop()
    finally:
        ctx.daemon = main
        subprocess.run(["umount", mnt], check=False)


def sc_ckpt_corrupt(ctx: Ctx, base: Producer) -> None:
    """SIGKILL the daemon and replace its checkpoints by a symlink to /dev/zero, a FIFO, garbage or a truncated
    copy (issue 10 #7), then restart it: it must come up at once and answer right or say what it lost."""
    d = ctx.daemon
    assert d is not None
    rng = ctx.rng
    publish_some(ctx, base, 50)
    time.sleep(0.5)  # a checkpoint (200ms interval)
    d.signal(signal.SIGKILL)
    how = rng.choice(["symlink to /dev/zero", "FIFO", "garbage", "truncated", "emptied"])
    names = [n for n in os.listdir(d.state_dir) if n.endswith(".ckpt")]
    for n in names:
        path = os.path.join(d.state_dir, n)
        if how == "truncated":
            # Only regular files: a file an earlier cycle made a symlink to /dev/zero or a FIFO stays while its
            # worker never reattaches (daemon/doc.go, Caveats), and truncate would follow it (EINVAL).
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.truncate(path, max(0, os.path.getsize(path) // 2))
            continue
        os.unlink(path)
        if how == "symlink to /dev/zero":
            os.symlink("/dev/zero", path)
        elif how == "FIFO":
            os.mkfifo(path, 0o600)
        else:
            with open(path, "wb") as f:
                f.write(os.urandom(rng.randint(1, 4096)) if how == "garbage" else b"")
            os.chmod(path, 0o600)
    ctx.fault(f"SIGKILL daemon, checkpoints replaced: {how} ({len(names)} files)")
    ctx.scenario = f"ckpt_corrupt:{how}"
    t0 = time.monotonic()
    before = sum(ctx.fig.failures.values()) + sum(ctx.fig.known.values())
    try:
        restart_daemon(ctx, d)
    except RuntimeError as e:
        ctx.fail("hangs", f"kvshmd did not come up over checkpoints ({how}): {e}")
        raise
    if time.monotonic() - t0 > 10:
        ctx.fail("hangs", f"kvshmd took {time.monotonic() - t0:.1f} s to come up over checkpoints ({how})")
    publish_some(ctx, base, 20)
    for w in base.workers:
        judge(ctx, w, f"checkpoints replaced ({how})")
    if sum(ctx.fig.failures.values()) + sum(ctx.fig.known.values()) > before:
        # A wedged daemon would fail every later scenario: SIGKILL it, remove what wedged it, start a new one.
        d = ctx.daemon
        assert d is not None
        d.signal(signal.SIGKILL)
        for n in os.listdir(d.state_dir):
            os.unlink(os.path.join(d.state_dir, n))
        restart_daemon(ctx, d)
        publish_some(ctx, base, 20)
