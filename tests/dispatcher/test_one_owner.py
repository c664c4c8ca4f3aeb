"""One owner per subscription, enforced by the product: the state refuses a change made
outside its owner (its dispatch task, the notifier's synchronous pass while that task
sleeps, or the subscription itself while no task runs), and no product code steps a
coroutine by hand or uses private asyncio. Real logs on real files; the refusals are
provoked on purpose. (``test_owner.py`` checks the same rule from the test side, with a
guard of its own around ``handle``, through the command queue's races.)"""

from __future__ import annotations

import ast
import asyncio
import time
from pathlib import Path

import pytest

from dispatcher import PartitionSnapshot, Subscription
from dispatcher.errors import StateOwnerError
from dispatcher.protocol import Grant
from tests.dispatcher._deliveries import singles, take
from wal import LogWriter

ROOT = Path(__file__).resolve().parents[2]
#: The product's packages (pyproject's ``packages.find``), not the tests or the benches.
PACKAGES = ("broker", "client", "dispatcher", "proto", "pyspark_headrace", "spark_connector", "wal")


@pytest.mark.asyncio(loop_scope="function")
async def test_a_task_other_than_the_dispatch_task_cannot_change_the_state(
    writers: list[LogWriter],
) -> None:
    """Scenario: a running subscription with one consumer; another task (here the test's
    own, then a task made for it) calls ``state.handle`` directly, as code that skipped
    the command queue would. Expected: StateOwnerError naming the owner, each time, and
    the state unchanged (the credit the consumer holds stays 10); the same grant through
    the queue is applied by the task (credit 15) and records still flow."""
    sub = Subscription("t", "s", writers, [PartitionSnapshot(0)] * 2)
    sub.start()
    try:
        session = sub.attach("c", 10)
        await sub.applied()
        cid = session.consumer_id
        with pytest.raises(StateOwnerError, match=r"t/s is owned by the task 'dispatch t/s'"):
            sub.state.handle(Grant(cid, 5), time.monotonic())

        async def elsewhere() -> None:
            sub.state.handle(Grant(cid, 5), time.monotonic())

        with pytest.raises(StateOwnerError):
            await asyncio.create_task(elsewhere())
        assert sub.state.credit(cid) == 10
        await sub.grant(session, 5)
        await sub.applied()
        assert sub.state.credit(cid) == 15
        await singles(writers[0], 3)
        assert [d.from_offset for d in await take(session, 3)] == [0, 1, 2]
    finally:
        await sub.aclose()


@pytest.mark.asyncio(loop_scope="function")
async def test_without_a_task_the_subscription_applies_commands_itself(
    writers: list[LogWriter],
) -> None:
    """Scenario: a subscription never started, then one closed. Expected: no owner task,
    so a command is applied at once by its caller (attach and grant change the state),
    and after ``aclose`` the closer owns the state again (a direct handle is allowed)."""
    sub = Subscription("t", "s", writers, [PartitionSnapshot(0)] * 2)
    session = sub.attach("c", 10)
    await sub.grant(session, 2)
    assert sub.state.credit(session.consumer_id) == 12
    sub.start()
    await asyncio.sleep(0)  # the task starts: from now on it is the owner
    with pytest.raises(StateOwnerError):
        sub.state.handle(Grant(session.consumer_id, 1), time.monotonic())
    await sub.aclose()
    sub.state.handle(Grant(session.consumer_id, 1), time.monotonic())
    assert sub.state.credit(session.consumer_id) == 13


def _hand_stepping(root: Path) -> list[str]:
    """Where the product packages under ``root`` step a coroutine by hand (``x.send(None)``,
    ``x.throw(...)``, ``types.coroutine``) or use a private name of ``asyncio``."""
    found: list[str] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    args = node.args
                    first_none = (
                        len(args) == 1
                        and isinstance(args[0], ast.Constant)
                        and args[0].value is None
                    )
                    if (node.func.attr == "send" and first_none) or node.func.attr == "throw":
                        found.append(f"{where}: .{node.func.attr}(...)")
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                    if (node.value.id, node.attr) == ("types", "coroutine"):
                        found.append(f"{where}: types.coroutine")
                    if node.value.id == "asyncio" and node.attr.startswith("_"):
                        found.append(f"{where}: asyncio.{node.attr}")
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("asyncio"):
                    found += [f"{where}: {a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_no_coroutine_is_stepped_by_hand_and_no_private_asyncio_is_used() -> None:
    """Scenario: every module of the product packages, parsed. Expected: no ``.send(None)``
    or ``.throw(...)`` (a coroutine stepped by hand, outside any task), no
    ``types.coroutine``, no private name of ``asyncio`` (imported or as an attribute)."""
    assert _hand_stepping(ROOT) == []
