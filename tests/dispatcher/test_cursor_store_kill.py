"""The cursor store under SIGKILL: a child process saves subscription states as fast as it
can (journal appends, and a checkpoint every few flushes: a 4 KiB limit), printing each
state once its save returned; the test kills it at random moments, eight times, reading
what is on disk after each kill and letting the next child open it.

Claims: after every kill, each subscription's saved cursor is at least the last one the
child reported saved and at most the one it was saving (never older than a reported save,
never a value not reached); every child opens what the last one left."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dispatcher.cursor_recovery import read_states

SUBSCRIPTIONS = 8
KILLS = 8

CHILD = r"""
import asyncio, os, random, sys
from dispatcher import PartitionSnapshot, Subscription
from dispatcher.cursor_store import CursorStore
from wal import FileSystem, LogWriter, encode_columns

async def main(root: str, seed: int, count: int) -> None:
    writer = await LogWriter.open(os.path.join(root, "log"))
    if writer.high_water_mark == 0:
        for _ in range(10):
            await writer.append(encode_columns([b"x"] * 100_000))
    subs = {}
    store = CursorStore(
        os.path.join(root, "subs"), FileSystem(), flush_interval_s=3600,
        lookup=subs.get, members=lambda topic: list(subs.values()), checkpoint_bytes=4096,
    )
    cursors = {name: doc.partitions[0].cursor for _, name, doc in store.load_all({"t"})}
    for i in range(count):
        name = f"s{i}"
        snap = PartitionSnapshot(cursors.get(name, 0))
        subs[("t", name)] = Subscription("t", name, [writer], [snap])
    print("open", flush=True)
    rng = random.Random(seed)
    while True:
        chosen = rng.sample(list(subs.values()), rng.randint(1, count))
        for sub in chosen:
            cursor = sub.snapshot()[0].cursor + rng.randint(1, 50)
            print("saving", sub.name, cursor, flush=True)
            await sub.commit(0, cursor)
        await store.save_all(chosen)
        for sub in chosen:
            print("saved", sub.name, sub.snapshot()[0].cursor, flush=True)

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


@pytest.mark.timeout(120)
def test_sigkill_while_saving_keeps_every_state_reported_saved(tmp_path: Path) -> None:
    rng = random.Random(20261125)
    saved: dict[str, int] = {}
    for round_ in range(KILLS):
        out, err = tmp_path / f"child{round_}.out", tmp_path / f"child{round_}.err"
        with out.open("wb") as sink, err.open("wb") as errors:
            child = subprocess.Popen(
                [sys.executable, "-c", CHILD, str(tmp_path), str(round_), str(SUBSCRIPTIONS)],
                stdout=sink,
                stderr=errors,
                cwd=Path(__file__).resolve().parents[2],
            )
            deadline = time.monotonic() + 30
            while b"open" not in out.read_bytes():
                assert child.poll() is None, err.read_text()
                assert time.monotonic() < deadline, "the child did not open in 30 s"
                time.sleep(0.01)
            time.sleep(rng.uniform(0.05, 0.6))
            child.send_signal(signal.SIGKILL)
            child.wait()
        saving: dict[str, int] = dict(saved)
        for line in out.read_text().splitlines():
            match line.split():
                case ["saving", name, value]:
                    saving[name] = int(value)
                case ["saved", name, value]:
                    saved[name] = int(value)
        on_disk = {
            name: doc.partitions[0].cursor
            for name, doc in read_states(str(tmp_path / "subs"), "t").items()
        }
        assert len(saved) == SUBSCRIPTIONS, round_
        for name, last in saved.items():
            assert last <= on_disk[name] <= saving[name], (round_, name, on_disk, saved)
        saved = {name: on_disk[name] for name in saved}  # the next child starts there
