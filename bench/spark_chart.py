"""Draw the chart of ``python -m bench spark --json`` output: rows per second of each
figure, min to max as error bars, beside its goal.

Usage: ``python -m bench spark --json > spark.jsonl`` then
``python -m bench.spark_chart spark.jsonl docs/bench/spark_throughput.png``. Needs
matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

#: (metric, system, label) of each bar, in order.
BARS = (
    ("parquet_read_rows_s", "spark-parquet", "Spark Parquet read"),
    ("connector_read_rows_s", "headrace", "connector batch read"),
    ("stream_ingest_rows_s", "headrace", "connector stream ingest\n(200k per trigger)"),
    ("sink_write_rows_s", "headrace", "sink publish\n(fsync always)"),
)
#: Rows per second the issue asks of the streaming and sink figures.
GOAL_ROWS_S = 500_000


def load(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The bench's JSON lines, by (metric, system)."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip().startswith("{"):
            doc = json.loads(line)
            out[(doc["metric"], doc["system"])] = doc
    return out


def draw(results: dict[tuple[str, str], dict[str, Any]], target: Path) -> None:
    """A horizontal bar chart of the four figures (millions of rows per second)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, values, low, high = [], [], [], []
    for metric, system, label in BARS:
        doc = results[(metric, system)]
        value = doc["value"] / 1e6
        labels.append(label)
        values.append(value)
        low.append(value - doc["params"].get("min", doc["value"]) / 1e6)
        high.append(doc["params"].get("max", doc["value"]) / 1e6 - value)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    colors = ["#999999", "#1f77b4", "#1f77b4", "#2ca02c"]
    ax.barh(labels, values, xerr=[low, high], color=colors, capsize=4)
    ax.axvline(GOAL_ROWS_S / 1e6, color="#d62728", linestyle="--", linewidth=1)
    ax.invert_yaxis()
    ax.text(GOAL_ROWS_S / 1e6, len(values) - 0.45, " goal 0.5 M", color="#d62728", fontsize=8)
    for y, (v, up) in enumerate(zip(values, high, strict=True)):
        ax.text(v + up, y, f"  {v:.2f} M", va="center", fontsize=8)
    ax.set_xlim(0, max(v + up for v, up in zip(values, high, strict=True)) * 1.15)
    ax.set_xlabel("million rows per second (median of rounds; bars: min-max)")
    records = results[("connector_read_rows_s", "headrace")]["params"]["records"]
    ax.set_title(f"bench spark: {records:,} records of 100 B, local[2], 2 cores", fontsize=10)
    fig.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m bench.spark_chart RESULTS.jsonl CHART.png", file=sys.stderr)
        return 2
    draw(load(Path(args[0])), Path(args[1]))
    print(f"chart written to {args[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
