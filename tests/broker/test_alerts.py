"""deploy/prometheus with promtool: the alert rules and the example configuration are
valid, and alerts_test.yml proves each rule both fires and stays quiet.

promtool is Debian's prometheus package; without it these tests skip, or fail when ``CI``
is set (.ci/run installs it).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.broker.promql import tool

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def _promtool(*args: str) -> str:
    done = subprocess.run(
        [tool("promtool"), *args],
        cwd=DEPLOY,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def _alert_names() -> list[str]:
    return re.findall(r"^\s*- alert: (\w+)$", (DEPLOY / "alerts.yml").read_text(), re.M)


def test_the_rules_are_valid() -> None:
    """Scenario: promtool check rules alerts.yml. Expected: success, nineteen rules."""
    assert "SUCCESS: 19 rules found" in _promtool("check", "rules", "alerts.yml")


def test_the_unit_tests_of_the_rules_pass() -> None:
    """Scenario: promtool test rules alerts_test.yml (series that should and should not
    fire each rule, with the labels and rendered annotations expected). Expected: success."""
    assert "SUCCESS" in _promtool("test", "rules", "alerts_test.yml")


def test_the_example_configuration_is_valid() -> None:
    """Scenario: promtool check config prometheus.yml (which loads alerts.yml).
    Expected: success."""
    assert "is valid prometheus config file syntax" in _promtool(
        "check", "config", "prometheus.yml"
    )


def test_every_rule_is_tested_firing_and_quiet() -> None:
    """Scenario: alerts_test.yml read case by case. Expected: every rule of alerts.yml
    has a case where it fires (expected alerts listed) and one where it does not
    (``exp_alerts: []``)."""
    fires: set[str] = set()
    quiet: set[str] = set()
    alert = ""
    for line in (DEPLOY / "alerts_test.yml").read_text().splitlines():
        text = line.strip()
        if text.startswith("alertname:"):
            alert = text.split()[1]
        elif text == "exp_alerts: []":
            quiet.add(alert)
        elif text == "exp_alerts:":
            fires.add(alert)
    names = set(_alert_names())
    assert len(names) == 19
    assert names - fires == set()
    assert names - quiet == set()


def test_every_rule_waits_and_says_what_to_do() -> None:
    """Scenario: alerts.yml read rule by rule. Expected: each has a ``for:``, a severity
    of warning or critical, and a summary and a description annotation."""
    text = (DEPLOY / "alerts.yml").read_text()
    rules = re.split(r"^\s*- alert: ", text, flags=re.M)[1:]
    assert len(rules) == len(_alert_names())
    for rule in rules:
        name = rule.split("\n", 1)[0]
        assert re.search(r"^\s+for: \d+[smh]$", rule, re.M), name
        assert re.search(r"^\s+severity: (warning|critical)$", rule, re.M), name
        assert re.search(r"^\s+summary: ", rule, re.M), name
        assert re.search(r"^\s+description: ", rule, re.M), name
