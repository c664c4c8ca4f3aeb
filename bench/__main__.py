"""The bench command line: ``python -m bench <scenario> [--json] [--quick] [--dir DIR]``.

Owns argument parsing, running one registered scenario inside a scratch data directory, and
printing: with ``--json`` one JSON object per line as each result is measured; otherwise a
table and a goals section at the end. Exit codes: 0 success, 1 error, 2 usage.

The ``spark`` scenario takes flags of its own (``--records N``, ``--rounds N``), so it is
registered here, beside the parser that reads them, on top of :data:`SCENARIOS`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from bench._output import Result, render_human
from bench._runner import SCENARIOS, RunOptions, Scenario, scratch_root
from wal import WalError

#: Scenarios with flags of their own (see :func:`_scenario`).
FLAGGED = ("spark",)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="Benchmark Headrace beside its peers."
    )
    parser.add_argument("scenario", choices=sorted([*SCENARIOS, *FLAGGED]), help="what to measure")
    parser.add_argument("--json", action="store_true", help="print one JSON object per line")
    parser.add_argument("--quick", action="store_true", help="small sizes: a run of seconds")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where data files go (default ./data/bench; use a real disk, not tmpfs)",
    )
    parser.add_argument(
        "--records",
        type=_positive,
        default=None,
        help="spark: records in the topic (default 2,000,000; 200,000 with --quick)",
    )
    parser.add_argument(
        "--rounds", type=_positive, default=None, help="spark: runs of each figure (default 3)"
    )
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _scenario(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Scenario:
    """The runner of ``args.scenario``, given its own flags; a usage error (exit 2) when
    flags are given to a scenario that does not take them."""
    if args.scenario != "spark":
        if args.records is not None or args.rounds is not None:
            parser.error("--records and --rounds apply to the spark scenario only")
        return SCENARIOS[args.scenario]

    def spark(options: RunOptions) -> Iterator[Result]:
        from bench import spark

        sizes = spark.Sizes(
            records=args.records
            or (spark.QUICK_RECORDS if options.quick else spark.DEFAULT_RECORDS),
            rounds=args.rounds or spark.DEFAULT_ROUNDS,
        )
        return spark.run(options, sizes=sizes)

    return spark


def _collect(results: Iterable[Result], *, as_json: bool) -> list[Result]:
    """Gather results, printing each as a JSON line right away when ``as_json``."""
    collected: list[Result] = []
    for result in results:
        collected.append(result)
        if as_json:
            print(result.to_json(), flush=True)
    return collected


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    scenario = _scenario(args, parser)
    try:
        with scratch_root(args.dir) as root:
            results = _collect(scenario(RunOptions(args.quick, root)), as_json=args.json)
    except (OSError, WalError) as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    if not args.json:
        print(render_human(args.scenario, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
