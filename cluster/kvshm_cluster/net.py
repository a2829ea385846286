"""The cluster's network: one namespace per node and per router, each a veth on one bridge in the root namespace.

Names carry the harness's pid (``kvc-<pid>-n3``, links ``kvc<pid>n3``), so a run removes what a crashed run left
(its pid is gone) and never what a live one uses. Addresses: ``10.S.0.1/16`` on the bridge, ``10.S.1.i`` node i,
``10.S.2.j`` router j, ``S = 100 + pid % 100``. A partition is iptables in the router's namespace (REJECT with a
TCP reset for the node's address, both ways) plus ``ss -K`` of the established connections on both sides: a
partition long enough that TCP gave up. What the publishers send meanwhile is lost, and the router reconnects
after the heal. Without the ``ss -K`` nothing is lost (measured): the packets are dropped, TCP retransmits into
the heal and ZMQ's queues carry the rest, as for the slow router.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from dataclasses import dataclass, field

PREFIX = "kvc"


def sh(*argv: str, check: bool = True) -> str:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r.stdout


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def clean_stale() -> list[str]:
    """Removes the namespaces (and their processes) and links of runs whose harness is gone."""
    gone: list[str] = []
    for line in sh("ip", "netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"{PREFIX}-(\d+)-\w+", name)
        if m and not _alive(int(m.group(1))):
            _kill_ns(name)
            gone.append(name)
    for line in sh("ip", "-o", "link", "show").splitlines():
        m = re.match(rf"\d+: ({PREFIX}(\d+)[a-z]\d*)[@:]", line)
        if m and not _alive(int(m.group(2))):
            sh("ip", "link", "del", m.group(1), check=False)
            gone.append(m.group(1))
    return gone


def _kill_ns(name: str) -> None:
    for pid in sh("ip", "netns", "pids", name, check=False).split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    sh("ip", "netns", "del", name, check=False)


@dataclass
class Net:
    pid: int = field(default_factory=os.getpid)
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)  # the veths' host ends
    blocked: set[tuple[int, int]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.subnet = 100 + self.pid % 100
        self.bridge = f"{PREFIX}{self.pid}b"

    def node_ns(self, i: int) -> str:
        return f"{PREFIX}-{self.pid}-n{i}"

    def router_ns(self, j: int) -> str:
        return f"{PREFIX}-{self.pid}-r{j}"

    def node_ip(self, i: int) -> str:
        return f"10.{self.subnet}.1.{i}"

    def router_ip(self, j: int) -> str:
        return f"10.{self.subnet}.2.{j}"

    def up(self, nodes: int, routers: int) -> None:
        """The bridge and every namespace (nodes 1..nodes, routers 1..routers)."""
        if nodes > 250 or routers > 250:
            raise ValueError("at most 250 nodes and 250 routers")
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"10.{self.subnet}.0.1/16", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for i in range(1, nodes + 1):
            self._ns(self.node_ns(i), f"{PREFIX}{self.pid}n{i}", self.node_ip(i))
        for j in range(1, routers + 1):
            self._ns(self.router_ns(j), f"{PREFIX}{self.pid}r{j}", self.router_ip(j))

    def _ns(self, ns: str, host_if: str, ip: str) -> None:
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
        self.links.append(host_if)
        sh("ip", "link", "set", host_if, "master", self.bridge, "up")
        for cmd in (["addr", "add", f"{ip}/16", "dev", "eth0"], ["link", "set", "eth0", "up"],
                    ["link", "set", "lo", "up"]):
            sh("ip", "-n", ns, *cmd)

    def exec(self, ns: str) -> list[str]:
        """The argv prefix that runs a command inside ``ns``."""
        return ["ip", "netns", "exec", ns]

    def partition(self, node: int, router: int) -> None:
        ns, ip = self.router_ns(router), self.node_ip(node)
        for chain, flag in (("INPUT", "-s"), ("OUTPUT", "-d")):
            sh(*self.exec(ns), "iptables", "-I", chain, flag, ip, "-p", "tcp", "-j", "REJECT", "--reject-with",
               "tcp-reset")
        # Established connections would survive (TCP retransmits into the heal): end them both sides, as a
        # partition past TCP's patience does.
        sh(*self.exec(ns), "ss", "-K", "dst", ip, check=False)
        sh(*self.exec(self.node_ns(node)), "ss", "-K", "dst", self.router_ip(router), check=False)
        self.blocked.add((node, router))

    def heal(self, node: int, router: int) -> None:
        ns, ip = self.router_ns(router), self.node_ip(node)
        for chain, flag in (("INPUT", "-s"), ("OUTPUT", "-d")):
            sh(*self.exec(ns), "iptables", "-D", chain, flag, ip, "-p", "tcp", "-j", "REJECT", "--reject-with",
               "tcp-reset", check=False)
        self.blocked.discard((node, router))

    def rx_bytes(self, ns: str) -> int:
        """Bytes received on ``ns``'s eth0 (the wire into a router)."""
        return self.rx(ns)[0]

    def rx(self, ns: str) -> tuple[int, int]:
        """(bytes, packets) received on ``ns``'s eth0."""
        out = sh(*self.exec(ns), "cat", "/sys/class/net/eth0/statistics/rx_bytes",
                 "/sys/class/net/eth0/statistics/rx_packets").split()
        return int(out[0]), int(out[1])

    def down(self) -> None:
        """Every veth, namespace (killing what still runs in it), then the bridge. The veths go first, explicitly:
        a namespace's deletion takes its veth pair along only later, in the kernel's cleanup work, and a Net of the
        same pid made meanwhile (the next test) would find the host end's name taken."""
        for link in reversed(self.links):
            sh("ip", "link", "del", link, check=False)
        self.links.clear()
        for ns in reversed(self.namespaces):
            _kill_ns(ns)
        self.namespaces.clear()
        sh("ip", "link", "del", self.bridge, check=False)
