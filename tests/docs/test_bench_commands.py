"""docs/benchmarks.md's shell blocks: the chart commands run as printed; every other bench
command is checked by the bench's own argument parser on its exact argv.

Why most commands are not run: each full scenario takes minutes on the 2-core machine
(``pubsub`` about 4, ``hint`` about 1.5, ``spark`` about 1 plus a JVM), several install
their peers' servers with apt (``pubsub``), and the CI suite shares the machine, so a
test runs each one's argv through ``python -m bench``'s parser (:func:`bench.__main__.
_parser`, then :func:`bench.__main__._scenario`, which refuses flags a scenario does not
take; ``plot``'s through :func:`bench.__main__._plot_parser`): a renamed scenario, a
dropped flag or a flag given to the wrong scenario fails here. The scenarios themselves are
run at test sizes by ``tests/bench/``. The ``HEADRACE_BENCH_SYSTEMS`` value is checked with
:func:`bench.pubsub.select_systems` (every name known); ``pip install -e '.[bench]'`` by
the extra existing in pyproject.toml (a test installs nothing).

What runs: the "Charts" block's ``bench wal --quick --json --plot > docs/bench/...`` (about
6 s) and ``bench plot docs/bench/pubsub-quick.jsonl``, as printed, in a scratch directory
holding a copy of the committed ``docs/bench/pubsub-quick.jsonl`` (so the charts are
written there, not over the committed ones). ``bench pubsub --quick`` (20 s, with its
peers) is parsed only.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import tomllib
from pathlib import Path

import pytest

from bench.__main__ import _parser, _plot_parser, _scenario
from bench.pubsub import select_systems
from tests.docs._shell import ROOT, commands, session, shell_blocks, without_comment

PAGE = ROOT / "docs" / "benchmarks.md"
BENCH = ".venv/bin/python -m bench"
PIP = ".venv/bin/pip install -e '.[bench]'"
#: Keys of every line of bench JSON output (docs/benchmarks.md, DESIGN.md section 4).
KEYS = {"bench", "system", "metric", "value", "unit", "params"}


def page_commands() -> list[str]:
    """Every command of the page's shell blocks, trailing comments dropped."""
    return [without_comment(c) for block in shell_blocks(PAGE) for c in commands(block)]


def bench_argv(command: str) -> tuple[dict[str, str], list[str]]:
    """``(environment assignments, argv after -m bench)`` of a page command; a ``> FILE``
    redirection is the shell's, not the bench's, and is left out."""
    words = shlex.split(command)
    env = {}
    while re.fullmatch(r"[A-Z_]+=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    assert words[:3] == BENCH.split(), command
    argv = words[3:]
    if ">" in argv:
        argv = argv[: argv.index(">")]
    return env, argv


def parses(argv: list[str]) -> argparse.Namespace:
    """``argv`` through the bench's parser; fails the test with the parser's words."""
    try:
        if argv[:1] == ["plot"]:
            return _plot_parser().parse_args(argv[1:])
        parser = _parser()
        args = parser.parse_args(argv)
        _scenario(args, parser)
    except SystemExit as exc:
        pytest.fail(f"python -m bench {shlex.join(argv)} does not parse (exit {exc.code})")
    return args


def test_every_bench_command_on_the_page_parses() -> None:
    """Scenario: every command in the page's shell blocks but the pip line, through the
    bench's argument parser (see the module docstring for why they are not run whole).
    Expected: each parses; the scenarios the page names are the bench's; the systems
    variable names only known systems; the pip line's extra exists."""
    found = page_commands()
    assert PIP in found
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "bench" in extras["optional-dependencies"]
    scenarios = set()
    for command in (c for c in found if c != PIP):
        env, argv = bench_argv(command)
        args = parses(argv)
        scenarios.add(argv[0])
        assert set(env) <= {"HEADRACE_BENCH_SYSTEMS"}, command
        if "HEADRACE_BENCH_SYSTEMS" in env:
            _, unknown = select_systems(env["HEADRACE_BENCH_SYSTEMS"])
            assert unknown == [], command
        if argv[0] == "plot":
            assert args.results.name, command
    assert scenarios >= {"wal", "pubsub", "dispatch", "spark", "memory", "hint", "plot"}


@pytest.mark.parametrize(
    "argv",
    [["nonesuch"], ["wal", "--records", "5"], ["plot"], ["pubsub", "--rounds", "0"]],
    ids=["unknown scenario", "a spark flag on wal", "plot without a file", "rounds 0"],
)
def test_the_parse_check_refuses_what_the_bench_refuses(argv: list[str]) -> None:
    """Scenario: argv the bench refuses (an unknown scenario, a spark-only flag given to
    wal, plot without its file, --rounds 0). Expected: the check fails, so the parse test
    above could."""
    with pytest.raises(pytest.fail.Exception, match="does not parse"):
        parses(argv)


def test_the_chart_commands_run_as_printed(tmp_path: Path) -> None:
    """Scenario: the "Charts" block in a scratch directory holding a copy of the
    committed docs/bench/pubsub-quick.jsonl: its wal line and its plot line run as
    printed; its pubsub line is parsed (module docstring). Expected: both exit 0; the wal
    line's file is bench JSON lines (the machine record first, then wal results); every
    chart the page shows or links under bench/ was drawn by them."""
    text = PAGE.read_text()
    block = text[text.index("## Charts") :]
    wal, pubsub, plot = commands(shell_blocks(PAGE)[1])
    assert block.index(wal) < block.index("![")  # the block under "Charts"
    parses(bench_argv(without_comment(pubsub))[1])
    (tmp_path / "docs" / "bench").mkdir(parents=True)
    shutil.copy(ROOT / "docs/bench/pubsub-quick.jsonl", tmp_path / "docs/bench")
    for step in session([wal, plot], tmp_path, {}, timeout=300):
        assert step.returncode == 0, step
    lines = [
        json.loads(x)
        for x in (tmp_path / "docs/bench/wal-quick.jsonl").read_text().split("\n")
        if x
    ]
    assert all(set(line) == KEYS for line in lines)
    assert lines[0]["system"] == "machine"
    assert {line["bench"] for line in lines} == {"wal"}
    shown = set(re.findall(r"\(bench/([\w.-]+\.png)\)", text[: text.index("## Against the peers")]))
    assert shown, "the Charts section shows charts"
    drawn = {p.name for p in (tmp_path / "docs/bench").glob("*.png")}
    assert shown <= drawn, shown - drawn
