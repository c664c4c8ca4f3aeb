"""The tail cache (:mod:`wal.tail`): reads from it must be exactly the reads of the file.

Checked against the real thing: a :class:`wal.LogWriter` with the cache and the same log
read from disk by :meth:`wal.Log.read` return the same batches (offsets and bytes) for every
offset and byte budget, under the high-water mark, through segment rolls, eviction and
retention.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proto.batch import RecordBatch, decode_batch
from wal import FsyncPolicy, LogConfig, LogWriter, OffsetOutOfRangeError, encode_columns
from wal.tail import ENTRY_OVERHEAD_BYTES, TailCache


def _batch(values: list[bytes]) -> RecordBatch:
    batch = decode_batch(encode_columns(values))
    assert batch is not None
    return batch


def _shape(batches: list[RecordBatch]) -> list[tuple[int, int, bytes]]:
    return [(b.base_offset, b.record_count, bytes(b.buffer)) for b in batches]


def test_cached_batches_carry_their_assigned_offsets_in_their_own_bytes() -> None:
    cache = TailCache(1 << 20)
    cache.add([_batch([b"a", b"b"]), _batch([b"c"])], [10, 12])
    got = cache.read(11, 1 << 20, upper=13)
    assert got is not None
    assert [(b.base_offset, b.values()) for b in got] == [(10, [b"a", b"b"]), (12, [b"c"])]
    for b in got:
        assert type(b.buffer.obj) is bytes
        assert len(b.buffer.obj) == b.size
        again = decode_batch(b.buffer.obj)
        assert again is not None
        assert again.base_offset == b.base_offset


def test_reads_outside_the_cache_are_left_to_the_file() -> None:
    cache = TailCache(1 << 20)
    assert cache.read(0, 100, upper=10) is None  # empty
    cache.add([_batch([b"a"]), _batch([b"b"])], [5, 6])
    assert cache.read(4, 100, upper=7) is None  # below it
    assert cache.read(7, 100, upper=9) is None  # past it
    assert cache.read(6, 100, upper=6) is None  # at or past the high-water mark
    got = cache.read(5, 1, upper=6)
    assert got is not None
    assert [b.base_offset for b in got] == [5]


def test_the_oldest_batches_go_first_and_the_bytes_stay_bounded() -> None:
    one = _batch([b"x" * 100])
    cache = TailCache(3 * (one.size + ENTRY_OVERHEAD_BYTES))
    for offset in range(200):
        cache.add([one], [offset])
        assert cache.size_bytes <= 3 * one.size
    assert (cache.first_offset, cache.next_offset) == (197, 200)
    assert cache.read(196, 1 << 20, upper=200) is None
    got = cache.read(197, 1 << 20, upper=200)
    assert got is not None
    assert [b.base_offset for b in got] == [197, 198, 199]


def test_tiny_batches_are_charged_for_their_objects_not_just_their_bytes() -> None:
    """Scenario: 10,000 one-record batches of ~100 bytes through a 64 KiB cache. Expected:
    it holds at most 64 KiB / (size + ENTRY_OVERHEAD_BYTES) of them (~73), not 64 KiB /
    size (~630): what a batch costs in memory is mostly its Python objects."""
    tiny = _batch([b"t"])
    cache = TailCache(64 << 10)
    for offset in range(10_000):
        cache.add([tiny], [offset])
    first, after = cache.first_offset, cache.next_offset
    assert first is not None
    assert after is not None
    assert after == 10_000
    assert after - first == (64 << 10) // (tiny.size + ENTRY_OVERHEAD_BYTES)


def test_a_gap_or_an_oversized_batch_starts_the_cache_afresh() -> None:
    small, big = _batch([b"s"]), _batch([b"b" * 4096])
    cache = TailCache(big.size - 1)
    cache.add([small, small], [0, 1])
    cache.add([small], [5])  # does not follow on: never from the writer, but never mixed
    assert (cache.first_offset, cache.next_offset) == (5, 6)
    cache.add([big], [6])
    assert (cache.first_offset, cache.next_offset) == (None, None)
    cache.add([small], [7])
    assert (cache.first_offset, cache.next_offset) == (7, 8)


def test_a_zero_size_cache_holds_nothing() -> None:
    cache = TailCache(0)
    cache.add([_batch([b"a"])], [0])
    assert cache.read(0, 100, upper=1) is None
    with pytest.raises(ValueError, match="at least 0"):
        TailCache(-1)


def test_the_size_is_a_validated_log_setting() -> None:
    with pytest.raises(ValueError, match="tail_cache_bytes"):
        LogConfig(tail_cache_bytes=-1)
    assert LogConfig().tail_cache_bytes == 1 << 20


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=40),
    cache_bytes=st.sampled_from([0, 300, 2_000, 1 << 20]),
    reads=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 3_000)), min_size=1, max_size=30),
)
def test_writer_reads_equal_file_reads(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[int],
    cache_bytes: int,
    reads: list[tuple[float, int]],
) -> None:
    """Property: for any batches, cache size, offsets and budgets, ``LogWriter.read``
    returns what ``Log.read`` returns from the file (segments roll every ~512 bytes)."""
    path = str(tmp_path_factory.mktemp("tail") / "log")
    config = LogConfig(segment_bytes=512, index_interval_bytes=64, tail_cache_bytes=cache_bytes)

    async def run() -> None:
        writer = await LogWriter.open(path, config)
        try:
            n = 0
            for size in sizes:
                await writer.append(encode_columns([b"v%d" % (n + i) for i in range(size)]))
                n += size
            hwm = writer.high_water_mark
            for where, budget in reads:
                offset = min(int(where * hwm), hwm)
                assert _shape(writer.read(offset, budget)) == _shape(
                    writer.log.read(offset, budget, upper=hwm)
                )
        finally:
            await writer.aclose()

    asyncio.run(run())


@pytest.mark.asyncio
async def test_interval_reads_stop_at_the_mark_though_the_cache_holds_more(wal_dir: str) -> None:
    """Under ``INTERVAL`` the cache holds batches written but not yet synced: they are not
    durable, so a read must not return them until the mark passes them."""
    config = LogConfig(fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=3_600_000)
    writer = await LogWriter.open(wal_dir, config)
    try:
        await writer.append(encode_columns([b"a"]))
        assert writer.high_water_mark == 0
        assert writer.read(0) == []
        await writer.flush()
        assert [b.values() for b in writer.read(0)] == [[b"a"]]
    finally:
        await writer.aclose()


@pytest.mark.asyncio
async def test_records_deleted_by_retention_are_not_served_from_the_cache(wal_dir: str) -> None:
    config = LogConfig(segment_bytes=512, index_interval_bytes=100)
    writer = await LogWriter.open(wal_dir, config)
    try:
        for i in range(30):
            await writer.append(encode_columns([b"%02d" % i]))
        assert writer.read(0)  # cached
        await writer.delete_before(writer.high_water_mark)
        assert writer.first_offset > 0
        with pytest.raises(OffsetOutOfRangeError):
            writer.read(0)
    finally:
        await writer.aclose()


def test_a_clear_inside_one_group_counts_only_what_follows_it() -> None:
    """Scenario: one ``add`` of a group holding small batches, then an oversized one, then
    small ones again (and another group with a gap inside it).
    Expected: the cache holds just the batches after the last clear, and its byte count
    is theirs alone: a clear in the middle of a group leaves no count behind."""
    small, big = _batch([b"s"]), _batch([b"b" * 4096])
    cache = TailCache(big.size - 1)
    cache.add([small, small, big, small, small], [0, 1, 2, 3, 4])
    assert (cache.first_offset, cache.next_offset) == (3, 5)
    assert cache.size_bytes == 2 * small.size
    cache.add([small, small], [5, 9])  # a gap inside the group
    assert (cache.first_offset, cache.next_offset) == (9, 10)
    assert cache.size_bytes == small.size
    room = TailCache(3 * (small.size + ENTRY_OVERHEAD_BYTES))
    room.add([small] * 5, range(5))
    assert (room.first_offset, room.next_offset, room.size_bytes) == (2, 5, 3 * small.size)


def test_a_batch_is_patched_once_on_first_read_and_then_shared() -> None:
    """Scenario: a batch added at offset 40 and read twice; another added over a
    bytearray that its owner then overwrites.
    Expected: both reads return the very same object, whose own bytes carry offset 40;
    the bytearray's batch reads back as it was added (the cache copied it at once)."""
    cache = TailCache(1 << 20)
    cache.add([_batch([b"a"])], [40])
    first, again = cache.read(40, 1 << 20, upper=41), cache.read(40, 1 << 20, upper=41)
    assert first is not None
    assert again is not None
    assert first[0] is again[0]
    assert decode_batch(bytes(first[0].buffer)) == first[0]
    assert first[0].base_offset == 40
    owned = bytearray(encode_columns([b"kept"]))
    view = decode_batch(owned)
    assert view is not None
    cache.add([view], [41])
    owned[:] = bytes(len(owned))
    got = cache.read(41, 1 << 20, upper=42)
    assert got is not None
    assert (got[0].base_offset, got[0].values()) == (41, [b"kept"])


def test_a_batch_viewing_a_bigger_buffer_is_copied_at_once() -> None:
    """Scenario: a batch decoded from the middle of a buffer holding two batches (as a
    read of the file returns them) is added.
    Expected: the cache's copy holds just that batch's bytes, with its assigned offset."""
    first, second = encode_columns([b"one"]), encode_columns([b"two"])
    both = first + second
    view = decode_batch(both, len(first))
    assert view is not None
    cache = TailCache(1 << 20)
    cache.add([view], [7])
    assert cache._batches[0].buffer.obj is not both
    got = cache.read(7, 1 << 20, upper=8)
    assert got is not None
    assert memoryview(got[0].buffer.obj).nbytes == len(second)
    assert (got[0].base_offset, got[0].values()) == (7, [b"two"])
