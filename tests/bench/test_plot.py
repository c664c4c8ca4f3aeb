"""Tests of the bench charts end to end (``bench.plot`` and ``python -m bench ... --plot``,
``python -m bench plot``): real PNG files from real (tiny) scenario runs, checked for
being PNGs of the size their chart asks for; redrawn from the saved JSON lines; and the
one-line errors without matplotlib or with a bad results file."""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bench import _chartdata, plot, pubsub, wal
from bench.__main__ import _parser, main
from bench._output import Goal, Result
from bench._pubsub_system import FakeSystem
from bench._samples import QUANTILES, Distribution
from wal import FsyncPolicy

TINY_GRID = wal.Grid(
    record_bytes=(100, 1024), batch=(1, 100), fsync=(FsyncPolicy.ALWAYS,), appenders=(1, 4)
)
TINY_WAL = wal.Sizes(
    cell_seconds=0.03,
    cell_bytes=1 << 20,
    disk_seq_bytes=2 << 20,
    fdatasync_seconds=0.03,
    encode_seconds=0.01,
    reopen_log_bytes=2 << 20,
    reopen_runs=1,
    pair_rounds=1,
    pair_bytes=1 << 20,
)
TINY_PUBSUB = pubsub.Sizes(messages=500, e2e_rate=200.0, e2e_seconds=0.3, restart_log_bytes=1 << 20)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's header; fails if it is not a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert head[12:16] == b"IHDR"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def expected_pixels(size_in: tuple[float, float]) -> tuple[int, int]:
    return round(size_in[0] * _chartdata.DPI), round(size_in[1] * _chartdata.DPI)


def charts_of(
    results: list[Result], distributions: list[Distribution]
) -> dict[str, tuple[int, int]]:
    """File name -> the pixel size each chart of the results should have."""
    sizes = {}
    for bench in dict.fromkeys(r.bench for r in results):
        chart = _chartdata.throughput_chart(bench, results)
        if chart is not None:
            sizes[chart.filename] = expected_pixels(chart.size_in)
        for cdf in _chartdata.cdf_charts(bench, distributions, results):
            sizes[cdf.filename] = expected_pixels(cdf.size_in)
    return sizes


def _results_of(stdout: str) -> list[Result]:
    return [
        Result(d["bench"], d["system"], d["metric"], d["value"], d["unit"], d["params"])
        for d in map(json.loads, stdout.splitlines())
    ]


@pytest.fixture
def tiny_wal(monkeypatch: pytest.MonkeyPatch) -> None:
    """``bench wal --quick`` at test sizes: well under a second of measuring."""
    monkeypatch.setattr(wal, "QUICK", TINY_WAL)
    monkeypatch.setattr(wal, "Grid", lambda: TINY_GRID)


def test_wal_run_with_plot_writes_its_charts_and_json_that_redraws_them(
    tiny_wal: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Scenario: ``bench wal --quick --json --plot DIR``, then ``bench plot`` of its saved
    output into another directory. Expected: the throughput chart and one append latency
    CDF per record size (the grid has one fsync policy), each a PNG of its chart's size;
    the JSON carries the machine record first and a quantile series per distribution; the
    redraw writes the same files at the same sizes."""
    out = tmp_path / "charts"
    code = main(["wal", "--quick", "--json", "--dir", str(tmp_path / "data"), "--plot", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    results = _results_of(captured.out)
    assert (results[0].system, results[0].metric) == ("machine", "cpu_cores")
    series = [r for r in results if r.is_series_point]
    cells = len(list(TINY_GRID.cells()))
    assert len(series) == (cells + 1) * len(QUANTILES)
    names = {
        "wal_throughput.png",
        "wal_append_latency_cdf_100_always.png",
        "wal_append_latency_cdf_1024_always.png",
    }
    assert {p.name for p in out.iterdir()} == names
    expected = charts_of(results, _distributions(results))
    assert set(expected) == names
    for name, pixels in expected.items():
        assert png_size(out / name) == pixels, name
    assert captured.err.count("chart written to") == 3
    saved = tmp_path / "wal.jsonl"
    saved.write_text(captured.out)
    again = tmp_path / "again"
    assert main(["plot", str(saved), "--out", str(again)]) == 0
    assert {p.name: png_size(p) for p in again.iterdir()} == {
        p.name: png_size(p) for p in out.iterdir()
    }


def test_human_run_with_plot_keeps_the_series_out_of_the_tables(
    tiny_wal: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --json the tables show the measured figures and the machine, not the
    quantile series the charts were drawn from."""
    out = tmp_path / "charts"
    assert main(["wal", "--quick", "--dir", str(tmp_path / "data"), "--plot", str(out)]) == 0
    report = capsys.readouterr().out
    assert "append_records_s" in report
    assert "cpu_cores" in report
    assert "quantile" not in report
    assert (out / "wal_throughput.png").exists()


def test_pubsub_run_with_plot_draws_every_system(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Scenario: ``bench pubsub --quick --plot DIR`` with three fake systems. Expected: a
    throughput chart and an e2e latency CDF, each a PNG of its chart's size, the CDF with
    one curve per system."""
    systems = [("headrace", "always"), ("nats-jetstream", "default"), ("redis-streams", "everysec")]
    entries = [pubsub.Entry(s, _fake(s, f)) for s, f in systems]
    monkeypatch.setattr(pubsub, "_entries_from_env", lambda _warn: (entries, False))
    monkeypatch.setattr(pubsub, "QUICK", TINY_PUBSUB)
    out = tmp_path / "charts"
    code = main(
        ["pubsub", "--quick", "--json", "--dir", str(tmp_path / "data"), "--plot", str(out)]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    results = _results_of(captured.out)
    expected = charts_of(results, list(_distributions(results)))
    assert set(expected) == {"pubsub_throughput.png", "pubsub_e2e_latency_cdf.png"}
    for name, pixels in expected.items():
        assert png_size(out / name) == pixels, name
    (cdf,) = _chartdata.cdf_charts("pubsub", _distributions(results), results)
    assert [c.system for c in cdf.curves] == [s for s, _ in systems]


def _fake(system: str, fsync: str) -> Callable[[Path], FakeSystem]:
    return lambda _data_dir: FakeSystem(system, fsync)


def _distributions(results: list[Result]) -> list[Distribution]:
    """Stand-ins for the run's distributions, rebuilt from its series (same chart shape)."""
    from bench._samples import curves_from_series

    return [
        Distribution(c.bench, c.system, c.metric, c.params, [v for _, v in c.points])
        for c in curves_from_series(results)
    ]


def _synthetic(bench: str) -> tuple[list[Result], list[Distribution]]:
    """Results shaped like the scenarios that are too slow to run here (they need a broker,
    Spark, or minutes): their rates, spreads, goals and latency distributions."""
    machine = Result(
        bench, "machine", "cpu_cores", 2, "cores", {"cpu": "test", "date": "2026-11-24T10:00:00Z"}
    )
    if bench == "spark":
        spread = {"records": 200_000, "min": 1.0e6, "max": 2.2e6}
        goal = Goal(">=", 500_000).params(5.1e5)
        return [
            machine,
            Result(bench, "headrace", "connector_read_rows_s", 2.0e6, "rows/s", spread),
            Result(bench, "spark-parquet", "parquet_read_rows_s", 4.2e6, "rows/s", spread),
            Result(bench, "headrace", "stream_ingest_rows_s", 5.1e5, "rows/s", {**spread, **goal}),
            Result(
                bench,
                "headrace",
                "sink_write_rows_s",
                7.3e5,
                "rows/s",
                {"min": 3.6e5, "max": 7.4e5},
            ),
            Result(bench, "headrace", "connector_vs_parquet", 0.47, "x", {}),
        ], []
    if bench == "memory":
        return [
            machine,
            Result(bench, "headrace", "publish_rate", 96.0, "MiB/s", {"seconds": 4.0}),
        ], []
    rates = [Result(bench, "headrace", "shared_msgs_s", 1.1e6, "msgs/s", {"consumers": 8})]
    e2e = [
        Distribution(
            bench,
            system,
            "e2e_latency_quantile_ms",
            {"rate_msg_s": rate},
            [i / 10 for i in range(1, 500)],
        )
        for system, rate in (("headrace", 2000.0), ("headrace", 200.0), ("grpc-aio-floor", 200.0))
    ]
    missed = Distribution(
        bench,
        "headrace",
        "missed_notification_delivery_quantile_ms",
        {"losses": 200},
        [499.0, 500.2],
    )
    return [machine, *rates], [*e2e, missed]


@pytest.mark.parametrize(
    ("bench", "files"),
    [
        ("spark", {"spark_throughput.png"}),
        ("memory", {"memory_throughput.png"}),
        (
            "dispatch",
            {
                "dispatch_throughput.png",
                "dispatch_e2e_latency_cdf.png",
                "dispatch_missed_notification_delivery_cdf.png",
            },
        ),
    ],
)
def test_every_scenario_gets_its_charts(bench: str, files: set[str], tmp_path: Path) -> None:
    """Scenario: results shaped like each remaining scenario's. Expected: one throughput
    chart per scenario and one CDF per latency metric, PNGs of their charts' sizes, listed
    throughput first."""
    results, distributions = _synthetic(bench)
    written = plot.write_charts(results, distributions, tmp_path / "out")
    assert {p.name for p in written} == files
    assert written[0].name == f"{bench}_throughput.png"
    for name, pixels in charts_of(results, distributions).items():
        assert png_size(tmp_path / "out" / name) == pixels, name


def test_without_matplotlib_plot_fails_at_once_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Scenario: matplotlib cannot be imported. Expected: ``--plot`` exits 1 before
    measuring anything (no output, no data directory), ``bench plot`` too, each with one
    line on stderr that says how to install it; a run without --plot is unaffected."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    data = tmp_path / "data"
    assert main(["wal", "--quick", "--dir", str(data), "--plot", str(tmp_path / "out")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert "pip install 'headrace[bench]'" in captured.err
    assert "matplotlib" in captured.err
    assert not data.exists()
    assert not (tmp_path / "out").exists()
    saved = tmp_path / "r.jsonl"
    saved.write_text(
        Result("wal", "headrace", "encode_records_s", 1.0, "records/s").to_json() + "\n"
    )
    assert main(["plot", str(saved)]) == 1
    assert "pip install 'headrace[bench]'" in capsys.readouterr().err
    with pytest.raises(plot.PlotUnavailableError):
        plot.write_charts([], [], tmp_path / "out")


def _line(value: str = "1", params: str = "{}") -> str:
    return (
        f'{{"bench": "wal", "system": "s", "metric": "m", "value": {value}, "unit": "u", '
        f'"params": {params}}}'
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "holds no bench results"),
        ('{"bench": "wal"}\n', "line 1 lacks system, metric, value, unit, params"),
        ("\nnot json\n", "line 2 is not JSON"),
        ("[1, 2]\n", "line 1 is not a JSON object"),
        (_line(value='"1"'), "value must be a finite number"),
        (_line(params='{"a": [1]}'), "params must be an object"),
        (
            '{"bench": 1, "system": "s", "metric": "m", "value": 1, "unit": "u", "params": {}}',
            "must be strings",
        ),
    ],
)
def test_a_bad_results_file_is_one_line_naming_the_line(
    content: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``bench plot`` of a file that is not bench --json output exits 1 with one line on
    stderr naming the file, the line and what is wrong; nothing is drawn."""
    saved = tmp_path / "r.jsonl"
    saved.write_text(content)
    assert main(["plot", str(saved), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("bench: error: ")
    assert str(saved) in err
    assert message in err
    assert not (tmp_path / "out").exists()


def test_plot_of_a_missing_file_or_old_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing file is an error naming it; output saved without --plot (latencies but no
    series) still gets its throughput chart, with a note that CDFs need --plot."""
    assert main(["plot", str(tmp_path / "missing.jsonl")]) == 1
    assert "cannot read" in capsys.readouterr().err
    saved = tmp_path / "old.jsonl"
    lines = [
        Result("pubsub", "headrace", "publish_msgs_s", 1e6, "msgs/s", {}),
        Result("pubsub", "headrace", "e2e_latency_p50_ms", 2.0, "ms", {}),
    ]
    saved.write_text("".join(r.to_json() + "\n" for r in lines))
    assert main(["plot", str(saved), "--out", str(tmp_path / "out")]) == 0
    assert "--json --plot" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["pubsub_throughput.png"]


def test_plot_subcommand_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """``bench plot`` without a file is a usage error (exit 2)."""
    with pytest.raises(SystemExit) as exc:
        main(["plot"])
    assert exc.value.code == 2
    assert "RESULTS" in capsys.readouterr().err.upper()


def test_plot_dir_defaults_to_docs_bench_and_must_be_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--plot`` alone means docs/bench; a --plot or --out that is a file is refused in
    one line before anything is measured or drawn."""
    assert _parser().parse_args(["wal", "--plot"]).plot == Path("docs") / "bench"
    assert _parser().parse_args(["wal"]).plot is None
    a_file = tmp_path / "file"
    a_file.write_text("")
    data = tmp_path / "data"
    assert main(["wal", "--quick", "--dir", str(data), "--plot", str(a_file)]) == 1
    err = capsys.readouterr().err
    assert "--plot" in err
    assert "is not a directory" in err
    assert not data.exists()
    saved = tmp_path / "r.jsonl"
    saved.write_text(Result("wal", "headrace", "encode_records_s", 1.0, "records/s").to_json())
    assert main(["plot", str(saved), "--out", str(a_file)]) == 1
    assert "--out" in capsys.readouterr().err
