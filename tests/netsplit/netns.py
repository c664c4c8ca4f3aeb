"""Several hosts on one machine, and real network splits between them: network namespaces
joined by a bridge, with packet drops made by ``tc``.

Role: a :class:`Lab` makes one namespace per named node, each with a veth pair whose host
end is a port of a bridge in the root namespace, and addresses from a private /24 of its
own (the bridge, i.e. the root namespace where the test itself runs, is ``.1``; the nodes
``.2`` on). Every node reaches every other node and the root namespace. A test runs
processes inside a node (:meth:`Lab.popen`), then splits the network:

- :meth:`Lab.cut_one_way` ``(src, dst)``: every IP packet from ``src`` to ``dst`` vanishes;
  the other direction still flows (an asymmetric split).
- :meth:`Lab.cut` ``(a, b)``: both directions.
- :meth:`Lab.heal`: every cut is removed; the packets flow again.

How a packet vanishes (``tc`` alone: this kernel has neither ``netem`` nor the ``gact``
drop action, and there is no iptables): each veth end carries an HTB root qdisc whose
unclassified traffic goes straight through (HTB's direct queue, no shaping) and one class
``1:2`` whose leaf qdisc is ``blackhole``. A cut is a ``u32`` filter that classifies the
packets of one direction into ``1:2``. A packet headed into namespace ``dst`` is caught on
the egress of ``dst``'s host-side veth (in the bridge, between the two hosts), matched on
its source address; a packet headed for the root namespace is caught on the egress of
``src``'s own veth, matched on its destination. ``blackhole`` reports the packet as sent,
so neither end sees an error or a reset: TCP connections stay open, segments are
retransmitted into the void, and the programs see timeouts, as on a real network split.
ARP is not IP and is never dropped, so neighbours stay resolved and a heal is immediate
(retransmissions get through at the next retry).

Names and teardown: everything a lab makes is named from a tag ``hr<pid, 5 base-36
digits><lab counter>``: namespaces ``<tag>-<node>``, the bridge ``<tag>br``, host veth ends
``<tag>h<i>``. :meth:`Lab.close` kills the processes it started (and anything else left in
its namespaces), deletes the namespaces (which deletes the veth pairs) and the bridge; it
runs even when a test fails (use the lab as a context manager). :func:`sweep` removes what
a crashed earlier run left behind: the names whose pid is no longer running (or is this
process, for a lab it no longer holds). The /24 is derived from the pid and counter and
moved on past any subnet already in use on this machine, so parallel runs do not collide.

Requirements: root and iproute2 (``ip``, ``tc``). :func:`require_netns` skips a test
without them (with ``CI`` set, a missing ``ip`` fails: CI installs iproute2).

Imports nothing of Headrace: it is a network, not a broker.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import pytest

log = logging.getLogger(__name__)

HOST = "host"
"""The node name of the root namespace (where the test runs): the bridge's address."""

_TAG_RE = re.compile(r"^hr([0-9a-z]{5})([0-9a-z])(?:-|br$|h\d+$)")
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
_DROP_CLASS = "1:2"
_live_tags: set[str] = set()
_counter = [0]  # labs made by this process (names the next one)


def require_netns() -> None:
    """Skip the calling test unless it can make network namespaces (root, ``ip`` and
    ``tc``). With ``CI`` set, missing programs fail the test instead (CI installs
    iproute2)."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        message = f"{' and '.join(missing)} not found (apt-get install iproute2)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must install iproute2 (.ci/run)")
        pytest.skip(message)
    if os.geteuid() != 0:
        pytest.skip("network namespaces (ip netns, veth, tc) need root; run the tests as root")


def _base36(n: int, width: int) -> str:
    digits = ""
    for _ in range(width):
        n, d = divmod(n, 36)
        digits = _DIGITS[d] + digits
    return digits


def _run(*args: str, netns: str | None = None, check: bool = True) -> str:
    """Run ``ip`` or ``tc`` (inside ``netns`` with ``-n``); its stdout.

    Raises:
        RuntimeError: it failed and ``check`` is set (with its stderr).
    """
    argv = [args[0], *(("-n", netns) if netns else ()), *args[1:]]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=10)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_stale(tag: str, pid: int) -> bool:
    if pid == os.getpid():
        return tag not in _live_tags
    return not _pid_alive(pid)


def _kill_netns_processes(netns: str) -> None:
    """SIGKILL every process still inside ``netns`` (ours: only labs put them there)."""
    for line in _run("ip", "netns", "pids", netns, check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(line), signal.SIGCONT)
            os.kill(int(line), signal.SIGKILL)


def sweep() -> list[str]:
    """Delete namespaces and links a crashed earlier run left (module docstring); returns
    their names. Labs of live processes, and this process's live labs, are left alone."""
    removed: list[str] = []
    for line in _run("ip", "netns", "list", check=False).splitlines():
        name = line.split()[0] if line.strip() else ""
        match = _TAG_RE.match(name)
        if match and _is_stale(name[:8], int(match.group(1), 36)):
            _kill_netns_processes(name)
            _run("ip", "netns", "delete", name, check=False)
            removed.append(name)
    for line in _run("ip", "-o", "link", "show", check=False).splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        match = _TAG_RE.match(name)
        if match and _is_stale(name[:8], int(match.group(1), 36)):
            _run("ip", "link", "delete", name, check=False)
            removed.append(name)
    if removed:
        log.warning("netns sweep: removed leftovers of an earlier run: %s", removed)
    return removed


def _subnets_in_use() -> list[ipaddress.IPv4Network]:
    found: list[ipaddress.IPv4Network] = []
    for line in _run("ip", "-4", "-o", "addr", "show", check=False).splitlines():
        with contextlib.suppress(IndexError, ValueError):
            found.append(ipaddress.IPv4Interface(line.split()[3]).network)
    for line in _run("ip", "-4", "route", "show", "table", "all", check=False).splitlines():
        first = line.split()[0] if line.strip() else ""
        with contextlib.suppress(ValueError):
            found.append(ipaddress.IPv4Network(first, strict=False))
    return found


def _free_subnet(seed: int) -> ipaddress.IPv4Network:
    """A /24 in 10.64.0.0/10 that overlaps nothing on this machine, starting from ``seed``."""
    used = _subnets_in_use()
    for step in range(64 * 256):
        index = (seed + step) % (64 * 256)
        net = ipaddress.IPv4Network(f"10.{64 + index // 256}.{index % 256}.0/24")
        if not any(net.overlaps(other) for other in used if other.prefixlen > 0):
            return net
    raise RuntimeError("no free /24 in 10.64.0.0/10 for a network namespace lab")


@dataclass(frozen=True)
class Node:
    """One host of the lab.

    Attributes:
        name: the test's name for it (``b1``, ``e2``; :data:`HOST` for the root namespace).
        netns: its namespace (``""`` for the root namespace).
        address: its IPv4 address on the lab's bridge.
        host_veth: the root-side end of its veth pair (``""`` for the root namespace).
    """

    name: str
    netns: str
    address: str
    host_veth: str

    @property
    def is_host(self) -> bool:
        return not self.netns


@dataclass
class Lab:
    """Namespaces joined by a bridge, and the cuts between them (module docstring).

    Start with :meth:`open` (or ``with Lab([...]) as lab``), end with :meth:`close`.
    Not thread-safe: one test drives it.

    Args:
        names: the nodes to make, one namespace each (not :data:`HOST`).
    """

    names: Sequence[str]
    tag: str = ""
    subnet: ipaddress.IPv4Network | None = None
    nodes: dict[str, Node] = field(default_factory=dict)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    cuts: set[tuple[str, str]] = field(default_factory=set)
    _filtered: set[tuple[str, str]] = field(default_factory=set)

    def __enter__(self) -> Lab:
        self.open()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def host(self) -> Node:
        """The root namespace, where the test (and its clients) run."""
        return self.nodes[HOST]

    def node(self, name: str) -> Node:
        return self.nodes[name]

    def open(self) -> None:
        """Sweep leftovers, then make the bridge, the namespaces and their veth pairs.

        Raises:
            RuntimeError: an ``ip``/``tc`` command failed (whatever was made is removed).
        """
        sweep()
        self.tag = f"hr{_base36(os.getpid(), 5)}{_base36(_counter[0], 1)}"
        _counter[0] += 1
        _live_tags.add(self.tag)
        self.subnet = _free_subnet(os.getpid() * 7 + _counter[0])
        hosts = self.subnet.hosts()
        bridge = f"{self.tag}br"
        try:
            _run("ip", "link", "add", bridge, "type", "bridge")
            self.nodes[HOST] = Node(HOST, "", str(next(hosts)), "")
            _run("ip", "addr", "add", f"{self.host.address}/24", "dev", bridge)
            _run("ip", "link", "set", bridge, "up")
            for i, name in enumerate(self.names):
                self._add_node(name, str(next(hosts)), f"{self.tag}h{i}", bridge)
        except BaseException:
            self.close()
            raise
        log.info("netns lab %s on %s: %s", self.tag, self.subnet, list(self.names))

    def _add_node(self, name: str, address: str, host_veth: str, bridge: str) -> None:
        assert name != HOST, name
        assert name not in self.nodes, name
        netns = f"{self.tag}-{name}"
        _run("ip", "netns", "add", netns)
        self.nodes[name] = Node(name, netns, address, host_veth)
        _run(
            "ip", "link", "add", host_veth, "type", "veth", "peer", "name", "veth0", "netns", netns
        )
        _run("ip", "link", "set", host_veth, "master", bridge)
        _run("ip", "link", "set", host_veth, "up")
        _run("ip", "addr", "add", f"{address}/24", "dev", "veth0", netns=netns)
        _run("ip", "link", "set", "veth0", "up", netns=netns)
        _run("ip", "link", "set", "lo", "up", netns=netns)
        _prepare_drops(host_veth, None)
        _prepare_drops("veth0", netns)

    def command(self, name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside node ``name`` (``ip netns exec`` execs it: same pid)."""
        node = self.nodes[name]
        return list(argv) if node.is_host else ["ip", "netns", "exec", node.netns, *argv]

    def popen(
        self, name: str, argv: Sequence[str], *, cwd: Path | None = None, log_to: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside node ``name``; :meth:`close` kills it if still running.
        Its stdout and stderr go to ``log_to`` (appended) when given."""
        sink: IO[Any] | int = subprocess.DEVNULL
        with contextlib.ExitStack() as stack:
            if log_to is not None:
                sink = stack.enter_context(log_to.open("ab"))
            process = subprocess.Popen(
                self.command(name, argv), cwd=cwd, stdout=sink, stderr=subprocess.STDOUT
            )
        self.processes.append(process)
        return process

    def cut_one_way(self, src: str, dst: str) -> None:
        """Drop every IP packet from ``src`` to ``dst`` (either may be :data:`HOST`, not
        both); the reverse direction keeps flowing."""
        a, b = self.nodes[src], self.nodes[dst]
        assert a != b, (src, dst)
        assert not (a.is_host and b.is_host), (src, dst)
        if not b.is_host:  # in the bridge, on the way into dst: match the source
            where, netns, match = b.host_veth, None, ("src", a.address)
        else:  # leaving src for the root namespace: match the destination
            where, netns, match = "veth0", a.netns, ("dst", b.address)
        _run(
            "tc", "filter", "add", "dev", where, "parent", "1:", "protocol", "ip", "prio", "1",
            "u32", "match", "ip", match[0], f"{match[1]}/32", "flowid", _DROP_CLASS,
            netns=netns,
        )  # fmt: skip
        self._filtered.add((where, netns or ""))
        self.cuts.add((src, dst))

    def cut(self, a: str, b: str) -> None:
        """Drop every IP packet between ``a`` and ``b``, both ways."""
        self.cut_one_way(a, b)
        self.cut_one_way(b, a)

    def heal(self) -> None:
        """Remove every cut: all packets flow again."""
        for where, netns in sorted(self._filtered):
            _run("tc", "filter", "del", "dev", where, "parent", "1:", netns=netns or None)
        self._filtered.clear()
        self.cuts.clear()

    def dropped(self) -> int:
        """Packets the cuts have dropped so far (every blackhole of the lab)."""
        total = 0
        for node in self.nodes.values():
            if node.is_host:
                continue
            for where, netns in ((node.host_veth, None), ("veth0", node.netns)):
                total += _blackhole_drops(
                    _run("tc", "-s", "qdisc", "show", "dev", where, netns=netns)
                )
        return total

    def close(self) -> None:
        """Kill the lab's processes, delete its namespaces and bridge. Idempotent; never
        raises for what is already gone."""
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGCONT)
                    process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        self.processes.clear()
        for node in self.nodes.values():
            if not node.is_host:
                _kill_netns_processes(node.netns)
                # the veth pair first: a deleted namespace is destroyed asynchronously
                _run("ip", "link", "delete", node.host_veth, check=False)
                _run("ip", "netns", "delete", node.netns, check=False)
        if self.tag:
            _run("ip", "link", "delete", f"{self.tag}br", check=False)
        self.nodes.clear()
        self.cuts.clear()
        self._filtered.clear()
        _live_tags.discard(self.tag)


def _prepare_drops(dev: str, netns: str | None) -> None:
    """An HTB root on ``dev`` passing unclassified packets untouched, and the class
    :data:`_DROP_CLASS` whose ``blackhole`` leaf drops whatever a cut sends there."""
    _run("tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", netns=netns)
    _run(
        "tc", "class", "add", "dev", dev, "parent", "1:", "classid", _DROP_CLASS,
        "htb", "rate", "1mbit", netns=netns,
    )  # fmt: skip
    _run("tc", "qdisc", "add", "dev", dev, "parent", _DROP_CLASS, "handle", "2:", "blackhole",
         netns=netns)  # fmt: skip


def _blackhole_drops(stats: str) -> int:
    """The ``dropped`` count of the blackhole qdisc in ``tc -s qdisc show`` output."""
    found = re.search(r"qdisc blackhole .*?\n.*?dropped (\d+)", stats)
    return int(found.group(1)) if found else 0


@contextlib.contextmanager
def lab(names: Sequence[str]) -> Iterator[Lab]:
    """A :class:`Lab` of ``names``, open for the block and closed after it (also on
    failure). Skips the test without root or iproute2 (:func:`require_netns`)."""
    require_netns()
    with Lab(names) as opened:
        yield opened
