"""The ``headrace`` command line, fed random argv against a running broker.

Every leaf command is found by walking the click group, so a new command is fuzzed at once;
argv mixes its own options with hostile tokens (unknown options, huge and negative numbers,
names that try to leave a directory, undecodable bytes as Python sees them in argv, config
files that are not TOML or not UTF-8). Client commands reach a real broker on 127.0.0.1;
``serve`` loads and checks its config but does not run a broker (that part is replaced).

Claims checked: the exit code is 0, 1 or 2; no Python traceback is printed; a failure says
why in exactly one ``Error:`` line on stderr (or click's ``Aborted!`` for a refused prompt).

Not fuzzed: ``consume``, ``lag --watch`` and ``cluster local`` (which starts etcd and
brokers), which wait for records, refresh or serve until interrupted by design, and
valid counts above 8 (``produce --count 10**9`` would run).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import grpc
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import broker.app
import broker.cli
from broker.config import BrokerConfig
from proto import admin_pb2 as _admin
from tests.broker.conftest import broker_config
from tests.fuzz._rpcs import unary
from tests.fuzz.conftest import SLOW, BrokerThread, examples

CI = 60
_BLOCKING = {("consume",), ("cluster", "local")}


def _leaves(
    group: click.Group, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # subcommands loaded lazily included
        cmd = group.get_command(ctx, name)
        assert cmd is not None, name
        if isinstance(cmd, click.Group):
            yield from _leaves(cmd, (*path, name))
        else:
            yield (*path, name), cmd


LEAVES = [(path, cmd) for path, cmd in _leaves(broker.cli.cli) if path not in _BLOCKING]


@dataclass
class Setup:
    runner: CliRunner
    tokens: st.SearchStrategy[str]


def _options(cmd: click.Command) -> list[str]:
    names = [
        o for p in cmd.params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts
    ]
    return [n for n in names if n not in ("--watch", "--broker")]


def _values(root: Path) -> st.SearchStrategy[str]:
    (root / "good.toml").write_text("[broker]\nlisten = '127.0.0.1:0'\n")
    (root / "bad.toml").write_bytes(b"[broker\nlisten = \xff\n")
    (root / "dir").mkdir()
    return st.one_of(
        st.sampled_from(["t", "s", "missing", "0", "1", "2", "8", "-1", "10001", "9" * 5000]),
        st.sampled_from(["1.5", "0x10", "", " ", "-", "--", "--nope", "-x", "earliest"]),
        st.sampled_from(["latest", "json", "text", "exclusive", "shared", "1700000000000"]),
        st.sampled_from(["../x", "/", "\udcff", "a\udcffb", "a\nb", "127.0.0.1:1", "DEBUG"]),
        st.sampled_from([str(root / n) for n in ("good.toml", "bad.toml", "dir", "missing")]),
        st.sampled_from(["--help", "-h", "--json", "--yes", "-V", "--version"]),
        st.text(st.characters(blacklist_characters="\x00"), max_size=12),  # argv holds no NUL
    )


def _argv(setup: Setup) -> st.SearchStrategy[list[str]]:
    """A leaf command with its arguments, a random subset of its options each with a value
    of its type (or a hostile one), and sometimes junk tokens anywhere."""

    def for_leaf(leaf: tuple[tuple[str, ...], click.Command]) -> st.SearchStrategy[list[str]]:
        path, cmd = leaf
        positionals = [_value(p, setup.tokens) for p in cmd.params if isinstance(p, click.Argument)]
        params = [
            p
            for p in cmd.params
            if isinstance(p, click.Option) and p.opts[0] not in ("--watch", "--broker")
        ]
        required = st.tuples(*(_option(p, setup.tokens) for p in params if p.required))
        optional = [_option(p, setup.tokens) for p in params if not p.required]
        chosen = st.lists(st.one_of(optional), max_size=3) if optional else st.just([])
        junk: st.SearchStrategy[list[str]] = st.one_of(
            st.just([]), st.lists(setup.tokens, min_size=1, max_size=2)
        )
        return st.tuples(st.tuples(*positionals), required, chosen, junk).map(
            lambda t: [*path, *t[0], *(tok for opt in (*t[1], *t[2]) for tok in opt), *t[3]]
        )

    return st.sampled_from(LEAVES).flatmap(for_leaf)


def _option(p: click.Option, tokens: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    if p.is_flag:
        return st.just([p.opts[0]])
    return _value(p, tokens).map(lambda v: [p.opts[0], v])


def _value(p: click.Parameter, tokens: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A value of ``p``'s type (small, so nothing runs for long) or any token."""
    if isinstance(p.type, click.Choice):
        return st.one_of(st.sampled_from([str(c) for c in p.type.choices]), tokens)
    if isinstance(p.type, click.types.IntParamType):
        return st.one_of(st.integers(-1, 8).map(str), tokens)
    return tokens


def _claims(result: Any, argv: list[str]) -> None:
    where = f"headrace {' '.join(map(repr, argv))}"
    assert result.exit_code in (0, 1, 2), f"{where}: exit {result.exit_code}\n{result.output}"
    if result.exception is not None:
        assert isinstance(result.exception, SystemExit), f"{where}: {result.exception!r}"
    assert "Traceback" not in result.output, f"{where}:\n{result.output}"
    assert "Traceback" not in result.stderr, f"{where}:\n{result.stderr}"
    if result.exit_code != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("Error:") or line == "Aborted!"]
        assert len(errors) == 1, f"{where}: stderr is not one error line:\n{result.stderr}"


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Setup]:
    """A broker with topic ``t``; the CLI aimed at it; ``serve`` stops after its config."""

    async def no_broker(config: BrokerConfig, on_ready: object = None) -> None:
        assert isinstance(config, BrokerConfig)

    monkeypatch.setattr(broker.app, "serve", no_broker)  # `serve` imports it when it runs
    # Relative paths in fuzzed arguments (`tokens create --tokens-file -x` makes -x.lock)
    # land in the test's directory, not in the checkout.
    monkeypatch.chdir(tmp_path)
    with BrokerThread(broker_config(tmp_path / "data")) as running:
        request = _admin.CreateTopicRequest(name="t", partitions=2).SerializeToString()
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            unary(channel, "/headrace.v1.Admin/CreateTopic")(request)
        runner = CliRunner(env={"HEADRACE_BROKER": f"127.0.0.1:{running.port}"})
        yield Setup(runner, _values(tmp_path))


def _run(setup: Setup, n: int) -> None:
    @settings(max_examples=n)
    @given(argv=_argv(setup), stdin=st.binary(max_size=40))
    def one(argv: list[str], stdin: bytes) -> None:
        result = setup.runner.invoke(broker.cli.cli, argv, input=stdin, prog_name="headrace")
        _claims(result, argv)

    one()


def test_random_argv_exits_0_1_or_2_with_one_error_line(setup: Setup) -> None:
    """Scenario: random argv for every leaf command but the blocking ones, against a live
    broker. Expected: exit code 0, 1 or 2; no traceback; one Error: line on failure."""
    _run(setup, examples(CI))


@pytest.mark.slow
def test_random_argv_long_run(setup: Setup) -> None:
    """Scenario: as the short run, with many more examples. Expected: the same."""
    _run(setup, examples(SLOW))
