"""The batch decoder and log recovery, fed random and damaged bytes.

Claims checked:
- ``decode_batch`` of any bytes returns a batch, ``None`` or raises ``CorruptBatchError``; the
  untrusted-input check ``validate_batch`` raises nothing else either, and every accessor
  of a batch it accepts works (the broker hands such batches to consumers and to Arrow).
- A log damaged anywhere (flipped, overwritten, truncated, padded, spliced bytes in any
  ``.log`` or ``.index`` file) reopens, or, for damage inside a sealed segment only, raises
  a ``WalError`` with a one-line message; once open, every batch that lies wholly before
  the damage reads back byte-exact, damage to an index (a cache) loses nothing, and the
  batch whose bytes were changed is never served as if it were whole.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz._strategies import batches, forge_crc, mutations
from tests.fuzz.conftest import SLOW, examples
from wal import (
    BatchRejectedError,
    CorruptBatchError,
    Log,
    LogConfig,
    RecordBatch,
    WalError,
    decode_batch,
    encode_columns,
    iter_batches,
)
from wal.validate import BatchLimits, validate_batch

CI_BATCHES = 300  # decoder examples; pure and fast
CI_LOGS = 60  # damaged logs; each copies and reopens a log
LIMITS = BatchLimits(max_record_bytes=1 << 20, max_batch_bytes=16 << 20)


def _touch_everything(batch: RecordBatch) -> None:
    """Read every column of ``batch``, as a consumer or the Arrow reader would."""
    assert len(batch.values()) == batch.record_count
    assert len(batch.keys()) == batch.record_count
    assert len(batch.headers()) == batch.record_count
    assert len(batch.timestamps()) == batch.record_count
    assert len(batch.records()) == batch.record_count
    assert list(batch.offsets()) == list(range(batch.base_offset, batch.next_offset))


def _decode_claims(data: bytes) -> None:
    with contextlib.suppress(CorruptBatchError):
        decode_batch(data)
    try:
        batch = validate_batch(data, LIMITS)
    except BatchRejectedError:  # a WalError and the codec's InvalidBatchError
        return
    _touch_everything(batch)


_DECODER_INPUT = st.one_of(
    st.binary(max_size=300),
    batches(),
    batches().flatmap(mutations).map(forge_crc),
    batches().flatmap(mutations).flatmap(mutations).map(forge_crc),
)


@settings(max_examples=examples(CI_BATCHES))
@given(data=_DECODER_INPUT)
def test_decoder_returns_a_batch_none_or_a_wal_error(data: bytes) -> None:
    """Scenario: random bytes, valid batches, and valid batches mutated with the CRC
    forged to match (so the layout checks, not the checksum, must catch the damage).
    Expected: decode gives a batch, None or the codec's CorruptBatchError; validate_batch
    a batch whose every column reads, or a BatchRejectedError; never another exception."""
    _decode_claims(data)


@pytest.mark.slow
@settings(max_examples=examples(SLOW * 20))
@given(data=_DECODER_INPUT)
def test_decoder_long_run(data: bytes) -> None:
    """Scenario: as the short run, with many more examples. Expected: the same."""
    _decode_claims(data)


# ---------------------------------------------------------------------------------------
# Damaged logs


@dataclass(frozen=True)
class Placed:
    """A batch as written: its file, byte position in it, and its bytes."""

    file: str
    position: int
    data: bytes
    base_offset: int


@dataclass(frozen=True)
class Template:
    path: Path
    config: LogConfig
    files: list[str]  # every .log and .index, sorted
    placed: list[Placed]


def _build(root: Path) -> Template:
    """A closed log of 20 batches over several 512-byte segments, indexed every 100 B."""
    config = LogConfig(segment_bytes=512, index_interval_bytes=100)
    path = root / "template"
    log = Log.open(str(path), config)
    for i in range(20):
        values = [b"%03d-%d" % (i, j) * (1 + j) for j in range(1 + i % 3)]
        log.append(encode_columns(values, keys=[b"k"] * len(values)))
    log.flush()
    log.close()
    files = sorted(p.name for p in path.iterdir() if p.suffix in (".log", ".index"))
    placed = [
        Placed(name, b.position_in_file, bytes(b.buffer), b.base_offset)
        for name in files
        if name.endswith(".log")
        for b in _with_positions((path / name).read_bytes())
    ]
    assert len({p.file for p in placed}) >= 3, "the template needs sealed segments"
    return Template(path, config, files, placed)


@dataclass(frozen=True)
class _At:
    position_in_file: int
    buffer: memoryview
    base_offset: int


def _with_positions(data: bytes) -> list[_At]:
    out: list[_At] = []
    pos = 0
    for b in iter_batches(data):
        out.append(_At(pos, b.buffer, b.base_offset))
        pos += b.size
    assert pos == len(data)
    return out


@dataclass(frozen=True)
class Damage:
    file: str
    kind: str  # flip | overwrite | truncate | append | insert
    at: int  # byte position where the file first differs
    data: bytes  # the damaged file


def _damage(t: Template) -> st.SearchStrategy[Damage]:
    return st.tuples(st.sampled_from(t.files), st.data()).map(lambda fd: _apply(t, *fd))


def _apply(t: Template, name: str, data: st.DataObject) -> Damage:
    original = (t.path / name).read_bytes()
    n = len(original)
    kind = data.draw(st.sampled_from(["flip", "overwrite", "truncate", "append", "insert"]))
    at = data.draw(st.integers(0, max(n - 1, 0)))
    junk = data.draw(st.binary(min_size=1, max_size=64))
    if kind == "flip" and n:
        damaged = original[:at] + bytes([original[at] ^ data.draw(st.integers(1, 255))])
        damaged += original[at + 1 :]
    elif kind == "overwrite":
        damaged = original[:at] + junk + original[at + len(junk) :]
    elif kind == "truncate":
        damaged = original[:at]
    elif kind == "insert":
        damaged = original[:at] + junk + original[at:]
    else:
        at, damaged = n, original + junk
    first_diff = next(
        (i for i, (a, b) in enumerate(zip(original, damaged, strict=False)) if a != b),
        min(len(original), len(damaged)),
    )
    return Damage(name, kind, first_diff, damaged)


def _readable_before(t: Template, damage: Damage) -> list[Placed]:
    """The batches that lie wholly before the damage (all of them for an index)."""
    if damage.file.endswith(".index"):
        return t.placed
    return [
        p
        for p in t.placed
        if p.file < damage.file or (p.file == damage.file and p.position + len(p.data) <= damage.at)
    ]


def _open(path: Path, config: LogConfig) -> Log | WalError:
    try:
        return Log.open(str(path), config)
    except WalError as exc:
        return exc


def _recovery_claims(t: Template, case: Path, damage: Damage) -> None:
    if case.exists():
        shutil.rmtree(case)
    shutil.copytree(t.path, case)
    (case / damage.file).write_bytes(damage.data)
    sealed = damage.file.endswith(".log") and damage.file != max(p.file for p in t.placed)
    log = _open(case, t.config)
    if isinstance(log, WalError):
        assert sealed, f"only damage inside a sealed segment may stop the open: {log}"
        assert str(log)
        assert "\n" not in str(log)
        return
    try:
        for p in _readable_before(t, damage):
            (got, *_) = log.read(p.base_offset, 1)
            assert got.base_offset == p.base_offset
            assert bytes(got.buffer) == p.data, f"batch {p.base_offset} changed"
        _damaged_batch_is_not_served(t, log, damage)
    finally:
        log.close()


def _damaged_batch_is_not_served(t: Template, log: Log, damage: Damage) -> None:
    """A read of the batch whose bytes were changed in place raises a WalError or, after a
    cut, finds nothing: the log never serves damaged data as if it were whole."""
    hit = [
        p
        for p in t.placed
        if p.file == damage.file and p.position <= damage.at < p.position + len(p.data)
    ]
    if not hit or damage.kind not in ("flip", "overwrite"):
        return
    try:
        got = log.read(hit[0].base_offset, 1)
    except WalError:
        return
    assert [bytes(b.buffer) for b in got[:1]] in ([], [hit[0].data]), (
        f"{damage.kind} at byte {damage.at} of {damage.file}: the damaged batch "
        f"{hit[0].base_offset} was served"
    )


def test_damaged_log_reopens_and_keeps_every_batch_before_the_damage(tmp_path: Path) -> None:
    """Scenario: a log of 20 batches in several segments; hypothesis damages one of its
    files (flip, overwrite, truncate, append, insert at any byte) and reopens a copy.
    Expected: it opens (a WalError is allowed only for damage in a sealed segment) and every
    batch wholly before the damage reads back byte-exact; an index's damage loses nothing."""
    t = _build(tmp_path)

    @settings(max_examples=examples(CI_LOGS))
    @given(damage=_damage(t))
    def one(damage: Damage) -> None:
        _recovery_claims(t, tmp_path / "case", damage)

    one()


@pytest.mark.slow
def test_damaged_log_long_run(tmp_path: Path) -> None:
    """Scenario: as the short run, with many more examples. Expected: the same."""
    t = _build(tmp_path)

    @settings(max_examples=examples(SLOW))
    @given(damage=_damage(t))
    def one(damage: Damage) -> None:
        _recovery_claims(t, tmp_path / "case", damage)

    one()
