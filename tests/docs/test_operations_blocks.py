"""The shell blocks of docs/concepts.md ("Subscription lag"), docs/operations/serving.md,
docs/operations/wal.md (its first two `wal inspect` lines) and the quickstart's clean-up,
run as printed against real `headrace serve` processes.

Substitutions, and nothing else:

- ``headrace`` and ``.venv/bin/headrace`` are this checkout's (its bin directory first on
  ``PATH``);
- the broker the client commands reach: ``HEADRACE_BROKER``, a broker on a free port (the
  pages' commands use the default address);
- ``serve`` with no address: ``HEADRACE_LISTEN`` and ``HEADRACE_METRICS_LISTEN`` set to
  free ports (serving.md: variables come before flags and after the TOML), so parallel
  tests do not collide on 50051 and 9464; in ``--listen 0.0.0.0:50051`` the port ->
  a free port;
- ``alert`` in ``lag --fail-on-stalled >/dev/null || alert`` is the reader's own command:
  a shell function that prints ``ALERT``;
- the page's metrics-port error: ``127.0.0.1:9464`` where it names the address it was
  sent to -> the test broker's metrics address (the command: ``topics list --broker``);
- ``lag --watch`` runs until the test's Ctrl-C (SIGINT), sent once it has refreshed twice.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._certs import Pki
from tests.broker.test_cli_security import _wait_tls
from tests.broker.test_serve_process import free_port, wait_serving
from tests.docs._shell import (
    BIN,
    ROOT,
    block_after,
    commands,
    environment,
    session,
    substitute,
    without_comment,
)

CONCEPTS = ROOT / "docs" / "concepts.md"
SERVING = ROOT / "docs" / "operations" / "serving.md"
WAL = ROOT / "docs" / "operations" / "wal.md"
QUICKSTART = ROOT / "docs" / "quickstart.md"
#: The columns ``lag --json`` names (DESIGN.md, section 4), all present in every row.
LAG_FIELDS = {"topic", "partition", "subscription", "type", "cursor", "head", "lag",
              "oldest_unacked_age_s", "consumers", "in_flight", "state", "reason"}  # fmt: skip


def _argv(command: str) -> list[str]:
    """A page's one-process command as argv, ``.venv/bin/`` -> this environment's."""
    return shlex.split(without_comment(command).replace(".venv/bin/", f"{BIN}/"))


def _stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    assert proc.wait(timeout=15) == 0, log.read_text()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A plain `headrace serve` on free ports in ``tmp_path / "broker"``; yields the
    environment the commands see (HEADRACE_BROKER)."""
    port = free_port()
    cwd = tmp_path / "broker"
    cwd.mkdir()
    with (cwd / "serve.log").open("w") as log:
        proc = subprocess.Popen(
            [BIN / "headrace", "serve", "--listen", f"127.0.0.1:{port}", "--metrics-listen", ""],
            cwd=cwd,
            stderr=log,
        )
    try:
        wait_serving(port, time.monotonic() + 20)
        yield {"HEADRACE_BROKER": f"127.0.0.1:{port}"}
    finally:
        _stop(proc, cwd / "serve.log")


def test_the_lag_examples_run_as_printed(broker: dict[str, str], tmp_path: Path) -> None:
    """Scenario: a topic "orders" of 3 partitions, 5 records, 3 consumed and acked by
    subscription billing (now with no consumer); then concepts.md's five `lag` lines.
    Expected: `lag` prints the table with one row per partition and a total row with
    lag 2; `--topic orders --state stalled,blocked` finds no row (nothing is stalled or
    blocked); `--json` is one array of 3 rows with every documented field and a total
    lag of 2; `--watch` refreshes more than once and stops on Ctrl-C; the
    `--fail-on-stalled ... || alert` line exits 0 without alerting."""
    setup = [
        "headrace topics create orders --partitions 3",
        "seq 5 | headrace produce orders",
        "headrace consume orders -s billing --count 3 --timeout 5",
    ]
    for step in session(setup, tmp_path, broker):
        assert step.returncode == 0, step
    lines = commands(block_after(CONCEPTS, "## Subscription lag"))
    assert len(lines) == 5, lines
    table, stuck, as_json, watch, cron = lines
    done = session([table, stuck, as_json, cron], tmp_path, broker,
                   prelude="alert() { echo ALERT; }")  # fmt: skip
    assert [s.returncode for s in done] == [0, 0, 0, 0], done
    rows = done[0].stdout.splitlines()
    assert rows[0].split()[:3] == ["topic", "subscription", "partition"], rows
    assert len(rows) == 5
    total = ["orders", "billing", "total", "exclusive", "2"]  # no cursor or head
    assert rows[4].split()[:5] == total
    assert done[1].stdout == "no subscriptions\n"
    found = json.loads(done[2].stdout)
    assert len(found) == 3
    assert all(set(r) >= LAG_FIELDS for r in found)
    assert sum(r["lag"] for r in found) == 2
    assert {r["state"] for r in found if r["lag"]} == {"NO_CONSUMER"}
    assert done[3].stdout == ""
    assert done[3].stderr == ""
    _check_watch(watch, tmp_path, broker)


def _check_watch(command: str, cwd: Path, env: dict[str, str]) -> None:
    """`lag --watch` until it has printed its table twice (20 s at most), then Ctrl-C."""
    proc = subprocess.Popen(
        _argv(command), cwd=cwd, env=environment(env), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    heads: list[str] = []
    deadline = time.monotonic() + 20
    while len(heads) < 2 and time.monotonic() < deadline and (line := proc.stdout.readline()):
        if line.split()[:1] == ["topic"]:
            heads.append(line)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=15)
    # 0 when the Ctrl-C lands in the second's sleep, 130 when it lands in a fetch.
    assert proc.returncode in {0, 130}, proc.returncode
    assert len(heads) == 2, heads
    assert "trend" in heads[0].split()


def test_serve_with_defaults_then_wal_inspect_then_clean_up(tmp_path: Path) -> None:
    """Scenario: serving.md's first line, `.venv/bin/headrace serve`, in an empty
    directory (addresses from HEADRACE_LISTEN / HEADRACE_METRICS_LISTEN); a topic "orders"
    and 5 records; Ctrl-C; then wal.md's first two `wal inspect` lines, then the
    quickstart's `rm -rf ./data`. Expected: the banner names ./data and both addresses;
    /metrics answers with headrace_ metrics, and a client command sent to it prints the
    page's one line (its address aside); the data is in ./data; both inspect lines exit
    0 with the same table, partition 0 of orders, status clean; after rm, no ./data."""
    serve = commands(block_after(SERVING, "# Serving"))[0]
    listen, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    env = {"HEADRACE_LISTEN": listen, "HEADRACE_METRICS_LISTEN": metrics}
    log = tmp_path / "serve.log"
    with log.open("w") as err:
        proc = subprocess.Popen(_argv(serve), cwd=tmp_path, stderr=err, env=environment(env))
    try:
        wait_serving(int(listen.rsplit(":", 1)[1]), time.monotonic() + 20)
        banner = log.read_text()
        assert f"serving on {listen}, data in ./data, metrics http://{metrics}/metrics" in banner
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as answer:
            assert "headrace_" in answer.read().decode()
        _check_metrics_port_hint(metrics, tmp_path)
        setup = ["headrace topics create orders --partitions 3", "seq 5 | headrace produce orders"]
        for step in session(setup, tmp_path, {"HEADRACE_BROKER": listen}):
            assert step.returncode == 0, step
    finally:
        _stop(proc, log)
    assert (tmp_path / "data" / "topics" / "orders" / "0").is_dir()
    by_path, by_name, _demo = commands(block_after(WAL, "A broker keeps partition P"))
    tables = session([by_path, by_name], tmp_path, {})
    assert [t.returncode for t in tables] == [0, 0], tables
    assert tables[0].stdout == tables[1].stdout
    assert tables[0].stdout.splitlines()[1].split()[-1] == "clean", tables[0].stdout
    (clean_up,) = commands(block_after(QUICKSTART, "To start again from nothing"))
    (removed,) = session([clean_up], tmp_path, {})
    assert removed.returncode == 0
    assert not (tmp_path / "data").exists()


def _check_metrics_port_hint(metrics: str, cwd: Path) -> None:
    """serving.md's text block: a client command pointed at the metrics port gets that
    one line (the page's metrics address there -> this broker's)."""
    text = SERVING.read_text()
    start = text.index("```text\n", text.index("is told so")) + len("```text\n")
    page = text[start : text.index("```", start)]
    (step,) = session([f"headrace topics list --broker {metrics}"], cwd, {})
    assert step.returncode == 1
    assert step.stderr == page.replace("at 127.0.0.1:9464:", f"at {metrics}:", 1)


def test_serve_on_a_reachable_address_needs_security(tmp_path: Path, pki: Pki) -> None:
    """Scenario: serving.md's second line, `serve --config headrace.toml --listen
    0.0.0.0:PORT  # needs [security]`, first with a headrace.toml without [security], then
    with [security] tls_cert, tls_key and tokens_file (the test CA's server pair).
    Expected: the first exits 1 with one line saying why; the second serves TLS on the
    port."""
    line = commands(block_after(SERVING, "# Serving"))[1]
    port = free_port()
    argv = _argv(substitute(line, {":50051": f":{port}"}))
    env = environment({"HEADRACE_METRICS_LISTEN": f"127.0.0.1:{free_port()}"})
    config = tmp_path / "headrace.toml"
    config.write_text('[broker]\ndata_dir = "data"\n')
    refused = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert refused.returncode == 1, refused.stderr
    (why,) = refused.stderr.splitlines()
    assert why.startswith(f"Error: refusing to serve on 0.0.0.0:{port}: "), why
    assert "set [security] tls_cert, tls_key and tokens_file" in why
    config.write_text(
        config.read_text() + f'[security]\ntls_cert = "{pki.server.cert}"\n'
        f'tls_key = "{pki.server.key}"\ntokens_file = "tokens.json"\n'
    )
    subprocess.run([*_argv("headrace tokens create --name ops --grant admin:*"),
                    "--config", str(config)], cwd=tmp_path, env=env, capture_output=True,
                   check=True)  # fmt: skip
    log = tmp_path / "serve.log"
    with log.open("w") as err:
        proc = subprocess.Popen(argv, cwd=tmp_path, stderr=err, env=env)
    try:
        _wait_tls(f"127.0.0.1:{port}", pki, time.monotonic() + 20)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, log.read_text()
