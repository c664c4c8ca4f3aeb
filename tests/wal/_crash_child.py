"""Child process of ``test_crash_kill``: appends with fsync ALWAYS until it is killed.

Usage: ``python -m tests.wal._crash_child DIR RUN`` (run from the repository root).

It opens a :class:`wal.LogWriter` on ``DIR`` (64 KiB segments, so rolls happen), prints
``ready``, then runs :data:`APPENDERS` concurrent appenders forever. After each append is
acknowledged it prints one line ``<first_offset> <last_offset> <first_id> <count>`` and
flushes stdout, so every line the parent reads names records that were acknowledged.

Record ids encode who wrote them: ``run * 10**9 + appender * 10**7 + seq``; an appender's
``seq`` counts its records, so its ids increase in the order it appended them. The payload
of a record is a function of its id alone (:func:`value_for`), so the parent can check it.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import sys

from wal import LogConfig, LogWriter, encode_columns

APPENDERS = 8
CONFIG = LogConfig(segment_bytes=64 * 1024, index_interval_bytes=4096)


def record_id(run: int, appender: int, seq: int) -> int:
    """The id of an appender's ``seq``-th record in a run."""
    return run * 10**9 + appender * 10**7 + seq


def value_for(rid: int) -> bytes:
    """The payload of record ``rid``: its id, then 16-400 bytes derived from it."""
    digest = hashlib.sha256(b"%d" % rid).digest()
    size = 16 + int.from_bytes(digest[:2], "little") % 385
    return b"%d:" % rid + (digest * (size // 32 + 1))[:size]


def id_of(value: bytes) -> int:
    """The record id a payload names."""
    return int(value.split(b":", 1)[0])


async def appender(writer: LogWriter, run: int, index: int) -> None:
    """Append batches of 1-5 records forever, reporting each acknowledgement; pause up to
    2 ms between appends so the volume stays small enough to check after every kill."""
    rng = random.Random(run * 100 + index)
    seq = 0
    while True:
        count = rng.randint(1, 5)
        first = record_id(run, index, seq)
        values = [value_for(first + k) for k in range(count)]
        result = await writer.append(encode_columns(values))
        sys.stdout.write(f"{result.first_offset} {result.last_offset} {first} {count}\n")
        sys.stdout.flush()
        seq += count
        await asyncio.sleep(rng.random() * 0.002)  # pace it: kills land at varied moments


async def main(path: str, run: int) -> None:
    """Open the log (recovering it) and append until killed."""
    writer = await LogWriter.open(path, CONFIG)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await asyncio.gather(*(appender(writer, run, a) for a in range(APPENDERS)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
