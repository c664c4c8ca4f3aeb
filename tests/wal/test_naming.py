"""Pure tests of segment file naming (:mod:`wal.naming`): no disk, no event loop."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wal.naming import (
    BROKEN_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TMP_SUFFIX,
    broken_name,
    is_leftover,
    parse_segment_name,
    segment_name,
)

_U64_MAX = 2**64 - 1


@pytest.mark.parametrize(
    ("base", "suffix", "expected"),
    [
        (0, LOG_SUFFIX, "00000000000000000000.log"),
        (42, LOG_SUFFIX, "00000000000000000042.log"),
        (42, INDEX_SUFFIX, "00000000000000000042.index"),
        (1200, INDEX_SUFFIX, "00000000000000001200.index"),
        (_U64_MAX, LOG_SUFFIX, "18446744073709551615.log"),
        (10**19, LOG_SUFFIX, "10000000000000000000.log"),
    ],
)
def test_segment_name(base: int, suffix: str, expected: str) -> None:
    """A segment file is its base offset zero-padded to 20 digits, then the suffix."""
    assert segment_name(base, suffix) == expected


def test_segment_name_rejects_negative_base() -> None:
    """A negative base offset has no file name."""
    with pytest.raises(ValueError, match="base offset must be >= 0"):
        segment_name(-1, LOG_SUFFIX)


def test_segment_names_sort_by_base_offset() -> None:
    """Zero padding makes lexical order of names equal numeric order of base offsets."""
    bases = [0, 9, 10, 99, 100, 1200, 10**12, _U64_MAX]
    names = [segment_name(b, LOG_SUFFIX) for b in bases]
    assert sorted(names) == names
    assert len(set(map(len, names))) == 1


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("00000000000000000000.log", (0, LOG_SUFFIX)),
        ("00000000000000000042.log", (42, LOG_SUFFIX)),
        ("00000000000000000042.index", (42, INDEX_SUFFIX)),
        ("18446744073709551615.index", (_U64_MAX, INDEX_SUFFIX)),
    ],
)
def test_parse_live_segment_names(name: str, expected: tuple[int, str]) -> None:
    """A live .log or .index name parses to (base_offset, suffix)."""
    assert parse_segment_name(name) == expected


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".log",
        "00000000000000000042",
        "00000000000000000042.",
        "0000000000000000042.log",  # 19 digits
        "000000000000000000042.log",  # 21 digits
        "0000000000000000004a.log",
        "-0000000000000000042.log",
        "+0000000000000000042.log",
        " 0000000000000000042.log",
        "00000000000000000042.LOG",
        "00000000000000000042.txt",
        "00000000000000000042.log.tmp",
        "00000000000000000042.index.tmp",
        "00000000000000000042.log.deleted",
        "00000000000000000042.log.192.broken",
        "00000000000000000042.logx",
        "00000000000000000042.index.",
        "cursor.json",
    ],
)
def test_parse_rejects_everything_else(name: str) -> None:
    """Temp, deleted, broken and foreign names are not live segment files: None."""
    assert parse_segment_name(name) is None


@pytest.mark.parametrize(
    "name",
    [
        "0000000000000000000\u00b2.log",  # superscript two: str.isdigit() but not int()-able
        "\u0660" * 20 + ".log",  # Arabic-Indic zeros: isdigit() and int() == 0
        "\uff10" * 20 + ".index",  # fullwidth zeros
    ],
    ids=["superscript", "arabic-indic", "fullwidth"],
)
def test_parse_rejects_non_ascii_digits(name: str) -> None:
    """Only ASCII 0-9 name a segment: other Unicode digits give None, never a crash or alias."""
    assert parse_segment_name(name) is None


@given(st.integers(0, _U64_MAX), st.sampled_from([LOG_SUFFIX, INDEX_SUFFIX]))
def test_name_round_trip(base: int, suffix: str) -> None:
    """parse_segment_name inverts segment_name for every u64 base offset."""
    assert parse_segment_name(segment_name(base, suffix)) == (base, suffix)


_digitish_names = st.builds(
    lambda stem, suffix: stem + suffix,
    # Characters str.isdigit() accepts: ASCII and other decimal digits, superscripts.
    st.text(
        st.characters(categories=["Nd"]) | st.sampled_from("0123456789¹²³"),
        min_size=20,
        max_size=20,
    ),
    st.sampled_from([LOG_SUFFIX, INDEX_SUFFIX]),
)


@given(st.text(max_size=40) | _digitish_names)
def test_parse_never_raises(name: str) -> None:
    """parse_segment_name returns None or a parse of a name it would itself produce."""
    parsed = parse_segment_name(name)
    if parsed is not None:
        assert segment_name(*parsed) == name


@pytest.mark.parametrize(
    ("base", "position", "expected"),
    [
        (0, 0, "00000000000000000000.log.0.broken"),
        (42, 192, "00000000000000000042.log.192.broken"),
    ],
)
def test_broken_name(base: int, position: int, expected: str) -> None:
    """Bytes cut from a tail are kept as <segment>.log.<position>.broken."""
    name = broken_name(base, position)
    assert name == expected
    assert name.endswith(BROKEN_SUFFIX)
    assert parse_segment_name(name) is None
    assert not is_leftover(name)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("00000000000000000042.index" + TMP_SUFFIX, True),
        ("00000000000000000042.log" + DELETED_SUFFIX, True),
        ("00000000000000000042.index" + DELETED_SUFFIX, True),
        ("cursors.json.tmp", True),
        ("00000000000000000042.log", False),
        ("00000000000000000042.index", False),
        ("00000000000000000042.log.0.broken", False),
        ("00000000000000000042.tmp.log", False),
        ("tmp", False),
    ],
)
def test_is_leftover(name: str, expected: bool) -> None:
    """Only .tmp and .deleted files are leftovers that opening the log cleans up."""
    assert is_leftover(name) is expected
