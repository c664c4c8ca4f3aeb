"""The pause before a client calls again after a retryable error: one rule for every client.

Role: full-jitter exponential backoff (:func:`backoff_s`), and the shorter cap of a routed
call that looks its topic up next (:func:`route_backoff_s`). Pure: the callers (the
producer's accumulator, the consumer session, the routers) do the waiting and decide
what is retryable.

Example: attempts 0, 1, 2 pause up to 0.05 s, 0.1 s, 0.2 s; from attempt 6 on, up to
2 s (a routed call that looks up next: up to 0.25 s from attempt 3 on).
"""

from __future__ import annotations

import random

_BACKOFF_BASE_S = 0.05
_BACKOFF_MAX_S = 2.0


#: The longest pause before a routed call looks its topic up again. Short, because the
#: wait is for the cluster (an election, a session that lapses), not for a broker to
#: recover from load: a new leader is found within this of being elected. A Lookup is
#: answered from the broker's memory, so a few a second per stuck call cost little.
ROUTE_BACKOFF_MAX_S = 0.25


#: The largest exponent used: past it every pause is at its cap anyway, and
#: ``base * 2**1024`` is no float (OverflowError; a producer's retry rounds are counted
#: from its last acknowledgement: at about 8 a second, a topic offline for 2-3 minutes).
_MAX_EXPONENT = 32


def backoff_s(attempt: int, rng: random.Random) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(max, base * 2**attempt)]."""
    return rng.uniform(0, min(_BACKOFF_MAX_S, _BACKOFF_BASE_S * 2 ** min(attempt, _MAX_EXPONENT)))


def route_backoff_s(attempt: int, rng: random.Random, *, lookup: bool) -> float:
    """The pause of a routed call: as :func:`backoff_s`, at most
    :data:`ROUTE_BACKOFF_MAX_S` when the call looks its topic up next (``lookup``)."""
    if not lookup:
        return backoff_s(attempt, rng)
    exponent = min(attempt, _MAX_EXPONENT)
    return rng.uniform(0, min(ROUTE_BACKOFF_MAX_S, _BACKOFF_BASE_S * 2**exponent))
