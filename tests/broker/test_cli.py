"""``headrace`` argument handling in process (click's CliRunner): errors found by the CLI
fuzz test (tests/fuzz/test_cli_fuzz.py) end in one ``Error:`` line, not a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from broker.cli import cli


@pytest.mark.parametrize(
    "argv",
    [
        # (a topic name that is not UTF-8 breaks the name rule first: a usage error, in
        # tests/broker/test_cli_usage.py)
        pytest.param(["produce", "t", "--key", "\udcff", "--count", "1"], id="key"),
        pytest.param(["produce", "t", "--key", "a\udcffb"], id="key-stdin"),
    ],
)
def test_argument_that_is_not_utf8_is_one_error_line(argv: list[str]) -> None:
    """Scenario: an argument holding argv bytes that are not UTF-8 (Python sees a lone
    surrogate), which gRPC cannot send. Expected: exit 1 and one Error: line naming the
    argument, before any connection (the broker address refuses connections)."""
    result = CliRunner(env={"HEADRACE_BROKER": "127.0.0.1:1"}).invoke(cli, argv)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    lines = [line for line in result.stderr.splitlines() if line]
    assert len(lines) == 1
    assert lines[0].startswith("Error: '")
    assert "is not UTF-8 text" in lines[0]
