"""A real Prometheus scrapes a real broker after a known workload (tests/broker/
metrics_workload.py): it sees the lag, a rate and a latency quantile; it accepts every
dashboard and alert expression, each of which names only series the broker exports; and
every dashboard panel shows data.

One broker (in a thread with its own event loop, ports chosen by the OS) and one Prometheus
(subprocess, scraping every second, deploy/prometheus/alerts.yml loaded) serve the whole
module. Without prometheus installed the module skips, or fails when ``CI`` is set.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.app import Broker
from broker.metrics import BrokerMetrics, ClusterSample, ReplicaLagSample
from tests.broker import metrics_workload as work
from tests.broker.conftest import broker_config
from tests.broker.promql import Prometheus, metric_names, tool

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "headrace.json"

#: What the dashboard's template variables and Grafana's own variables become in a test.
SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "$instance": ".*",
    "$topic": work.TOPIC,
    "$subscription": work.SUBSCRIPTION,
}
#: Series that are not the broker's but are fine to use: Prometheus's own.
FOREIGN = frozenset({"up"})


@dataclass
class Scraped:
    """What the module's tests share."""

    prometheus: Prometheus
    exported: set[str]  # every sample name on the broker's /metrics


class _BrokerThread:
    """A broker on its own event loop in a thread, so that sync tests can share it."""

    def __init__(self, data_dir: Path) -> None:
        self._config = work.workload_config(broker_config(data_dir))
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._started: Future[Broker] = Future()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._main(),))

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        try:
            async with Broker(self._config) as broker:
                self._started.set_result(broker)
                await self._stop.wait()
        except BaseException as exc:
            if not self._started.done():
                self._started.set_exception(exc)
            raise

    def start(self) -> Broker:
        self._thread.start()
        return self._started.result(timeout=30)

    def run(self, coro: Any) -> Any:
        """Run ``coro`` on the broker's loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def stop(self) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)
        self._loop.close()


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    """The broker prepared (topic and subscription, all series at 0), scraped twice by
    Prometheus, then the workload, then Prometheus holding its results."""
    tool("prometheus")
    directory = tmp_path_factory.mktemp("prometheus")
    broker_thread = _BrokerThread(directory / "data")
    broker = broker_thread.start()
    prometheus: Prometheus | None = None
    try:
        address = f"127.0.0.1:{broker.port}"
        broker_thread.run(work.prepare(address))
        target = f"127.0.0.1:{broker.metrics_port}"
        prometheus = Prometheus(directory, [target], [ALERTS])
        prometheus.wait_ready()
        prometheus.wait_for('count_over_time(up{job="headrace"}[1m]) >= 2')
        broker_thread.run(work.run(address))
        broker_thread.run(work.settled(broker.metrics_port))
        text = broker_thread.run(asyncio.to_thread(work.scrape_text, broker.metrics_port))
        exported = {
            s.name for family in text_string_to_metric_families(text) for s in family.samples
        }
        sub = f'topic="{work.TOPIC}", subscription="{work.SUBSCRIPTION}"'
        prometheus.wait_for(f"sum(headrace_dlq_entries{{{sub}}}) == {work.POISON}")
        prometheus.wait_for(f"sum(headrace_subscription_lag_messages{{{sub}}}) == {work.LAG}")
        yield Scraped(prometheus, exported)
    finally:
        if prometheus is not None:
            prometheus.stop()
        broker_thread.stop()


def _substitute(expr: str) -> str:
    for variable, value in SUBSTITUTIONS.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"a variable left unsubstituted in {expr}"
    return expr


def _dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def _panel_targets() -> list[tuple[str, str]]:
    """(panel title, expression) of every query of every panel."""
    return [
        (panel["title"], target["expr"])
        for panel in _dashboard()["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def _unknown(expr: str, exported: set[str]) -> set[str]:
    return {n for n in metric_names(expr) if n not in exported and n not in FOREIGN}


# -- the tokenizer --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ('up{job="headrace"} == 0', {"up"}),
        (
            "histogram_quantile(0.99, sum by (instance, le) (rate(x_bucket{a=~'b(c)'}[5m])))",
            {"x_bucket"},
        ),
        ("sum without (le) (rate(a_total[1m] offset 5m)) > 0.1 * b", {"a_total", "b"}),
        ('a / on (topic) group_left (subscription) b{x="sum(y)"}', {"a", "b"}),
        ("max_over_time(a[10m:1m]) > 1e3 and bool b unless c", {"a", "b", "c"}),
        ("sum by (topic) (deriv(lag_messages[10m])) > 0", {"lag_messages"}),
        ('{__name__="hidden"} + 0x1F', set()),
    ],
)
def test_metric_names_tokenizer(expr: str, names: set[str]) -> None:
    """Scenario: expressions with functions, aggregations and grouping clauses, label
    values that look like calls, ranges, subqueries, offsets and numbers. Expected: only
    the selected metric names come out."""
    assert metric_names(expr) == names


# -- the running Prometheus -----------------------------------------------------------


def test_prometheus_sees_the_lag_a_rate_and_a_quantile(scraped: Scraped) -> None:
    """Scenario: the workload (40 published, 30 acked, 2 dead-lettered, 8 left). Expected
    through Prometheus's API: the lag is 8, the publish rate over a minute is above 0,
    the p99 dispatch latency is a real number within the buckets, the oldest unacked
    record has an age, and the broker's up is 1."""
    prom = scraped.prometheus
    sub = f'topic="{work.TOPIC}", subscription="{work.SUBSCRIPTION}"'
    assert prom.value(f"sum(headrace_subscription_lag_messages{{{sub}}})") == work.LAG
    rate = prom.value(f'sum(rate(headrace_published_records_total{{topic="{work.TOPIC}"}}[1m]))')
    assert rate is not None
    assert rate > 0
    p99 = prom.value(
        "histogram_quantile(0.99, sum by (le) "
        f'(rate(headrace_dispatch_latency_seconds_bucket{{topic="{work.TOPIC}"}}[1m])))'
    )
    assert p99 is not None
    assert 0 < p99 <= 3600
    age = prom.value(f"max(headrace_subscription_oldest_unacked_age_seconds{{{sub}}})")
    assert age is not None
    assert age > 0
    assert prom.value('up{job="headrace"}') == 1


def test_every_dashboard_query_is_accepted_and_shows_data(scraped: Scraped) -> None:
    """Scenario: every query of every dashboard panel, template variables substituted
    ($topic=orders, $subscription=billing, $instance=.*, $__rate_interval=1m). Expected:
    Prometheus accepts each, each names only series the broker exports, and each returns
    at least one series with a number (not NaN): no panel is empty."""
    problems = []
    for title, raw in _panel_targets():
        expr = _substitute(raw)
        if unknown := _unknown(expr, scraped.exported):
            problems.append(f"{title}: {expr} names series nobody exports: {sorted(unknown)}")
            continue
        reply = scraped.prometheus.query(expr)
        if reply["status"] != "success":
            problems.append(f"{title}: {expr} refused: {reply.get('error')}")
            continue
        values = [float(r["value"][1]) for r in reply["data"]["result"]]
        if not any(not math.isnan(v) for v in values):
            problems.append(f"{title}: {expr} returned no data ({values})")
    assert problems == []


def test_the_template_variables_find_the_workload(scraped: Scraped) -> None:
    """Scenario: the dashboard's query variables (label_values(selector, label)).
    Expected: each selector names exported series and returns the workload's value of
    the label (the broker, the topic, the subscription)."""
    expected = {"topic": work.TOPIC, "subscription": work.SUBSCRIPTION}
    variables = [v for v in _dashboard()["templating"]["list"] if v["type"] == "query"]
    assert {v["name"] for v in variables} == {"instance", "topic", "subscription"}
    for variable in variables:
        match = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["query"]["query"])
        assert match is not None, variable["query"]
        selector, label = _substitute(match.group(1)), match.group(2)
        assert not _unknown(selector, scraped.exported)
        result = scraped.prometheus.query(selector)["data"]["result"]
        values = {r["metric"][label] for r in result if label in r["metric"]}
        assert values, f"{variable['name']}: {selector} has no {label}"
        if label in expected:
            assert expected[label] in values


def test_every_alert_rule_is_loaded_healthy_and_names_exported_series(scraped: Scraped) -> None:
    """Scenario: Prometheus loaded deploy/prometheus/alerts.yml and evaluated it against
    the broker. Expected: every rule is healthy (evaluated without error), has a severity
    of warning or critical and a summary and description, its expression is accepted as a
    query, and it names only series the broker exports (or up; the cluster rules: series a
    cluster member exports, from the same declarations)."""
    prom = scraped.prometheus
    rules: list[dict[str, Any]] = []
    for _ in range(50):  # the first evaluation is at most a second away
        groups = prom.api("rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if rules and all(r["lastEvaluation"] > "0001-01-01T00:00:00Z" for r in rules):
            break
        threading.Event().wait(0.2)
    declared = re.findall(r"^\s*- alert:", ALERTS.read_text(), flags=re.MULTILINE)
    assert len(declared) >= 17  # the cluster's and replication's rules among them
    assert len(rules) == len(declared)  # Prometheus loaded every rule the file declares
    exported = scraped.exported | _cluster_member_series()
    for rule in rules:
        assert rule["type"] == "alerting"
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["name"]
        assert rule["annotations"]["summary"]
        assert rule["annotations"]["description"]
        assert prom.query(rule["query"])["status"] == "success", rule["name"]
        assert not _unknown(rule["query"], exported), rule["name"]


def _cluster_member_series() -> set[str]:
    """The sample names a cluster member exports beyond a single broker's (the
    ``headrace_cluster_*`` gauges), from the broker's own declarations
    (:class:`broker.metrics.BrokerMetrics`) fed a member's sample with an offline topic
    and a replicated topic it leads, and one lagging follower of it."""
    metrics = BrokerMetrics()
    metrics.watch_cluster(
        lambda: ClusterSample(
            True, 1.0, 1, True, 1, 2, True, (("t", "b2", "offline"),), (("r", 3, 2, 2),)
        )
    )
    metrics.watch_replication(lambda: [ReplicaLagSample("r", 0, "b2", 3, 1.5)])
    text = generate_latest(metrics.registry).decode()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


# -- the dashboard's structure (no Prometheus needed) ---------------------------------


def test_the_dashboard_is_a_grafana_dashboard_over_a_chosen_prometheus() -> None:
    """Scenario: deploy/grafana/headrace.json. Expected: schemaVersion 39; a datasource
    variable of type prometheus that every panel and query uses; topic and subscription
    variables; unique panel ids; panels that do not overlap on the 24-column grid; and
    panels for lag (records and age), throughput, latency quantiles, redeliveries and the
    dead-letter queue; over several brokers: records/s per node id, and a panel repeated
    per broker."""
    board = _dashboard()
    assert board["schemaVersion"] == 39
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"topic", "subscription"} <= set(variables)
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}"
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
    exprs = " ".join(expr for _, expr in _panel_targets())
    for needed in (
        "headrace_subscription_lag_messages",
        "headrace_subscription_oldest_unacked_age_seconds",
        "rate(headrace_published_records_total",
        "rate(headrace_dispatched_records_total",
        "rate(headrace_acked_records_total",
        "histogram_quantile(0.99, sum by (topic, le) (rate(headrace_dispatch_latency_seconds",
        "histogram_quantile(0.99, sum by (instance, le) (rate(headrace_wal_append_seconds",
        "histogram_quantile(0.99, sum by (instance, le) (rate(headrace_wal_fsync_seconds",
        "rate(headrace_redelivered_records_total",
        "headrace_dlq_entries",
        "sum by (node_id) (rate(headrace_published_records_total",
        "group_left (node_id) headrace_node_info",
    ):
        assert needed in exprs
    assert [p["title"] for p in panels if p.get("repeat") == "instance"] == ["Broker $instance"]
