"""The bench command line: ``python -m bench <scenario> [--json] [--quick] [--dir DIR]``.

Owns argument parsing, running one registered scenario inside a scratch data directory, and
printing: with ``--json`` one JSON object per line as each result is measured; otherwise a
table and a goals section at the end. Exit codes: 0 success, 1 error, 2 usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from bench._output import Result, render_human
from bench._runner import SCENARIOS, RunOptions, scratch_root
from wal import WalError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="Benchmark Headrace beside its peers."
    )
    parser.add_argument("scenario", choices=sorted(SCENARIOS), help="what to measure")
    parser.add_argument("--json", action="store_true", help="print one JSON object per line")
    parser.add_argument("--quick", action="store_true", help="small sizes: a run of seconds")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where data files go (default ./data/bench; use a real disk, not tmpfs)",
    )
    return parser


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
    args = _parser().parse_args(argv)
    scenario = SCENARIOS[args.scenario]
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
