"""Every shell example of the docs is run by a test, or is on a reasoned list of those
that are not: a new ```sh / ```bash / ```console block in docs/ or README.md fails here
until it is one or the other.

A block is named by its page, its first line (without a trailing comment or ``\\``, cut to
60 characters) and, when that opens several blocks of the page, which of them (1, 2,
...). :data:`RUN_BY` gives the tests that run each block (together, when several share
it); :data:`NOT_RUN` gives the reason for each block no test runs. Both are checked
against the pages both ways: a block on neither list fails, and so does an entry that no
longer names a block, or a test that does not exist.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from tests.docs._shell import ROOT, commands, shell_blocks, without_comment

#: A block: (page relative to the repository, its first line, which such block).
Block = tuple[str, str, int]

_QUICKSTART = "tests/docs/test_quickstart.py::test_the_quickstart_prints_what_the_page_shows"
_README_IS_PAGE = "tests/docs/test_quickstart.py::test_the_readme_quickstart_is_the_pages"
_OPS = "tests/docs/test_operations_blocks.py::"
_SECURITY = "tests/docs/test_security_page.py::"
_BENCH = "tests/docs/test_bench_commands.py::"
_CLUSTER = "tests/docs/test_cluster_page.py::"
_GRPCURL = (
    "tests/broker/test_readme_grpcurl.py::"
    "test_the_readme_grpcurl_session_works_against_a_real_broker"
)

#: Each block some test runs, and the tests that run it (each names its substitutions).
RUN_BY: dict[Block, tuple[str, ...]] = {
    ("docs/quickstart.md", ".venv/bin/headrace topics create orders --partitions 3", 1): (
        _QUICKSTART,
    ),
    ("docs/quickstart.md", "seq 5 | .venv/bin/headrace produce orders", 1): (_QUICKSTART,),
    ("docs/quickstart.md", ".venv/bin/headrace consume orders --subscription billing --c", 1): (
        _QUICKSTART,
    ),
    ("docs/quickstart.md", ".venv/bin/headrace lag", 1): (_QUICKSTART,),
    ("docs/quickstart.md", ".venv/bin/headrace consume orders -s billing --count 1 --dea", 1): (
        _QUICKSTART,
    ),
    ("docs/quickstart.md", "rm -rf ./data", 1): (
        _OPS + "test_serve_with_defaults_then_wal_inspect_then_clean_up",
    ),
    ("docs/quickstart.md", ".venv/bin/headrace topics create orders --partitions 3", 2): (
        "tests/docs/test_quickstart.py::test_every_command_of_the_longer_tour_runs",
    ),
    ("README.md", ".venv/bin/headrace topics create orders --partitions 3", 1): (
        _README_IS_PAGE,
        _QUICKSTART,
    ),
    ("README.md", "seq 5 | .venv/bin/headrace produce orders", 1): (
        _README_IS_PAGE,
        _QUICKSTART,
    ),
    ("README.md", ".venv/bin/headrace consume orders --subscription billing --c", 1): (
        _README_IS_PAGE,
        _QUICKSTART,
    ),
    ("README.md", ".venv/bin/headrace lag", 1): (
        _README_IS_PAGE,
        _QUICKSTART,
    ),
    ("docs/concepts.md", "headrace lag", 1): (_OPS + "test_the_lag_examples_run_as_printed",),
    ("docs/operations/serving.md", ".venv/bin/headrace serve", 1): (
        _OPS + "test_serve_with_defaults_then_wal_inspect_then_clean_up",
        _OPS + "test_serve_on_a_reachable_address_needs_security",
    ),
    ("docs/operations/wal.md", ".venv/bin/headrace wal inspect ./data/topics/orders/0", 1): (
        _OPS + "test_serve_with_defaults_then_wal_inspect_then_clean_up",
        "tests/docs/test_examples.py::test_the_wal_example_prints_what_the_page_shows_and_inspects_clean",
    ),
    (
        "docs/operations/security.md",
        "headrace tokens create --name ops --grant 'admin:*' --config",
        1,
    ): (_SECURITY + "test_the_secured_broker_session_runs_as_printed",),
    (
        "docs/operations/security.md",
        "headrace topics create orders --partitions 3 --broker broker",
        1,
    ): (_SECURITY + "test_the_secured_broker_session_runs_as_printed",),
    (
        "docs/operations/security.md",
        "headrace tokens create --name etl --role consume --topics 'o",
        1,
    ): (_SECURITY + "test_the_tokens_commands_run_as_printed",),
    (
        "docs/operations/cluster.md",
        ".venv/bin/headrace cluster local --brokers 3 --data-dir /tmp",
        1,
    ): (_CLUSTER + "test_the_local_cluster_session_runs_as_printed",),
    (
        "docs/operations/cluster.md",
        "export HEADRACE_BROKER=127.0.0.1:52380,127.0.0.1:52381,127.0",
        1,
    ): (_CLUSTER + "test_the_local_cluster_session_runs_as_printed",),
    (
        "docs/operations/cluster.md",
        ".venv/bin/headrace topics create orders --partitions 3 --rep",
        1,
    ): (_CLUSTER + "test_the_replicated_topic_example_runs_as_printed",),
    ("docs/grpcurl.md", 'grpcurl -plaintext -d \'{"name": "orders", "partitions": 1}\'', 1): (
        _GRPCURL,
    ),
    ("docs/grpcurl.md", 'grpcurl -plaintext -d \'{"topic": "orders", "partition": -1,', 1): (
        _GRPCURL,
    ),
    ("docs/grpcurl.md", 'grpcurl -plaintext -d \'{"topic": "orders", "partition": 0, "', 1): (
        _GRPCURL,
    ),
    ("docs/grpcurl.md", "grpcurl -plaintext -d @ 127.0.0.1:50051 headrace.v1.Broker/S", 1): (
        _GRPCURL,
    ),
    ("docs/spark.md", ".venv/bin/python docs/examples/spark_order_counts.py", 1): (
        "tests/spark_connector/test_order_counts_example.py::test_the_order_counts_script_counts_each_run_once",
    ),
    ("docs/benchmarks.md", ".venv/bin/python -m bench wal", 1): (
        _BENCH + "test_every_bench_command_on_the_page_parses",
    ),
    ("docs/benchmarks.md", ".venv/bin/python -m bench wal --quick --json --plot > docs/b", 1): (
        _BENCH + "test_the_chart_commands_run_as_printed",
    ),
    ("docs/benchmarks.md", ".venv/bin/python -m bench pubsub", 1): (
        _BENCH + "test_every_bench_command_on_the_page_parses",
    ),
    ("docs/benchmarks.md", "HEADRACE_BENCH_SYSTEMS=headrace,redis-streams,grpc-aio-floor", 1): (
        _BENCH + "test_every_bench_command_on_the_page_parses",
    ),
    ("docs/benchmarks.md", ".venv/bin/python -m bench hint", 1): (
        _BENCH + "test_every_bench_command_on_the_page_parses",
    ),
    ("docs/benchmarks.md", ".venv/bin/python -m bench spark --json > bench/results/spark", 1): (
        _BENCH + "test_every_bench_command_on_the_page_parses",
    ),
    ("docs/benchmarks.md", ".venv/bin/python -m bench cluster", 1): (
        _BENCH + "test_every_bench_command_on_the_page_parses",
        "tests/bench/test_cluster_bench.py::test_quick_run_measures_every_cell_on_placed_topics",
    ),
    ("docs/benchmarks.md", ".venv/bin/python -m bench replication", 1): (
        _BENCH + "test_every_bench_command_on_the_page_parses",
        "tests/bench/test_replication.py::test_quick_json_run_reports_every_system_that_can_run_here",
    ),
}

_MAKE = (
    "make targets: they set up .venv (pip install), run the whole suite, serve until "
    "Ctrl-C or run minutes of benchmarks, so no test runs them; each target named is "
    "checked to exist in the Makefile below"
)
#: Each block no test runs, and why.
NOT_RUN: dict[Block, str] = {
    ("docs/quickstart.md", "make run", 1): (
        "make run is `pip install` then `headrace serve`; the quickstart test starts that "
        "serve and compares its banner with this step's output"
    ),
    ("README.md", "make run", 2): "the quickstart's step 1 (the README's is the page's)",
    ("README.md", "make run", 1): _MAKE,
    ("README.md", "make lint", 1): _MAKE,
    ("docs/index.md", "make run", 1): _MAKE,
    ("docs/development.md", "make run", 1): _MAKE,
}


def _pages() -> list[Path]:
    docs = (p for p in (ROOT / "docs").rglob("*.md") if "examples" not in p.parts)
    return [*sorted(docs), ROOT / "README.md"]


def _name(first_line: str) -> str:
    """A block's name: its first line without a trailing comment or continuation, cut to
    60 characters."""
    return without_comment(first_line).removesuffix("\\").rstrip()[:60].rstrip()


def blocks_of(page: Path, name: str) -> dict[Block, str]:
    """The shell blocks of ``page`` (called ``name``), by name, with their bodies."""
    found: dict[Block, str] = {}
    seen: Counter[str] = Counter()
    for body in shell_blocks(page):
        first = _name(body.splitlines()[0]) if body.strip() else ""
        seen[first] += 1
        found[name, first, seen[first]] = body
    return found


def blocks() -> dict[Block, str]:
    """Every shell block of the docs and the README, by name, with its body."""
    found: dict[Block, str] = {}
    for page in _pages():
        found |= blocks_of(page, str(page.relative_to(ROOT)))
    return found


def test_every_shell_block_is_run_by_a_test_or_listed_with_a_reason() -> None:
    """Scenario: every ```sh / ```bash / ```console / ```shell block of docs/ and
    README.md. Expected: each is in RUN_BY or in NOT_RUN (not both), and every entry of
    either names a block that exists (an entry left behind by an edit fails too)."""
    found = set(blocks())
    assert not RUN_BY.keys() & NOT_RUN.keys()
    listed = RUN_BY.keys() | NOT_RUN.keys()
    unlisted = sorted(found - listed)
    assert unlisted == [], (
        "shell blocks no test runs: run each in a test (and add it to RUN_BY) or add it to "
        f"NOT_RUN with the reason: {unlisted}"
    )
    assert sorted(listed - found) == [], "entries that name no block"


def test_every_named_test_exists() -> None:
    """Scenario: each test RUN_BY names. Expected: its file exists and defines it."""
    missing = []
    for tests in RUN_BY.values():
        for test in tests:
            path, name = test.split("::")
            source = (ROOT / path).read_text() if (ROOT / path).is_file() else ""
            if not re.search(rf"^(async )?def {name}\(", source, re.MULTILINE):
                missing.append(test)
    assert missing == []


def test_every_make_target_a_page_shows_exists() -> None:
    """Scenario: each `make TARGET` line of the blocks no test runs. Expected: the
    Makefile defines TARGET (the pages' make lines are checked though not run)."""
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.MULTILINE))
    found = blocks()
    named = [c.split()[1] for key in NOT_RUN for c in commands(found[key]) if c.startswith("make ")]
    assert len(named) >= 10
    assert sorted(set(named) - targets) == []


def test_the_guard_sees_a_new_block(tmp_path: Path) -> None:
    """Scenario: a page with a ```bash block, an indented ```console block, a ~~~sh block
    with a title whose first line repeats the first block's, and a ```text block.
    Expected: the three shell blocks are found, the repeat as its second occurrence, the
    text block not (so the check above would fail on a new shell block in any form)."""
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\necho a\n```\n\n- a list\n\n    ```console\n    $ echo b\n    ```\n\n"
        '~~~sh title="again"\necho a\n~~~\n\n```text\necho c\n```\n'
    )
    found = blocks_of(page, "page.md")
    assert list(found) == [("page.md", "echo a", 1), ("page.md", "    $ echo b", 1),
                           ("page.md", "echo a", 2)]  # fmt: skip
