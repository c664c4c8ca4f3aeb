"""Tests of :mod:`broker.fd_budget`: the pure rule of whether partitions fit. No disk."""

from __future__ import annotations

import pytest

from broker.fd_budget import RESERVE, FdUsage, Shortfall, fds_needed, shortfall


@pytest.mark.parametrize(
    ("usage", "available"),
    [
        # The module docstring's worked example.
        (FdUsage(20_000, 150, 50, 2_500), 20_000 - 100 - 2_500 - RESERVE),
        # Idle cached descriptors count as free: the cache closes them on demand.
        (FdUsage(2_048, 400, 300, 256), 2_048 - 100 - 256 - RESERVE),
        # Creates still running hold their promise.
        (FdUsage(2_048, 100, 0, 256, reserved=500), 2_048 - 600 - 256 - RESERVE),
        # Never below zero.
        (FdUsage(256, 200, 0, 64), 0),
    ],
)
def test_available_descriptors(usage: FdUsage, available: int) -> None:
    """Scenario: measured usages. Expected: limit - busy - cache capacity - reserve."""
    assert usage.available == available


@pytest.mark.parametrize(
    ("partitions", "fits"),
    [(1, True), (17_144, True), (17_145, False), (10_000, True)],
)
def test_shortfall_at_the_boundary(partitions: int, fits: bool) -> None:
    """Scenario: the worked example's 17,144 free descriptors. Expected: up to 17,144
    partitions fit; one more is short by exactly one, and the most that fit is named."""
    usage = FdUsage(20_000, 150, 50, 2_500)
    got = shortfall(partitions, usage)
    if fits:
        assert got is None
    else:
        assert got == Shortfall(fds_needed(partitions), 17_144, 20_000, 17_144)
