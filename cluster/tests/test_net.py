"""The namespaces a crashed run left are removed by the next; a live run's are not (root only)."""

from __future__ import annotations

import os
import subprocess

import pytest
from kvshm_cluster import net

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _names() -> str:
    return net.sh("ip", "netns", "list") + net.sh("ip", "-o", "link", "show")


def test_clean_stale_removes_a_dead_runs_namespaces_and_links() -> None:
    dead = net.Net(pid=_dead_pid())
    live = net.Net()
    try:
        dead.up(1, 1)
        live.up(1, 0)
        sleeper = subprocess.Popen([*dead.exec(dead.node_ns(1)), "sleep", "60"])
        gone = net.clean_stale()
        assert dead.node_ns(1) in gone and dead.router_ns(1) in gone and dead.bridge in gone
        names = _names()
        assert dead.node_ns(1) not in names and dead.bridge not in names
        assert live.node_ns(1) in names and live.bridge in names
        assert sleeper.wait(timeout=10) != 0  # what ran in the dead run's namespace is killed
    finally:
        dead.down()
        live.down()
    assert live.node_ns(1) not in _names()


def test_partition_cuts_and_heal_restores() -> None:
    n = net.Net()
    try:
        n.up(1, 1)
        srv = subprocess.Popen([*n.exec(n.node_ns(1)), "python3", "-m", "http.server", "8000", "--bind",
                                n.node_ip(1)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        get = [*n.exec(n.router_ns(1)), "python3", "-c",
               f"import urllib.request as u; u.urlopen('http://{n.node_ip(1)}:8000/', timeout=2)"]
        try:
            for _ in range(50):
                if subprocess.run(get, capture_output=True).returncode == 0:
                    break
            else:
                pytest.fail("the server never answered")
            n.partition(1, 1)
            assert subprocess.run(get, capture_output=True).returncode != 0
            n.heal(1, 1)
            assert subprocess.run(get, capture_output=True).returncode == 0
        finally:
            srv.kill()
            srv.wait()
    finally:
        n.down()
