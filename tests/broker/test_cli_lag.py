"""`headrace lag` against a real broker: JSON fields and types, the grouped table with
totals, --state filters, --fail-on-stalled, and the pure helpers behind the table.

The broker runs in the test's event loop with three subscriptions in known states:
``orders/billing`` (caught up on both partitions), ``orders/audit`` (no consumer, behind on
both) and ``jobs/poison`` (BLOCKED: poison policy block, max_deliveries 1, one nack). The
command runs in-process through click's runner on a worker thread (it makes its own event
loop, as from a shell); the exit codes are also checked once through the real entry point
as a subprocess.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from click.testing import CliRunner, Result

from broker.app import Broker
from broker.cli_lag import LAG_FIELDS, STATES, duration, lag, render, totals
from client import AsyncAdminClient, AsyncConsumer, AsyncProducer, SubscriptionListing
from dispatcher import DispatchConfig, DispatchPolicy, HeartbeatConfig, PoisonPolicy
from tests.broker.conftest import broker_config
from tests.broker.test_cli_client import headrace
from tests.broker.test_lag_scenarios import polled

pytestmark = pytest.mark.timeout(60)
aio = pytest.mark.asyncio(loop_scope="function")


@pytest_asyncio.fixture
async def address(tmp_path: Path) -> AsyncIterator[str]:
    """A broker holding the three subscriptions of the module docstring."""
    dispatch = DispatchConfig(
        subscriptions={"jobs/poison": DispatchPolicy(max_deliveries=1, poison=PoisonPolicy.BLOCK)}
    )
    config = broker_config(
        tmp_path / "data", heartbeat=HeartbeatConfig(interval_s=0.05), dispatch=dispatch
    )
    async with Broker(config) as broker:
        at = f"127.0.0.1:{broker.port}"
        async with AsyncAdminClient(at) as admin, AsyncProducer(at) as producer:
            await admin.create_topic("orders", 2)
            await admin.create_topic("jobs", 1)
            for i in range(6):
                await producer.publish("orders", b"o%d" % i, partition=i % 2)
            await producer.publish("jobs", b"bad", partition=0)
            async with AsyncConsumer("orders", "audit", broker=at, receive_queue=1):
                pass  # exists, acks nothing
            async with AsyncConsumer("orders", "billing", broker=at) as consumer:
                for _ in range(6):
                    consumer.ack(await consumer.receive(timeout=5))
            async with AsyncConsumer("jobs", "poison", broker=at) as consumer:
                consumer.nack(await consumer.receive(timeout=5), delay=0)
                await polled(
                    lambda: admin.describe_subscription("jobs", "poison"),
                    lambda info: info.partitions[0].state == "BLOCKED",
                )
            await polled(
                lambda: admin.describe_subscription("orders", "billing"),
                lambda info: info.lag == 0,
            )
        yield at


async def cli(address: str, *args: str) -> Result:
    """``headrace lag ARGS --broker ADDRESS`` in-process, off the broker's loop."""
    return await asyncio.to_thread(CliRunner().invoke, lag, [*args, "--broker", address])


async def rows(address: str, *args: str) -> list[dict[str, Any]]:
    done = await cli(address, "--json", *args)
    assert done.exit_code == 0, done.output
    found: list[dict[str, Any]] = json.loads(done.output)
    return found


@aio
async def test_json_rows_have_every_field_typed(address: str) -> None:
    """Scenario: ``lag --json``. Expected: one flat row per (topic, partition,
    subscription), five in all, each with exactly LAG_FIELDS (DESIGN's twelve, then the
    rates), each typed: integers, floats, drain_s a float or null, a known trend and
    state; the states are those of the scenario."""
    found = await rows(address)
    assert len(found) == 5
    for row in found:
        assert list(row) == list(LAG_FIELDS)
        for name in ("partition", "cursor", "head", "lag", "consumers", "in_flight"):
            assert type(row[name]) is int, (name, row)
        for name in ("oldest_unacked_age_s", "ingress_rate", "ack_rate"):
            assert isinstance(row[name], float | int), (name, row)
            assert math.isfinite(row[name]), (name, row)
        assert row["drain_s"] is None or isinstance(row["drain_s"], float | int)
        assert row["trend"] in ("growing", "shrinking", "steady")
        assert row["state"] in STATES
        assert isinstance(row["reason"], str)
        assert (row["state"] == "CAUGHT_UP") == (row["reason"] == "")
    states = {(r["subscription"], r["partition"]): r["state"] for r in found}
    assert states == {
        ("audit", 0): "NO_CONSUMER",
        ("audit", 1): "NO_CONSUMER",
        ("billing", 0): "CAUGHT_UP",
        ("billing", 1): "CAUGHT_UP",
        ("poison", 0): "BLOCKED",
    }
    caught_up = [r for r in found if r["subscription"] == "billing"]
    assert all(r["drain_s"] == 0 for r in caught_up)
    assert all(r["drain_s"] is None for r in found if r["subscription"] == "audit")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--state", "NO_CONSUMER"), {"audit"}),
        (("--state", "blocked,caught_up"), {"poison", "billing"}),
        (("--state", "BLOCKED", "--state", "NO_CONSUMER"), {"poison", "audit"}),
        (("--state", "STALLED"), set()),
        (("--state", "CAUGHT_UP", "--topic", "jobs"), set()),
        (("--subscription", "audit", "--state", "NO_CONSUMER"), {"audit"}),
    ],
)
@aio
async def test_state_filter(address: str, args: tuple[str, ...], expected: set[str]) -> None:
    """--state takes repeated options or comma lists in any case, beside --topic and
    --subscription; only rows in those states are shown."""
    assert {r["subscription"] for r in await rows(address, *args)} == expected


@pytest.mark.parametrize("bad", ["STUCK", "lagging,nope", ""])
@aio
async def test_a_bad_state_is_a_usage_error(address: str, bad: str) -> None:
    """Scenario: --state with a value that is not a state. Expected: exit 2 before any
    call, one error naming the value and listing the five states."""
    done = await cli(address, "--state", bad)
    assert done.exit_code == 2
    assert "is not a state; use CAUGHT_UP, LAGGING, NO_CONSUMER, STALLED, BLOCKED" in (done.output)


@aio
async def test_fail_on_stalled(address: str) -> None:
    """Scenario: --fail-on-stalled over the BLOCKED topic, over the other one, and with a
    filter that hides the BLOCKED row. Expected: exit 3 with the output printed first;
    exit 0 when no shown row is STALLED or BLOCKED."""
    blocked = await cli(address, "--fail-on-stalled", "--topic", "jobs", "--json")
    assert blocked.exit_code == 3
    assert json.loads(blocked.output)[0]["state"] == "BLOCKED"
    table = await cli(address, "--fail-on-stalled")
    assert table.exit_code == 3
    assert "blocked on poison: offset 0 failed 1 deliveries" in table.output
    assert (await cli(address, "--fail-on-stalled", "--topic", "orders")).exit_code == 0
    assert (await cli(address, "--fail-on-stalled", "--state", "NO_CONSUMER")).exit_code == 0
    assert (await cli(address, "--topic", "jobs")).exit_code == 0  # without the flag


@aio
async def test_table_groups_rows_with_totals(address: str) -> None:
    """Scenario: ``lag --topic orders`` as a table. Expected: the rows grouped by
    subscription (audit, then billing), partitions in order, each group closed by a total
    row: lag summed, state the worst, reason naming the worst partition."""
    done = await cli(address, "--topic", "orders")
    assert done.exit_code == 0, done.output
    head, *lines = done.output.splitlines()
    assert head.split()[:3] == ["topic", "subscription", "partition"]
    for column in ("lag", "age_s", "in/s", "ack/s", "drain", "state", "reason"):
        assert column in head.split()
    assert "trend" not in head.split()  # only in --watch
    cells = [line.split() for line in lines]
    assert [(c[1], c[2]) for c in cells] == [
        ("audit", "0"),
        ("audit", "1"),
        ("audit", "total"),
        ("billing", "0"),
        ("billing", "1"),
        ("billing", "total"),
    ]
    audit_total = lines[2]
    assert "NO_CONSUMER" in audit_total
    assert "partition 0: no consumer: 3 records wait for a consumer" in audit_total
    assert " 6 " in audit_total  # 3 + 3 records behind
    assert "never" in audit_total
    assert "CAUGHT_UP" in lines[5]


@aio
async def test_the_real_entry_point_exit_codes(address: str) -> None:
    """Through ``headrace`` as a subprocess: --help documents exit code 3; a bad --state
    exits 2 with one line; --fail-on-stalled exits 3."""
    helped = await asyncio.to_thread(headrace, address, "lag", "--help")
    assert "--fail-on-stalled" in helped.stdout
    assert "3 with --fail-on-stalled" in " ".join(helped.stdout.split())
    bad = await asyncio.to_thread(headrace, address, "lag", "--state", "bogus")
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    stuck = await asyncio.to_thread(headrace, address, "lag", "--fail-on-stalled")
    assert stuck.returncode == 3, stuck.stderr
    assert "BLOCKED" in stuck.stdout


def row(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "topic": "t",
        "partition": 0,
        "subscription": "s",
        "type": "shared",
        "cursor": 0,
        "head": 0,
        "lag": 0,
        "oldest_unacked_age_s": 0.0,
        "consumers": 1,
        "in_flight": 0,
        "state": "CAUGHT_UP",
        "reason": "",
        "ingress_rate": 0.0,
        "ack_rate": 0.0,
        "drain_s": 0.0,
        "trend": "steady",
    }
    return {**base, **changes}


def test_totals_of_a_group() -> None:
    """Lag, in-flight and rates summed; oldest age the maximum; drain the slowest
    partition's; state the worst; trend growing if any grows."""
    total = totals(
        [
            row(lag=10, in_flight=4, ingress_rate=5.0, ack_rate=7.0, drain_s=5.0,
                oldest_unacked_age_s=3.0, state="LAGGING", reason="consumer slow: x",
                trend="shrinking"),
            row(partition=1, lag=20, in_flight=1, ingress_rate=1.0, ack_rate=3.0,
                drain_s=10.0, oldest_unacked_age_s=9.5, state="LAGGING",
                reason="window full: y", trend="growing"),
            row(partition=2),
        ]
    )  # fmt: skip
    assert {k: total[k] for k in ("partition", "lag", "in_flight", "drain_s", "state")} == {
        "partition": "total",
        "lag": 30,
        "in_flight": 5,
        "drain_s": 10.0,
        "state": "LAGGING",
    }
    assert (total["ingress_rate"], total["ack_rate"]) == (6.0, 10.0)
    assert total["oldest_unacked_age_s"] == 9.5
    assert total["trend"] == "growing"
    assert total["reason"] == "partition 1: window full: y"
    never = totals([row(lag=5, drain_s=None, state="NO_CONSUMER"), row(partition=1)])
    assert (never["drain_s"], never["state"]) == (None, "NO_CONSUMER")


@pytest.mark.parametrize(
    ("seconds", "lag", "shown"),
    [
        (0.0, 0, "-"),
        (None, 5, "never"),
        (44.6, 5, "45s"),
        (725.0, 5, "12m05s"),
        (12_000.0, 5, "3h20m"),
    ],
)
def test_drain_durations(seconds: float | None, lag: int, shown: str) -> None:
    """The table's drain column: - when caught up, never when it does not drain."""
    assert duration(seconds, lag) == shown


def test_render_adds_the_trend_in_watch() -> None:
    """--watch shows a TREND column after DRAIN; a group of one still gets its total."""
    text = render([row(lag=3, drain_s=None, trend="growing", state="LAGGING")], trend=True)
    head, first, total = text.splitlines()
    columns = head.split()
    assert columns[columns.index("drain") + 1] == "trend"
    assert "growing" in first
    assert total.split()[2] == "total"


@pytest.mark.parametrize("where", ["clear", "sleep"])
def test_watch_ends_normally_on_a_ctrl_c_wherever_it_lands(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Scenario: `lag --watch`, its fetch answering no subscriptions, and a Ctrl-C
    (KeyboardInterrupt) landing while it clears the screen or while it sleeps.
    Expected: exit 0 either way, never click's "Aborted!" with exit 1 (a CI run once
    caught the Ctrl-C between the fetch and the sleep)."""

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("broker.cli_lag.run", lambda make, target: SubscriptionListing(()))
    if where == "clear":
        monkeypatch.setattr("broker.cli_lag.click.clear", interrupt)
    else:
        monkeypatch.setattr("broker.cli_lag.time.sleep", interrupt)
    result = CliRunner().invoke(lag, ["--watch"])
    assert result.exit_code == 0, result.output
    assert "Aborted" not in result.output
