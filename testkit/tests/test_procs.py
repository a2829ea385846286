from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from kvshm_testkit import LIVE, Proc, Timeout, cpu_seconds, kill_live, proc_state, rss_bytes, wait_until


def test_wait_until_returns_once_the_condition_holds() -> None:
    calls = []

    def cond() -> bool:
        calls.append(1)
        return len(calls) >= 3

    wait_until("three calls", cond, 5.0, interval=0.01)
    assert len(calls) == 3


def test_wait_until_names_what_timed_out() -> None:
    with pytest.raises(Timeout, match="never: not within 0 s"):
        wait_until("never", lambda: False, 0.05, interval=0.01)


def test_proc_logs_output_and_stops_its_whole_group(tmp_path: Path) -> None:
    # A shell with a grandchild in its group: SIGTERM to the leader alone would leave the grandchild.
    p = Proc("sh", ["sh", "-c", "echo hello; sleep 60 & wait"], tmp_path / "sh.log")
    assert p.pid in LIVE
    wait_until("hello logged", lambda: "hello" in p.log_text(), 5.0, interval=0.01)
    assert p.alive() and p.group_alive()
    assert p.stop(signal.SIGTERM, 5.0, group=True)
    assert not p.group_alive()
    assert p.returncode == -signal.SIGTERM
    assert p.pid not in LIVE


def test_proc_stop_sigkills_a_child_that_ignores_the_signal(tmp_path: Path) -> None:
    p = Proc("stubborn", ["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done"], tmp_path / "s.log")
    wait_until("trap set", lambda: "ready" in p.log_text(), 5.0, interval=0.01)
    assert not p.stop(signal.SIGTERM, 0.3)
    assert p.returncode == -signal.SIGKILL


def test_proc_ask_speaks_json_lines(tmp_path: Path) -> None:
    script = "import json,sys\nprint(json.dumps({'ready': 1}), flush=True)\nfor l in sys.stdin:\n" \
             "    print(json.dumps({'twice': 2 * json.loads(l)['n']}), flush=True)\n"
    p = Proc("child", [sys.executable, "-c", script], tmp_path / "c.log", pipes=True)
    try:
        assert p.ask(None, 10.0) == {"ready": 1}
        assert p.ask({"n": 21}, 10.0) == {"twice": 42}
    finally:
        p.kill()
    assert not p.alive()


def test_proc_ask_is_bounded_and_reports_an_early_exit(tmp_path: Path) -> None:
    quiet = Proc("quiet", ["sleep", "60"], tmp_path / "q.log", pipes=True)
    t0 = time.monotonic()
    with pytest.raises(Timeout, match="quiet: no reply"):
        quiet.ask(None, 0.2)
    assert time.monotonic() - t0 < 5.0
    quiet.kill()
    gone = Proc("gone", ["true"], tmp_path / "g.log", pipes=True)
    with pytest.raises(RuntimeError, match="gone: exited"):
        gone.ask({"op": "x"}, 10.0)
    gone.reap()


def test_kill_live_ends_every_child_left(tmp_path: Path) -> None:
    ps = [Proc(f"s{i}", ["sleep", "60"], tmp_path / f"{i}.log") for i in range(2)]
    kill_live()
    assert all(not p.alive() for p in ps)
    assert not any(p.pid in LIVE for p in ps)


def test_proc_readings_of_a_live_and_a_gone_process(tmp_path: Path) -> None:
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(60)"
    p = Proc("spin", [sys.executable, "-c", spin], tmp_path / "p.log")
    try:
        wait_until("0.3 s of CPU", lambda: cpu_seconds(p.pid) >= 0.25, 10.0, interval=0.02)
        assert rss_bytes(p.pid) > 1 << 20
        assert rss_bytes(p.pid, "NoSuchField") == 0
    finally:
        p.kill()
    assert cpu_seconds(p.pid) == 0.0
    assert rss_bytes(p.pid) == 0


def test_proc_state_follows_stop_and_continue(tmp_path: Path) -> None:
    p = Proc("sleeper", ["sleep", "60"], tmp_path / "s.log")
    try:
        wait_until("sleeping", lambda: proc_state(p.pid) == "S", 5.0, interval=0.01)
        p.send(signal.SIGSTOP)
        wait_until("stopped", lambda: proc_state(p.pid) == "T", 5.0, interval=0.01)
        p.send(signal.SIGCONT)
        wait_until("running", lambda: proc_state(p.pid) == "S", 5.0, interval=0.01)
    finally:
        p.kill()
    assert proc_state(p.pid) == ""
