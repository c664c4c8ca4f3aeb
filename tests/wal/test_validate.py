"""Header limits in batch validation (:mod:`wal.validate`): pure, no loop, no disk."""

from __future__ import annotations

import pytest

from wal import HeaderLimitError, InvalidBatchError, encode_columns
from wal.validate import BatchLimits, validate_batch

LIMITS = BatchLimits(
    max_record_bytes=1 << 20,
    max_batch_bytes=16 << 20,
    max_headers_per_record=4,
    max_header_bytes=64,
    max_header_name_bytes=8,
)


def batch_with(*headers: dict[str, bytes]) -> bytes:
    """One record per header map, values ``v0``, ``v1``, ..."""
    values = [b"v%d" % i for i in range(len(headers))]
    return encode_columns(values, timestamps_ms=1, headers=list(headers))


@pytest.mark.parametrize(
    ("headers", "setting", "found"),
    [
        ({f"h{i}": b"" for i in range(4)}, None, ""),
        ({f"h{i}": b"" for i in range(5)}, "max_headers_per_record", "5 headers"),
        ({"a": b"x" * 63}, None, ""),
        ({"a": b"x" * 64}, "max_header_bytes", "65 bytes of header names and values"),
        ({"abcdefgh": b""}, None, ""),
        ({"abcdefghi": b""}, "max_header_name_bytes", "a header name of 9 bytes"),
    ],
)
def test_header_limits_at_and_one_over(
    headers: dict[str, bytes], setting: str | None, found: str
) -> None:
    """Scenario: the second record of a batch carries headers at a limit, or one over it.
    Expected: at the limit the batch is valid; one over raises HeaderLimitError naming
    record 1, the figure found, the limit and its [limits] key."""
    data = batch_with({"ok": b"1"}, headers)
    if setting is None:
        assert validate_batch(data, LIMITS).record_count == 2
        return
    with pytest.raises(HeaderLimitError) as info:
        validate_batch(data, LIMITS)
    assert info.value.index == 1
    assert info.value.setting == setting
    assert f"record 1 has {found}; the limit is" in str(info.value)
    assert f"([limits] {setting})" in str(info.value)
    assert isinstance(info.value, InvalidBatchError)


def test_spread_headers_pass_when_no_record_is_over() -> None:
    """Scenario: three records with four headers each (twelve in the batch, over the
    per-record limit of four as a total). Expected: valid: limits are per record."""
    four = {f"h{i}": b"" for i in range(4)}
    assert validate_batch(batch_with(four, four, four), LIMITS).record_count == 3


def test_no_limits_means_none_apply() -> None:
    """Scenario: 200 headers with long names and no header limits (the wal default).
    Expected: valid."""
    limits = BatchLimits(max_record_bytes=1 << 20, max_batch_bytes=16 << 20)
    many = {"n" * 300 + str(i): b"v" for i in range(200)}
    assert validate_batch(batch_with(many), limits).record_count == 1
