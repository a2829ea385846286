"""The loopback-only network namespace the stack runs in.

Dynamo 1.6.1 binds its event-plane PUB sockets on 0.0.0.0 (hard-coded), so the stack runs where the only
interface is loopback: a namespace this module creates (``ip netns add``, ``lo`` up) and removes. The harness
re-runs itself inside it (``ip netns exec``), so every process it starts, and every request and subscription it
makes, stays inside; the outer process only creates, waits and removes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

INSIDE_ENV = "KVSHM_DYNAMO_NETNS"  # set in the inner run: the namespace's name


def inside() -> str | None:
    """The namespace this process runs in (set by :func:`run_inside`), or None outside."""
    return os.environ.get(INSIDE_ENV) or None


def run_inside(argv: Sequence[str], timeout: float) -> int:
    """Create ``kvshm-dyn-<pid>`` with only ``lo`` (up), run ``argv`` in it (bounded by ``timeout`` seconds: then
    SIGKILLed), remove it; the exit status of ``argv`` (124 when it ran out of time)."""
    name = f"kvshm-dyn-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        links = subprocess.run(["ip", "-n", name, "-o", "link"], check=True, capture_output=True, text=True)
        assert [ln.split(":")[1].strip() for ln in links.stdout.splitlines()] == ["lo"], links.stdout
        env = dict(os.environ, **{INSIDE_ENV: name})
        with subprocess.Popen(["ip", "netns", "exec", name, *argv], env=env, start_new_session=True) as p:
            try:
                return p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                print(f"kvshm_dynamo: the run did not end within {timeout:.0f} s: killed", file=sys.stderr)
                os.killpg(p.pid, 9)
                p.wait()
                return 124
    finally:
        _kill_left(name)
        subprocess.run(["ip", "netns", "del", name], check=False)


def _kill_left(name: str) -> None:
    """SIGKILL whatever the run left in the namespace (only processes it started can be there)."""
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False).stdout
    for pid in out.split():
        try:
            os.kill(int(pid), 9)
        except ProcessLookupError:
            pass
