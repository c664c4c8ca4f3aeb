"""Test aids for PromQL: the metric names an expression reads, and a real Prometheus.

Prometheus 2.42 (Debian 12) has no ``/api/v1/parse_query`` and promtool no AST dump, so
:func:`metric_names` is a tokenizer: it blanks what cannot hold a metric name (string
literals, label matchers, ranges, grouping label lists), then keeps each identifier that is
neither a function or aggregation (followed by ``(``) nor a keyword.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENTIFIER = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)")
_KEYWORDS = frozenset(
    {
        # aggregations (their parenthesis may follow a by/without clause)
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        # modifiers and binary operators
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "atan2",
        "inf",
        "nan",
    }
)


def metric_names(expr: str) -> set[str]:
    """Every metric name ``expr`` selects (as written: ``x_bucket``, ``y_total``)."""
    text = _STRINGS.sub('""', expr)
    text = _MATCHERS.sub("{}", text)
    text = _RANGES.sub("[]", text)
    text = _GROUPING.sub(r"\1", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name = match.group(1)
        rest = text[match.end() :].lstrip()
        if name.lower() in _KEYWORDS or rest.startswith("("):
            continue
        names.add(name)
    return names


def tool(name: str) -> str:
    """The path of ``name`` (prometheus, promtool). Missing: a failure when ``CI`` is set
    (CI installs Debian's prometheus package, see .ci/run), a skip otherwise."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must install it (.ci/run)")
        pytest.skip(message)
    return path


def free_port() -> int:
    """A loopback port free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Prometheus:
    """A real Prometheus server scraping ``targets`` every second, with ``rule_files``
    loaded, its data in ``directory``. Stop it with :meth:`stop`."""

    def __init__(self, directory: Path, targets: list[str], rule_files: list[Path]) -> None:
        binary = tool("prometheus")
        config = directory / "prometheus.yml"
        config.write_text(
            json.dumps(  # JSON is YAML
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(p) for p in rule_files],
                    "scrape_configs": [
                        {"job_name": "headrace", "static_configs": [{"targets": targets}]}
                    ],
                }
            )
        )
        self.port = free_port()
        self._log = (directory / "prometheus.log").open("wb")
        self._process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={directory / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.log_path = directory / "prometheus.log"

    def wait_ready(self, timeout: float = 15) -> None:
        """Block until ``/-/ready`` answers 200."""
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log_path.read_text()[-2000:]}")
            try:
                url = f"http://127.0.0.1:{self.port}/-/ready"
                with urllib.request.urlopen(url, timeout=1) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError("prometheus did not become ready")
            time.sleep(0.1)

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``; its JSON document, errors included (status "error")."""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                return json.load(reply)
        except urllib.error.HTTPError as exc:  # 400/422 carry the error document
            return json.load(exc)

    def query(self, expr: str) -> Any:
        """An instant query's document."""
        return self.api("query", query=expr)

    def value(self, expr: str) -> float | None:
        """The one value of a query that returns one series, or ``None`` (no data)."""
        result = self.query(expr)["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, expr: str, timeout: float = 15) -> None:
        """Block until ``expr`` returns data (e.g. ``x > 0``)."""
        deadline = time.monotonic() + timeout
        while not self.query(expr).get("data", {}).get("result"):
            if time.monotonic() > deadline:
                raise AssertionError(f"no data for {expr} within {timeout} s")
            time.sleep(0.2)

    def stop(self) -> None:
        """Terminate the server and wait for it."""
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.close()
