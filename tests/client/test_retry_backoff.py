"""The pauses of retried and routed calls (client._retry)."""

from __future__ import annotations

import random

from client._retry import ROUTE_BACKOFF_MAX_S, backoff_s, route_backoff_s


def test_a_routed_call_looks_up_again_within_a_quarter_second() -> None:
    """Scenario: the pauses of attempts 0-30 before a Lookup and before a plain retry.
    Expected: before a Lookup never over 250 ms (a new leader is found soon after its
    election), growing from 50 ms; before a plain retry up to 2 s as before, and the
    first attempts of both are bounded by 50 ms."""
    rng = random.Random(7)
    lookups = [route_backoff_s(a, rng, lookup=True) for a in range(31) for _ in range(50)]
    retries = [route_backoff_s(a, rng, lookup=False) for a in range(31) for _ in range(50)]
    assert ROUTE_BACKOFF_MAX_S == 0.25
    assert max(lookups) <= 0.25
    assert max(lookups) > 0.2  # the cap is reached, not a smaller one
    assert max(retries) > 1.0  # plain retries keep their 2 s cap
    assert max(retries) <= 2.0
    assert all(route_backoff_s(0, rng, lookup=True) <= 0.05 for _ in range(100))
    assert all(backoff_s(0, rng) <= 0.05 for _ in range(100))


def test_any_number_of_attempts_has_a_pause_within_its_cap() -> None:
    """Scenario: the pauses of attempts 1,000 to 1,100 and 100,000 (a producer's retry
    rounds count from its last acknowledgement: a topic offline for a few minutes at
    about 8 rounds a second passes 1,024), before a Lookup and not, and of the plain rule.
    Expected: each is a pause within its cap (250 ms, 2 s); before, attempt 1,024 raised
    OverflowError (``0.05 * 2**1024`` is no float) in the producer's resend."""
    rng = random.Random(3)
    for attempt in [*range(1000, 1101), 100_000]:
        assert 0 <= route_backoff_s(attempt, rng, lookup=True) <= 0.25
        assert 0 <= route_backoff_s(attempt, rng, lookup=False) <= 2.0
        assert 0 <= backoff_s(attempt, rng) <= 2.0
