"""A stateful property test of :class:`wal.Log` on disk, with simulated power cuts.

Hypothesis drives a small-segment log (512-byte segments, retention by size) through
random appends, flushes, rolls, retention, clean reopens and power cuts, against a model:

- ``values[o]`` is the payload written at offset ``o``, for every offset below the head;
- ``durable``: offsets below it were made durable by a flush, a roll or a clean close, so
  they must survive a power cut. What was appended after it may or may not survive, but
  what survives is a prefix of what was written, in order.

Power cuts use :class:`wal.FaultyFs`'s page model with 64-byte pages, so a cut can keep a
later unsynced page and lose an earlier one (several per 512-byte segment); recovery must
still yield a prefix, with nothing corrupt after it, and every sealed segment must read.

Invariant after every step: reading from the first offset to the head returns exactly
``values[first_offset:head]``, dense, intact, in order (retention removes only a prefix).
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import tempfile
from collections.abc import Sequence
from itertools import pairwise

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from tests.wal._helpers import CrashableFs, read_all
from wal import Log, LogConfig, encode_columns

CONFIG = LogConfig(segment_bytes=512, index_interval_bytes=100, retention_bytes=1000)


def value_for(i: int, pad: int) -> bytes:
    """A payload that names its record id and whose content can be checked."""
    return b"%08d:" % i + hashlib.sha256(b"%d" % i).digest()[: i % 29] + b"." * pad


class LogMachine(RuleBasedStateMachine):
    """The model and the log under test, in a fresh directory per example."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="wal-property-")
        self.path = os.path.join(self.tmp, "log")
        self.fs = CrashableFs(page_size=64)
        self.log = Log.open(self.path, CONFIG, fs=self.fs)
        self.values: list[bytes] = []
        self.durable = 0
        self.next_id = 0

    def teardown(self) -> None:
        self.fs.die()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _append(self, pads: Sequence[int]) -> None:
        values = [value_for(self.next_id + k, pad) for k, pad in enumerate(pads)]
        self.next_id += len(pads)
        result = self.log.append(encode_columns(values))
        assert result.first_offset == len(self.values)
        assert result.last_offset == len(self.values) + len(values) - 1
        self.values += values

    @initialize(batches=st.integers(0, 30), flushed=st.booleans())
    def prefill(self, batches: int, flushed: bool) -> None:
        """Start from a log of several segments, so that every example has some."""
        for k in range(batches):
            self._append([k % 50] * (1 + k % 3))
        if flushed:
            self.flush()

    @rule(pads=st.lists(st.integers(0, 80), min_size=1, max_size=4))
    def append(self, pads: Sequence[int]) -> None:
        self._append(pads)

    @rule(
        batches=st.lists(
            st.lists(st.integers(0, 80), min_size=1, max_size=3), min_size=2, max_size=8
        )
    )
    def append_several(self, batches: Sequence[Sequence[int]]) -> None:
        for pads in batches:
            self._append(pads)

    @rule()
    def flush(self) -> None:
        self.log.flush()
        self.durable = self.log.head

    @rule()
    def roll(self) -> None:
        self.log.roll()
        self.durable = self.log.head

    @rule(floor=st.one_of(st.none(), st.integers(0, 200)))
    def apply_retention(self, floor: int | None) -> None:
        before = self.log.first_offset
        active_base = self.log.segment_infos()[-1].base_offset
        deleted = self.log.apply_retention(floor)
        assert self.log.first_offset >= before
        assert self.log.first_offset <= active_base, "retention deleted the active segment"
        if deleted:
            assert deleted[0] == before
            assert floor is None or self.log.first_offset <= floor
        else:
            assert self.log.first_offset == before

    @rule()
    def reopen(self) -> None:
        head, first = self.log.head, self.log.first_offset
        self.log.close()
        self.log = Log.open(self.path, CONFIG, fs=self.fs)
        assert (self.log.first_offset, self.log.head) == (first, head)
        assert self.log.recovery.truncated_bytes == 0
        self.durable = head

    @rule(seed=st.integers(0, 2**32 - 1))
    def power_cut(self, seed: int) -> None:
        first = self.log.first_offset
        self.fs.die()
        self.fs.power_cut(random.Random(seed))
        self.log = Log.open(self.path, CONFIG, fs=self.fs)
        assert self.durable <= self.log.head <= len(self.values)
        assert self.log.first_offset == first
        del self.values[self.log.head :]
        for info in self.log.segment_infos()[:-1]:  # every sealed segment reads, whole
            got = [v for b in read_all(self.log, info.base_offset) for v in b.values()]
            assert got == self.values[info.base_offset :]

    @rule(where=st.floats(0, 1), max_bytes=st.integers(1, 2000))
    def read_from(self, where: float, max_bytes: int) -> None:
        first, head = self.log.first_offset, self.log.head
        if head == first:
            assert self.log.read(head) == []
            return
        offset = min(head - 1, first + int(where * (head - first)))
        got = self.log.read(offset, max_bytes)
        assert got
        assert got[0].base_offset <= offset < got[0].next_offset
        for a, b in pairwise(got):
            assert b.base_offset == a.next_offset
        for b in got:
            assert b.values() == self.values[b.base_offset : b.next_offset]

    @invariant()
    def reads_back_exactly_the_model(self) -> None:
        batches = read_all(self.log)
        values = [v for b in batches for v in b.values()]
        assert self.log.head == len(self.values)
        assert values == self.values[self.log.first_offset :]
        assert self.durable <= self.log.head


def test_log_survives_any_sequence_of_operations_and_power_cuts() -> None:
    """Scenario: up to 50 random sequences of 30 steps (append, flush, roll, retention,
    reopen, power cut, bounded read). Expected: after every step the log reads back exactly
    the model; a power cut keeps everything flushed and a prefix of the rest."""
    run_state_machine_as_test(
        LogMachine,
        settings=settings(
            max_examples=50,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
