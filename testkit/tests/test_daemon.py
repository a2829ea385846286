from __future__ import annotations

import signal
from pathlib import Path

import pytest

from kvshm_testkit import Kvshmd, Timeout, http_get


def test_kvshmd_starts_healthy_serves_metrics_and_stops_cleanly(kvshmd_bin: Path, tmp_path: Path) -> None:
    d = Kvshmd(kvshmd_bin, tmp_path, flags=["--log-format", "json"]).start()
    try:
        assert d.socket == tmp_path / "kvshmd.sock" and d.socket.is_socket()
        assert d.http.startswith("127.0.0.1:") and not d.http.endswith(":0")
        assert http_get(d.healthz_url).status == 200
        m = http_get(d.metrics_url)
        assert m.status == 200 and b"# HELP kvshm_" in m.body
        assert (tmp_path / "xdg").stat().st_mode & 0o777 == 0o700
        assert '"kvshmd serving"' in d.log_text()
    finally:
        rc = d.stop()
    assert rc == 0 and not d.alive()


def test_kvshmd_restart_keeps_its_addresses_and_reads_only_the_new_life(kvshmd_bin: Path, tmp_path: Path) -> None:
    with Kvshmd(kvshmd_bin, tmp_path) as d:
        http, pid = d.http, d.pid
        d.kill()
        assert not d.alive()
        assert http_get(d.healthz_url, 1.0).status == 0
        d.restart()
        assert (d.http, d.starts) == (http, 2) and d.pid != pid
        assert http_get(d.healthz_url).status == 200
        assert d.log_text().count("kvshmd serving") == 1
        assert d.log.read_text().count("kvshmd serving") == 2


def test_kvshmd_pause_and_resume(kvshmd_bin: Path, tmp_path: Path) -> None:
    with Kvshmd(kvshmd_bin, tmp_path) as d:
        d.pause()
        assert http_get(d.healthz_url, 0.5).status == 0  # stopped: the request times out
        d.resume()
        assert http_get(d.healthz_url, 5.0).status == 200
        d.pause()  # stop() resumes a paused daemon before SIGTERM
    assert d.proc is not None and d.proc.returncode == 0


def test_kvshmd_without_http_is_health_checked_over_the_socket(kvshmd_bin: Path, tmp_path: Path) -> None:
    with Kvshmd(kvshmd_bin, tmp_path, http=None) as d:
        assert d.http == "" and "--http" not in d.argv()
        with pytest.raises(ValueError, match="without HTTP"):
            d.url("/healthz")
        assert d.alive()


def test_kvshmd_that_exits_at_start_raises_with_its_log(kvshmd_bin: Path, tmp_path: Path) -> None:
    d = Kvshmd(kvshmd_bin, tmp_path, flags=["--no-such-flag"])
    with pytest.raises(RuntimeError, match="no-such-flag"):
        d.start()
    d.stop()


def test_kvshmd_that_never_answers_times_out(tmp_path: Path) -> None:
    # Not kvshmd: a program that ignores its flags and never listens; start's wait is bounded.
    fake = tmp_path / "silent"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    d = Kvshmd(fake, tmp_path)
    with pytest.raises(Timeout, match="kvshmd healthy"):
        d.start(timeout=0.5)
    assert not d.alive() and d.proc is not None and d.proc.returncode == -signal.SIGKILL
