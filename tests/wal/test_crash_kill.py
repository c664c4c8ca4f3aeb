"""A real crash test: SIGKILL a writing process at random moments (``DESIGN.md`` 2.6).

A child process (:mod:`tests.wal._crash_child`) appends with fsync ALWAYS from eight
concurrent tasks and prints every acknowledgement. The parent kills it with SIGKILL after a
seeded random delay (some kills land while it is still starting or recovering), restarts it
on the same directory, and after every kill checks a copy of the directory: every
acknowledged record of every run so far is present at its acknowledged offset, intact and
in order; no record appears twice.

SIGKILL loses the process, not the page cache, so this checks the logic (offsets, group
commit, rolls, restarts and recovery), while ``test_faults`` covers torn writes and power
loss.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from tests.wal._crash_child import id_of, value_for
from wal import Log

ROOT = Path(__file__).resolve().parents[2]
RUNS = 25
SEED = 20240607


@dataclass
class Tally:
    """Counts reported at the end of the test."""

    kills: int = 0
    kills_before_ready: int = 0
    acked_batches: int = 0
    acked_records: int = 0
    torn_tails_cut: int = 0
    bytes_cut: int = 0
    records_in_log: int = 0
    segments: int = 0
    per_run: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Ack:
    """One acknowledged append: offsets first..last hold ids first_id.."""

    first_offset: int
    last_offset: int
    first_id: int
    count: int


def run_and_kill(
    path: Path, run: int, delay: float, after_ready: bool, log_dir: Path
) -> tuple[list[Ack], bool]:
    """Start a child on ``path`` and SIGKILL it ``delay`` seconds after it started (or,
    with ``after_ready``, after it reported ready, so a slow start still leaves time to
    append). Return the acknowledgements it printed and whether it had reported ready."""
    stderr_path = log_dir / f"child-{run}.stderr"
    chunks: list[bytes] = []
    ready = threading.Event()

    def drain(out: IO[bytes]) -> None:
        for line in iter(out.readline, b""):
            chunks.append(line)
            if line == b"ready\n":
                ready.set()

    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.wal._crash_child", str(path), str(run)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        assert proc.stdout is not None
        reader = threading.Thread(target=drain, args=(proc.stdout,))
        reader.start()
        if after_ready:
            ready.wait(30)
        time.sleep(delay)
        exited = proc.poll()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        reader.join()
        proc.stdout.close()
    assert exited is None, f"child exited on its own ({exited}): {stderr_path.read_text()}"
    lines = [c[:-1] for c in chunks if c.endswith(b"\n")]  # a torn last line is dropped
    started = bool(lines) and lines[0] == b"ready"
    acks = [Ack(*map(int, line.split())) for line in lines[1:]] if started else []
    return acks, started


def check_copy(path: Path, scratch: Path, acks: list[Ack], tally: Tally) -> None:
    """Open a copy of the directory (so that the next child recovers the original itself)
    and check every acknowledgement so far against it."""
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(path, scratch)
    log = Log.open(str(scratch))
    try:
        tally.torn_tails_cut += log.recovery.truncated_bytes > 0
        tally.bytes_cut += log.recovery.truncated_bytes
        tally.segments = log.recovery.segments
        assert log.first_offset == 0
        values: list[bytes] = []
        for batch in log.read(0, 1 << 40):
            assert batch.base_offset == len(values), "offsets are not dense"
            values += batch.values()
        assert len(values) == log.head
    finally:
        log.close()
    tally.records_in_log = len(values)
    ids = [id_of(v) for v in values]
    assert len(set(ids)) == len(ids), "a record appears twice"
    for rid, value in zip(ids, values, strict=True):
        assert value == value_for(rid), f"record {rid} is damaged"
    for ack in acks:
        for k in range(ack.count):
            offset = ack.first_offset + k
            assert offset < len(values), f"acknowledged offset {offset} lost (head {len(values)})"
            assert ids[offset] == ack.first_id + k, f"offset {offset} holds the wrong record"
    last_seq: dict[int, int] = {}
    for rid in ids:  # each appender's records appear in the order it appended them
        writer, seq = divmod(rid, 10**7)
        assert seq > last_seq.get(writer, -1), f"record {rid} is out of order"
        last_seq[writer] = seq


def test_sigkill_at_random_moments_loses_no_acknowledged_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Scenario: 25 times, start the child on the same directory and SIGKILL it after a
    seeded random delay (one in five measured from the start, so that it may land while the
    child starts up or recovers; the rest 20-400 ms after it is ready). Expected:
    after every kill, every acknowledged record of every run is at its acknowledged offset
    with its exact payload, each appender's records are in order, none appears twice, and
    the log really did roll and acknowledge records."""
    rng = random.Random(SEED)
    path = tmp_path / "log"
    scratch = tmp_path / "check"
    tally = Tally()
    acks: list[Ack] = []
    for run in range(RUNS):
        early = rng.random() < 0.2
        delay = rng.uniform(0.0, 0.12) if early else rng.uniform(0.02, 0.4)
        new, ready = run_and_kill(path, run, delay, not early, tmp_path)
        tally.kills += 1
        tally.kills_before_ready += not ready
        tally.per_run.append(sum(a.count for a in new))
        acks += new
        if path.exists():
            check_copy(path, scratch, acks, tally)
    tally.acked_batches = len(acks)
    tally.acked_records = sum(a.count for a in acks)
    with capsys.disabled():
        print(
            f"\n[crash-kill] {tally.kills} SIGKILLs ({tally.kills_before_ready} before ready), "
            f"{tally.acked_records} acknowledged records in {tally.acked_batches} batches, "
            f"all present; log holds {tally.records_in_log} records in {tally.segments} "
            f"segments; {tally.torn_tails_cut} checks cut a torn tail "
            f"({tally.bytes_cut} bytes); acked per run: {tally.per_run}"
        )
    assert tally.acked_records > 1000, "too few acknowledgements to mean anything"
    assert tally.segments > 3, "the log never rolled"
    assert tally.records_in_log >= tally.acked_records
    assert os.listdir(path)
