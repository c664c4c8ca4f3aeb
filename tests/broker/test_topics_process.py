"""Topic admin against a real ``headrace serve`` process: a lowered open-files limit, and
SIGKILL in the middle of a large create or delete.

- Under ``RLIMIT_NOFILE`` lowered in the child (``preexec_fn``), a topic that cannot fit is
  refused with RESOURCE_EXHAUSTED before any file is made, and the broker goes on serving.
- SIGKILL at seeded random moments during a CreateTopic or DeleteTopic of 2,000
  partitions, then a restart: the topic is whole (``topic.json``, every partition listed
  and on disk) or absent, and nothing else is left under ``topics/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from broker.topics import TopicRegistry
from proto import admin_pb2 as _admin
from proto import admin_pb2_grpc
from tests.broker.test_kill import ROOT, BrokerProcess
from tests.broker.test_serve_process import free_port, wait_serving
from wal import LogConfig

LOW_LIMIT = 600
PARTITIONS = 2_000
KILLS = 3


def entries(data: Path) -> list[str]:
    """Names under ``topics/`` (leftovers included)."""
    root = data / "topics"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def check_whole_or_absent(data: Path, listed: dict[str, int], name: str, n: int) -> bool:
    """``name`` is whole on disk and listed with ``n`` partitions, or absent from both,
    and nothing else is under ``topics/``. Returns whether it is there."""
    if not listed:
        assert entries(data) == [], f"a topic absent from ListTopics left {entries(data)}"
        return False
    assert listed == {name: n}
    assert entries(data) == [name]
    topic_dir = data / "topics" / name
    meta = json.loads((topic_dir / "topic.json").read_bytes())
    assert meta == {"name": name, "partitions": n, "id": meta["id"]}
    assert len(meta["id"]) == 16
    assert sorted(int(p.name) for p in topic_dir.iterdir() if p.is_dir()) == list(range(n))
    return True


def lowered_limit() -> None:
    """In the child before exec: soft and hard ``RLIMIT_NOFILE`` at ``LOW_LIMIT``."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW_LIMIT, LOW_LIMIT))


def serve_under_low_limit(data: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    """``headrace serve`` on ``data`` and ``port`` under ``LOW_LIMIT``; stderr to ``log``."""
    with log.open("wb") as stderr:
        return subprocess.Popen(
            [
                *(sys.executable, "-c", "from broker.cli import main; main()", "serve"),
                *("--data-dir", str(data), "--listen", f"127.0.0.1:{port}"),
                *("--metrics-listen", ""),
            ],
            cwd=ROOT,
            stderr=stderr,
            preexec_fn=lowered_limit,  # noqa: PLW1509 - only setrlimit, no locks taken
        )


def test_a_topic_over_a_lowered_fd_limit_is_refused_up_front(tmp_path: Path) -> None:
    """Scenario: ``headrace serve`` runs with RLIMIT_NOFILE 600 (soft and hard); a client
    creates a topic of 1,000 partitions, then one of 50. Expected: the first gets
    RESOURCE_EXHAUSTED naming the 1,000 descriptors needed, the limit and the remedy, and
    leaves nothing under topics/; the broker keeps serving and creates the second; the log
    states the budget."""
    port = free_port()
    data = tmp_path / "data"
    log = tmp_path / "serve.log"
    proc = serve_under_low_limit(data, port, log)
    try:
        wait_serving(port, time.monotonic() + 20)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            admin = admin_pb2_grpc.AdminStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                admin.CreateTopic(_admin.CreateTopicRequest(name="big", partitions=1000))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            message = refused.value.details() or ""
            assert "would need 1000 file descriptors" in message
            assert f"open-files limit of {LOW_LIMIT}" in message
            assert "ulimit -n" in message
            assert entries(data) == []
            info = admin.CreateTopic(_admin.CreateTopicRequest(name="small", partitions=50))
            assert len(info.partitions) == 50
            assert entries(data) == ["small"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0
    assert f"soft limit {LOW_LIMIT}, hard limit {LOW_LIMIT}" in log.read_text()


async def listed(address: str) -> dict[str, int]:
    """ListTopics as name -> partitions."""
    async with grpc.aio.insecure_channel(address) as channel:
        got = await admin_pb2_grpc.AdminStub(channel).ListTopics(
            _admin.ListTopicsRequest(), timeout=60
        )
    return {t.name: len(t.partitions) for t in got.topics}


async def admin_call(address: str, request: object) -> None:
    """Run a create or delete to its answer; ALREADY_EXISTS and NOT_FOUND count as done."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        code = grpc.StatusCode.OK
        try:
            if isinstance(request, _admin.CreateTopicRequest):
                await stub.CreateTopic(request, timeout=120)
            else:
                await stub.DeleteTopic(request, timeout=120)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
    done = (grpc.StatusCode.OK, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.NOT_FOUND)
    assert code in done


async def call_then_kill(broker: BrokerProcess, request: object, delay_s: float) -> bool:
    """Start ``request`` (a create or delete) and SIGKILL the broker ``delay_s`` later.
    Returns whether the kill came before the answer."""
    async with grpc.aio.insecure_channel(broker.address) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        if isinstance(request, _admin.CreateTopicRequest):
            call = asyncio.ensure_future(stub.CreateTopic(request, timeout=120))
        else:
            call = asyncio.ensure_future(stub.DeleteTopic(request, timeout=120))
        await asyncio.sleep(delay_s)
        answered = call.done()
        broker.kill()
        with contextlib.suppress(grpc.aio.AioRpcError):  # UNAVAILABLE, or done in time
            await call
    return not answered


@pytest.mark.asyncio(loop_scope="function")
@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_sigkill_during_a_large_create_or_delete_leaves_it_whole_or_absent(
    tmp_path: Path,
) -> None:
    """Scenario: a broker is SIGKILLed at seeded random moments (20 ms to 3 s in) while it
    creates a topic of 2,000 partitions, and while it deletes one, starting each time from
    the other state; it restarts after each kill. Then a create and a delete run to their
    answer and the broker is SIGKILLed right after each. Expected: after every restart the
    topic is whole or absent, with nothing else left under topics/; after an answered create
    it is whole, after an answered delete absent."""
    rng = random.Random(20261124)
    data = tmp_path / "data"
    broker = BrokerProcess(tmp_path, free_port())
    create = _admin.CreateTopicRequest(name="big", partitions=PARTITIONS)
    delete = _admin.DeleteTopicRequest(name="big")
    outcomes: list[tuple[str, float, bool, bool]] = []
    try:
        await broker.start()
        for kind, request, undo in (("create", create, delete), ("delete", delete, create)):
            for _ in range(KILLS):
                await admin_call(broker.address, undo)  # the state this change starts from
                delay = rng.uniform(0.02, 3.0)
                cut = await call_then_kill(broker, request, delay)
                await broker.start()
                got = await listed(broker.address)
                there = check_whole_or_absent(data, got, "big", PARTITIONS)
                outcomes.append((kind, round(delay, 2), cut, there))
            await admin_call(broker.address, request)
            broker.kill()
            await broker.start()
            got = await listed(broker.address)
            assert check_whole_or_absent(data, got, "big", PARTITIONS) == (kind == "create")
    finally:
        broker.kill()
    print(f"[topics-kill] (change, kill after s, before the answer, there after): {outcomes}")
    assert any(cut for _kind, _delay, cut, _there in outcomes), "no kill cut a change short"


async def make_topic(data: Path, name: str, partitions: int) -> None:
    """Create ``name`` in ``data`` with an in-process registry (this process's limit)."""
    reg = TopicRegistry(str(data), LogConfig())
    await reg.open()
    await reg.create(name, partitions)
    await reg.aclose()


def test_a_start_whose_topics_exceed_a_lowered_fd_limit_stops_with_one_line(
    tmp_path: Path,
) -> None:
    """Scenario: a topic of 500 partitions exists; ``headrace serve`` starts under
    RLIMIT_NOFILE 600. Expected: it exits 1 before serving, with one line on stderr saying
    the 500 partitions would need 500 descriptors, the limit and the remedy; the topic's
    files are untouched."""
    data = tmp_path / "data"
    asyncio.run(make_topic(data, "wide", 500))
    before = sorted(p.name for p in (data / "topics" / "wide").iterdir())
    log = tmp_path / "serve.log"
    proc = serve_under_low_limit(data, free_port(), log)
    assert proc.wait(timeout=60) == 1
    errors = [line for line in log.read_text().splitlines() if line.startswith("Error")]
    assert len(errors) == 1, log.read_text()
    assert "the 500 partitions of the 1 topics on disk would need 500" in errors[0]
    assert f"open-files limit of {LOW_LIMIT}" in errors[0]
    assert sorted(p.name for p in (data / "topics" / "wide").iterdir()) == before
