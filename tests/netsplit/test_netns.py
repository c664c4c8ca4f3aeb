"""The network-namespace lab itself (:mod:`tests.netsplit.netns`): cuts drop packets in the
directions asked and no other, a TCP connection survives a cut and resumes after a heal,
and nothing is left behind (by a closed lab, or by a crashed run once swept).

Real namespaces, veth pairs, a bridge and ``tc``; the peers are tiny Python servers started
inside the namespaces. Needs root and iproute2 (skips otherwise).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.netsplit.netns import HOST, Lab, _base36, require_netns, sweep

pytestmark = pytest.mark.timeout(60)

PORT = 9000

UDP_SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
while True:
    data, peer = s.recvfrom(100)
    with open(sys.argv[3], "ab") as f:
        f.write(data + b"\\n")
    s.sendto(b"ack:" + data, peer)
"""

TCP_ECHO = """
import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
c, _ = s.accept()
while data := c.recv(100):
    c.sendall(data)
"""

UDP_PROBE = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(float(sys.argv[4]))
s.sendto(sys.argv[3].encode(), (sys.argv[1], int(sys.argv[2])))
try:
    print(s.recvfrom(100)[0].decode())
except TimeoutError:
    print("none")
"""

WAIT_S = 0.5
"""How long a probe waits for a reply that a cut should have dropped."""


@pytest.fixture
def lab() -> Iterator[Lab]:
    require_netns()
    with Lab(["a", "b"]) as opened:
        yield opened


def _probe(lab: Lab, frm: str, to: str, text: str) -> str:
    """Send one datagram ``text`` from node ``frm`` to ``to``'s UDP server; its reply, or
    ``"none"`` after :data:`WAIT_S`."""
    argv = [sys.executable, "-c", UDP_PROBE, lab.node(to).address, str(PORT), text, str(WAIT_S)]
    done = subprocess.run(lab.command(frm, argv), capture_output=True, check=True, timeout=10)
    return done.stdout.decode().strip()


def _received(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def _wait_received(log: Path, text: str) -> bool:
    deadline = time.monotonic() + 2.0
    while text not in _received(log):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class Case(NamedTuple):
    """One row: who sends to ``a``, the one-way cut (if any), and what gets through."""

    sender: str
    cut_from: str | None
    cut_to: str | None
    arrives: bool
    answered: bool


CASES = [
    Case(HOST, None, None, arrives=True, answered=True),
    Case(HOST, HOST, "a", arrives=False, answered=False),  # host -> ns: dropped on the way in
    Case(HOST, "a", HOST, arrives=True, answered=False),  # ns -> host: the reply is dropped
    Case("b", "b", "a", arrives=False, answered=False),  # ns -> ns
    Case("b", "a", "b", arrives=True, answered=False),
    Case("b", "a", HOST, arrives=True, answered=True),  # a cut elsewhere changes nothing here
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.sender}-cut-{c.cut_from}-{c.cut_to}")
def test_a_one_way_cut_drops_only_the_packets_of_its_direction(
    lab: Lab, tmp_path: Path, case: Case
) -> None:
    """Scenario: a UDP server in ``a`` logs each datagram and answers it; ``sender`` sends
    one after ``cut_one_way(cut_from, cut_to)``, then again after ``heal()``.
    Expected: the datagram reaches ``a`` unless the cut is sender -> a; the answer comes
    back only if neither direction between them is cut; after the heal both get through."""
    log = tmp_path / "a.log"
    lab.popen("a", [sys.executable, "-c", UDP_SERVER, lab.node("a").address, str(PORT), str(log)])
    assert _wait_for_server(lab, case.sender)
    if case.cut_from is not None and case.cut_to is not None:
        lab.cut_one_way(case.cut_from, case.cut_to)
    reply = _probe(lab, case.sender, "a", "during")  # waits WAIT_S for the answer
    if case.arrives:
        assert _wait_received(log, "during")
    else:
        assert "during" not in _received(log)
    assert (reply == "ack:during") is case.answered
    if not (case.arrives and case.answered):
        assert lab.dropped() > 0
    lab.heal()
    assert _probe(lab, case.sender, "a", "after") == "ack:after"
    assert _wait_received(log, "after")


def _wait_for_server(lab: Lab, sender: str) -> bool:
    """The UDP server in ``a`` answers ``sender`` (it is up) within 5 s."""
    deadline = time.monotonic() + 5.0
    while _probe(lab, sender, "a", "hello") != "ack:hello":
        if time.monotonic() > deadline:
            return False
    return True


def test_a_cut_leaves_a_tcp_connection_open_and_a_heal_resumes_it(lab: Lab) -> None:
    """Scenario: the test (root namespace) holds a TCP connection to an echo server in
    ``a``; the two are cut apart both ways, a message is sent, then the cut is healed.
    Expected: during the cut the read times out (no reset, no error: the packets
    vanished); after the heal the same connection delivers the echo of the message sent
    during the cut (TCP retransmitted it)."""
    address = lab.node("a").address
    lab.popen("a", [sys.executable, "-c", TCP_ECHO, address, str(PORT)])
    deadline = time.monotonic() + 5.0
    while True:
        try:
            conn = socket.create_connection((address, PORT), timeout=0.5)
            break
        except OSError:
            assert time.monotonic() < deadline, "the echo server did not listen"
            time.sleep(0.05)
    with conn:
        conn.sendall(b"one")
        assert conn.recv(10) == b"one"
        lab.cut(HOST, "a")
        conn.sendall(b"two")
        with pytest.raises(TimeoutError):
            conn.recv(10)
        assert lab.dropped() > 0
        lab.heal()
        conn.settimeout(10.0)  # the next retransmission (RTO backs off from ~200 ms)
        assert conn.recv(10) == b"two"


def _names() -> str:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    return listed.stdout + links.stdout


def test_a_closed_lab_leaves_nothing_and_a_sweep_removes_a_crashed_runs_leftovers() -> None:
    """Scenario: a lab is opened (with a process in a namespace) and closed; then a
    namespace and a link named like a lab of a pid that no longer runs are made (what a
    crashed run leaves), and :func:`sweep` runs while another lab of ours is open.
    Expected: after close no name with the lab's tag exists and its process is dead;
    the sweep removes exactly the dead pid's namespace and link, not the open lab."""
    require_netns()
    with Lab(["a"]) as closed:
        process = closed.popen("a", ["sleep", "60"])
        tag = closed.tag
    assert process.poll() is not None
    assert tag not in _names()
    dead = next(p for p in range(32767, 1000, -1) if not _alive(p))
    stale = f"hr{_base36(dead, 5)}0"
    with Lab(["a"]) as live:
        subprocess.run(["ip", "netns", "add", f"{stale}-x"], check=True)
        subprocess.run(["ip", "link", "add", f"{stale}br", "type", "bridge"], check=True)
        removed = sweep()
        assert sorted(removed) == sorted([f"{stale}-x", f"{stale}br"])
        assert f"{live.tag}-a" in _names()
    assert stale not in _names()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
