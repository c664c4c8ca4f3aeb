"""A dead-letter queue's settings (dispatcher/dead_letter_config.py): validation, bounds
and defaults; pure, no event loop and no disk.
"""

from __future__ import annotations

import pytest

from dispatcher.dead_letter_config import DlqConfig, OverflowPolicy, PutOutcome
from dispatcher.dead_letter_queue import default_log_config
from dispatcher.errors import DlqConfigError


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("max_entries", 0, id="max_entries-zero"),
        pytest.param("max_entries", True, id="max_entries-bool"),
        pytest.param("max_entries", 1.5, id="max_entries-float"),
        pytest.param("max_age_s", 0.0, id="max_age-zero"),
        pytest.param("max_age_s", -1.0, id="max_age-negative"),
        pytest.param("max_age_s", float("inf"), id="max_age-inf"),
        pytest.param("max_age_s", float("nan"), id="max_age-nan"),
        pytest.param("max_age_s", "1d", id="max_age-str"),
        pytest.param("overflow", "drop_oldest", id="overflow-str"),
        pytest.param("max_event_bytes", 0, id="max_event_bytes-zero"),
        pytest.param("max_event_bytes", 255 * 2**20 + 1, id="max_event_bytes-over"),
        pytest.param("max_replays", -1, id="max_replays-negative"),
        pytest.param("max_replays", 2**32, id="max_replays-over-uint32"),
    ],
)
def test_config_rejects_bad_values(field: str, value: object) -> None:
    """Scenario: a DlqConfig with one bad field. Expected: a ValueError (DlqConfigError)
    whose message names the field, the value and what is allowed."""
    with pytest.raises(ValueError, match=field) as info:
        DlqConfig(**{field: value})  # type: ignore[arg-type]
    assert isinstance(info.value, DlqConfigError)
    assert info.value.field == field
    assert repr(value) in str(info.value)
    assert "must be" in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"max_entries": 1}, id="one-entry"),
        pytest.param({"max_age_s": None}, id="keep-forever"),
        pytest.param({"max_age_s": 1}, id="int-age"),
        pytest.param({"max_event_bytes": 1}, id="one-byte-events"),
        pytest.param({"max_event_bytes": 255 * 2**20}, id="largest-events"),
        pytest.param({"max_replays": 0}, id="no-replays"),
        pytest.param({"max_replays": 2**32 - 1}, id="most-replays"),
        pytest.param({"overflow": OverflowPolicy.BLOCK}, id="block"),
    ],
)
def test_config_accepts_boundary_values(kwargs: dict[str, object]) -> None:
    """Scenario: a DlqConfig at the edge of each range. Expected: it is accepted and
    keeps the value."""
    cfg = DlqConfig(**kwargs)  # type: ignore[arg-type]
    assert {name: getattr(cfg, name) for name in kwargs} == kwargs


def test_config_defaults() -> None:
    """Scenario: DlqConfig(). Expected: the documented defaults."""
    cfg = DlqConfig()
    assert cfg == DlqConfig(100_000, 7 * 24 * 3600.0, OverflowPolicy.DROP_OLDEST, 1 << 20, 3)
    assert PutOutcome.STORED.is_stored()
    assert not PutOutcome.REJECTED.is_stored()
    log = default_log_config()  # every subscription has a queue, read by admin calls only
    assert (log.tail_cache_bytes, log.max_record_bytes) == (0, 256 << 20)
