"""Pure tests of log configuration (:mod:`wal.config`): no disk, no event loop."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from proto.batch import HEADER_SIZE
from wal.config import KIB, MIB, FsyncPolicy, LogConfig
from wal.errors import WalConfigError, WalError
from wal.validate import BatchLimits

GIB = 1024 * MIB


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("segment_bytes", 128 * MIB),
        ("segment_ms", None),
        ("index_interval_bytes", 4 * KIB),
        ("max_record_bytes", 1 * MIB),
        ("max_batch_bytes", 16 * MIB),
        ("retention_ms", None),
        ("retention_bytes", None),
        ("fsync", FsyncPolicy.ALWAYS),
        ("fsync_interval_ms", 100),
        ("max_group_bytes", 32 * MIB),
    ],
)
def test_documented_defaults(field: str, expected: object) -> None:
    """Each default is the one documented on LogConfig."""
    assert getattr(LogConfig(), field) == expected


def test_default_byte_sizes_in_bytes() -> None:
    """The documented sizes in plain bytes: 128 MiB, 4 KiB, 1 MiB, 16 MiB."""
    config = LogConfig()
    assert config.segment_bytes == 134_217_728
    assert config.index_interval_bytes == 4096
    assert config.max_record_bytes == 1_048_576
    assert config.max_batch_bytes == 16_777_216
    assert config.fsync.is_always()


# Fields with an inclusive integer range: (field, lowest valid, highest valid).
_RANGES = [
    ("segment_bytes", 128, 2 * GIB),
    ("index_interval_bytes", 1, 2 * GIB),
    ("max_record_bytes", 1, 256 * MIB),
    ("max_batch_bytes", HEADER_SIZE + 64, 256 * MIB),
    ("fsync_interval_ms", 1, 3_600_000),
    ("max_group_bytes", 1, 1 * GIB),
]
_OPTIONAL = ["segment_ms", "retention_ms", "retention_bytes"]


@pytest.mark.parametrize(("field", "low", "high"), _RANGES)
def test_range_boundaries_are_accepted(field: str, low: int, high: int) -> None:
    """The lowest and highest documented values of each ranged field are valid."""
    low_kwargs: dict[str, Any] = {field: low}
    high_kwargs: dict[str, Any] = {field: high}
    assert getattr(LogConfig(**low_kwargs), field) == low
    assert getattr(LogConfig(**high_kwargs), field) == high


@pytest.mark.parametrize(
    ("field", "value"),
    [
        *[(field, low - 1) for field, low, _ in _RANGES],
        *[(field, high + 1) for field, _, high in _RANGES],
        *[(field, 0) for field, _, _ in _RANGES],
        *[(field, -1) for field, _, _ in _RANGES],
        *[(field, None) for field, _, _ in _RANGES],
        *[(field, 4096.0) for field, _, _ in _RANGES],
        *[(field, "4096") for field, _, _ in _RANGES],
        *[(field, True) for field, _, _ in _RANGES],
        *[(field, 0) for field in _OPTIONAL],
        *[(field, -5) for field in _OPTIONAL],
        *[(field, 1.5) for field in _OPTIONAL],
        *[(field, "60000") for field in _OPTIONAL],
        *[(field, True) for field in _OPTIONAL],
        ("fsync", "always"),
        ("fsync", None),
        ("fsync", 0),
    ],
)
def test_invalid_value_names_the_field(field: str, value: object) -> None:
    """Every out-of-range or wrongly typed value raises WalConfigError naming its field."""
    kwargs: dict[str, Any] = {field: value}
    with pytest.raises(WalConfigError) as info:
        LogConfig(**kwargs)
    err = info.value
    assert err.field == field
    assert err.value == value
    assert type(err.value) is type(value)
    assert f"{field}=" in str(err)
    assert err.requirement
    assert isinstance(err, WalError)
    assert isinstance(err, ValueError)


@pytest.mark.parametrize("field", _OPTIONAL)
@pytest.mark.parametrize("value", [None, 1, 7 * 24 * 3_600_000, 2**62])
def test_optional_fields_accept_none_or_positive(field: str, value: int | None) -> None:
    """segment_ms, retention_ms and retention_bytes take None (disabled) or any positive int."""
    kwargs: dict[str, Any] = {field: value}
    assert getattr(LogConfig(**kwargs), field) == value


@pytest.mark.parametrize("policy", list(FsyncPolicy))
def test_every_fsync_policy_is_accepted(policy: FsyncPolicy) -> None:
    """Each FsyncPolicy member is a valid fsync setting; only ALWAYS is_always()."""
    assert LogConfig(fsync=policy).fsync is policy
    assert policy.is_always() is (policy is FsyncPolicy.ALWAYS)


def test_fsync_error_lists_the_choices() -> None:
    """A bad fsync value's requirement names every policy."""
    kwargs: dict[str, Any] = {"fsync": "sometimes"}
    with pytest.raises(WalConfigError) as info:
        LogConfig(**kwargs)
    for policy in FsyncPolicy:
        assert policy.value in info.value.requirement


def test_first_invalid_field_is_reported() -> None:
    """Two bad fields raise for one of them, with that field's name and value."""
    with pytest.raises(WalConfigError) as info:
        LogConfig(segment_bytes=1, max_record_bytes=0)
    assert (info.value.field, info.value.value) in {("segment_bytes", 1), ("max_record_bytes", 0)}


def test_replace_revalidates() -> None:
    """dataclasses.replace runs the same validation as the constructor."""
    config = LogConfig(segment_bytes=512, index_interval_bytes=100)
    with pytest.raises(WalConfigError) as info:
        dataclasses.replace(config, index_interval_bytes=0)
    assert info.value.field == "index_interval_bytes"


def test_config_is_frozen() -> None:
    """A LogConfig cannot be changed after validation."""
    config = LogConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.segment_bytes = 1  # type: ignore[misc]
    assert config.segment_bytes == 128 * MIB


def test_small_test_config() -> None:
    """The ~512 B segments tests use (STYLE rule 31) are valid."""
    config = LogConfig(segment_bytes=512, index_interval_bytes=100)
    assert (config.segment_bytes, config.index_interval_bytes) == (512, 100)


@pytest.mark.parametrize(("record", "batch"), [(1 * MIB, 16 * MIB), (100, HEADER_SIZE + 64)])
def test_limits(record: int, batch: int) -> None:
    """limits carries max_record_bytes and max_batch_bytes into BatchLimits."""
    config = LogConfig(max_record_bytes=record, max_batch_bytes=batch)
    assert config.limits == BatchLimits(max_record_bytes=record, max_batch_bytes=batch)
