"""The bench command line: ``python -m bench <scenario> [--json] [--quick] [--dir DIR]
[--plot [DIR]]`` and ``python -m bench plot RESULTS.jsonl [--out DIR]``.

Owns argument parsing, running one registered scenario inside a scratch data directory, and
printing: with ``--json`` one JSON object per line as each result is measured; otherwise a
table and a goals section at the end. Every run starts with the machine record
(:mod:`bench._machine`). With ``--plot`` the run keeps its latency samples, adds their
quantile series to the output (JSON only: the tables leave them out) and draws its charts
(:mod:`bench.plot`) into DIR, ``docs/bench`` by default; ``plot`` redraws them from saved
``--json`` output. Exit codes: 0 success, 1 error, 2 usage.

The ``spark`` scenario takes flags of its own (``--records N``, ``--rounds N``), and so
does ``cluster`` (``--brokers 1,2``), so they are registered here, beside the parser that
reads them, on top of :data:`SCENARIOS`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from bench import plot
from bench._machine import machine_result
from bench._output import Result, render_human
from bench._runner import NOTES, SCENARIOS
from bench._samples import SampleLog
from bench._scenario import RunOptions, Scenario
from bench._scratch import scratch_root
from bench._server_process import ServerFailedError
from wal import WalError

#: Scenarios with flags of their own (see :func:`_scenario`).
FLAGGED = ("spark", "cluster")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark Headrace beside its peers.",
        epilog="Redraw the charts of saved --json output: python -m bench plot RESULTS.jsonl "
        "[--out DIR]",
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
        "--plot",
        type=Path,
        nargs="?",
        const=plot.DEFAULT_DIR,
        default=None,
        metavar="DIR",
        help="draw PNG charts of this run into DIR (default docs/bench); with --json the "
        "output adds the latency quantile series, so `plot` can redraw the CDFs later",
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
    parser.add_argument(
        "--brokers",
        default=None,
        metavar="N,N,...",
        help="cluster: broker counts to measure, 1 always among them (default 1..min(cores, 4))",
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
    if args.scenario != "cluster" and args.brokers is not None:
        parser.error("--brokers applies to the cluster scenario only")
    if args.scenario == "cluster":
        return _cluster(args, parser)
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


def _cluster(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Scenario:
    """The ``cluster`` scenario with its ``--brokers`` counts (a usage error when bad)."""
    from bench import cluster

    if args.records is not None or args.rounds is not None:
        parser.error("--records and --rounds apply to the spark scenario only")
    counts: tuple[int, ...] | None = None
    if args.brokers is not None:
        try:
            counts = cluster.parse_brokers(args.brokers)
        except ValueError as exc:
            parser.error(f"--brokers: {exc}")

    def run(options: RunOptions) -> Iterator[Result]:
        return cluster.run(options, brokers=counts)

    return run


def _plot_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench plot",
        description="Draw the charts of saved `python -m bench <scenario> --json` output "
        "(latency CDFs need output of a run with --plot too).",
    )
    parser.add_argument("results", type=Path, help="a file of bench JSON lines")
    parser.add_argument(
        "--out",
        type=Path,
        default=plot.DEFAULT_DIR,
        metavar="DIR",
        help="where the PNG files go (default docs/bench)",
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


def _error(message: str) -> int:
    print(f"bench: error: {message}", file=sys.stderr)
    return 1


def _not_a_directory(out: Path, flag: str) -> str | None:
    """Why ``out`` cannot take the charts, or None; checked before any measuring."""
    if out.exists() and not out.is_dir():
        return f"{flag}: {out} exists and is not a directory; give a directory for the charts"
    return None


def _write_charts(results: list[Result], samples: SampleLog | None, out: Path) -> int:
    """Draw the charts, name each file on stderr; the exit code."""
    try:
        written = plot.write_charts(results, samples or (), out)
    except (OSError, plot.PlotUnavailableError) as exc:
        return _error(f"charts not written: {exc}")
    if not written:
        return _error("nothing to chart: no throughput and no latency series in the results")
    for path in written:
        print(f"bench: chart written to {path}", file=sys.stderr)
    return 0


def plot_main(argv: Sequence[str]) -> int:
    """``python -m bench plot RESULTS.jsonl [--out DIR]``; the exit code."""
    args = _plot_parser().parse_args(argv)
    try:
        plot.require_matplotlib()
        results = plot.load_results(args.results)
    except (plot.PlotUnavailableError, plot.ResultsFileError) as exc:
        return _error(str(exc))
    if (problem := _not_a_directory(args.out, "--out")) is not None:
        return _error(problem)
    if not any(r.is_series_point for r in results) and any("latency" in r.metric for r in results):
        print(
            f"bench: note: {args.results} has no latency quantile series, so no CDF charts; "
            "save a run with --json --plot to keep them",
            file=sys.stderr,
        )
    return _write_charts(results, None, args.out)


def _run(args: argparse.Namespace, runner: Scenario, samples: SampleLog | None) -> list[Result]:
    """The machine record, then the scenario's results, then (with samples) their series."""
    results = _collect([machine_result(args.scenario)], as_json=args.json)
    with scratch_root(args.dir) as root:
        results += _collect(runner(RunOptions(args.quick, root, samples)), as_json=args.json)
    if samples is not None:
        results += _collect(samples.series(), as_json=args.json)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["plot"]:
        return plot_main(arguments[1:])
    parser = _parser()
    args = parser.parse_args(arguments)
    scenario = _scenario(args, parser)
    samples: SampleLog | None = None
    if args.plot is not None:
        try:
            plot.require_matplotlib()  # before the run, not after minutes of it
        except plot.PlotUnavailableError as exc:
            return _error(str(exc))
        if (problem := _not_a_directory(args.plot, "--plot")) is not None:
            return _error(problem)
        samples = SampleLog()
    try:
        results = _run(args, scenario, samples)
    except (OSError, WalError, ServerFailedError) as exc:
        return _error(str(exc))
    if not args.json:
        notes = NOTES[args.scenario]() if args.scenario in NOTES else []
        print(render_human(args.scenario, results, notes))
    if args.plot is not None:
        return _write_charts(results, samples, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
